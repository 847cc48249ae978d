"""Quantized weights: bitsandbytes parameters put on a device and quantized there, and 8-bit weights
offloaded (:mod:`.bnb_params`). Accelerate's loading API stays in :mod:`accel.utils.bnb`
(``load_and_quantize_model``, ``BnbQuantizationConfig``); the big-model loaders call this package for each
parameter. Importing this package imports none of its modules.
"""

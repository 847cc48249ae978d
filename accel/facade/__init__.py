"""The Accelerator's own jobs, each a module next to the others; :mod:`accel.accelerator` (Accelerate's
module and class) delegates to them and they never hold the Accelerator.

``preparation`` (the body of ``prepare`` and the registry behind ``prepared_objects()``), ``accumulation``
(the step/sync rule of ``accumulate``), ``uneven_inputs`` (``gather_for_metrics``, ``join_uneven_inputs``),
``model_wrappers`` (compile, ``unwrap_model``), ``context_parallel``, ``lomo`` (LOMO's fused backward),
``options`` (constructor checks) and ``delegates`` (the thin methods that forward to collectives,
trackers and checkpointing). Importing this package imports none of them.
"""

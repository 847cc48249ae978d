"""AWS Trainium and Inferentia (NeuronCores) through ``torch_neuronx`` (collectives: neuron)."""

from __future__ import annotations

from .extension import ExtensionBackend


class NeuronBackend(ExtensionBackend):
    """AWS Neuron: ``torch.neuron`` from torch_neuronx, one device per NeuronCore chosen by NEURON_RT_VISIBLE_CORES."""

    name = "neuron"
    device_type = "neuron"
    extension_package = "torch_neuronx"
    install_hint = "pip install torch-neuronx from the AWS Neuron repository, on a Trainium/Inferentia instance"
    collective_backend = "neuron"
    accelerate_rng_key = "torch_neuron_manual_seed"
    visible_devices_env = "NEURON_RT_VISIBLE_CORES"
    start_method = "spawn"
    distributed_type = "MULTI_NEURON"
    priority = 35
    oom_messages = ("Neuron out of memory", "NRT_RESOURCE")

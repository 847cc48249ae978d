"""accel offers every public name of the installed Accelerate, module by module, with Accelerate's constants.

A module's public names are its ``__all__``; without one, a package's re-exports (names that are
not modules and not third-party objects) and a plain module's own top-level definitions. The few
names accel leaves out are listed in ``EXCLUDED`` with the reason. The second half checks that the
names added for parity behave (they are implementations, not placeholders).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from _waits import SAFETY_NET_S

accelerate = pytest.importorskip("accelerate", reason="the installed Accelerate is the reference for the public names")

MODULES = [
    "accelerate", "accelerate.utils", "accelerate.test_utils", "accelerate.utils.constants", "accelerate.utils.dataclasses",
    "accelerate.state", "accelerate.data_loader", "accelerate.big_modeling", "accelerate.hooks", "accelerate.logging",
    "accelerate.launchers", "accelerate.utils.operations", "accelerate.utils.modeling", "accelerate.utils.memory",
    "accelerate.utils.random", "accelerate.utils.other", "accelerate.utils.imports", "accelerate.optimizer",
    "accelerate.scheduler", "accelerate.tracking", "accelerate.checkpointing", "accelerate.parallelism_config",
]
#: packages whose API is what they re-export
PACKAGES = {"accelerate", "accelerate.utils", "accelerate.test_utils"}

#: (module or "*", name) -> why accel does not offer it
EXCLUDED = {
    ("*", "logger"): "a module's own logging.Logger instance, not API",
    ("accelerate.utils.other", "np_core"): "an alias of numpy's private core module, used only to build TORCH_SAFE_GLOBALS",
    ("accelerate.checkpointing", "save_accelerator_state"):
        "accel's save_state writes one transactional checkpoint (manifest, atomic commit) from the Accelerator; "
        "Accelerate's per-object writer has no counterpart there",
    ("accelerate.checkpointing", "load_accelerator_state"): "the reading half of save_accelerator_state (see there)",
}


def _definitions(module: types.ModuleType) -> list[str]:
    tree = ast.parse(inspect.getsource(module))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def _is_third_party(value: object) -> bool:
    origin = getattr(value, "__module__", None)
    return (inspect.isclass(value) or callable(value)) and origin is not None and not origin.startswith("accelerate")


def public_names(module_name: str) -> list[str]:
    """Accelerate's public names of ``module_name`` (see the module docstring for the rule)."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        names = list(module.__all__)
    elif module_name in PACKAGES:
        names = [n for n, v in vars(module).items() if not isinstance(v, types.ModuleType) and not _is_third_party(v)]
    else:
        names = _definitions(module)
    return sorted({n for n in names if not n.startswith("_")})


def _excluded(module_name: str, name: str) -> bool:
    return ("*", name) in EXCLUDED or (module_name, name) in EXCLUDED


def _counterpart(module_name: str) -> types.ModuleType:
    return importlib.import_module("accel" + module_name[len("accelerate"):])


@pytest.mark.parametrize("module_name", MODULES)
def test_accel_has_every_public_name(module_name):
    names = public_names(module_name)
    assert names, f"no public names found in {module_name}: the discovery rule is broken"
    ours = _counterpart(module_name)
    missing = [n for n in names if not _excluded(module_name, n) and not hasattr(ours, n)]
    assert not missing, f"{ours.__name__} lacks {len(missing)} of {module_name}'s public names: {missing}"


def test_exclusions_are_still_needed():
    for (module_name, name), reason in EXCLUDED.items():
        assert reason.strip()
        if module_name == "*":
            continue
        assert name in public_names(module_name), f"{module_name}.{name} is no longer public in Accelerate: drop the exclusion"
        assert not hasattr(_counterpart(module_name), name), f"accel now has {module_name}.{name}: drop the exclusion"


def _plain(value: object) -> bool:
    if isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def test_constants_have_accelerates_values():
    theirs = importlib.import_module("accelerate.utils.constants")
    ours = importlib.import_module("accel.utils.constants")
    compared = []
    for name in public_names("accelerate.utils.constants"):
        value = getattr(theirs, name)
        if name.isupper() and _plain(value):
            assert getattr(ours, name) == value, f"{name}: accel has {getattr(ours, name)!r}, Accelerate {value!r}"
            compared.append(name)
    assert {"FSDP2_STATE_DICT_TYPE", "SAFE_WEIGHTS_NAME", "RNG_STATE_NAME", "FSDP_PYTORCH_VERSION"} <= set(compared)


def test_utils_constants_are_the_constants_module():
    import accel.utils as utils
    import accel.utils.constants as constants

    for name in ("SAFE_WEIGHTS_NAME", "RNG_STATE_NAME", "WEIGHTS_INDEX_NAME", "TORCH_LAUNCH_PARAMS"):
        assert getattr(utils, name) == getattr(constants, name)
    assert utils.SAFE_WEIGHTS_NAME == "model.safetensors" and utils.RNG_STATE_NAME == "random_states"


def test_enum_values_match():
    from accelerate.utils import SageMakerDistributedType as Theirs

    from accel.utils import SageMakerDistributedType
    from accel.utils.dataclasses import BaseEnum, EnumWithContains

    assert [m.value for m in SageMakerDistributedType] == [m.value for m in Theirs]

    class Colour(BaseEnum):
        RED = "red"

    assert isinstance(Colour, EnumWithContains) and "red" in Colour and "blue" not in Colour
    assert str(Colour.RED) == "red" and Colour.list() == ["red"]


# ---------------------------------------------------------------------------------------- behaviour of the added names
def test_megatron_plugin_reads_the_environment_and_builds_megatron_args(monkeypatch):
    from accel.utils import MegatronLMPlugin

    monkeypatch.setenv("ACCELERATE_MEGATRON_LM_TP_DEGREE", "2")
    monkeypatch.setenv("ACCELERATE_MEGATRON_LM_NUM_MICRO_BATCHES", "4")
    plugin = MegatronLMPlugin(pp_degree=2, consumed_samples=[5])
    args = plugin.megatron_lm_default_args
    assert (plugin.tp_degree, plugin.num_micro_batches, plugin.gradient_clipping) == (2, 4, 1.0)
    assert args["tensor_model_parallel_size"] == 2 and args["pipeline_model_parallel_size"] == 2
    assert plugin.DDP_impl == "local" and plugin.consumed_samples == [5, 0, 0]
    plugin.set_training_args(micro_batch_size=3, dp_degree=2)
    assert args["global_batch_size"] == 2 * 3 * 4
    plugin.set_optimizer_type(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.1, betas=(0.8, 0.9)))
    assert (args["optimizer"], args["adam_beta1"], args["lr"]) == ("adam", 0.8, 0.1)
    with pytest.raises(ValueError, match="Adam-family and SGD"):
        plugin.set_optimizer_type(torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))]))
    monkeypatch.setenv("ACCELERATE_MEGATRON_LM_PP_DEGREE", "two")
    with pytest.raises(ValueError, match="ACCELERATE_MEGATRON_LM_PP_DEGREE='two'"):
        MegatronLMPlugin()


def test_megatron_config_parsers_agree_with_accelerate():
    from accelerate.utils import MegatronLMPlugin as TheirPlugin

    from accel.utils import MegatronLMPlugin

    config = SimpleNamespace(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=100,
                             return_dict=True)
    model = SimpleNamespace(config=config)
    batch = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
    ours, theirs = MegatronLMPlugin(), TheirPlugin()
    ours.set_network_size_args(model, batch)
    theirs.set_network_size_args(model, batch)
    keys = ("seq_length", "num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings",
            "tokenizer_type", "model_type_name", "pretraining_flag", "orig_vocab_size")
    assert {k: ours.megatron_lm_default_args[k] for k in keys} == {k: theirs.megatron_lm_default_args[k] for k in keys}
    with pytest.raises(ValueError, match="no Megatron-LM config parser for model type 'resnet'"):
        ours.set_network_size_args(SimpleNamespace(config=SimpleNamespace(model_type="resnet")))


def test_megatron_train_steps_refuse_with_the_reason():
    from accel.utils import AbstractTrainStep, GPTTrainStep, MegatronLMDummyScheduler

    with pytest.raises(RuntimeError, match="GPTTrainStep drives Megatron-LM training, which cannot run here"):
        GPTTrainStep(None, SimpleNamespace())
    assert issubclass(GPTTrainStep, AbstractTrainStep)
    scheduler = MegatronLMDummyScheduler("opt", total_num_steps=100, warmup_num_steps=10)
    assert (scheduler.total_num_steps, scheduler.warmup_num_steps) == (100, 10)


def test_avg_losses_single_process():
    from accel.utils import avg_losses_across_data_parallel_group

    out = avg_losses_across_data_parallel_group([torch.tensor(1.5), torch.tensor([2.5])])
    assert out.tolist() == [1.5, 2.5]


def test_cpu_distributed_information(monkeypatch):
    from accel.utils import get_cpu_distributed_information

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    info = get_cpu_distributed_information()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 8, 1, 1)


def test_current_device_type_follows_the_registry(monkeypatch):
    from accel.backends import get_registry
    from accel.utils import get_current_device_type

    registry = get_registry()
    for backend in registry.probe_order():
        if backend.device_type != "cpu":
            monkeypatch.setattr(type(backend), "is_available", lambda self: False)
    assert get_current_device_type() == ("cuda", "MULTI_GPU")  # Accelerate's answer without an accelerator
    hpu = registry.get("hpu")
    monkeypatch.setattr(type(hpu), "is_available", lambda self: True)
    assert get_current_device_type() == ("hpu", "MULTI_HPU")


def test_nvidia_smi_helpers_without_a_driver(monkeypatch):
    from accel.utils import check_cuda_p2p_ib_support, get_gpu_info

    monkeypatch.setenv("PATH", "")
    with pytest.raises(FileNotFoundError, match="nvidia-smi is not on PATH"):
        get_gpu_info()
    assert check_cuda_p2p_ib_support() is True


def test_set_numa_affinity_pins_to_one_node(tmp_path):
    script = (
        "import os\nfrom accel.utils import set_numa_affinity\nfrom accel.utils.environment import _numa_nodes\n"
        "set_numa_affinity(0)\nassert sorted(os.sched_getaffinity(0)) == sorted(_numa_nodes()[0])\n"
        "set_numa_affinity(0)\nprint('pinned')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert out.returncode == 0 and "pinned" in out.stdout, out.stderr
    from accel.utils import set_numa_affinity

    with pytest.raises(ValueError, match="local_process_index must be >= 0"):
        set_numa_affinity.__wrapped__(-1)


def test_decorators_refuse_with_the_reason(monkeypatch):
    import accel.utils.imports as imports
    from accel import Accelerator
    from accel.utils import deepspeed_required, torchao_required

    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)

    @torchao_required
    def needs_ao():
        return 1

    with pytest.raises(ImportError, match="needs torchao >= 0.6.1"):
        needs_ao()

    @deepspeed_required
    def needs_ds():
        return 2

    assert needs_ds() == 2  # no state yet: nothing to contradict
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match="needs DeepSpeed, but the Accelerator is configured for NO"):
        needs_ds()


def test_rocm_and_gaudi_probes_here():
    from accel.utils import is_cuda_available, is_habana_gaudi1, is_rocm_available

    assert is_rocm_available() is (getattr(torch.version, "hip", None) is not None and is_cuda_available())
    assert is_habana_gaudi1() is False


def test_grad_scaler_and_autocast_context():
    from accel import Accelerator
    from accel.utils import AutocastKwargs, get_grad_scaler, get_mixed_precision_context_manager

    scaler = get_grad_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0
    Accelerator(cpu=True, mixed_precision="bf16")
    with get_mixed_precision_context_manager(native_amp=True):
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    with get_mixed_precision_context_manager(native_amp=True, autocast_kwargs=AutocastKwargs(enabled=False)):
        assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.float32
    with get_mixed_precision_context_manager(native_amp=False):
        assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.float32


def test_gathered_parameters_and_shape_exchange_single_process():
    from accel import Accelerator
    from accel.utils import GatheredParameters
    from accel.utils.operations import TENSOR_INT_TO_DTYPE, gather_tensor_shape

    Accelerator(cpu=True)
    layer = torch.nn.Linear(3, 5)
    with GatheredParameters(list(layer.parameters()), modifier_rank=0):
        layer.weight.data.fill_(1.0)
    assert float(layer.weight.detach().sum()) == 15.0
    shape, code = gather_tensor_shape(torch.zeros(2, 7, dtype=torch.bfloat16))
    assert shape.tolist() == [2, 7] and TENSOR_INT_TO_DTYPE[code] == torch.bfloat16
    with pytest.raises(TypeError, match="cannot send dtype"):
        gather_tensor_shape(torch.zeros(2, dtype=torch.complex64))


def test_children_bottom_up_matches_accelerate():
    from accelerate.utils import get_module_children_bottom_up as theirs

    from accel.utils import get_module_children_bottom_up

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2)))
    assert get_module_children_bottom_up(model) == theirs(model)
    assert get_module_children_bottom_up(model, return_fqns=True) == theirs(model, return_fqns=True)
    assert get_module_children_bottom_up(model)[-1] is model


def test_ensure_weights_retied_keeps_ties():
    from accel.utils import ensure_weights_retied

    class Tied(torch.nn.Module):
        _tied_weights_keys = ["head.weight"]

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(4, 4)
            self.head = torch.nn.Linear(4, 4, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()

    def reinit(module):
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.zeros_like(param)))
        return module

    assert ensure_weights_retied(reinit, torch.nn.Linear(1, 1), torch.device("cpu")) is reinit
    init = ensure_weights_retied(reinit, model, torch.device("cpu"))
    init(model.embed)
    init(model.head)
    assert model.head.weight is model.embed.weight


def test_regional_compile_in_place_keeps_the_module():
    from accel.utils import compile_regions_fsdp2

    model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    assert compile_regions_fsdp2(model) is model
    assert all(block._compiled_call_impl is not None for block in model[0])


def test_transformer_engine_helpers_name_the_missing_package(monkeypatch):
    import accel.utils.imports as imports
    from accel.utils import apply_fp8_autowrap, contextual_fp8_autocast, convert_model

    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    for call in (lambda: convert_model(torch.nn.Linear(16, 16)), lambda: contextual_fp8_autocast(print, None),
                 lambda: apply_fp8_autowrap(torch.nn.Linear(16, 16), None)):
        with pytest.raises(ImportError, match="needs transformer_engine"):
            call()


def test_tqdm_and_install_xla():
    from accel.utils import install_xla, tqdm

    assert list(tqdm(range(3))) == [0, 1, 2]
    with pytest.raises(ValueError, match="main_process_only=True/False by keyword"):
        tqdm(True, range(3))
    with pytest.raises(RuntimeError, match="only works inside a Google Colab notebook"):
        install_xla()


def test_custom_state_round_trip_in_accelerates_file(tmp_path):
    from accelerate.checkpointing import load_custom_state as their_load

    from accel.checkpointing import load_custom_state, save_custom_state
    from accel.state import PartialState

    PartialState(cpu=True)
    source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    save_custom_state(source, tmp_path, index=3)
    assert (tmp_path / "custom_checkpoint_3.pkl").is_file()
    load_custom_state(target, tmp_path, index=3)
    assert torch.equal(target.weight, source.weight)
    other = torch.nn.Linear(2, 2)
    from accelerate.state import PartialState as TheirState

    TheirState(cpu=True)  # Accelerate's logging needs its state
    try:
        their_load(other, str(tmp_path), index=3)  # Accelerate reads the same file
    finally:
        TheirState._reset_state()
    assert torch.equal(other.weight, source.weight)
    with pytest.raises(FileNotFoundError, match="no custom checkpoint custom_checkpoint_4.pkl"):
        load_custom_state(target, tmp_path, index=4)
    with pytest.raises(TypeError, match="has no state_dict"):
        save_custom_state(object(), tmp_path)


def test_small_state_and_optimizer_helpers():
    from accel.optimizer import move_to_device, patch_optimizer_step
    from accel.state import ThreadLocalSharedDict, do_nothing

    assert do_nothing(1, key=2) is None
    moved = move_to_device({"a": [torch.ones(1)], "b": 3}, "cpu")
    assert moved["b"] == 3 and moved["a"][0].device.type == "cpu"
    holder = SimpleNamespace()
    step = patch_optimizer_step(holder, lambda: "stepped")
    assert step() == "stepped" and holder._accelerate_step_called is True

    class Shared:
        state = ThreadLocalSharedDict()

    Shared().state["x"] = 1
    assert Shared.state == {"x": 1}


def _pipeline_rank():
    from accel.inference import prepare_pippy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    inputs = torch.randn(4, 8)
    expected = model(inputs)
    prepare_pippy(model, example_args=(inputs[:2],), gather_output=True)
    with torch.no_grad():
        out = model(inputs)
    return model.hf_split_points, float((out - expected).abs().max())


def test_prepare_pippy_runs_two_stages_on_gloo():
    from dist_utils import run_distributed

    results = run_distributed(_pipeline_rank, 2)
    for points, error in results:
        assert points == ["3"] and error < 1e-5


def test_prepare_pippy_needs_a_process_group():
    from accel import prepare_pippy
    from accel.state import PartialState

    PartialState(cpu=True)
    with pytest.raises(RuntimeError, match="needs a process group"):
        prepare_pippy(torch.nn.Linear(2, 2), example_args=(torch.ones(1, 2),))


# ---------------------------------------------------------------------------------------- behaviours that follow Accelerate
_PRECISION_PROBE = r"""
import json, sys, warnings
from unittest.mock import Mock
lib = sys.argv[1]
if lib == "accel":
    from accel import Accelerator
    from accel.utils import DistributedType
else:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
out = {}
Accelerator(cpu=True, mixed_precision="fp16")
try:
    out["implicit"] = Accelerator(cpu=True).state.mixed_precision
except ValueError as exc:
    out["implicit"] = "ValueError"
for value in ("fp16", "bf16"):
    try:
        Accelerator(cpu=True, mixed_precision=value)
        out[value] = "ok"
    except ValueError as exc:
        out[value] = "ValueError" if "mixed_precision" in str(exc) else str(exc)
accelerator = Accelerator(cpu=True)
accelerator.state.distributed_type = DistributedType.FSDP
joinable = Mock()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with accelerator.join_uneven_inputs([joinable]):
        out["block_ran"] = True
out["join_warned"] = any(issubclass(w.category, UserWarning) and "only supported" in str(w.message) for w in caught)
out["joinable_untouched"] = not joinable.method_calls
print("RESULT" + json.dumps(out))
"""


def _probe(lib: str) -> dict:
    # a single plain process: no launcher's variables (another test in this worker may have left some)
    launcher = ("ACCEL_", "ACCELERATE_", "PMI_", "OMPI_", "MV2_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher)
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}
    done = subprocess.run([sys.executable, "-c", _PRECISION_PROBE, lib], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    import json

    return json.loads(line[len("RESULT"):])


def test_precision_and_join_follow_accelerate():
    ours, theirs = _probe("accel"), _probe("accelerate")
    assert ours == theirs
    assert ours == {"implicit": "fp16", "fp16": "ok", "bf16": "ValueError", "block_ran": True, "join_warned": True,
                    "joinable_untouched": True}


def _join_rank():
    import warnings
    from unittest.mock import Mock

    from torch.utils.data import DataLoader

    from accel import Accelerator
    from accel.utils import DataLoaderConfiguration, DistributedType

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    assert accelerator.distributed_type == DistributedType.MULTI_CPU
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    # 3 samples over 2 ranks: rank 0 gets 2 batches, rank 1 one; without Join rank 0 would hang in backward
    loader = accelerator.prepare(DataLoader(torch.arange(3.0).view(-1, 1), batch_size=1))
    batches = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # joining under MULTI_CPU must not warn
        with accelerator.join_uneven_inputs([model]):
            for batch in loader:
                model(batch).sum().backward()
                batches += 1
    accelerator.state.distributed_type = DistributedType.FSDP  # code and tests set it; judged when called
    joinable = Mock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([joinable]):
            pass
    accelerator.state.distributed_type = DistributedType.MULTI_CPU
    return batches, [str(w.message) for w in caught], joinable.method_calls


def test_join_uneven_inputs_reads_the_distributed_type_when_called():
    from dist_utils import run_distributed

    results = run_distributed(_join_rank, 2)
    assert sorted(batches for batches, _, _ in results) == [1, 2]
    for _, messages, calls in results:
        assert ("Joining uneven inputs is only supported for multi-GPU training, as a result `join_uneven_inputs` "
                "will have no effect." in messages)  # Accelerate's words, which its tests match
        assert calls == []

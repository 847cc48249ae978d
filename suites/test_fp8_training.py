"""fp8 training (torchao ``Float8Linear``) on the backend under test: DDP at 1 and 2 ranks, FSDP2, FSDP1 and
DeepSpeed (ZeRO-2 and ZeRO-3) at 2 ranks; and a torchao recipe passed beside another ``mixed_precision``
under FSDP2 and DeepSpeed, which converts the model as in Accelerate.

``Accelerator(mixed_precision="fp8")`` converts the model's ``nn.Linear`` layers the way Accelerate 1.15
does (``accel.utils.ao``): the first and the last linear layer, and any layer whose in/out sizes are not
multiples of 16, stay in high precision; the rest become ``Float8Linear``. Under FSDP2 the conversion
happens before ``fully_shard``; with torchao's ``enable_fsdp_float8_all_gather`` (Accelerate's default) each
shard is cast to float8 before the all-gather and the first optimizer recomputes the weights' fp8 scales after
every step in one all-reduce (``precompute_float8_dynamic_scale_for_fsdp``), as Accelerate registers it.
Under DeepSpeed the engine runs bf16 and the conversion happens before ``deepspeed.initialize``; under FSDP1 and
DeepSpeed the float8 all-gather (FSDP2's) is off.

Two modes per test: ``emulated`` forces torchao's emulation (``Float8LinearConfig(emulate=True)``: fp8
casts with high-precision matmuls), which runs on any backend and is labelled "fp8 (emulated)"; ``planned``
leaves the choice to accel, which uses real fp8 GEMMs where ``torch._scaled_mm`` runs on the device.

Tolerance. Each run trains :func:`_mlp` for ``STEPS`` AdamW steps on a fixed regression task, once in fp32 and
once in fp8, at the same world size and strategy, from the same weights and data (the fp32 run once per rank
process, world size and strategy: the tests that compare with it share it). float8 e4m3 keeps 3
mantissa bits (relative rounding up to 2**-4 per element, with per-tensor scales), and the layers left in
high precision run under bf16 autocast (8 bits), so the fp8 loss curve is a noisy copy of the fp32 one.
On the host (torch 2.13, torchao 0.18; ``pytest suites/test_fp8_training.py -m cpu``) the mean of the last
``TAIL`` global losses stayed within 1 % of fp32's under DDP, 2 % under DeepSpeed and FSDP1 and 4 % under FSDP2
(with the float8 all-gather), and no step was more than 6 % (DDP, DeepSpeed, FSDP1) or 12 % (FSDP2) off.
The bounds below (``TAIL_TOLERANCE`` 10 %, ``STEP_TOLERANCE`` 25 %) leave room for devices whose fp8 kernels
round differently, while an
optimizer that kept stepping the pre-conversion parameters (the model never learns: its loss stays near the
first one, 2-3x the fp32 tail), a missing gradient sync or fp8 scales that differ across ranks fall far outside
them; the runs must also have learned (tail below 60 % of the first loss) and must differ from fp32 (a run that
silently stayed in fp32 would match it exactly).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from _training_utils import fresh_state
from accel import Accelerator
from accel.facts import versions

pytestmark = pytest.mark.require_package(f"torchao>={versions.TORCHAO_FP8}")

STEPS = 48
TAIL = 10
SAMPLES = 256
GLOBAL_BATCH = 32
TAIL_TOLERANCE = 0.10
STEP_TOLERANCE = 0.25
MODES = [pytest.param(True, id="emulated"), pytest.param(False, id="planned")]

#: the MLP's linear layers by name: which ones Accelerate's filter converts, and why the others stay
CONVERTED = ["2", "4"]
KEPT = {"0": "first linear layer", "6": "40 output features (not a multiple of 16)", "8": "last linear layer"}


def _mlp() -> torch.nn.Module:
    """Five linear layers: two that fp8 converts, the first and last kept, one kept for its size."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40), torch.nn.ReLU(), torch.nn.Linear(40, 1))


def _data() -> TensorDataset:
    """``SAMPLES`` points of a smooth 32 -> 1 regression, the same numbers on every backend."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 32, generator=g)
    y = torch.sin(2 * x @ (torch.randn(32, 1, generator=g) / 32 ** 0.5))
    return TensorDataset(x, y)


def _fit(accelerator: Accelerator, model, optimizer, loader) -> list[float]:
    """``STEPS`` AdamW steps over as many epochs as that takes; the per-step global (rank-mean) losses."""
    losses: list[float] = []
    dtype = next(accelerator.unwrap_model(model).parameters()).dtype  # DeepSpeed's bf16 engine takes bf16 inputs
    while len(losses) < STEPS:
        for x, y in loader:
            loss = F.mse_loss(model(x.to(dtype)).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
            if len(losses) == STEPS:
                break
    return losses


def _recipe(emulated: bool):
    """``AORecipeKwargs`` with Accelerate's defaults (pad_inner_dim, float8 all-gather); emulation forced or not."""
    from torchao.float8 import Float8LinearConfig

    from accel.utils import AORecipeKwargs

    if not emulated:
        return AORecipeKwargs()
    return AORecipeKwargs(config=Float8LinearConfig(emulate=True, pad_inner_dim=True, enable_fsdp_float8_all_gather=True))


def _fsdp2(version: int = 2):
    from accel.utils import FullyShardedDataParallelPlugin

    # each Float8Linear its own FSDP unit (4096 parameters and more), the rest in the root unit
    return FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="size_based_wrap", min_num_params=4000)


def _train(mixed_precision: str, fsdp: bool | int = False, emulated: bool = False, zero_stage: int | None = None,
           recipe: bool = False):
    """AdamW, ``GLOBAL_BATCH`` samples per step over all ranks (``fsdp``: True or the FSDP version; ``recipe``: pass
    the torchao recipe whatever ``mixed_precision`` is); returns (accelerator, model, per-step global losses)."""
    fresh_state()
    kwargs = {"fsdp_plugin": _fsdp2(2 if fsdp is True else fsdp)} if fsdp else {}
    if zero_stage is not None:
        from accel.utils import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=zero_stage, gradient_clipping=1.0)
    if mixed_precision == "fp8" or recipe:
        kwargs["kwargs_handlers"] = [_recipe(emulated)]
    accelerator = Accelerator(mixed_precision=mixed_precision, **kwargs)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)  # built before prepare, as users do
    loader = DataLoader(_data(), batch_size=GLOBAL_BATCH // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, _fit(accelerator, model, optimizer, loader)


#: fp32 reference losses per (world size, FSDP version, ZeRO stage), kept for the rank's life: tests that compare
#: with the same reference share one run of it (a deterministic function of the key)
_REFERENCES: dict[tuple[int, int, int | None], list[float]] = {}


def _reference(world_size: int, fsdp: bool | int = False, zero_stage: int | None = None) -> list[float]:
    """The fp32 run's per-step global losses for this world size and strategy (see ``_train``)."""
    key = (world_size, 2 if fsdp is True else int(fsdp), zero_stage)
    if key not in _REFERENCES:
        _REFERENCES[key] = _train("no", fsdp=fsdp, zero_stage=zero_stage)[2]
    return list(_REFERENCES[key])


def _assert_tracks(losses: list[float], reference: list[float], what: str) -> None:
    assert len(losses) == len(reference) == STEPS, (len(losses), len(reference))
    assert losses != reference, f"{what}: the fp8 losses equal fp32's exactly; nothing ran in fp8"
    tail, reference_tail = sum(losses[-TAIL:]) / TAIL, sum(reference[-TAIL:]) / TAIL
    assert abs(tail - reference_tail) <= TAIL_TOLERANCE * reference_tail, \
        f"{what}: mean of the last {TAIL} losses {tail:.4f} vs fp32 {reference_tail:.4f}"
    worst = max(abs(a - b) / b for a, b in zip(losses, reference))
    assert worst <= STEP_TOLERANCE, f"{what}: a step's loss is {worst:.1%} away from fp32's"
    assert tail < 0.6 * losses[0], f"{what}: did not learn ({losses[0]:.4f} -> {tail:.4f})"


def _assert_layer_choice(model: torch.nn.Module) -> None:
    from torchao.float8.float8_linear import Float8Linear

    def plain(name: str) -> str:  # FSDP1's inner units keep their wrapper in the name
        return name.replace("._fsdp_wrapped_module", "")

    linears = {plain(name): type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    converted = sorted(plain(name) for name, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == CONVERTED, f"Float8Linear layers {converted}, expected {CONVERTED} ({linears})"
    for name, why in KEPT.items():
        assert linears[name] == "Linear", f"layer {name} ({why}) must stay in high precision, is {linears[name]}"


def _label(accelerator: Accelerator, emulated: bool) -> None:
    label = accelerator.precision.label
    assert accelerator.mixed_precision == "fp8"
    if emulated:
        assert label == "fp8 (emulated)" and accelerator.precision.fp8.config.emulate
    else:
        assert label == ("fp8 (emulated)" if accelerator.precision.fp8.emulated else "fp8"), label
    assert f"Mixed precision type: {label}\n" in repr(accelerator.state)


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("emulated", MODES)
def test_fp8_ddp_tracks_fp32(device, world_size, rank, emulated):
    reference = _reference(world_size)
    accelerator, model, losses = _train("fp8", fsdp=False, emulated=emulated)
    _label(accelerator, emulated)
    _assert_layer_choice(accelerator.unwrap_model(model))
    _assert_tracks(losses, reference, f"fp8 at {world_size} rank(s)")
    if world_size > 1:  # the gradient all-reduce kept the replicas identical
        from accel.utils import gather

        flat = torch.cat([p.detach().float().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
        replicas = gather(flat[None]).cpu()
        assert torch.equal(replicas[0], replicas[1]), "the DDP replicas' weights diverged"


@pytest.mark.world_size(2)
@pytest.mark.require_fsdp2
@pytest.mark.parametrize("emulated", MODES)
def test_fp8_fsdp2_tracks_fp32_with_float8_all_gather(device, world_size, rank, emulated):
    from torch.distributed.tensor import DTensor
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    gathered_dtypes: list[torch.dtype] = []
    original = WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather

    def spy(self, mesh):  # FSDP2 checks this hook's signature: it must stay (self, mesh)
        result = original(self, mesh)
        gathered_dtypes.append(result[0][0].dtype)
        return result

    reference = _reference(world_size, fsdp=True)
    WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = spy
    try:
        accelerator, model, losses = _train("fp8", fsdp=True, emulated=emulated)
    finally:
        WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = original
    assert accelerator.distributed_type == "FSDP" and accelerator.is_fsdp2
    _label(accelerator, emulated)
    _assert_layer_choice(model)
    for name in CONVERTED:  # sharded, and wrapped for the fp8 all-gather
        weight = model.get_submodule(name).weight
        assert isinstance(weight, DTensor) and isinstance(weight._local_tensor, WeightWithDynamicFloat8CastTensor), name
        assert weight.to_local().numel() < weight.numel(), f"layer {name} is not sharded"
    # every forward and backward gathered each converted weight in float8
    assert gathered_dtypes and set(gathered_dtypes) == {torch.float8_e4m3fn}, set(gathered_dtypes)
    assert len(gathered_dtypes) >= 2 * len(CONVERTED) * STEPS, len(gathered_dtypes)
    # the post-step hook left every rank the same precomputed scales
    from accel.utils import gather

    scales = torch.stack([model.get_submodule(n).weight._local_tensor._precomputed_scale.float() for n in CONVERTED])
    every_rank = gather(scales[None].to(accelerator.device)).cpu()
    assert torch.equal(every_rank[0], every_rank[1]), every_rank
    _assert_tracks(losses, reference, "fp8 under FSDP2")


@pytest.mark.world_size(2)
@pytest.mark.require_fsdp2
def test_fp8_fsdp2_without_float8_all_gather(device, world_size, rank):
    """``enable_fsdp_float8_all_gather=False``: plain sharded weights, no scale hook, still tracks fp32."""
    from torch.distributed.tensor import DTensor
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from accel.utils import AORecipeKwargs

    reference = _reference(world_size, fsdp=True)
    fresh_state()
    recipe = AORecipeKwargs(config=Float8LinearConfig(emulate=True, pad_inner_dim=True, enable_fsdp_float8_all_gather=False))
    accelerator = Accelerator(mixed_precision="fp8", fsdp_plugin=_fsdp2(), kwargs_handlers=[recipe])
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loader = DataLoader(_data(), batch_size=GLOBAL_BATCH // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    _assert_layer_choice(model)
    weight = model.get_submodule(CONVERTED[0]).weight
    assert isinstance(weight, DTensor) and not isinstance(weight._local_tensor, WeightWithDynamicFloat8CastTensor)
    assert not optimizer.optimizer._optimizer_step_post_hooks, "no scale precompute without the float8 all-gather"
    losses = _fit(accelerator, model, optimizer, loader)
    _assert_tracks(losses, reference, "fp8 under FSDP2 without float8 all-gather")



@pytest.mark.world_size(2)
@pytest.mark.require_fsdp2
def test_fp8_fsdp1_tracks_fp32(device, world_size, rank):
    """FSDP1 wraps the converted model too; torchao's float8 all-gather is FSDP2's, so it is off here (its weight
    wrapper cannot be moved by FSDP1's ``module.to``)."""
    reference = _reference(world_size, fsdp=1)
    accelerator, model, losses = _train("fp8", fsdp=1, emulated=True)
    assert accelerator.distributed_type == "FSDP" and not accelerator.is_fsdp2
    _label(accelerator, emulated=True)
    assert not accelerator.precision.fp8.config.enable_fsdp_float8_all_gather
    _assert_layer_choice(accelerator.unwrap_model(model))
    _assert_tracks(losses, reference, "fp8 under FSDP1")


@pytest.mark.world_size(2)
@pytest.mark.require_deepspeed
@pytest.mark.parametrize("zero_stage", [pytest.param(2, id="zero2"), pytest.param(3, id="zero3")])
def test_fp8_deepspeed_tracks_fp32(device, world_size, rank, zero_stage):
    """As in Accelerate: DeepSpeed runs bf16 and the model gets its Float8Linear layers before the engine is built.

    The FSDP2-only float8 all-gather is turned off under DeepSpeed (its weight wrapper cannot be moved by
    DeepSpeed's ``module.to``), so the default recipe trains here.
    """
    reference = _reference(world_size, zero_stage=zero_stage)
    accelerator, model, losses = _train("fp8", emulated=True, zero_stage=zero_stage)
    assert accelerator.distributed_type == "DEEPSPEED" and model.zero_optimization_stage() == zero_stage
    _label(accelerator, emulated=True)
    assert accelerator.state.deepspeed_plugin.deepspeed_config["bf16"]["enabled"] is True
    assert not accelerator.precision.fp8.config.enable_fsdp_float8_all_gather
    inner = accelerator.unwrap_model(model)
    _assert_layer_choice(inner)
    assert {p.dtype for p in inner.parameters()} == {torch.bfloat16}
    _assert_tracks(losses, reference, f"fp8 under DeepSpeed ZeRO-{zero_stage}")
    accelerator.free_memory()


@pytest.mark.world_size(2)
@pytest.mark.require_fsdp2
def test_a_torchao_recipe_beside_bf16_converts_the_model_under_fsdp2(device, world_size, rank):
    """Under FSDP Accelerate converts the model whenever a torchao recipe is passed, whatever ``mixed_precision``
    is; the other layers keep bf16."""
    reference = _reference(world_size, fsdp=True)
    accelerator, model, losses = _train("bf16", fsdp=True, emulated=True, recipe=True)
    assert accelerator.mixed_precision == "bf16" and accelerator.is_fsdp2
    assert accelerator.precision.label == "bf16 + fp8 (emulated) layers"
    assert f"Mixed precision type: {accelerator.precision.label}\n" in repr(accelerator.state)
    _assert_layer_choice(accelerator.unwrap_model(model))
    _assert_tracks(losses, reference, "bf16 with the recipe's fp8 layers under FSDP2")


@pytest.mark.world_size(2)
@pytest.mark.require_deepspeed
def test_a_torchao_recipe_beside_full_precision_converts_the_model_under_deepspeed(device, world_size, rank):
    """The same under DeepSpeed: the engine keeps fp32 and the model gets its Float8Linear layers before it is
    built (the FSDP2-only float8 all-gather off)."""
    reference = _reference(world_size, zero_stage=2)
    accelerator, model, losses = _train("no", zero_stage=2, emulated=True, recipe=True)
    assert accelerator.distributed_type == "DEEPSPEED" and accelerator.mixed_precision == "no"
    assert accelerator.precision.label == "no + fp8 (emulated) layers"
    assert not accelerator.state.deepspeed_plugin.deepspeed_config.get("bf16", {}).get("enabled", False)
    assert not accelerator.precision.fp8.config.enable_fsdp_float8_all_gather
    inner = accelerator.unwrap_model(model)
    _assert_layer_choice(inner)
    assert {p.dtype for p in inner.parameters()} == {torch.float32}
    _assert_tracks(losses, reference, "fp32 with the recipe's fp8 layers under DeepSpeed ZeRO-2")
    accelerator.free_memory()

"""The requirement table: what each Accelerate-style test decorator (``require_cuda``, ``slow``, ...) needs.

One row per decorator, written in the harness's marker vocabulary (``require_backend("cuda")``,
``require_devices(2, of=("cuda",))``, ...). Both decorator sets are generated from it:
``accel.test_utils.testing`` evaluates a row against the active backend when a test is decorated,
``accel_harness.markers`` turns the same row into pytest marks evaluated per test instance. "The
backend" is the one the test runs on: the active backend under ``accel.test_utils``, the instance's
backend under the harness.

Markers a row may use (each skip carries the reason code in brackets):

* ``require_backend(*names)`` runs only on these backends [not-on-backend];
  ``require_non_<name>`` never on that one [not-on-backend].
* ``require_devices(n, exact=False, of=())``: at least ``n`` devices (exactly ``n`` with ``exact``)
  on the backend; with ``of`` the backend must also be one of those [needs-devices].
* ``require_fp16`` / ``require_bf16`` / ``require_fp8(training=False)``: the backend computes in that dtype;
  ``training=True`` also asks that accel can train in fp8 here (a library for it) [unsupported-dtype].
* ``require_torch(spec)`` [torch-version]; ``require_fsdp2``: torch >= the FSDP2 floor [torch-version]
  and a collective backend [needs-multiprocess].
* ``require_package(*requirements, any_of=False)`` (``"name"``, a dotted module, or ``"name>=1.2"``)
  [needs-package]; ``require_no_package(name)``: the package must be absent [known-limitation];
  ``require_deepspeed``: DeepSpeed installed, with an accelerator for the backend [needs-package,
  not-on-backend].
* ``require_opt_in(VARIABLE)``: runs only when the yes/no variable is true [opt-in];
  ``slow`` marks a slow test (it skips nothing by itself).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from typing import Any, Mapping, NamedTuple

from . import versions
from .reasons import (
    KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_PACKAGE, NOT_ON_BACKEND, OPT_IN, TORCH_VERSION, UNSUPPORTED_DTYPE,
)

__all__ = ["MARKER_CODES", "NOT_IN_TABLE", "REQUIREMENT_TABLE", "Need", "Row", "marker_code", "module_found", "package_problem"]


class Need(NamedTuple):
    """One condition: the harness marker ``marker`` called with ``args`` and ``kwargs``."""

    marker: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}


class Row(NamedTuple):
    """One decorator: its name, its conditions (all must hold) and Accelerate's skip message."""

    name: str
    needs: tuple[Need, ...]
    message: str


def _backend(name: str, *more: str) -> Need:
    return Need("require_backend", (name, *more))


def _package(*requirements: str, any_of: bool = False) -> Need:
    return Need("require_package", requirements, {"any_of": True} if any_of else {})


def _devices(n: int, exact: bool = False, of: tuple[str, ...] = ()) -> Need:
    kwargs: dict[str, Any] = {}
    if exact:
        kwargs["exact"] = True
    if of:
        kwargs["of"] = of
    return Need("require_devices", (n,), kwargs)


_TRACKERS = ("wandb", "tensorboard", "trackio", "swanlab")

_ROWS: tuple[Row, ...] = (
    # which backend the test runs on
    Row("require_cpu", (_backend("cpu"),), "test requires only a CPU"),
    Row("require_non_cpu", (Need("require_non_cpu"),), "test requires a hardware accelerator"),
    *(Row(f"require_{name}", (_backend(name),), f"test requires a {name} device")
      for name in ("cuda", "xpu", "mps", "hpu", "npu", "mlu", "musa", "sdaa", "neuron")),
    Row("require_tpu", (_backend("xla"),), "test requires a TPU (the xla backend)"),
    Row("require_cuda_or_xpu", (_backend("cuda", "xpu"),), "test requires a cuda or xpu device"),
    Row("require_cuda_or_hpu", (_backend("cuda", "hpu"),), "test requires a cuda or hpu device"),
    *(Row(f"require_non_{name}", (Need(f"require_non_{name}"),), f"test does not run on {name}")
      for name in ("cuda", "xpu", "mps", "hpu")),
    Row("require_non_torch_xla", (Need("require_no_package", ("torch_xla",)),),
        "test requires an environment without torch_xla"),
    # how many devices
    Row("require_single_device", (Need("require_non_cpu"), _devices(1, exact=True)),
        "test requires a single accelerator device"),
    Row("require_multi_device", (_devices(2),), "test requires several devices"),
    Row("require_single_gpu", (_devices(1, exact=True, of=("cuda",)),), "test requires exactly one cuda device"),
    Row("require_single_xpu", (_devices(1, exact=True, of=("xpu",)),), "test requires exactly one xpu device"),
    Row("require_multi_gpu", (_devices(2, of=("cuda",)),), "test requires several cuda devices"),
    Row("require_multi_xpu", (_devices(2, of=("xpu",)),), "test requires several xpu devices"),
    Row("require_multi_gpu_or_xpu", (_devices(2, of=("cuda", "xpu")),), "test requires several cuda or xpu devices"),
    # dtypes
    Row("require_fp16", (Need("require_fp16"),), "test requires fp16 support"),
    Row("require_bf16", (Need("require_bf16"),), "test requires bf16 support"),
    Row("require_fp8", (Need("require_fp8", (), {"training": True}),), "test requires fp8 training support"),
    # torch and parallelism
    Row("require_fsdp2", (Need("require_fsdp2"),), f"test requires FSDP2 (torch >= {versions.TORCH_FSDP2})"),
    Row("require_tp", (Need("require_torch", (f">={versions.TORCH_TP}",)),
                       _package(f"transformers>={versions.TRANSFORMERS_TP}")),
        f"test requires torch version >= {versions.TORCH_TP} and transformers version >= {versions.TRANSFORMERS_TP}"),
    Row("require_pippy", (Need("require_torch", (f">={versions.TORCH_PIPELINING}",)),
                          _package("torch.distributed.pipelining")),
        "test requires pipeline parallelism (torch.distributed.pipelining)"),
    Row("require_deepspeed", (Need("require_deepspeed"),), "test requires DeepSpeed"),
    # packages
    Row("require_tensorboard", (_package("tensorboard", "tensorboardX", any_of=True),), "test requires tensorboard"),
    *(Row(f"require_{package}", (_package(package),), f"test requires {package}")
      for package in ("wandb", "comet_ml", "mlflow", "aim", "clearml", "dvclive", "swanlab", "trackio", "pandas",
                      "matplotlib", "torchvision", "timm", "transformers", "datasets", "triton", "schedulefree",
                      "transformer_engine", "safetensors", "import_timer")),
    Row("require_peft", (_package("peft"),), "test requires PEFT"),
    Row("require_bnb", (_package("bitsandbytes"),), "test requires bitsandbytes"),
    Row("require_torchao", (_package(f"torchao>={versions.TORCHAO_FP8}"),), "test requires torchao"),
    Row("require_torchdata_stateful_dataloader", (_package(f"torchdata>={versions.TORCHDATA_STATEFUL}"),),
        "test requires torchdata.stateful_dataloader"),
    Row("require_huggingface_suite", (_package("transformers", "datasets"),),
        "test requires the Hugging Face suite (transformers and datasets)"),
    Row("require_transformer_engine_mxfp8", (_package(f"transformer_engine>={versions.TRANSFORMER_ENGINE_MXFP8}"),),
        "test requires transformers engine MXFP8 block scaling"),
    Row("require_trackers", (_package(*_TRACKERS, any_of=True), Need("require_no_package", ("comet_ml",))),
        "test requires at least one tracker to be available and for `comet_ml` to not be installed"),
    # opt-in
    Row("slow", (Need("slow"), Need("require_opt_in", ("RUN_SLOW",))), "test is slow"),
)

#: decorator name -> row; the one place each Accelerate-style decorator's condition lives
REQUIREMENT_TABLE: dict[str, Row] = {row.name: row for row in _ROWS}

#: Accelerate decorators that are no row, and why
NOT_IN_TABLE: dict[str, str] = {
    "require_torch_min_version": "takes version=; both sets build require_torch('>=<version>') from it",
    "skip": "unconditional: unittest.skip / pytest.mark.skip",
}


#: marker -> the reason code its skips carry (``require_fsdp2`` and ``require_deepspeed`` name a second code
#: for their second condition: needs-multiprocess and not-on-backend)
MARKER_CODES: dict[str, str] = {
    "require_backend": NOT_ON_BACKEND,
    "require_non_": NOT_ON_BACKEND,
    "require_devices": NEEDS_DEVICES,
    "require_multi_device": NEEDS_DEVICES,
    "require_fp16": UNSUPPORTED_DTYPE,
    "require_bf16": UNSUPPORTED_DTYPE,
    "require_fp8": UNSUPPORTED_DTYPE,
    "require_torch": TORCH_VERSION,
    "require_fsdp2": TORCH_VERSION,
    "require_package": NEEDS_PACKAGE,
    "require_no_package": KNOWN_LIMITATION,
    "require_deepspeed": NEEDS_PACKAGE,
    "require_opt_in": OPT_IN,
    "known_limitation": KNOWN_LIMITATION,
    "slow": OPT_IN,
}


def marker_code(marker: str) -> str:
    """The reason code of ``marker``'s skips (``require_non_<name>`` included); KeyError for an unknown marker."""
    key = "require_non_" if marker.startswith("require_non_") else marker
    try:
        return MARKER_CODES[key]
    except KeyError:
        raise KeyError(f"no reason code for the marker {marker!r}; known: {', '.join(MARKER_CODES)}") from None


# ------------------------------------------------------------------------------- package probes (both sets)
def module_found(name: str) -> bool:
    """Whether module ``name`` can be imported, found without importing it or its parent packages."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec is not None


def package_problem(requirement: str) -> str | None:
    """Why ``requirement`` (a module name, or ``"dist>=1.2"``) is not met here; None when it is.

    A plain name is looked up as a module (nothing is imported); a version specifier is checked against
    the installed distribution's metadata. A malformed requirement is a ValueError naming it.
    """
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    text = str(requirement).strip()
    try:
        parsed = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"not a package name or requirement: {requirement!r} ({exc})") from None
    if parsed.extras or parsed.marker or parsed.url:
        raise ValueError(f"{requirement!r}: extras, URLs and environment markers are not supported")
    if not parsed.specifier:
        return None if module_found(parsed.name) else f"test needs the {parsed.name} package, which is not installed"
    try:
        installed = metadata.version(parsed.name)
    except metadata.PackageNotFoundError:
        return f"test needs {text}, which is not installed"
    try:
        ok = parsed.specifier.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return f"test needs {text}; installed version {installed!r} cannot be compared"
    return None if ok else f"test needs {text}; installed {installed}"

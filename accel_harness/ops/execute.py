"""Run one operator task in a worker: each sample on the host and on the device, compared.

Samples come from the OpInfo entry for the device (as torch's own ``test_compare_cpu`` makes
them) and are copied to the host with their layout kept. The host runs first; the device then
runs the same call. Before each run the worker marks which sample, variant and direction it is
in (``begin``), so the parent can name the case if the process dies or hangs there.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any, Callable, Iterator

import torch

from . import outcomes as oc
from .compare import Tolerance, compare, default_tolerance
from .plan import SampleResult, Task
from .seeding import seed_all
from .transfer import mirror

__all__ = ["attempt", "classify_error", "cotangents", "first_line", "judge", "op_samples", "op_variants", "run_op_task", "samples_failed", "tensors_in", "tolerance_for"]

Begin = Callable[[int, str, str], None]

#: how a dtype is named in torch's "not implemented for 'X'" messages
_DTYPE_WORDS = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble", torch.int64: "Long",
                torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool"}


def tolerance_for(task: Task, dtype: torch.dtype) -> Tolerance:
    """The task's tolerance: torch's default for the dtype, replaced where the task carries an override."""
    default = default_tolerance(dtype)
    return Tolerance(atol=default.atol if task.atol is None else task.atol,
                     rtol=default.rtol if task.rtol is None else task.rtol)


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (the rest of a torch error is usually a long C++ trace)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def classify_error(exc: BaseException, host_exc: BaseException | None, dtype: torch.dtype) -> str:
    """The reason code of a device error, given what the host did with the same sample."""
    if host_exc is not None:
        return oc.BOTH_RAISE if type(exc) is type(host_exc) else oc.ERROR_DIFFERS
    text = str(exc)
    if isinstance(exc, NotImplementedError) or "not implemented for" in text or "Could not run" in text:
        word = _DTYPE_WORDS.get(dtype)
        return oc.UNSUPPORTED_DTYPE if word and f"'{word}'" in text else oc.MISSING_KERNEL
    return oc.ERROR


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _leaves_needing_grad(sample: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in([sample.input, list(sample.args), sample.kwargs]) if t.requires_grad and t.is_leaf]


def cotangents(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Fixed random weights for the outputs' gradients (made on the host, so both sides get the same)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype) for o in outputs]


class _Side:
    """One sample as one side (host or device) sees it, with the call variants."""

    def __init__(self, entry: Any, sample: Any, device: Any, from_device: Any, grad: bool, keep_places: bool = False):
        self.entry = entry
        self.device = device
        # the device side keeps each tensor where the sample made it (a host index tensor stays on the host)
        place = None if keep_places else device
        self.input = mirror(sample.input, place, grad, from_device)
        self.args = mirror(tuple(sample.args), place, grad, from_device)
        self.kwargs = mirror(dict(sample.kwargs), place, grad, from_device)
        self.process = sample.output_process_fn_grad

    def call(self, variant: str, out_like: Any = None) -> Any:
        entry = self.entry
        if variant == "unprocessed":
            return entry(self.input, *self.args, **self.kwargs)
        if variant in ("function", "noncontiguous"):
            return self.process(entry(self.input, *self.args, **self.kwargs))
        if variant == "method":
            return self.process(entry.method_variant(self.input, *self.args, **self.kwargs))
        if variant == "inplace":
            return entry.inplace_variant(self.input, *self.args, **self.kwargs)
        if variant == "out":
            out = mirror(out_like, self.device, False)
            entry(self.input, *self.args, out=out, **self.kwargs)
            return out
        raise ValueError(f"unknown operator variant {variant!r}")

    def grads(self, outputs: Any, seed: int) -> list[torch.Tensor | None] | None:
        """Gradients of the sample's inputs for fixed output weights (None: nothing differentiable)."""
        outs = [o for o in tensors_in(outputs) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
        inputs = _leaves_needing_grad(self)
        if not outs or not inputs:
            return None
        weights = [w.to(o.device) for w, o in zip(cotangents(outs, seed), outs)]
        return list(torch.autograd.grad(outs, inputs, weights, allow_unused=True))


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads (0: leave the setting alone)."""
    if not count:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def attempt(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as exc:  # the sample's own error: recorded, the sweep goes on
        return None, exc


def _one(task: Task, entry: Any, sample: Any, index: int, variant: str, directions: tuple[str, ...],
         device: Any, dtype: torch.dtype, tol: Tolerance, begin: Begin) -> list[SampleResult]:
    """Run one sample x variant in the requested directions; the forward result feeds the backward."""
    results: list[SampleResult] = []
    crashed = {d: task.decided.get((index, variant, d)) for d in directions}
    if any(crashed.values()):  # an earlier attempt died here: report that, never run it again
        reason, message = next(v for v in crashed.values() if v)
        chosen = {d: crashed[d] or (reason, f"not run: {message}") for d in directions}
        return [SampleResult(variant, d, index, chosen[d][0], message=chosen[d][1]) for d in directions]
    backward = "backward" in directions
    started = time.perf_counter()
    begin(index, variant, "forward")
    host = _Side(entry, sample, "cpu", device, backward)
    out_like = None
    if variant == "out":  # out= tensors shaped like the function's result on the host
        out_like, _ = attempt(lambda: _Side(entry, sample, "cpu", device, False).call("unprocessed"))
        if not tensors_in(out_like):
            return [SampleResult(variant, d, index, oc.NO_REFERENCE, message="the operator returns no tensor to pass as out=")
                    for d in directions]
    host_out, host_exc = attempt(lambda: host.call(variant, out_like))
    dev = _Side(entry, sample, device, None, backward, keep_places=True)
    with threads(task.device_threads):
        dev_out, dev_exc = attempt(lambda: dev.call(variant, out_like))
    forward = judge(host_out, host_exc, dev_out, dev_exc, dtype, tol)
    forward.sample, forward.variant, forward.direction = index, variant, "forward"
    forward.seconds = time.perf_counter() - started
    results.append(forward)
    if backward:
        results.append(_backward(host, host_out, dev, dev_out, forward, index, variant, dtype, tol, begin, task.device_threads))
    return [r for r in results if r.direction in directions]


def _backward(host: _Side, host_out: Any, dev: _Side, dev_out: Any, forward: SampleResult, index: int, variant: str,
              dtype: torch.dtype, tol: Tolerance, begin: Begin, device_threads: int) -> SampleResult:
    if forward.reason not in (oc.PASSED, oc.MISMATCH):
        return SampleResult(variant, "backward", index, oc.NO_REFERENCE if forward.reason in (oc.NO_REFERENCE, oc.BOTH_RAISE)
                            else forward.reason, message=f"the forward did not run: {forward.message}")
    started = time.perf_counter()
    begin(index, variant, "backward")
    host_grads, host_exc = attempt(lambda: host.grads(host_out, index))
    if host_exc is None and host_grads is None:
        return SampleResult(variant, "backward", index, oc.NO_SAMPLES, message="no differentiable output")
    with threads(device_threads):
        dev_grads, dev_exc = attempt(lambda: dev.grads(dev_out, index))
    result = judge(host_grads, host_exc, dev_grads, dev_exc, dtype, tol)
    result.sample, result.variant, result.direction = index, variant, "backward"
    result.seconds = time.perf_counter() - started
    return result


def judge(host_out: Any, host_exc: BaseException | None, dev_out: Any, dev_exc: BaseException | None,
           dtype: torch.dtype, tol: Tolerance) -> SampleResult:
    if dev_exc is not None:
        reason = classify_error(dev_exc, host_exc, dtype)
        message = first_line(dev_exc) if host_exc is None else f"device {first_line(dev_exc)}; host {first_line(host_exc)}"
        return SampleResult("", "", 0, reason, message=message)
    if host_exc is not None:
        return SampleResult("", "", 0, oc.NO_REFERENCE, message=f"the host raised {first_line(host_exc)}; the device did not")
    comparison, exc = attempt(lambda: compare(dev_out, host_out, tol))
    if exc is not None:  # the device's result could not even be read back
        return SampleResult("", "", 0, oc.ERROR, message=f"reading the device's result: {first_line(exc)}")
    return SampleResult("", "", 0, oc.PASSED if comparison.ok else oc.MISMATCH, max_abs=comparison.max_abs,
                        max_rel=comparison.max_rel, message=comparison.message, tolerance=str(tol))


def samples_failed(task: Task, exc: BaseException, dtype: torch.dtype) -> list[SampleResult]:
    """Every row of a task whose samples could not be made on the device (making them runs device code)."""
    reason = classify_error(exc, None, dtype)
    return [SampleResult(v, d, 0, reason, message=f"making the samples on the device: {first_line(exc)}") for v, d in task.pairs]


def op_variants(entry: Any) -> tuple[str, ...]:
    """The call variants an OpInfo entry has."""
    variants = ["function"]
    if entry.method_variant is not None:
        variants.append("method")
    if entry.inplace_variant is not None:
        variants.append("inplace")
    if entry.supports_out:
        variants.append("out")
    variants.append("noncontiguous")
    return tuple(variants)


def op_samples(entry: Any, device: torch.device, dtype: torch.dtype, requires_grad: bool, limit: int | None) -> list[Any]:
    """The entry's first ``limit`` samples (all when None or 0), as ``entry.sample_inputs`` yields them outside a test.

    torch's sample iterator looks for the running ``unittest.TestCase`` with ``inspect.stack()``
    twice per call (none runs in a sweep worker), which costs more than making the samples; this
    pulls from the entry's sample function with the same seed before each sample. An entry whose
    class has a ``sample_inputs`` of its own goes through it unchanged.
    """
    from torch.testing._internal.common_utils import SEED
    from torch.testing._internal.opinfo.core import OpInfo

    if type(entry).sample_inputs is not OpInfo.sample_inputs or getattr(entry, "sample_inputs_func", None) is None:
        return list(itertools.islice(entry.sample_inputs(device, dtype, requires_grad=requires_grad), limit or None))
    pending = iter(entry.sample_inputs_func(entry, device, dtype, requires_grad))
    samples: list[Any] = []
    while not limit or len(samples) < limit:
        seed_all(SEED)
        try:
            samples.append(next(pending))
        except StopIteration:
            break
    return samples


def run_op_task(task: Task, entry: Any, device: torch.device, begin: Begin) -> list[SampleResult]:
    """Every sample of an OpInfo task, each variant, each direction."""
    dtype = getattr(torch, task.dtype)
    tol = tolerance_for(task, dtype)
    backward = "backward" in task.directions
    begin(-1, "function", "forward")  # making the samples runs device code too
    seed_all(0)
    samples, exc = attempt(lambda: op_samples(entry, device, dtype, backward, task.limit))
    if exc is not None:
        return samples_failed(task, exc, dtype)
    results: list[SampleResult] = []
    for index, sample in enumerate(samples):
        for variant in task.variants:
            if variant == "noncontiguous":
                made, exc = attempt(sample.noncontiguous)
                if exc is not None:
                    results += [SampleResult(variant, d, index, oc.NO_SAMPLES, message=f"no non-contiguous copy: {first_line(exc)}")
                                for d in task.directions]
                    continue
                use = made
            else:
                use = sample
            directions = task.directions if variant in ("function", "noncontiguous") else ("forward",)
            directions = tuple(d for d in directions if d in task.directions)
            if directions:
                results += _one(task, entry, use, index, variant, directions, device, dtype, tol, begin)
    return results

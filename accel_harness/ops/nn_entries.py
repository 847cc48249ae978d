"""Run ModuleInfo and OptimInfo tasks: torch.nn modules and optimizers on the device against the host.

A module is built on the host from torch's constructor input, copied to the device, and both run
the same forward input (train or eval mode); the backward compares the parameters' and inputs'
gradients. An optimizer takes three steps on the host and on the device from the same parameters
and the same loss, and the parameters are compared after them.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import time
from typing import Any, Callable

import torch

from . import outcomes as oc
from .execute import attempt, cotangents, first_line, judge, samples_failed, tensors_in, tolerance_for
from .plan import SampleResult, Task
from .seeding import seed_all
from .transfer import mirror

__all__ = ["run_module_task", "run_optim_task", "same_implementation"]

Begin = Callable[[int, str, str], None]

#: optimizer steps taken on each side before the parameters are compared
OPTIMIZER_STEPS = 3


def run_module_task(task: Task, info: Any, device: torch.device, begin: Begin) -> list[SampleResult]:
    """Every module input of a ModuleInfo task, in each requested mode and direction."""
    dtype = getattr(torch, task.dtype)
    tol = tolerance_for(task, dtype)
    results: list[SampleResult] = []
    for variant in task.variants:
        training = variant == "train"
        begin(-1, variant, "forward")
        seed_all(0)
        inputs, exc = attempt(lambda: list(itertools.islice(info.module_inputs_func(
            info, device=device, dtype=dtype, requires_grad="backward" in task.directions, training=training), task.limit or None)))
        if exc is not None:
            results += [r for r in samples_failed(task, exc, dtype) if r.variant == variant]
            continue
        for index, module_input in enumerate(inputs):
            decided = [task.decided.get((index, variant, d)) for d in task.directions]
            if any(decided):
                reason, message = next(d for d in decided if d)
                results += [SampleResult(variant, d, index, reason, message=message) for d in task.directions]
                continue
            if module_input.forward_input is None:
                continue
            results += _module_sample(info, module_input, index, variant, training, task.directions, device, dtype, tol, begin)
    return results


def _build(info: Any, module_input: Any, side: Any, source: Any, dtype: torch.dtype) -> torch.nn.Module:
    args = mirror(tuple(module_input.constructor_input.args), side, False, source)
    kwargs = mirror(dict(module_input.constructor_input.kwargs), side, False, source)
    seed_all(0)
    return info.module_cls(*args, **kwargs).to(side).to(dtype)


def _module_sample(info: Any, module_input: Any, index: int, variant: str, training: bool, directions: tuple[str, ...],
                   device: torch.device, dtype: torch.dtype, tol: Any, begin: Begin) -> list[SampleResult]:
    started = time.perf_counter()
    begin(index, variant, "forward")
    grad = "backward" in directions
    host_module, host_exc = attempt(lambda: _build(info, module_input, "cpu", device, dtype).train(training))
    if host_exc is not None:
        return [SampleResult(variant, d, index, oc.NO_REFERENCE, message=f"the host could not build it: {first_line(host_exc)}")
                for d in directions]
    dev_module, dev_exc = attempt(lambda: copy.deepcopy(host_module).to(device))
    forward_input = module_input.forward_input
    host_args = mirror(tuple(forward_input.args), "cpu", grad, device)
    host_kwargs = mirror(dict(forward_input.kwargs), "cpu", grad, device)
    dev_args = mirror(tuple(forward_input.args), None, grad)
    dev_kwargs = mirror(dict(forward_input.kwargs), None, grad)
    seed_all(index)
    host_out, host_exc = attempt(lambda: host_module(*host_args, **host_kwargs))
    if dev_exc is None:
        seed_all(index)
        dev_out, dev_exc = attempt(lambda: dev_module(*dev_args, **dev_kwargs))
    else:
        dev_out = None
    forward = judge(host_out, host_exc, dev_out, dev_exc, dtype, tol)
    forward.sample, forward.variant, forward.direction, forward.seconds = index, variant, "forward", time.perf_counter() - started
    results = [forward]
    if grad:
        begin(index, variant, "backward")
        if forward.reason not in (oc.PASSED, oc.MISMATCH):
            results.append(SampleResult(variant, "backward", index, oc.NO_REFERENCE if forward.reason in (oc.NO_REFERENCE, oc.BOTH_RAISE)
                                        else forward.reason, message=f"the forward did not run: {forward.message}"))
        else:
            host_grads, host_exc = attempt(lambda: _module_grads(host_module, host_out, [host_args, host_kwargs], index))
            dev_grads, dev_exc = attempt(lambda: _module_grads(dev_module, dev_out, [dev_args, dev_kwargs], index))
            if host_exc is None and host_grads is None:
                results.append(SampleResult(variant, "backward", index, oc.NO_SAMPLES, message="no differentiable output"))
            else:
                backward = judge(host_grads, host_exc, dev_grads, dev_exc, dtype, tol)
                backward.sample, backward.variant, backward.direction = index, variant, "backward"
                results.append(backward)
    return results


def _module_grads(module: torch.nn.Module, outputs: Any, inputs: Any, seed: int) -> list[Any] | None:
    outs = [o for o in tensors_in(outputs) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    leaves = [p for p in module.parameters() if p.requires_grad] + [t for t in tensors_in(inputs) if t.requires_grad]
    if not outs or not leaves:
        return None
    weights = [w.to(o.device) for w, o in zip(cotangents(outs, seed), outs)]
    return list(torch.autograd.grad(outs, leaves, weights, allow_unused=True))


def run_optim_task(task: Task, info: Any, device: torch.device, begin: Begin) -> list[SampleResult]:
    """Each optimizer input of an OptimInfo task: parameters after the same steps on both sides."""
    dtype = getattr(torch, task.dtype)
    tol = tolerance_for(task, dtype)
    begin(-1, "step", "step")
    inputs, exc = attempt(lambda: list(itertools.islice(info.optim_inputs_func(device=device, dtype=dtype), task.limit or None)))
    if exc is not None:
        return samples_failed(task, exc, dtype)
    results: list[SampleResult] = []
    for index, optim_input in enumerate(inputs):
        variant = "step"
        decided = task.decided.get((index, variant, "step"))
        if decided:
            results.append(SampleResult(variant, "step", index, decided[0], message=decided[1]))
            continue
        started = time.perf_counter()
        begin(index, variant, "step")
        kwargs = same_implementation(info.optim_cls, optim_input.kwargs, device)
        host_params, host_exc = attempt(lambda: _optimize(info, kwargs, "cpu", device, dtype, index))
        dev_params, dev_exc = attempt(lambda: _optimize(info, kwargs, device, device, dtype, index))
        result = judge(host_params, host_exc, dev_params, dev_exc, dtype, tol)
        result.sample, result.variant, result.direction = index, variant, "step"
        result.message = f"[{optim_input.desc}] {result.message}" if result.message else None
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results


def same_implementation(optim_cls: type, kwargs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``kwargs`` with the implementation torch would pick on ``device`` made explicit.

    Left to itself an optimizer runs the foreach implementation on the devices torch lists for it
    (cuda, xpu, the PrivateUse1 device, ...) and the for-loop one on the host; in float16 and
    bfloat16 the two round differently, so the host must run the device's choice to check its kernels.
    """
    if "foreach" in kwargs or kwargs.get("fused") or kwargs.get("differentiable"):
        return kwargs
    if "foreach" not in inspect.signature(optim_cls).parameters:
        return kwargs
    # torch's own list of the device types that default to foreach (no public name)
    from torch.optim.optimizer import _get_foreach_kernels_supported_devices as foreach_devices

    return {**kwargs, "foreach": torch.device(device).type in foreach_devices()}


def _optimize(info: Any, kwargs: dict[str, Any], side: Any, source: Any, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(5, 3, generator=generator, dtype=torch.float64).to(dtype)
    bias = torch.randn(5, generator=generator, dtype=torch.float64).to(dtype)
    data = torch.randn(3, generator=generator, dtype=torch.float64).to(dtype).to(side)
    params = [mirror(weight, side, True), mirror(bias, side, True)]
    optimizer = info.optim_cls(params, **mirror(dict(kwargs), side, False, source))

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = ((params[0] @ data + params[1]) ** 2).sum()
        loss.backward()
        return loss

    for _ in range(OPTIMIZER_STEPS):
        optimizer.step(closure)
    return [p.detach() for p in params]



"""The optimizer wrapper: steps only when gradients are synchronised, and through the grad scaler."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .state import GradientState
from .launch import heartbeat


def _move_state(state: Any, device: torch.device) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _move_state(v, device) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_move_state(v, device) for v in state)
    return state


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer for ``Accelerator.prepare``.

    While gradients accumulate (``GradientState.sync_gradients`` is False), ``step`` and
    ``zero_grad`` do nothing. With an fp16 grad scaler, ``step`` goes through the scaler and
    ``step_was_skipped`` tells whether inf/NaN gradients made it skip the update.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device_placement: bool = True, scaler: torch.amp.GradScaler | None = None):
        # deliberately not calling Optimizer.__init__: this object delegates to `optimizer`
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        self._accelerate_step_called = False

    # ------------------------------------------------------------------ delegation
    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict``, moving its tensors to the parameters' device when placing on the device."""
        if self.device_placement:
            device = self._param_device()
            if device is not None:
                state_dict = _move_state(state_dict, device)
        self.optimizer.load_state_dict(state_dict)

    def _param_device(self) -> torch.device | None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                return p.device
        return None

    def train(self) -> None:
        """Switch an optimizer that has modes (schedule-free) to training."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Switch an optimizer that has modes (schedule-free) to evaluation."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    # ------------------------------------------------------------------ stepping
    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear the gradients, except while they accumulate."""
        if self.gradient_state.sync_gradients:
            if set_to_none is None:
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step when gradients are synchronised (through the grad scaler under fp16); a no-op while accumulating."""
        if heartbeat.active:  # progress for accel launch's hang watchdog
            heartbeat.beat()
        if not self.gradient_state.sync_gradients:
            return None
        self._accelerate_step_called = True
        if self.scaler is None:  # no scaler: ``_is_overflow`` stays False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
        self.scaler.update()
        # the scale only shrinks when the scaler found inf/NaN gradients and skipped the step
        self._is_overflow = self.scaler.get_scale() < scale_before
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step`` was skipped because of inf/NaN gradients."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        """Accelerate's name for ``step_was_skipped``."""
        return self._is_overflow


def move_to_device(state: Any, device: Any) -> Any:
    """``state`` (an optimizer state or any nest of lists, tuples and dicts) with every tensor moved to ``device``."""
    return _move_state(state, torch.device(device) if isinstance(device, (str, int)) else device)


def patch_optimizer_step(accelerated_optimizer: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an optimizer's ``step``) marking ``accelerated_optimizer._accelerate_step_called`` when it runs,
    so a scheduler can tell whether the optimizer really stepped."""

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step

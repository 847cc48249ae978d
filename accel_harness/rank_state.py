"""Rank state between tests: what a rank looked like before its first test, put back after each one.

Default dtype and device, grad and deterministic modes, the torch, Python and NumPy random generators,
the environment variables and the working directory; only what a test changed is set again, so the
cost per test stays small.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class RankBaseline:
    """What a rank looked like before its first test, put back after every test.

    Each setting is compared with the baseline and set only if a test changed it. The torch and
    Python generators are put back every time (cheaper than reading their state to compare);
    NumPy's global generator is compared through its raw state bytes (:class:`NumpyGlobalRng`)."""

    def __init__(self, backend: Any = None) -> None:
        import random

        import torch

        self.backend = backend
        self.environ = EnvironSnapshot()
        self.cwd = os.getcwd()
        self.dtype = torch.get_default_dtype()
        self.default_device = torch.get_default_device() if hasattr(torch, "get_default_device") else None
        self.grad = torch.is_grad_enabled()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.torch_seed = torch.initial_seed()
        self.torch_rng = torch.get_rng_state()
        self.device_rng = None
        if backend is not None:
            try:  # the generator of the rank's device (the host one again on a host backend)
                self.device_rng = backend.get_rng_state()
            except Exception:
                self.device_rng = None
        self.python_rng = random.getstate()
        self.numpy_rng = NumpyGlobalRng()

    @classmethod
    def capture(cls, backend: Any = None) -> "RankBaseline":
        """The rank's settings now (called once, before its first test)."""
        return cls(backend)

    def restore(self) -> None:
        """Put back every setting a test changed."""
        import random

        import torch

        self.environ.restore()
        try:
            here = os.getcwd()
        except OSError:  # the test removed its working directory
            here = None
        if here != self.cwd:
            try:
                os.chdir(self.cwd)
            except OSError:
                pass
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if self.default_device is not None and torch.get_default_device() != self.default_device:
            torch.set_default_device(self.default_device)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        if torch.initial_seed() != self.torch_seed:
            torch.manual_seed(self.torch_seed)  # the test reseeded: every device's generator, as in a fresh process
        torch.set_rng_state(self.torch_rng)
        if self.device_rng is not None:
            self.backend.set_rng_state(self.device_rng)
        random.setstate(self.python_rng)
        self.numpy_rng.restore()


class EnvironSnapshot:
    """``os.environ`` as it was, compared and put back through its raw mapping.

    ``dict(os.environ)`` decodes every name and value (tens of microseconds on every test); the
    raw bytes mapping behind ``os.environ`` compares in well under one. Where that mapping is
    missing (another Python), the decoded copy is used."""

    def __init__(self) -> None:
        self.raw = getattr(os.environ, "_data", None)
        self.saved_raw = dict(self.raw) if isinstance(self.raw, dict) else None
        self.saved = dict(os.environ)

    def changed(self) -> bool:
        """Whether a variable was set, changed or removed since the snapshot."""
        if self.saved_raw is not None and getattr(os.environ, "_data", None) is self.raw:
            return self.raw != self.saved_raw
        return dict(os.environ) != self.saved

    def restore(self) -> None:
        """Put the variables back (through ``os.environ``, so the C-level environment follows)."""
        if self.changed():
            os.environ.clear()
            os.environ.update(self.saved)


class NumpyGlobalRng:
    """NumPy's global generator (``numpy.random.seed``/``rand``/...) as it was, put back when a test moved it.

    Reading or setting its state through ``get_state``/``set_state`` costs over a hundred
    microseconds. Its bit generator exposes the address of its raw state (the Mersenne Twister's
    key and position), so the rank keeps a copy of those bytes and compares them, a couple of
    microseconds, and calls ``set_state`` only when they differ. The copy is used only after it is
    checked against ``get_state`` at capture; otherwise (another NumPy layout) ``set_state`` runs
    every time. Without NumPy at capture, a NumPy imported later is reseeded from the OS each time,
    as a fresh process would be."""

    #: mt19937's raw state: 624 32-bit words of key, then the position as a C int
    _KEY_WORDS = 624

    def __init__(self) -> None:
        self.numpy = sys.modules.get("numpy")
        self.state = self.numpy.random.get_state() if self.numpy is not None else None
        #: the global generator's bit generator, held so that its state's address stays valid
        self.bit_generator = self._bit_generator()
        self.address: int | None = None
        self.raw: bytes | None = None
        if self.state is not None and self.bit_generator is not None:
            self._snapshot()

    def _bit_generator(self) -> Any:
        """The bit generator behind NumPy's global functions (None where it cannot be reached)."""
        if self.numpy is None:
            return None
        try:
            return self.numpy.random.mtrand._rand._bit_generator
        except AttributeError:
            return None

    def _snapshot(self) -> None:
        try:
            import ctypes

            address = self.bit_generator.ctypes.state_address
            raw = ctypes.string_at(address, self._KEY_WORDS * 4 + 4)
            name, key, pos = self.state[0], self.state[1], self.state[2]
            expected = bytes(self.numpy.asarray(key, dtype="<u4").tobytes()) + int(pos).to_bytes(4, "little", signed=True)
            if name == "MT19937" and raw == expected:
                self.address, self.raw = address, raw
        except Exception:  # no ctypes interface, another layout: compare nothing, set every time
            self.address = self.raw = None

    def moved(self) -> bool:
        """Whether the generator may have moved since capture (always True when it cannot be read cheaply)."""
        if self.address is None or self._bit_generator() is not self.bit_generator:
            return True
        import ctypes

        return ctypes.string_at(self.address, len(self.raw)) != self.raw

    def restore(self) -> None:
        """Put the generator back (NumPy imported after capture: reseed it from the OS)."""
        if self.numpy is None:
            numpy = sys.modules.get("numpy")
            if numpy is not None:
                numpy.random.seed(None)
            return
        if self.moved():
            if self.bit_generator is not None and self._bit_generator() is not self.bit_generator:
                self.numpy.random.set_bit_generator(self.bit_generator)  # the test swapped it (NumPy >= 1.25)
            self.numpy.random.set_state(self.state)

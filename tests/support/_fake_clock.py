"""A fake clock for tests of timing code: the time a test's fake work takes, never the machine's."""

from __future__ import annotations

import time


class FakeClock:
    """Stands in for the ``time`` module: ``perf_counter`` reads virtual time, only ``advance`` moves it.

    Tests advance it by powers of two, so every sum and difference is exact.
    """

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str):
        return getattr(time, name)

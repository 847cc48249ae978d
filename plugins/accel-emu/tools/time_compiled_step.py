"""Times one small-MLP training step (forward, backward, SGD) eager and compiled with Inductor, on emu and cpu.

Each (device, mode) is timed in rounds that alternate with the others; prints the median step time of
each, the compiled/eager ratio per device, the first (compiling) step's time, and the machine's load
average, so figures from a busy machine can be recognised as such.

    python plugins/accel-emu/tools/time_compiled_step.py --rounds 5 --steps 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import accel_emu


def _make(device: str, compiled: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.GELU(), torch.nn.Linear(256, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    forward = torch.compile(model) if compiled else model
    x, y = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)
    return forward, optimizer, x, y


def _step(forward, optimizer, x, y) -> None:
    loss = F.cross_entropy(forward(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _sync(device: str) -> None:
    if device != "cpu":
        torch.accelerator.synchronize()


def main() -> None:
    """Parse the arguments, time every (device, mode) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    accel_emu.load()
    cases = [(device, compiled) for device in ("emu", "cpu") for compiled in (False, True)]
    state, first, times = {}, {}, {case: [] for case in cases}
    for case in cases:
        state[case] = _make(*case)
        start = time.perf_counter()
        _step(*state[case])
        _sync(case[0])
        first[case] = time.perf_counter() - start
    for _ in range(args.rounds):
        for case in cases:
            start = time.perf_counter()
            for _ in range(args.steps):
                _step(*state[case])
            _sync(case[0])
            times[case].append((time.perf_counter() - start) / args.steps)
    print(f"load average {os.getloadavg()}; {args.rounds} rounds of {args.steps} steps; OMP threads {torch.get_num_threads()}")
    for device in ("emu", "cpu"):
        eager, compiled = (statistics.median(times[(device, c)]) for c in (False, True))
        print(f"{device}: eager {eager * 1e3:.3f} ms/step, compiled {compiled * 1e3:.3f} ms/step "
              f"(compiled/eager {compiled / eager:.2f}); first compiled step {first[(device, True)]:.1f} s")


if __name__ == "__main__":
    main()

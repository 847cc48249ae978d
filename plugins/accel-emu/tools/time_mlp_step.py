"""Times one small-MLP training step (forward, backward, AdamW) on emu and on cpu, alternating.

Prints the median of each device's rounds and the ratio, and the machine's load average from
``os.getloadavg()`` so figures from a busy machine can be recognised as such.

    python plugins/accel-emu/tools/time_mlp_step.py --rounds 7 --steps 20 [--cpu-time]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import accel_emu


def _make(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64).to(device)
    y = torch.randint(0, 10, (32,)).to(device)
    return model, opt, x, y


def _round(device: str, steps: int, clock=time.perf_counter) -> float:
    model, opt, x, y = _make(device)
    loss = None
    for _ in range(3):  # warm-up
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.accelerator.synchronize() if device != "cpu" else None
    start = clock()
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    float(loss.item())  # waits for the device
    return (clock() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the process's CPU time (all threads, one intra-op thread) instead of wall time: "
                             "steadier than wall time on a machine shared with other jobs")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    accel_emu.load()
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.process_time
    times: dict[str, list[float]] = {"cpu": [], "emu": []}
    for _ in range(args.rounds):
        for device in ("cpu", "emu"):
            times[device].append(_round(device, args.steps, clock))
    med = {d: statistics.median(v) for d, v in times.items()}
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}; clock: {'process CPU time' if args.cpu_time else 'wall'}")
    for device, values in times.items():
        print(f"{device}: median {med[device] * 1e3:.2f} ms/step over {args.rounds} rounds "
              f"(min {min(values) * 1e3:.2f}, max {max(values) * 1e3:.2f})")
    print(f"emu/cpu: {med['emu'] / med['cpu']:.1f}x")


if __name__ == "__main__":
    main()

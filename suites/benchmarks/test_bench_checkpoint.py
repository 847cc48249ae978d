"""Checkpoint save and load throughput through ``Accelerator.save_state`` / ``load_state`` (MB/s, 1 MB = 1e6 bytes).

The checkpoint is an MLP of ``width x width`` fp32 layers with its AdamW state (after one step,
so the two moment buffers exist), on the device, in one process: ``model.safetensors``,
``optimizer.bin``, RNG states and the manifest. Throughput = bytes of the checkpoint directory /
median round time.

* ``save``: one ``save_state`` into the same directory per call, i.e. what accel really does:
  write into a temporary sibling, fsync every file, rename into place, delete the previous
  checkpoint. Bound by the disk's synchronous write speed as much as by accel.
* ``load``: one ``load_state`` of that directory per call (read, verify, copy into the model and
  optimizer on the device). Just written, the files are in the page cache: this measures accel's
  loading path and memory copies, not a cold disk.

The directory is pytest's ``tmp_path`` (the temporary directory's file system).

Methodology against run-to-run noise: ``load`` reads a checkpoint written (and fsynced by
``save_state``) once before timing and then read again and again, so every round sees the same,
fully cached files (``extra_info["page_cache"] = "warm"``); rounds last at least
:data:`ROUND_TIME_S`; on a host CPU the process is pinned to one core while it measures
(``extra_info["cpu_pinning"]``). ``load`` is bound by host memory bandwidth on the CPU backend,
so the host's memory probe is timed in rounds interleaved with it (``host_reference.py``).
"""

from __future__ import annotations

import os

from dataclasses import replace

import pytest
import torch

import host_reference
import timing

#: (width, layers): full and quick, on the host CPU and on accelerators
MODEL = {"cpu": ((1024, 4), (512, 4)), "device": ((4096, 4), (1024, 4))}


#: shortest round (seconds): several saves or loads per round
ROUND_TIME_S = 0.25


def model_shape(backend, settings: timing.Settings) -> tuple[int, int]:
    full, quick = MODEL["cpu" if backend.device_type == "cpu" else "device"]
    return quick if settings.quick or settings.smoke else full


def _dir_bytes(path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


@pytest.mark.parametrize("operation", ["save", "load"])
def test_checkpoint(benchmark, backend, accel_on_backend, bench_settings, tmp_path, operation):
    from accel import Accelerator

    width, layers = model_shape(backend, bench_settings)
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, width, device=accelerator.device)).sum().backward()
    optimizer.step()
    target = tmp_path / "checkpoint"
    accelerator.save_state(str(target))
    nbytes = _dir_bytes(target)

    if operation == "save":
        def call():
            accelerator.save_state(str(target))
    else:
        def call():
            accelerator.load_state(str(target))

    settings = bench_settings
    if not (settings.smoke or settings.quick):
        settings = replace(settings, round_time_s=max(settings.round_time_s, ROUND_TIME_S))
    with timing.pinned_to_core() as pinning:
        if operation == "load":  # memory-bound: time the host's memory probe in interleaved rounds
            m = host_reference.measure_with_memory_probe(benchmark, backend, call, settings)
        else:
            m = timing.measure(backend, call, settings)
    parameters = sum(p.numel() for p in model.parameters())
    info = timing.extra_info(
        backend, m, metric=f"checkpoint_{operation}", unit="MB/s", work_per_round=nbytes * m.iterations / timing.MB,
        work_unit="MB", dtype="float32", settings=bench_settings,
        host_bound=timing.on_host(backend, "memory") if operation == "load" else None,
        sizes={"checkpoint_bytes": nbytes, "parameters": parameters, "width": width, "layers": layers,
               "files": sorted(os.listdir(target))},
        operation=operation, optimizer="AdamW", safe_serialization=True,
        page_cache="warm" if operation == "load" else None, cpu_pinning=pinning,
        round_time_s=settings.round_time_s,
    )
    timing.record(benchmark, m, info)
    # the JSON parts (manifest, RNG states) may change by a few bytes between saves
    assert abs(_dir_bytes(target) - nbytes) <= 0.01 * nbytes

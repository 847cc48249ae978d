"""Timing for accel's benchmark suites: synchronized device timing, raw samples, pytest-benchmark records.

How a benchmark is timed
------------------------
:func:`measure` runs a callable on a backend in four phases:

1. one untimed call (first-touch allocation, kernel selection, lazy initialisation);
2. calibration: batches of 1, 2, 4, ... back-to-back calls, timed, until one batch lasts a quarter
   of ``Settings.round_time_s``; that gives the time per call and so ``iterations``, the number of
   calls in one round of about ``round_time_s`` (short operations are then not drowned in timer
   resolution or launch jitter). The calibration calls are never samples;
3. ``Settings.warmup_rounds`` timed rounds that are **kept apart** (``Measurement.warmup_samples``)
   and never reach the statistics;
4. the measured rounds: as many as fit in ``Settings.budget_s``, clamped to
   ``[min_rounds, max_rounds]``. Each sample is the duration of one round (``iterations`` calls).

Every round is timed with ``backend.timer()`` (:class:`accel.backends.Timer`): device events where
the backend supports them (``backend.use_host_timers`` is False), otherwise a host clock read only
after ``backend.synchronize()``, both before the round starts and before it ends. So queued
asynchronous work is never half counted: with host timers, work queued before the round is
finished before the start clock is read and the round's own work is finished before the end clock
is read; with events, the start event sits behind earlier work on the stream and the end event is
synchronized before ``elapsed_time`` is read. An optional ``setup`` runs before each round outside
the timed region.

How samples reach pytest-benchmark
----------------------------------
:func:`record` hands the measured samples to pytest-benchmark through ``benchmark.pedantic`` with
pytest-benchmark's *timer* option set to :data:`DEVICE_CLOCK` (the suites' ``conftest.py`` puts
``@pytest.mark.benchmark(timer=DEVICE_CLOCK)`` on every benchmark test). That clock is a virtual
clock: during :func:`record` it only advances by the device-synchronized duration of each round, so
every round pytest-benchmark sees is exactly one sample measured by :func:`measure`, no more and no
less: ``stats.data`` in the JSON are the raw per-round seconds (pytest-benchmark always writes
``stats.data`` into ``--benchmark-json``; ``--benchmark-save-data`` does the same for
``--benchmark-save``, and ``accel bench`` passes both). Warm-up rounds are not replayed.

Multi-process benchmarks cannot use the ``benchmark`` fixture inside the ranks (it does not pickle).
They run their rank function in the harness's pooled process group with :func:`run_in_ranks`; each
rank times its rounds itself with :func:`measure` (``reduce_max`` makes the ranks agree on the
calibration and turns each round into the *slowest* rank's time, because a collective ends when its
last rank does) and writes its samples to a file; the pytest process then records them with
:func:`record`, exactly like a single-process measurement.

``extra_info`` schema (what the report generator reads)
--------------------------------------------------------
Written by :func:`extra_info` into every benchmark entry:

====================  ========================================================================
``backend``           backend name (``cpu``, ``cuda``, ...)
``device``            device model (``backend.device_properties(0).name``)
``dtype``             ``"float32"``, ``"bfloat16"``, ... (``None`` where meaningless)
``metric``            what is measured: ``matmul``, ``device_copy``, ``h2d_pageable``,
                      ``all_reduce_busbw``, ``train_step_mlp``, ``data_loader_shard``, ...
``unit``              unit of ``throughput``: ``TFLOP/s``, ``GB/s``, ``MB/s``, ``steps/s``,
                      ``samples/s``
``throughput``        ``work_per_round / median(stats.data)``: derived from the MEDIAN round
``higher_is_better``  ``True`` (all of these are throughputs)
``world_size``        ranks taking part (1 for single-process benchmarks)
``work_per_round``    work done by one round, in ``work_unit``
``work_unit``         the numerator of ``unit`` (``TFLOP``, ``GB``, ``MB``, ``steps``,
                      ``samples``), so ``throughput == work_per_round / median``
``work_size``         same value as ``work_per_round`` (the name ``accel_reports.analyse.benchmarks`` reads)
``sizes``             dict of problem sizes (matrix side, bytes, batch, ...)
``iterations``        calls per round; ``rounds`` / ``warmup_rounds`` as measured
``median_s``          median round time in seconds (equal to ``stats.median``)
``timing``            ``"device events"`` or ``"host timers"``
``quick``             True for ``--quick`` / ``ACCEL_BENCH_QUICK=1`` runs (smaller sizes)
``torch_threads``     torch threads of the process that ran the work (per rank for multi-rank ones)
``loadavg_1m``        the host's 1-minute load average when the benchmark finished: other work on
                      the machine shows up as noise, this says how much there was
``host_bound``        ``"compute"`` or ``"memory"`` when the work runs on the host CPU and that
                      resource limits it (``None`` otherwise: device work, disk, latency-bound)
``host_reference``    the host probe before and after the benchmark (added by the suites'
                      ``conftest.py``; see ``host_reference.py``)
``torch_version``, ``accel_version``
====================  ========================================================================

Benchmarks add their own keys (e.g. ``overhead_ratio`` and ``baseline_throughput`` for accel vs a
hand-written loop, ``algbw`` for collectives).

Where each part lives
---------------------
This module is the library's documentation and the one import of the suites; the code sits in sibling
modules, one concern each: ``timing_settings`` (how long to measure), ``timing_measure`` (measuring),
``timing_pinning`` (CPU pinning), ``timing_record`` (the pytest-benchmark clock and records),
``timing_info`` (``extra_info``, units, bus bandwidth) and ``timing_ranks`` (multi-process runs).
"""

from __future__ import annotations

from timing_info import GB, MB, TFLOP, all_gather_busbw_bytes, all_reduce_busbw_bytes, device_model, extra_info, on_host
from timing_measure import MAX_ITERATIONS, Measurement, measure, measure_interleaved
from timing_pinning import pinned_to_core
from timing_ranks import rank_max, run_in_ranks
from timing_record import DEVICE_CLOCK, DeviceClock, record
from timing_settings import (FULL, QUICK, QUICK_ENV, SET_ENV, SMOKE, STANDARD, Settings, core_set_requested,
                             quick_requested, settings_for)

__all__ = [
    "DEVICE_CLOCK",
    "FULL",
    "GB",
    "MAX_ITERATIONS",
    "MB",
    "QUICK",
    "QUICK_ENV",
    "SET_ENV",
    "STANDARD",
    "SMOKE",
    "TFLOP",
    "DeviceClock",
    "Measurement",
    "Settings",
    "all_gather_busbw_bytes",
    "all_reduce_busbw_bytes",
    "device_model",
    "extra_info",
    "measure",
    "measure_interleaved",
    "on_host",
    "pinned_to_core",
    "quick_requested",
    "core_set_requested",
    "rank_max",
    "record",
    "run_in_ranks",
    "settings_for",
]

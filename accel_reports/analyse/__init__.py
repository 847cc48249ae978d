"""The second stage of a report: loaded frames in, the findings out.

``analysis`` builds the :class:`~accel_reports.analyse.analysis.Report` (summary matrix, per-test grid,
failure clusters, skip groups, the diff against a baseline, the verdict) from ``groups``, ``areas``,
``evidence`` (flaky failures, expired known issues, applicable coverage, fair comparison), ``vendor``
(upstream suites) and ``operators`` (operator sweeps); ``benchmarks`` judges benchmark figures with
``benchmark_stats``, ``noise`` (the one noise measure) and ``claims``; ``census`` compares two runs'
kernel censuses. Imports only the load stage below it.
"""

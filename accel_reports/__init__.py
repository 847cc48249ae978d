"""Qualification reports: many runs' results in, one HTML page and one Markdown summary out.

One subpackage per stage, each importing only the stages before it:

* ``load``: harness JSON Lines, pytest ``--junitxml`` files and pytest-benchmark JSON into tidy pandas
  frames (``accel_reports.load.loaders.load_results``: one row per test per run, per run, per benchmark);
* ``analyse``: the findings (``accel_reports.analyse.analysis.build_report``: summary matrix, per-test grid,
  failure clusters, skip groups, the diff against a baseline, the verdict; benchmarks judged with the one
  noise measure; operator sweeps; the kernel census of two runs);
* ``history``: the run store, SQLite or PostgreSQL (``accel_reports.history.store.open_history``);
* ``render``: ``report.html`` (self-contained) and ``report.md`` (``accel_reports.render.report.write_report``)
  and the support matrix.

The generator of realistic results for the report's tests and benchmark stays in the repository
(``tests/support/_synthetic_results.py``); it is not part of the package.

Importing this package imports nothing else (pandas and jinja2 load with the module that needs them).
"""

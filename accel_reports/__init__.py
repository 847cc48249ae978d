"""Qualification reports: many runs' results in, one HTML page and one Markdown summary out.

``accel_reports.load.loaders`` reads harness JSON Lines, pytest ``--junitxml`` files and pytest-benchmark JSON
into tidy pandas frames (one row per test per run); ``accel_reports.analyse.analysis`` computes the summary
matrix, the per-test grid, failure clusters, skip groups and the diff against a baseline;
``accel_reports.analyse.benchmarks`` compares benchmark samples with a noise-aware rule; ``accel_reports.render`` turns
the result into ``report.html`` (self-contained) and ``report.md`` (GitHub-flavoured);
``accel_reports.analyse.operators`` sums up the rows of operator sweeps (``accel ops``) for their section.
The generator of realistic results for the report's tests and benchmark stays in the repository
(``tests/_synthetic_results.py``); it is not part of the package.

Importing this package imports nothing else (pandas and jinja2 load with the module that needs them).
"""

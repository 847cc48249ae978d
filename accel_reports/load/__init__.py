"""The first stage of a report: result files in, tidy frames out.

``loaders`` reads harness JSON Lines, pytest ``--junitxml`` files (``junit``) and pytest-benchmark JSON
(``benchmark_rows``) into one row per test per run, per run and per benchmark; ``headers``, the
``*_records`` modules and ``display`` check what a record or run header carries on the way in. Nothing
here imports a later stage (analyse, history, render).
"""

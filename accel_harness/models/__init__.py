"""Validated models: real architectures trained to a target on a backend, judged against the host.

One concern per module: :mod:`.zoo` (the architectures, one table), :mod:`.tasks` (learnable data
with a known optimum), :mod:`.train` (one training run and its record), :mod:`.gates` (the verdict
against the host fp32 reference). The suite ``suites/test_models.py`` puts them together; see
docs/models.md. Nothing is downloaded: models are built from configurations, data from seeds.
"""

"""Nightly CI matrices: the matrix file, its plan, one cell's runner, the combined report.

``ci/matrix.yaml`` is the one definition; ``python -m ci.plan`` turns it into the GitHub Actions
job matrix, ``python -m ci.run_cell`` runs one cell (on a developer machine or a CI runner),
``python -m ci.collect`` renders the report over many cells, and ``python -m ci.validate_workflow``
checks ``.github/workflows/nightly.yml`` against the matrix. Only PyYAML is needed to plan and to
start a cell; the cell's own virtual environment holds torch and accel.
"""

"""The accel qualification harness: a pytest plugin (``harness.plugin``), its markers and skip
reasons (``harness.markers``), the JSON Lines result records (``harness.records``) and known
issues as data (``harness.known_issues``).

Importing this package imports nothing else; each module loads what it needs.
"""

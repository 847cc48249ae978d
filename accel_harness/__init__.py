"""The accel qualification harness: a pytest plugin (``accel_harness.plugin``), its markers and skip
reasons (``accel_harness.markers``), the JSON Lines result records (``accel_harness.records``) and known
issues as data (``accel_harness.known_issues``).

Importing this package imports nothing else; each module loads what it needs.
"""

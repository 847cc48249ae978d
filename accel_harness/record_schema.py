"""The results file's schema: its name, version and the values its fields may take.

Kept apart from the writer (:mod:`accel_harness.records`) and the reader
(:mod:`accel_harness.record_reader`) so that both use one definition without importing each other.
"""

SCHEMA = "accel.results"
SCHEMA_VERSION = "1.0"
_MAJOR = int(SCHEMA_VERSION.split(".")[0])

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
WHEN = ("setup", "call", "teardown")

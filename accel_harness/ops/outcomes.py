"""Operator sweep outcomes and reason codes: the one table every part of the sweep and the reports use.

A row of the sweep (one operator x call variant x dtype x direction on one backend) ends with an
*outcome* (``passed``, ``failed``, ``skipped``, ``xfailed``, ``xpassed`` or ``known``) and a
*reason code* that says why. Torch-free, so reports read it without importing torch.
"""

from __future__ import annotations

from accel.facts.reasons import UNSUPPORTED_DTYPE

__all__ = [
    "COMPARED_OUTCOMES", "CRASH", "ERROR", "ERROR_DIFFERS", "MISMATCH", "MISSING_KERNEL", "NO_REFERENCE",
    "NO_SAMPLES", "OP_OUTCOMES", "OP_REASONS", "PASSED", "RECORD_OUTCOME", "SEVERITY", "TIMEOUT", "TORCH_SKIP",
    "TORCH_DTYPE", "TORCH_XFAIL", "UNSUPPORTED_DTYPE", "BOTH_RAISE", "KNOWN", "worst",
]

# ---------------------------------------------------------------------------- reason codes
PASSED = "passed"
BOTH_RAISE = "raises-like-host"
MISMATCH = "mismatch"
MISSING_KERNEL = "missing-kernel"
ERROR = "error"
ERROR_DIFFERS = "error-differs"
CRASH = "crash"
TIMEOUT = "timeout"
TORCH_SKIP = "torch-skip"
TORCH_XFAIL = "torch-xfail"
NO_REFERENCE = "no-reference"
NO_SAMPLES = "no-samples"
TORCH_DTYPE = "torch-dtype"
KNOWN = "known-issue"

#: reason code -> (outcome of a row with only this reason, one line a vendor reads)
OP_REASONS: dict[str, tuple[str, str]] = {
    PASSED: ("passed", "the device's result matches the host's within the tolerance"),
    BOTH_RAISE: ("passed", "the sample is invalid: the device raises the same error type as the host"),
    MISMATCH: ("failed", "the device's result differs from the host's beyond the tolerance"),
    UNSUPPORTED_DTYPE: ("failed", "the device has no kernel for this dtype (the host has)"),
    MISSING_KERNEL: ("failed", "the device has no kernel for the operator (NotImplementedError)"),
    ERROR: ("failed", "the device raised where the host did not"),
    ERROR_DIFFERS: ("failed", "device and host both raised, with different error types"),
    CRASH: ("failed", "the process died (a signal) while the device ran the sample"),
    TIMEOUT: ("failed", "the sample did not finish within the per-sample timeout"),
    TORCH_SKIP: ("skipped", "torch's own metadata skips this operator on this device type and dtype"),
    TORCH_XFAIL: ("xfailed", "torch's own metadata expects this operator to fail here, and it does"),
    NO_REFERENCE: ("skipped", "the host itself cannot run these samples: nothing to compare against"),
    NO_SAMPLES: ("skipped", "torch's database gives no sample for this dtype and variant"),
    TORCH_DTYPE: ("skipped", "torch's database does not list this dtype for the operator on this device type"),
    KNOWN: ("known", "a known issue of the device profile or known-issues file covers the failure"),
}

#: the outcomes a row may end with (records map ``known`` to a failure with the issue's id)
OP_OUTCOMES = ("passed", "failed", "known", "xfailed", "xpassed", "skipped")

#: outcomes that count as "compared on the device" in pass rates (skips are not)
COMPARED_OUTCOMES = frozenset({"passed", "failed", "known", "xfailed", "xpassed"})

#: the record outcome (accel_harness.records.OUTCOMES) of each row outcome
RECORD_OUTCOME = {"passed": "passed", "failed": "failed", "known": "failed", "xfailed": "xfailed",
                  "xpassed": "xpassed", "skipped": "skipped"}

#: how bad a sample's reason is: a row takes the reason of its worst sample
SEVERITY: dict[str, int] = {
    NO_SAMPLES: 0, TORCH_DTYPE: 0, NO_REFERENCE: 1, TORCH_SKIP: 2, PASSED: 3, BOTH_RAISE: 4, TORCH_XFAIL: 5, MISMATCH: 6,
    ERROR_DIFFERS: 7, UNSUPPORTED_DTYPE: 8, MISSING_KERNEL: 9, ERROR: 10, TIMEOUT: 11, CRASH: 12,
}


def worst(reasons: list[str]) -> str:
    """The reason a row of several samples ends with: the most severe one (:data:`SEVERITY`).

    A row whose compared samples all passed but one sample had no reference still passes: a
    skipped sample never outranks a compared one."""
    if not reasons:
        return NO_SAMPLES
    return max(reasons, key=lambda code: SEVERITY[code])

"""The harness side of a device profile: claims checked against skips, applicable coverage.

A profile (``--profile FILE``, see ``accel.backends.profile``) declares what its device can do.
Here each test instance on the profile's backend gets the capability areas it exercises (from its
requirement marks: ``require_bf16(amp=True)`` is ``bf16_autocast``, a world size above 1 is
``collectives``, ...). When the profile claims an area and the test skips for lack of exactly that
(its reason code says so, e.g. ``unsupported-dtype``), the skip becomes a failure with the reason
code ``claim-contradicted``: "declared bf16_autocast; skipped: ...". The run's coverage per area
(tests that ran out of tests applicable to the claims) goes into the results file.

Importing this module is cheap (no torch): the plugin imports it only when a profile is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pytest

from . import markers as harness_markers

__all__ = ["CLAIM_CONTRADICTED", "ProfileSession", "item_areas", "lacks_area", "load_profile_known_issues", "probe_areas"]

#: reason code of a failure made from a skip that contradicts a declared capability
CLAIM_CONTRADICTED = "claim-contradicted"

#: the area of tests that exercise no particular capability
GENERAL = "general"

_STASH_CONTRADICTION = pytest.StashKey[str]()

#: area -> (skip reason codes that mean "this area is missing", text the message must contain or None)
_LACKING: dict[str, tuple[tuple[str, ...], str | None]] = {
    **{area: ((harness_markers.UNSUPPORTED_DTYPE,), None)
       for area in ("fp16", "bf16", "fp8", "fp16_autocast", "bf16_autocast", "fp8_autocast")},
    "collectives": ((harness_markers.NEEDS_MULTIPROCESS,), None),
    "device_count": ((harness_markers.NEEDS_DEVICES,), None),
    "memory_stats": ((harness_markers.NOT_ON_BACKEND,), "memory statistics"),
}

#: suite modules whose every test exercises one area (no requirement mark says so)
_MODULE_AREAS = {"test_memory.py": "memory_stats"}


def _mark_areas(mark: Any) -> list[str]:
    name = getattr(mark, "name", "")
    kwargs = dict(getattr(mark, "kwargs", {}) or {})
    if name in ("require_fp16", "require_bf16"):
        dtype = name.removeprefix("require_")
        return [f"{dtype}_autocast" if kwargs.get("amp") is True else dtype]
    if name == "require_fp8":
        return ["fp8"]
    if name == "require_fsdp2":
        return ["collectives"]
    if name in ("require_devices", "require_multi_device"):
        return ["device_count"]
    return []


def item_areas(marks: Iterable[Any], nodeid: str, world_size: int | None) -> list[str]:
    """The capability areas a test instance exercises (``["general"]`` when none)."""
    areas: list[str] = []
    for mark in marks:
        areas.extend(_mark_areas(mark))
    if world_size is not None and world_size > 1:
        areas.append("collectives")
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if module in _MODULE_AREAS:
        areas.append(_MODULE_AREAS[module])
    return list(dict.fromkeys(areas)) or [GENERAL]


def lacks_area(area: str, code: str, message: str) -> bool:
    """Whether a skip with ``code`` and ``message`` says the test's ``area`` is missing."""
    codes, text = _LACKING.get(area, ((), None))
    return code in codes and (text is None or text in message)


def _claimed(declared: Mapping[str, Any], area: str) -> bool:
    value = declared.get(area)
    if area == "device_count":
        return isinstance(value, int) and not isinstance(value, bool) and value > 1
    return value is True


@dataclass
class _Tally:
    applicable: int = 0
    ran: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    contradicted: list[str] = field(default_factory=list)


class ProfileSession:
    """One pytest session's profile: judges skips, tags records, counts coverage (a pytest plugin object)."""

    def __init__(self, profile: Any, known: Any = None):
        self.profile = profile
        self.declared: dict[str, Any] = profile.declared()
        self.known = known
        self.tallies: dict[str, _Tally] = {}
        self.not_claimed: dict[str, int] = {}
        self.expired: list[Any] = []
        self.probes: dict[str, tuple[Any, str]] = {}
        self.disagreements: dict[str, str] = {}

    # ------------------------------------------------------------------ judging skips
    def contradiction(self, areas: Iterable[str], reason: Any, needed_devices: int | None = None) -> str | None:
        """The failure message when a skip ``reason`` (a SkipReason) contradicts a claim, else None."""
        code = getattr(reason, "code", harness_markers.UNSPECIFIED)
        message = str(getattr(reason, "message", reason))
        for area in areas:
            if not _claimed(self.declared, area) or not lacks_area(area, code, message):
                continue
            if area == "device_count" and needed_devices is not None and self.declared[area] < needed_devices:
                continue  # the profile claims fewer devices than this test needs: the skip is honest
            claim = self.declared[area]
            what = f"{claim} devices" if area == "device_count" else area
            return f"[{CLAIM_CONTRADICTED}] profile {self.profile.name!r} declared {what}; skipped: [{code}] {message}"
        return None

    def judge_setup_skip(self, item: pytest.Item, world_size: int | None, reason: Any) -> Any:
        """Called by the plugin before a harness skip: None (and a failure to come) when the skip
        contradicts a claim, else ``reason`` unchanged."""
        message = self.contradiction(item_areas(item.iter_markers(), item.nodeid, world_size), reason,
                                     _needed_devices(item, world_size))
        if message is None:
            return reason
        item.stash[_STASH_CONTRADICTION] = message
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        message = item.stash.get(_STASH_CONTRADICTION, None)
        if message is not None:
            pytest.fail(message, pytrace=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any):
        outcome = yield
        report = outcome.get_result()
        from .params import item_backend

        backend, world = item_backend(item)
        if backend != self.profile.name:
            return
        areas = item_areas(item.iter_markers(), item.nodeid, world)
        extra: dict[str, Any] = {"capability_areas": areas}
        if report.when == "call" and report.skipped and not hasattr(report, "wasxfail"):
            text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
            reason = harness_markers.parse_skip(text)
            message = self.contradiction(areas, reason, _needed_devices(item, world))
            if message is not None:  # a skip in the test body that contradicts a claim
                report.outcome = "failed"
                report.longrepr = message
        if report.failed and report.when == "call" and (
                item.stash.get(_STASH_CONTRADICTION, None) is not None or f"[{CLAIM_CONTRADICTED}]" in str(report.longrepr)):
            report.user_properties.append(("accel_reason_code", CLAIM_CONTRADICTED))
        if report.failed and self.known is not None:
            from .records import device_neutral_id

            test_id = device_neutral_id(item.nodeid, backend)
            live = self.known.match_failure(test_id, item.nodeid, backend, None, report.longreprtext)
            old = self.known.match_failure(test_id, item.nodeid, backend, None, report.longreprtext, include_expired=True)
            if live is None and old is not None:
                extra["expired_known_issue"] = old.id
        report.user_properties.append(("accel_record_extra", extra))

    # ------------------------------------------------------------------ coverage (controller)
    def pytest_runtest_logreport(self, report: Any) -> None:
        # one count per test: its call phase, or its setup phase when it skipped or errored there
        if report.when == "teardown" or (report.when == "setup" and report.passed):
            return
        props = dict(getattr(report, "user_properties", ()) or ())
        if props.get("accel_backend") != self.profile.name or "accel_record_extra" not in props:
            return
        areas = props["accel_record_extra"].get("capability_areas") or [GENERAL]
        for area in areas:
            if area != GENERAL and not _claimed(self.declared, area):
                self.not_claimed[area] = self.not_claimed.get(area, 0) + 1
                continue
            tally = self.tallies.setdefault(area, _Tally())
            tally.applicable += 1
            if report.skipped and not hasattr(report, "wasxfail"):
                tally.skipped += 1
                continue
            tally.ran += 1
            if report.failed:
                tally.failed += 1
                if props.get("accel_reason_code") == CLAIM_CONTRADICTED:
                    tally.contradicted.append(report.nodeid)
            else:
                tally.passed += 1

    def probe(self, backend: Any) -> None:
        """Ask the backend's own probes about every claimed area; disagreements are kept for the header."""
        self.probes = probe_areas(backend)
        self.disagreements = {}
        for area, (value, reason) in self.probes.items():
            claim = self.declared.get(area)
            if area == "device_count":
                if isinstance(claim, int) and not isinstance(claim, bool) and isinstance(value, int) and value < claim:
                    self.disagreements[area] = f"declared {claim} devices; the backend sees {value}"
            elif claim is True and value is False:
                self.disagreements[area] = f"declared {area}; probe: {reason}"

    def header(self, expired: Iterable[Any] = ()) -> dict[str, Any]:
        """What the run header's ``extra["profile"]`` carries (known before any test runs)."""
        p = self.profile
        self.expired = list(expired)
        return {
            "probes": {area: {"value": value, "reason": reason} for area, (value, reason) in self.probes.items()},
            "disagreements": dict(self.disagreements),
            "name": p.name, "device_type": p.device_type, "format": p.format, "version": p.version,
            "path": str(p.path) if p.path else None, "sha256": p.sha256,
            "declared": self.declared,
            "expired_known_issues": [{"id": i.id, "expires": i.expires.isoformat(), "issue": i.issue or i.url}
                                     for i in self.expired],
        }

    def coverage(self) -> dict[str, Any]:
        """Per claimed area: applicable, ran, passed, failed, skipped and the contradicted tests."""
        return {
            "areas": {area: {"applicable": t.applicable, "ran": t.ran, "passed": t.passed, "failed": t.failed,
                             "skipped": t.skipped, "contradicted": t.contradicted}
                      for area, t in sorted(self.tallies.items())},
            "not_claimed": dict(sorted(self.not_claimed.items())),
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        write(f"accel profile {self.profile.name!r} ({self.profile.path}): applicable coverage per area")
        for area, data in self.coverage()["areas"].items():
            bad = f", {len(data['contradicted'])} claim(s) contradicted" if data["contradicted"] else ""
            write(f"  {area}: {data['ran']} of {data['applicable']} ran ({data['passed']} passed, {data['failed']} failed){bad}")
        for area, text in self.disagreements.items():
            write(f"accel profile: claim not borne out by the backend's probe: {area}: {text}", red=True)
        for issue in self.expired:
            write(f"accel profile: known issue {issue.id!r} expired on {issue.expires.isoformat()}: "
                  "its tests' failures count as untracked", yellow=True)


#: area -> the Backend property whose Capability answers it
_PROBES = {"fp16": "supports_fp16", "bf16": "supports_bf16", "fp8": "supports_fp8",
           "fp16_autocast": "supports_fp16_amp", "bf16_autocast": "supports_bf16_amp",
           "memory_stats": "memory_stats_capability"}


def probe_areas(backend: Any) -> dict[str, tuple[Any, str]]:
    """``{area: (value, reason)}`` from the backend's probes: True/False per capability, the device count."""
    out: dict[str, tuple[Any, str]] = {}
    for area, attribute in _PROBES.items():
        try:
            cap = getattr(backend, attribute)
            out[area] = (bool(cap), str(getattr(cap, "reason", "")))
        except Exception as exc:  # a failing probe is evidence too
            out[area] = (False, f"probe failed: {type(exc).__name__}: {exc}")
    try:
        comm = backend.comm_backend
        out["collectives"] = (comm is not None, comm or backend.comm_backend_reason())
    except Exception as exc:
        out["collectives"] = (False, f"probe failed: {type(exc).__name__}: {exc}")
    try:
        out["device_count"] = (int(backend.device_count()), "device_count()")
    except Exception as exc:
        out["device_count"] = (0, f"probe failed: {type(exc).__name__}: {exc}")
    return out


def _needed_devices(item: pytest.Item, world_size: int | None) -> int | None:
    needed = []
    for mark in item.iter_markers():
        if mark.name == "require_devices" and (mark.args or "n" in mark.kwargs):
            value = mark.args[0] if mark.args else mark.kwargs["n"]
            if isinstance(value, int):
                needed.append(value)
        elif mark.name == "require_multi_device":
            needed.append(2)
    if world_size and world_size > 1:
        needed.append(world_size)
    return max(needed) if needed else None


def load_profile_known_issues(profile: Any, extra: Any = None) -> Any:
    """The profile's known issues (merged into ``extra``, a KnownIssues, when given); errors name the line."""
    from .known_issues import KnownIssues, KnownIssuesError

    known = extra if extra is not None else KnownIssues()
    source = f"device profile {profile.path} known_issues"
    try:
        known.extend(profile.known_issues, source)
    except KnownIssuesError as exc:
        match = re.search(r"entry #(\d+)", str(exc))
        if match:
            line = profile.known_issue_lines[int(match.group(1)) - 1]
            if line:
                raise KnownIssuesError(f"{exc} (line {line})") from None
        raise
    return known

"""Known issues as data: a YAML file that links failures to upstream bugs.

The file is a list of entries, or a mapping with one key ``issues`` holding that list::

    issues:
      - id: pytorch-135550                 # required, unique
        url: https://github.com/pytorch/pytorch/issues/135550
        title: all_gather_into_tensor hangs with xccl
        backends: [xpu]                    # optional; default: every backend
        torch: ">=2.5,<2.8"                # optional version specifier (quote it in YAML)
        tests: ["suites/test_collectives.py::test_all_gather*"]   # optional patterns
        ops: ["fft.*"]                     # optional operator patterns (the operator sweep's op names)
        dtypes: [bfloat16]                 # optional: with ops, only these dtypes
        error: "UR_RESULT_ERROR_\\w+"      # optional regex searched in the failure text
        xfail: true                        # optional; default false
        reason: known-limitation           # optional reason code (lower-case words joined by '-')
        issue: https://github.com/...      # optional link to the tracking issue (as url)
        expires: 2026-06-30                # optional date: after it the entry covers nothing

An entry needs ``tests``, ``ops`` or ``error`` (``error`` with either: then both must match). Every condition given
must hold: backend in ``backends``, installed torch in ``torch``, a ``tests`` pattern matching
the test, and ``error`` found (``re.search``) in the failure message/traceback.

Test patterns are matched against the device-neutral test id and the nodeid. Only ``*`` (any
text, ``::`` and ``/`` included) and ``?`` (one character) are wildcards; ``[`` and ``]`` are
literal because test ids carry parameters in brackets. A pattern without ``[`` also matches a test
whose id has a ``[...]`` parameter part (``t.py::test_x`` matches ``t.py::test_x[ws2]``).

An entry whose ``expires`` date has passed no longer covers anything: its failures count as
untracked again, and :meth:`KnownIssues.expired` lists it so the run can say so.

``xfail: true`` lets the plugin report a matching failure as xfailed when asked
(``--known-issues-xfail``); otherwise a match only records the issue id.

Re-running only what known issues cover (``accel qualify --rerun-known``): this module is also a
pytest plugin, loaded with ``-p accel_harness.known_issues``, whose ``--accel-rerun-known YAML``
option keeps only the test instances that an entry's ``tests`` patterns name on a backend (and
torch release) the entry concerns, and deselects the rest. :func:`rerun_verdicts` then says, per
entry, whether its tests now pass.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from accel.facts import yaml_safe
from accel.facts.yaml_safe import preview

__all__ = ["FIELDS", "KnownIssue", "KnownIssues", "KnownIssuesError", "RerunVerdict", "dump_known_issues", "load_known_issues",
           "rerun_verdicts"]

#: the keys an entry may have
FIELDS = ("id", "url", "title", "backends", "torch", "tests", "ops", "dtypes", "error", "xfail", "reason", "issue", "expires")


class KnownIssuesError(ValueError):
    """A known-issues file that cannot be loaded; the message names file, entry and field."""


# ---------------------------------------------------------------------------- patterns
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


_PARAMS = re.compile(r"\A(?P<base>.*?::[^:\[\]]+)\[.*\]\Z", re.DOTALL)


def _without_params(test_id: str) -> str:
    match = _PARAMS.match(test_id)
    return match.group("base") if match else test_id


def _version(value: Any) -> Version | None:
    if value is None:
        return None
    try:
        return Version(Version(str(value)).base_version)
    except InvalidVersion:
        raise ValueError(f"not a torch version: {value!r}") from None


# ---------------------------------------------------------------------------- one issue
@dataclass(frozen=True)
class KnownIssue:
    """One entry of a known-issues file (build it with :meth:`KnownIssues.from_data`)."""

    id: str
    title: str | None = None
    url: str | None = None
    #: lower-case backend names, or None for every backend
    backends: tuple[str, ...] | None = None
    #: torch version specifier text, or None for every version
    torch: str | None = None
    tests: tuple[str, ...] = ()
    #: operator name patterns (the operator sweep's rows), same wildcards as ``tests``
    ops: tuple[str, ...] = ()
    #: with ``ops``: the dtypes the entry covers (empty: every dtype)
    dtypes: tuple[str, ...] = ()
    #: regular expression searched in the failure text
    error: str | None = None
    xfail: bool = False
    #: a reason code for the failure (free text of lower-case words joined by '-')
    reason: str | None = None
    #: link to the tracking issue
    issue: str | None = None
    #: the last day the entry covers failures (None: no end)
    expires: datetime.date | None = None
    #: where the entry came from: ``"path, entry #3"``
    source: str = ""
    _specifier: SpecifierSet | None = field(default=None, repr=False, compare=False)
    _error_regex: re.Pattern[str] | None = field(default=None, repr=False, compare=False)
    _test_regexes: tuple[tuple[re.Pattern[str], bool], ...] = field(default=(), repr=False, compare=False)
    _op_regexes: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def applies_to(self, backend: str | None, torch_version: Any = None) -> bool:
        """Backend and torch filters: does the issue concern this backend and torch release?

        An issue restricted to some backends never applies to ``backend=None``; an unknown
        ``torch_version`` (None) does not exclude anything.
        """
        if self.backends is not None and (backend or "").lower() not in self.backends:
            return False
        version = _version(torch_version)
        if self._specifier is not None and version is not None:
            return self._specifier.contains(version, prereleases=True)
        return True

    def is_expired(self, today: datetime.date | None = None) -> bool:
        """Whether ``expires`` lies before ``today`` (default: the current date)."""
        return self.expires is not None and self.expires < (today or datetime.date.today())

    def matches_test(self, test_id: str | None, nodeid: str | None = None) -> bool:
        """Whether a ``tests`` pattern matches the test (False when the entry has none)."""
        names = [n for n in (test_id, nodeid) if n]
        for regex, literal_brackets in self._test_regexes:
            for name in names:
                if regex.match(name):
                    return True
                if not literal_brackets and regex.match(_without_params(name)):
                    return True
        return False

    def matches_op(self, op: str, dtype: str | None = None) -> bool:
        """Whether an ``ops`` pattern matches the operator (and ``dtypes``, when given, the dtype)."""
        if self.dtypes and dtype not in self.dtypes:
            return False
        return any(regex.match(op) for regex in self._op_regexes)

    def matches_text(self, text: str | None) -> bool:
        """Whether the ``error`` regex is found in ``text`` (False when the entry has none)."""
        return bool(self._error_regex is not None and text and self._error_regex.search(text))

    def as_dict(self) -> dict[str, Any]:
        """The entry as file data (fields that are not set are left out)."""
        data: dict[str, Any] = {
            "id": self.id, "title": self.title, "url": self.url,
            "backends": list(self.backends) if self.backends is not None else None,
            "torch": self.torch, "tests": list(self.tests) or None, "ops": list(self.ops) or None,
            "dtypes": list(self.dtypes) or None, "error": self.error,
            "reason": self.reason, "issue": self.issue,
            "expires": self.expires.isoformat() if self.expires is not None else None,
        }
        data = {k: v for k, v in data.items() if v is not None}
        data["xfail"] = self.xfail
        return data


# ---------------------------------------------------------------------------- validation
class _EntryError(Exception):
    def __init__(self, key: str | None, problem: str):
        self.key = key
        self.problem = problem


def _strings(key: str, value: Any, lower: bool = False) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise _EntryError(key, f"expected a string or a non-empty list of strings, got {preview(value)}")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise _EntryError(key, f"expected non-empty strings, got {preview(item)}")
        out.append(item.strip().lower() if lower else item.strip())
    return tuple(out)


def _optional_text(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _EntryError(key, f"expected a string, got {preview(value)} ({type(value).__name__})")
    return value.strip() or None


def _date(key: str, value: Any) -> datetime.date | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise _EntryError(key, f"expected a date written YYYY-MM-DD, got {preview(value)}")


def _parse_entry(entry: Any, source: str) -> KnownIssue:
    if not isinstance(entry, Mapping):
        raise _EntryError(None, f"expected a mapping with at least id and tests/error, got {type(entry).__name__} {preview(entry)}")
    for key in entry:
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known fields: {', '.join(FIELDS)})"
            raise _EntryError(str(key), f"unknown field{hint}")
    issue_id = entry.get("id")
    if isinstance(issue_id, bool) or not isinstance(issue_id, (str, int)) or not str(issue_id).strip():
        raise _EntryError("id", "every entry needs an id (a non-empty string)" if issue_id is None else f"expected a non-empty string, got {preview(issue_id)}")
    issue_id = str(issue_id).strip()
    title = _optional_text("title", entry.get("title"))
    url = _optional_text("url", entry.get("url"))
    backends = _strings("backends", entry["backends"], lower=True) if entry.get("backends") is not None else None
    spec_text = entry.get("torch")
    specifier = None
    if spec_text is not None:
        if not isinstance(spec_text, str) or not spec_text.strip():
            raise _EntryError("torch", f"expected a version specifier string such as '>=2.5,<2.8' (quoted in YAML), got {preview(spec_text)}")
        try:
            specifier = SpecifierSet(spec_text)
        except InvalidSpecifier as exc:
            raise _EntryError("torch", f"not a version specifier: {preview(spec_text)} ({exc}); write e.g. '>=2.5,<2.8'") from None
        spec_text = str(spec_text).strip()
    tests = _strings("tests", entry["tests"]) if entry.get("tests") is not None else ()
    error = entry.get("error")
    regex = None
    if error is not None:
        if not isinstance(error, str) or not error:
            raise _EntryError("error", f"expected a regular expression string, got {preview(error)}")
        try:
            regex = re.compile(error)
        except re.error as exc:
            raise _EntryError("error", f"bad regular expression {preview(error)}: {exc}") from None
    ops = _strings("ops", entry["ops"]) if entry.get("ops") is not None else ()
    dtypes = _strings("dtypes", entry["dtypes"], lower=True) if entry.get("dtypes") is not None else ()
    if dtypes and not ops:
        raise _EntryError("dtypes", "dtypes narrows ops: give ops (operator patterns) too")
    if not tests and not ops and error is None:
        raise _EntryError("tests", "an entry needs tests (patterns), ops (operator patterns), error (a regex), or a pattern and error")
    xfail = entry.get("xfail", False)
    if not isinstance(xfail, bool):
        raise _EntryError("xfail", f"expected true or false, got {preview(xfail)}")
    reason = _optional_text("reason", entry.get("reason"))
    if reason is not None and not re.fullmatch(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", reason):
        raise _EntryError("reason", f"expected a reason code such as 'known-limitation' (lower-case words joined by '-'), got {preview(reason)}")
    issue = _optional_text("issue", entry.get("issue"))
    expires = _date("expires", entry.get("expires"))
    return KnownIssue(
        id=issue_id, title=title, url=url, backends=backends, torch=spec_text, tests=tests, ops=ops, dtypes=dtypes,
        error=error, xfail=xfail, reason=reason, issue=issue, expires=expires, source=source, _specifier=specifier, _error_regex=regex,
        _test_regexes=tuple((_pattern_regex(p), "[" in p) for p in tests),
        _op_regexes=tuple(_pattern_regex(p) for p in ops),
    )


# ---------------------------------------------------------------------------- the collection
class KnownIssues:
    """The known issues of a run, in file order (the first match wins)."""

    def __init__(self, issues: Iterable[KnownIssue] = ()):
        self.issues: list[KnownIssue] = []
        self._by_id: dict[str, KnownIssue] = {}
        for issue in issues:
            self.add(issue)

    def add(self, issue: KnownIssue) -> None:
        if issue.id in self._by_id:
            first = self._by_id[issue.id]
            raise KnownIssuesError(f"{issue.source}: duplicate known issue id {issue.id!r} (first defined at {first.source})")
        self.issues.append(issue)
        self._by_id[issue.id] = issue

    @classmethod
    def from_data(cls, data: Any, source: str = "<data>") -> "KnownIssues":
        """Issues from already-parsed YAML data (a list, or a mapping with ``issues``)."""
        issues = cls()
        issues.extend(data, source)
        return issues

    def extend(self, data: Any, source: str) -> None:
        if data is None:
            return
        if isinstance(data, Mapping):
            unknown = [k for k in data if k != "issues"]
            if unknown:
                close = difflib.get_close_matches(str(unknown[0]), ["issues"], n=1)
                hint = "; did you mean 'issues'?" if close else ""
                raise KnownIssuesError(f"{source}: unknown top-level key {preview(unknown[0])}{hint} (expected a list of entries or a mapping with 'issues')")
            data = data.get("issues")
            if data is None:
                return
        if not isinstance(data, list):
            raise KnownIssuesError(f"{source}: expected a list of known-issue entries (or 'issues:' holding one), got {type(data).__name__}")
        for number, entry in enumerate(data, start=1):
            label = f"{source}, entry #{number}"
            try:
                issue = _parse_entry(entry, label)
            except _EntryError as exc:
                raw_id = entry.get("id") if isinstance(entry, Mapping) else None
                ident = f" (id {preview(raw_id)})" if raw_id is not None else ""
                fld = f": field {exc.key!r}" if exc.key else ""
                raise KnownIssuesError(f"{label}{ident}{fld}: {exc.problem}") from None
            self.add(issue)

    def __iter__(self) -> Iterator[KnownIssue]:
        return iter(self.issues)

    def __len__(self) -> int:
        return len(self.issues)

    def __contains__(self, issue_id: object) -> bool:
        return issue_id in self._by_id

    def get(self, issue_id: str) -> KnownIssue | None:
        return self._by_id.get(issue_id)

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.issues]

    def expired(self, today: datetime.date | None = None) -> list[KnownIssue]:
        """The entries whose ``expires`` date has passed: they cover nothing any more."""
        return [issue for issue in self.issues if issue.is_expired(today)]

    def match_failure(self, test_id: str | None, nodeid: str | None, backend: str | None,
                      torch_version: Any, text: str | None, *, today: datetime.date | None = None,
                      include_expired: bool = False) -> KnownIssue | None:
        """The first issue this failure matches, or None.

        ``text`` is the failure message and/or traceback the ``error`` regex is searched in.
        Expired entries are passed over unless ``include_expired`` (to name the entry that
        used to cover a failure).
        """
        for issue in self.issues:
            if not include_expired and issue.is_expired(today):
                continue
            if not issue.applies_to(backend, torch_version):
                continue
            if issue.tests and not issue.matches_test(test_id, nodeid):
                continue
            if issue.ops and not issue.tests:  # an operator entry covers sweep rows, not tests
                continue
            if issue.error is not None and not issue.matches_text(text):
                continue
            return issue
        return None

    def match_op(self, op: str, dtype: str | None, backend: str | None, torch_version: Any, text: str | None, *,
                 today: datetime.date | None = None) -> KnownIssue | None:
        """The first unexpired issue whose ``ops`` patterns cover this failing operator row, or None."""
        for issue in self.issues:
            if not issue.ops or issue.is_expired(today) or not issue.applies_to(backend, torch_version):
                continue
            if not issue.matches_op(op, dtype):
                continue
            if issue.error is not None and not issue.matches_text(text):
                continue
            return issue
        return None

    def match_test(self, test_id: str | None, nodeid: str | None, backend: str | None,
                   torch_version: Any) -> list[KnownIssue]:
        """Issues whose ``tests`` patterns name this test on this backend and torch release.

        For a *passing* test these are "tracked passes": the issue may be fixed (consider closing
        it). Issues matched by ``error`` alone cannot name a test and never appear here.
        """
        return [
            issue for issue in self.issues
            if issue.tests and not issue.is_expired() and issue.applies_to(backend, torch_version) and issue.matches_test(test_id, nodeid)
        ]


def load_known_issues(*paths: str | os.PathLike[str]) -> KnownIssues:
    """Load and merge known-issues YAML files; ids must be unique across them."""
    issues = KnownIssues()
    for raw in paths:
        path = Path(raw)
        try:
            data = yaml_safe.read(path)
        except FileNotFoundError:
            raise KnownIssuesError(f"known issues file {path} not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise KnownIssuesError(f"known issues file {path} cannot be read: {exc}") from None
        except yaml_safe.YamlError as exc:
            where = f" line {exc.line}" if exc.line else ""
            where += f", column {exc.column}" if exc.line and exc.column else ""
            problem = exc.problem if exc.refused else f"not valid YAML: {exc.problem}"
            raise KnownIssuesError(f"known issues file {path}{where}: {problem}") from None
        issues.extend(data, str(path))
    return issues


def dump_known_issues(issues: Iterable[KnownIssue], path: str | os.PathLike[str]) -> Path:
    """Write ``issues`` as a known-issues YAML file (what :func:`load_known_issues` reads back)."""
    import yaml

    target = Path(path)
    target.write_text(yaml.safe_dump({"issues": [issue.as_dict() for issue in issues]}, sort_keys=False,
                                     allow_unicode=True), encoding="utf-8")
    return target


# ---------------------------------------------------------------------------- re-running what they cover
@dataclass(frozen=True)
class RerunVerdict:
    """What re-running one entry's tests found: ``status`` is ``now-passes`` (every covered test that
    ran passed: the entry can go), ``still-fails``, ``not-run`` (its tests were all skipped or not
    selected here) or ``not-rerunnable`` (an entry matched by error text alone names no test)."""

    issue: KnownIssue
    status: str
    passed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def line(self) -> str:
        """The console sentence for this entry."""
        ran = len(self.passed) + len(self.failed)
        if self.status == "now-passes":
            return f"known issue {self.issue.id} now passes ({len(self.passed)} of {ran} test(s)): remove it"
        if self.status == "still-fails":
            return (f"known issue {self.issue.id} still fails ({len(self.failed)} of {ran} test(s), e.g. "
                    f"{self.failed[0]})")
        if self.status == "not-run":
            return f"known issue {self.issue.id}: none of its tests ran here ({len(self.skipped)} skipped)"
        return f"known issue {self.issue.id}: matched by error text only, it names no test to re-run"


def rerun_verdicts(issues: Iterable[KnownIssue], records: Iterable[Mapping[str, Any]],
                   torch_version: Any = None) -> list[RerunVerdict]:
    """Per entry, from test records (``nodeid``, ``test_id``, ``backend``, ``outcome``): whether the
    tests its ``tests`` patterns name now pass. A test counts for an entry only on the backends and
    torch release the entry concerns; xfailed counts as failing (the failure is still there),
    xpassed as passing."""
    records = list(records)
    verdicts = []
    for issue in issues:
        if not issue.tests:
            verdicts.append(RerunVerdict(issue, "not-rerunnable"))
            continue
        passed, failed, skipped = [], [], []
        for rec in records:
            backend = rec.get("backend")
            if not issue.applies_to(backend, torch_version) or not issue.matches_test(rec.get("test_id"), rec.get("nodeid")):
                continue
            outcome = rec.get("outcome")
            name = str(rec.get("nodeid"))
            if outcome in ("passed", "xpassed"):
                passed.append(name)
            elif outcome in ("failed", "error", "xfailed"):
                failed.append(name)
            else:
                skipped.append(name)
        status = "still-fails" if failed else ("now-passes" if passed else "not-run")
        verdicts.append(RerunVerdict(issue, status, tuple(passed), tuple(failed), tuple(skipped)))
    return verdicts


def pytest_addoption(parser: Any) -> None:
    """``--accel-rerun-known YAML``: run only the tests the file's entries name (this module as a ``-p`` plugin)."""
    parser.getgroup("accel").addoption(
        "--accel-rerun-known", dest="accel_rerun_known", metavar="YAML", default=None,
        help="run only the test instances that this known-issues file's test patterns name (on the backends and "
             "torch release each entry concerns); the rest are deselected")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep only the instances a known issue covers (when ``--accel-rerun-known`` is given)."""
    path = config.getoption("accel_rerun_known", None)
    if not path:
        return
    from importlib import metadata

    from .params import item_backend
    from .records import device_neutral_id

    try:
        issues = [i for i in load_known_issues(path) if i.tests]
    except KnownIssuesError as exc:
        import pytest

        raise pytest.UsageError(f"--accel-rerun-known: {exc}") from None
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    kept, dropped = [], []
    for item in items:
        backend, _ = item_backend(item)
        test_id = device_neutral_id(item.nodeid, backend)
        covered = any(issue.applies_to(backend, torch_version) and issue.matches_test(test_id, item.nodeid)
                      for issue in issues)
        (kept if covered else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

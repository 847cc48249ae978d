"""pytest ``--junitxml`` files (``*.xml``) as test rows, parsed with :mod:`xml.etree.ElementTree`, which
never fetches external entities or DTDs. The harness's ``accel_backend``/``accel_world_size``/
``accel_known_issue`` test properties and ``run_id``/``torch_version``/``accel_version``/``backend``
suite properties are used when present. A file cut short keeps the test cases read before the break.
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from accel.facts.backends import BUILTIN_BACKENDS
from accel_harness.records import Problem, device_neutral_id, failure_signature, first_error_line

from .display import display_path, display_text, line_of, short

__all__ = ["ROW_TEXT", "load_junit"]

#: a test row's text fields, made displayable wherever the row comes from
ROW_TEXT = ("nodeid", "test_id", "backend", "when", "reason_code", "message", "signature", "traceback", "known_issue")


def _junit_nodeid(case: ET.Element) -> str:
    classname = case.get("classname") or ""
    name = case.get("name") or "?"
    file_attr = case.get("file")
    parts = classname.split(".") if classname else []
    if file_attr:
        module = file_attr.replace("\\", "/")
        module_parts = module[:-3].split("/") if module.endswith(".py") else module.split("/")
        classes = parts[len(module_parts):]
        return "::".join([module, *classes, name])
    # pytest writes "pkg.module.Class": the module ends before the first capitalised part
    split = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    module = "/".join(parts[:split]) + ".py" if split else ""
    return "::".join([p for p in [module, *parts[split:], name] if p])


def _junit_backend(nodeid: str) -> str | None:
    match = re.search(r"\[(.*)\]\Z", nodeid)
    if not match:
        return None
    tokens = match.group(1).split("-")
    # a built-in backend's name among the id's parameters, when the file carries no ``accel_backend`` property
    return next((b for b in BUILTIN_BACKENDS if b in tokens), None)


def _properties(element: ET.Element) -> dict[str, str]:
    props = {}
    container = element.find("properties")
    if container is not None:
        for prop in container.findall("property"):
            if prop.get("name"):
                props[prop.get("name")] = prop.get("value") or ""
    return props


def _junit_case(case: ET.Element, suite_props: dict[str, str], bad: list[tuple[str, str, str]] | None = None) -> dict[str, Any]:
    """One ``<testcase>`` as a test row; attributes of a wrong type go to ``bad`` as
    ``(nodeid, field, message)`` and are left empty."""
    props = _properties(case)
    nodeid = _junit_nodeid(case)
    backend = props.get("accel_backend") or suite_props.get("backend") or _junit_backend(nodeid)
    world = props.get("accel_world_size")
    outcome, when, reason_code, message, text = "passed", "call", None, None, None
    for child in case:
        tag = child.tag
        if tag in ("failure", "error"):
            text = (child.text or "").strip() or child.get("message") or ""
            message = child.get("message") or first_error_line(text)
            if tag == "failure":
                outcome = "failed"
            else:  # pytest: "failed on setup/teardown with ..."
                outcome = "error"
                lowered = (child.get("message") or "").lower()
                when = "teardown" if "teardown" in lowered else "setup"
            break
        if tag == "skipped":
            if (child.get("type") or "") == "pytest.xfail":
                outcome, message = "xfailed", child.get("message")
            else:
                from accel_harness.markers import parse_skip

                outcome = "skipped"
                reason = parse_skip(child.get("message") or (child.text or ""))
                reason_code, message = reason.code, reason.message
            break
    try:
        world_size = int(world) if world not in (None, "", "None") else None
    except ValueError:
        world_size = None
        if bad is not None:
            bad.append((nodeid, "accel_world_size", f"property 'accel_world_size': expected an integer, got {short(world)}"))
    try:
        duration = float(case.get("time") or 0.0)
        if not math.isfinite(duration):
            raise ValueError
    except ValueError:
        duration = 0.0
        if bad is not None:
            bad.append((nodeid, "time", f"attribute 'time': expected a number of seconds, got {short(case.get('time'))}"))
    return {
        "nodeid": nodeid,
        "test_id": device_neutral_id(nodeid, backend),
        "backend": backend,
        "world_size": world_size,
        "outcome": outcome,
        "duration": duration,
        "when": when,
        "reason_code": reason_code,
        "message": message,
        "signature": failure_signature(text) if text else None,
        "traceback": text,
        "known_issue": props.get("accel_known_issue") or None,
        "tracked_pass": None,
    }


def load_junit(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[Problem]]:
    """One pytest ``--junitxml`` file: ``(run row, test rows, problems)``.

    Parsed incrementally: a file cut short (or broken further down) keeps the test cases completed
    before the error, and a case whose ``<failure>``/``<error>`` had begun at the break (it failed,
    whatever the rest said); the ``"unreadable"`` problem names the line. A ``time`` attribute or
    ``accel_world_size`` property that is no number is an ``"invalid"`` problem (the field is left
    empty). External entities are never fetched.
    """
    path = Path(path)
    where = display_path(path)
    problems: list[Problem] = []
    raw = path.read_bytes()
    if not raw.strip():
        return None, [], [Problem(where, 1, "empty file: no JUnit XML", "unreadable")]
    rows: list[dict[str, Any]] = []
    bad: list[tuple[str, str, str]] = []
    suite_attrs: dict[str, str] = {}
    suite_props: dict[str, str] = {}
    pending_cases: list[ET.Element] = []
    current: ET.Element | None = None
    try:
        with open(path, "rb") as fh:
            for event, element in ET.iterparse(fh, events=("start", "end")):
                tag = element.tag
                if event == "start":
                    if tag == "testsuite" and not suite_attrs:
                        suite_attrs = dict(element.attrib)
                    elif tag == "testcase":
                        current = element
                    continue
                if tag == "properties" and current is None and not suite_props:
                    suite_props = {p.get("name"): p.get("value") or "" for p in element.findall("property") if p.get("name")}
                elif tag == "testcase":
                    current = None
                    pending_cases.append(element)
                    if len(pending_cases) >= 256:  # convert and free them as we go
                        rows.extend(_junit_case(c, suite_props, bad) for c in pending_cases)
                        for c in pending_cases:
                            c.clear()
                        pending_cases = []
    except (ET.ParseError, RecursionError, ValueError) as exc:
        position = getattr(exc, "position", None)
        line = position[0] if position else 0
        kept = ""
        # a test case cut at the break whose <failure>/<error> had begun still failed: keep it
        if current is not None and any(child.tag in ("failure", "error") for child in current):
            partial = _junit_case(current, suite_props)
            partial["message"] = (partial["message"] or "") + " [cut short: the JUnit file breaks inside this test case]"
            rows.extend(_junit_case(c, suite_props, bad) for c in pending_cases)
            pending_cases = []
            rows.append(partial)
            kept = f"; the test case cut at the break ({partial['nodeid']}) is kept as {partial['outcome']}"
        problems.append(Problem(where, line, f"not well-formed XML ({exc}); test cases before it are kept{kept}", "unreadable"))
    rows.extend(_junit_case(c, suite_props, bad) for c in pending_cases)
    text = None
    for nodeid, fld, message in bad:
        text = text if text is not None else raw.decode("utf-8", errors="replace")
        name = nodeid.rsplit("::", 1)[-1]
        problems.append(Problem(where, line_of(text, f'name="{name}"'), f"test case {nodeid!r}: {message}; the field is left empty",
                                "invalid"))
    if not suite_attrs and not rows:
        if not problems:
            problems.append(Problem(where, 1, "no <testsuite> element: not a pytest --junitxml file", "unreadable"))
        return None, [], problems
    for row in rows:
        for name in ROW_TEXT:
            value = row.get(name)
            if isinstance(value, str) and not value.isascii():
                row[name] = display_text(value)
    suite_attrs = {k: display_text(v) for k, v in suite_attrs.items()}
    suite_props = {k: display_text(v) for k, v in suite_props.items()}
    timestamp = suite_attrs.get("timestamp")
    run_id = suite_props.get("run_id") or f"junit:{display_path(path.stem)}" + (f"@{timestamp}" if timestamp else "")
    backends = sorted({r["backend"] for r in rows if r["backend"]})
    run = {
        "run_id": run_id,
        "source": where,
        "format": "junit",
        "backends": ", ".join(backends),
        "torch_version": suite_props.get("torch_version"),
        "torch_build": suite_props.get("torch_build"),
        "accel_version": suite_props.get("accel_version"),
        "host": suite_attrs.get("hostname"),
        "start_time": timestamp,
        "end_time": None,
        "interrupted": any(p.kind == "unreadable" for p in problems),
        "records": len(rows),
        "device_models": "",
        "git_commit": suite_props.get("git_commit"),
    }
    return run, rows, problems

"""A run's results: collection errors from the JUnit file, completed records, the run's status and a summary."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .common import _run
from .install import InstallResult
from .skips import SkipRule, classify_skip, load_skip_table
from .source import Suite

#: a run's status: it ran; nothing ran because collection failed; nothing was collected; it was cut short
STATUSES = ("completed", "collection-failed", "no-tests", "interrupted")


@dataclass
class SuiteRun:
    """One run of a suite on one backend."""

    backend: str
    against: str
    status: str
    exit_code: int | None
    results: Path | None
    log: Path
    counts: dict[str, int]
    collection_errors: int
    seconds: float


def junit_collection_errors(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Modules that failed (or skipped) at collection, from a pytest ``--junitxml`` file:
    ``[{"nodeid", "outcome" ("error"/"skipped"), "text"}]``."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in tree.iter("testcase"):
        for child in case:
            message = child.get("message") or ""
            if child.tag == "error" and message == "collection failure":
                outcome = "error"
            elif child.tag == "skipped" and message == "collection skipped":
                outcome = "skipped"
            else:
                continue
            classname = case.get("classname") or ""
            name = case.get("name") or ""
            module = (classname + "." + name).strip(".") if classname else name
            parts = module.split(".")
            nodeid = "/".join(parts) + ".py" if parts and parts[-1] else module
            out.append({"nodeid": nodeid, "outcome": outcome, "text": child.text or message})
    return out


def complete_records(raw: str | os.PathLike[str] | None, out: str | os.PathLike[str], *, backend: str,
                     upstream: Mapping[str, Any], exit_code: int | None, collection: Sequence[Mapping[str, str]] = (),
                     rules: Sequence[SkipRule] | None = None, header_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``out``: the harness results file ``raw`` completed for an upstream run.

    Every record gets ``backend``; skips with no harness reason code get one from the skip table;
    ``collection`` entries (see :func:`junit_collection_errors`) become records of their module
    (``extra.phase = "collection"``); the header's ``extra["upstream"]`` gets ``upstream`` plus the
    run's ``status``, ``exit_code`` and ``collection_errors``. Without ``raw`` (pytest stopped
    before the session started) a header is made from ``header_defaults``. Returns the upstream block.
    """
    from ..markers import UNSPECIFIED
    from ..records import RecordWriter, make_record, new_run_id, read_records, utc_now

    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    end_time = None
    interrupted = raw is None
    if raw is not None:
        header, records, _problems = read_records(raw)
        if header is not None:
            interrupted = bool(header.get("interrupted"))
            end_time = header.get("end_time")
    if header is None:
        header = {"run_id": new_run_id(), "start_time": utc_now(), **dict(header_defaults or {})}
    header = {k: v for k, v in header.items() if k not in ("type", "end_time", "run_end", "interrupted")}
    header["backends"] = [backend]
    for key in ("device_models", "device_count", "driver_versions", "runtime_versions", "comm_backends"):
        if isinstance(header.get(key), dict):
            header[key] = {k: v for k, v in header[key].items() if k == backend}
    rules = load_skip_table() if rules is None else rules
    run_id = str(header["run_id"])
    seen = set()
    completed = []
    for rec in records:
        rec = {k: v for k, v in rec.items() if k != "type"}
        rec["backend"] = backend
        rec["test_id"] = rec.get("nodeid")
        if rec.get("outcome") == "skipped" and rec.get("reason_code") in (None, UNSPECIFIED):
            rec["reason_code"] = classify_skip(rec.get("message"), rules)
        seen.add(rec.get("nodeid"))
        completed.append(rec)
    errors = 0
    for entry in collection:
        if entry["nodeid"] in seen:
            continue
        seen.add(entry["nodeid"])
        errors += entry["outcome"] == "error"
        record = make_record(run_id=run_id, nodeid=entry["nodeid"], backend=backend, outcome=entry["outcome"],
                             when="setup", text=entry["text"] if entry["outcome"] == "error" else entry["text"],
                             extra={"phase": "collection"}).to_dict()
        if entry["outcome"] == "skipped":
            record["reason_code"] = classify_skip(entry["text"], rules) if record["reason_code"] == UNSPECIFIED else record["reason_code"]
        record.pop("type", None)
        completed.append(record)
    ran = [r for r in completed if (r.get("extra") or {}).get("phase") != "collection"]
    if interrupted and exit_code not in (0, 1, 5):
        status = "interrupted" if ran else "collection-failed"
    elif not ran and (errors or exit_code not in (0, 1, 5)):
        status = "collection-failed"
    elif not ran:
        status = "no-tests"
    elif interrupted:
        status = "interrupted"
    else:
        status = "completed"
    block = {**dict(upstream), "status": status, "exit_code": exit_code, "collection_errors": errors}
    header.setdefault("extra", {})
    header["extra"] = {**(header.get("extra") or {}), "upstream": block}
    # a run cut short stays marked so: its run_end line says ``interrupted`` (read_records flags it)
    cut_short = {"interrupted": True} if interrupted and status == "interrupted" else {}
    writer = RecordWriter(out, header)
    try:
        for rec in completed:
            writer.write(rec)
    finally:
        writer.close(end_time=end_time or utc_now(), upstream_status=status, **cut_short)
    return block


def _finish(suite: Suite, backend: str, side: str, raw_dir: Path, junit: Path, final: Path, exit_code: int | None,
            install: InstallResult | None, rewritten: int, log: Path | None = None,
            python: str | None = None) -> dict[str, Any]:
    raws = sorted(raw_dir.glob("*.jsonl")) if raw_dir.is_dir() else []
    collection = junit_collection_errors(junit)
    if not raws and not collection and exit_code not in (0, 1, 5, None) and log is not None and log.is_file():
        # pytest stopped before its session began (a conftest or plugin that does not import, a
        # usage error): the log's tail is the reason, recorded against the test folder itself
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-40:])
        collection = [{"nodeid": suite.tests_dir.name, "outcome": "error", "text": tail}]
    against_version = _installed_version(side, python)
    upstream = {"project": suite.project, "version": suite.version, "against": side, "against_version": against_version,
                "suite": suite.label, "source": suite.source, "rewritten_files": rewritten,
                "install": install.to_dict() if install is not None else None}
    defaults = _header_defaults()
    return complete_records(raws[-1] if raws else None, final, backend=backend, upstream=upstream, exit_code=exit_code,
                            collection=collection, header_defaults=defaults)


def _installed_version(name: str, python: str | None = None) -> str | None:
    from importlib import metadata

    if python and python != sys.executable:  # asked of the suite's own environment
        code = "import sys\nfrom importlib import metadata\ntry:\n    print(metadata.version(sys.argv[1]))\nexcept Exception:\n    pass\n"
        proc = _run([python, "-c", code, name])
        return (proc.stdout or "").strip() or None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _header_defaults() -> dict[str, Any]:
    import platform

    return {"accel_version": _installed_version("accel"), "torch_version": (_installed_version("torch") or "").split("+")[0] or None,
            "python": platform.python_version(), "os": platform.platform(), "host": platform.node(),
            "schema": "accel.results", "schema_version": "1.0"}


def summary_line(suite: Suite, run: SuiteRun) -> str:
    """``accelerate 1.15.0 against accel on cpu: completed — 313 passed, 20 failed, 4 errors, 120 skipped``."""
    parts = [f"{run.counts.get(o, 0)} {o}" for o in ("passed", "failed", "error", "skipped") if run.counts.get(o)]
    return (f"{suite.label} against {run.against} on {run.backend}: {run.status}"
            + (f" — {', '.join(parts)}" if parts else "") + (f" ({run.collection_errors} modules failed to import)" if run.collection_errors else ""))


def write_summary(path: str | os.PathLike[str], suite: Suite, runs: Sequence[SuiteRun], install: InstallResult | None) -> None:
    """A JSON summary of an upstream qualification (``--json``)."""
    data = {
        "suite": suite.label, "project": suite.project, "version": suite.version, "source": suite.source,
        "extras": suite.extras, "requirements": suite.requirements,
        "install": install.to_dict() if install is not None else None,
        "runs": [{"backend": r.backend, "against": r.against, "status": r.status, "exit_code": r.exit_code,
                  "counts": r.counts, "collection_errors": r.collection_errors, "seconds": round(r.seconds, 1),
                  "results": str(r.results) if r.results else None, "log": str(r.log)} for r in runs],
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

"""Text a record derives from a test's report: device-neutral ids, failure signatures, truncation.

Pure string functions, apart from the writer and reader, because the reports group and match
results with them too (:mod:`accel_reports.load.junit`, :mod:`accel_harness.known_issues`).
"""

from __future__ import annotations

import re

#: longest signature (characters)
SIGNATURE_LIMIT = 300


def truncate(text: str | None, limit: int) -> str | None:
    """``text`` cut to at most ``limit`` characters, keeping its head and (longer) tail."""
    if text is None or len(text) <= limit:
        return text
    marker = "\n... [{} characters truncated] ...\n"
    room = max(limit - len(marker.format(len(text))), 0)
    head = room // 4
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else "")



# ---------------------------------------------------------------------------- device-neutral ids
_NODEID_PARAMS = re.compile(r"\A(?P<base>.*?::[^:\[\]]+)\[(?P<params>.*)\]\Z", re.DOTALL)


def device_neutral_id(nodeid: str, backend_name: str | None) -> str:
    """``nodeid`` without the backend's parametrization id, so one test lines up across backends.

    ``suites/test_a.py::test_x[cpu-ws2]`` -> ``suites/test_a.py::test_x[ws2]``;
    ``t.py::test_y[cuda]`` -> ``t.py::test_y``; ``t.py::test_z[fp16-xpu-ws4]`` ->
    ``t.py::test_z[fp16-ws4]``. The plugin must use the backend name as the backend's id; only
    the first occurrence of it among the ``-``-separated ids is removed.
    """
    if not backend_name:
        return nodeid
    match = _NODEID_PARAMS.match(nodeid)
    if not match:
        return nodeid
    tokens = match.group("params").split("-")
    needle = backend_name.split("-")
    for i in range(len(tokens) - len(needle) + 1):
        if tokens[i:i + len(needle)] == needle:
            del tokens[i:i + len(needle)]
            break
    else:
        return nodeid
    rest = "-".join(tokens)
    return match.group("base") + (f"[{rest}]" if rest else "")


# ---------------------------------------------------------------------------- failure signatures
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PYTEST_E_LINE = re.compile(r"^E(?:\s+(?P<text>.*))?$")
_EXCEPTION_LINE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout|Fault)\w*|Failed))"
    r"(?::\s*(?P<message>.*))?$"
)
_LOCATION_PREFIX = re.compile(r"^(?:[A-Za-z]:)?[^\s:]+:\d+: ")
_TRACEBACK_NOISE = (
    "Traceback (most recent call last):",
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def _candidate_lines(text: str) -> list[str]:
    text = _ANSI.sub("", text)
    lines = text.splitlines()
    e_lines = []
    for line in lines:
        match = _PYTEST_E_LINE.match(line.rstrip())
        if match and match.group("text"):
            e_lines.append(match.group("text").strip())
    if e_lines:  # pytest longrepr: the "E   " lines are the error
        return e_lines
    out = []
    for line in lines:  # a plain traceback: exception lines are not indented
        stripped = line.rstrip()
        if not stripped or stripped[0].isspace() or stripped in _TRACEBACK_NOISE:
            continue
        out.append(_LOCATION_PREFIX.sub("", stripped, count=1))  # --tb=line: "path:12: Error: ..."
    return out


def first_error_line(text: str | None) -> str | None:
    """The first line naming the error in ``text`` (pytest longrepr or a plain traceback).

    Prefers the first ``SomeError: message`` line (in a chained traceback, the root cause), then
    the first ``assert ...`` line, then the first ``E`` line (pytest) or non-indented line.
    """
    if not text or not text.strip():
        return None
    candidates = _candidate_lines(text)
    if not candidates:
        return text.strip().splitlines()[0].strip()
    for line in candidates:
        if _EXCEPTION_LINE.match(line):
            return line
    for line in candidates:
        if line.startswith("assert "):
            return line
    return candidates[0]


_DEVICE_NAMES = "cuda|xpu|hpu|mps|npu|mlu|musa|privateuseone|meta"
_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    # memory addresses
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<ADDR>"),
    # absolute paths (posix, home, windows) and relative paths ending in a file extension
    (re.compile(r"(?:(?<=\s)|(?<=^)|(?<=[\"'(\[=:]))(?:~|[A-Za-z]:)?(?:[\\/][\w.\-+@~]+)+[\\/]?"), "<PATH>"),
    (re.compile(r"\b[\w.\-]+(?:/[\w.\-]+)+\.[A-Za-z]\w*\b"), "<PATH>"),
    # uuid / long hex ids (git commits, request ids)
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<ID>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b"), "<ID>"),
    # sizes (2.00 GiB, 512 MiB, 1024 bytes): one placeholder whatever the unit
    (re.compile(r"(?<!\w)\d+(?:\.\d+)?\s*(?:[KMGTPE]i?B|B|bytes)(?!\w)"), "<SIZE>"),
    # device indices: cuda:0, xpu:3 -> <device>:<N> keeps the device type
    (re.compile(rf"\b({_DEVICE_NAMES}):\d+\b"), r"\1:<N>"),
    # numbers (ints, decimals, versions, exponents; a time/ratio suffix kept), not parts of
    # identifiers such as fp16
    (re.compile(r"(?<!\w)[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?((?:ms|us|ns|s|x|%)?)(?!\w)"), r"<N>\1"),
]
_CALLS = re.compile(r"\b(tensor|array|Parameter|Tensor)\(")


def _strip_calls(line: str) -> str:
    """Replace the contents of ``tensor(...)``/``array(...)`` with ``<VALUE>`` (brackets balanced)."""
    out = []
    pos = 0
    while True:
        match = _CALLS.search(line, pos)
        if not match:
            out.append(line[pos:])
            return "".join(out)
        out.append(line[pos:match.end()])
        depth = 1
        i = match.end()
        while i < len(line) and depth:
            if line[i] in "([{":
                depth += 1
            elif line[i] in ")]}":
                depth -= 1
            i += 1
        out.append("<VALUE>)" if depth == 0 else "<VALUE>")
        pos = i


def _normalise(line: str) -> str:
    line = _strip_calls(line)
    for pattern, replacement in _NORMALISERS:
        line = pattern.sub(replacement, line)
    line = re.sub(r"\s+", " ", line).strip()
    return line


def failure_signature(text: str | None) -> str | None:
    """The noise-free first error line of ``text``, for grouping failures by root cause.

    Numbers become ``<N>``, sizes (``2.00 GiB``, ``512 MiB``) ``<SIZE>``, addresses ``<ADDR>``,
    file paths ``<PATH>``, tensor/array contents ``<VALUE>``, long hex ids ``<ID>``, device indices
    ``cuda:<N>``; whitespace is collapsed. Two OOMs that differ only in sizes,
    or the same assertion on ``cuda:0`` and ``cuda:1``, give the same signature.
    """
    line = first_error_line(text)
    if line is None:
        return None
    signature = _normalise(line)
    if len(signature) > SIGNATURE_LIMIT:
        signature = signature[: SIGNATURE_LIMIT - 3] + "..."
    return signature

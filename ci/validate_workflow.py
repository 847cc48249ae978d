"""Check the nightly workflow against the matrix, so the two cannot drift apart unnoticed.

    python -m ci.validate_workflow [--workflow .github/workflows/nightly.yml] [--matrix ci/matrix.yaml]

Checks (each problem is reported with the workflow's line):

* the file parses as YAML and has ``on`` (PyYAML reads an unquoted ``on`` key as the boolean true;
  both spellings are accepted) with a ``schedule`` (cron) and ``workflow_dispatch``, and ``jobs``;
* every job has ``runs-on`` (or ``uses``), its ``needs`` name jobs that exist, and the needs have
  no cycle;
* every ``needs.JOB`` in a job's expressions names a job it needs, and ``needs.JOB.outputs.NAME`` an
  output that job declares; every ``steps.ID.outputs.NAME`` names a step of the same job, and for a
  step running ``ci.plan`` an output that ci.plan writes;
* the cells job (the one whose ``strategy.matrix`` is ``fromJSON(needs.PLAN.outputs.NAME)``) reads
  the output that ci.plan writes the matrix to, from a plan step that runs ``ci.plan`` on this
  matrix file, and runs ``ci.run_cell``;
* every ``matrix.KEY`` used in a job is a key of its matrix: for the cells job, a key that every
  expanded cell has (disabled ones too).

Exit status: 0 when the workflow is consistent, 1 with the problems listed, 2 when a file cannot be
read or the matrix file is broken.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ci.matrix import DEFAULT_MATRIX, REPO, Matrix, MatrixError, _Document, load_matrix
from ci.plan import OUTPUT_NAME, PLAN_OUTPUTS

DEFAULT_WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"

_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_MATRIX_REF = re.compile(r"(?<![\w.])matrix\.([A-Za-z_][\w-]*)")
_NEEDS_REF = re.compile(r"(?<![\w.])needs\.([A-Za-z_][\w-]*)(?:\.outputs\.([A-Za-z_][\w-]*))?")
_STEPS_REF = re.compile(r"(?<![\w.])steps\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w-]*)")
_FROM_JSON = re.compile(r"^\s*\$\{\{\s*fromJSON\(\s*needs\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w-]*)\s*\)\s*\}\}\s*$")
_STEP_OUTPUT = re.compile(r"^\s*\$\{\{\s*steps\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w-]*)\s*\}\}\s*$")


class WorkflowError(MatrixError):
    what = "workflow file"


@dataclass(frozen=True)
class Problem:
    message: str
    line: int | None = None

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass
class Validation:
    path: Path
    problems: list[Problem]
    cells_job: str | None = None
    plan_job: str | None = None
    matrix_keys: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _strings(value: Any, path: tuple) -> list[tuple[tuple, str]]:
    """Every string in ``value`` with its key path."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _strings(v, path + (k,))]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in _strings(v, path + (i,))]
    return []


def _expressions(job: dict[str, Any], base: tuple) -> list[tuple[tuple, str]]:
    """The expression texts of a job: ``${{ ... }}`` anywhere, and whole ``if:`` values."""
    found = []
    for path, text in _strings(job, base):
        if path and path[-1] == "if":
            found.append((path, text))
        found += [(path, m.group(1)) for m in _EXPRESSION.finditer(text)]
    return found


def _needs(job: dict[str, Any]) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else [n for n in needs if isinstance(n, str)] if isinstance(needs, list) else []


def _plan_matrix_path(run: str) -> Path | None:
    """The ``--matrix`` a ``ci.plan`` command line names (None: the default)."""
    for line in run.splitlines():
        if "ci.plan" not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word == "--matrix" and i + 1 < len(words):
                return Path(words[i + 1])
            if word.startswith("--matrix="):
                return Path(word.split("=", 1)[1])
    return None


def validate_workflow(workflow: str | Path = DEFAULT_WORKFLOW, matrix: Matrix | str | Path | None = None) -> Validation:
    """Check ``workflow`` against ``matrix`` (a loaded Matrix or a path; default ci/matrix.yaml).

    Raises WorkflowError when the workflow is not readable YAML, MatrixError for a broken matrix;
    returns the problems found otherwise.
    """
    path = Path(workflow)
    if not isinstance(matrix, Matrix):
        matrix = load_matrix(matrix)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError(f"cannot be read: {exc}", path) from None
    doc = _Document(path, text, WorkflowError, "expected `on:` and `jobs:`")
    result = Validation(path=path, problems=[])

    def problem(message: str, at: tuple = ()) -> None:
        line = None
        probe = tuple(at)
        while probe and line is None:
            line = doc.lines.get(probe)
            probe = probe[:-1]
        result.problems.append(Problem(message, line if line is not None else doc.lines.get(())))

    data = doc.data
    if not isinstance(data, dict):
        problem("expected a mapping with `on` and `jobs`")
        return result
    on_key = "on" if "on" in data else True if True in data else None  # PyYAML's yaml.safe_load gives True
    if on_key is None:
        problem("no `on:` triggers")
    else:
        triggers = data[on_key]
        names = set(triggers) if isinstance(triggers, dict) else {triggers} if isinstance(triggers, str) else set(triggers or [])
        if "schedule" not in names:
            problem("no `schedule` trigger: the nightly must run by itself", (on_key,))
        elif isinstance(triggers, dict):
            crons = triggers.get("schedule")
            if not isinstance(crons, list) or not all(isinstance(c, dict) and isinstance(c.get("cron"), str) for c in crons):
                problem("`schedule` must be a list of `- cron: \"...\"` entries", (on_key, "schedule"))
        if "workflow_dispatch" not in names:
            problem("no `workflow_dispatch` trigger: the nightly must be startable by hand", (on_key,))

    jobs = data.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        problem("no jobs", ("jobs",))
        return result

    for name, job in jobs.items():
        at = ("jobs", name)
        if not isinstance(job, dict):
            problem(f"job {name!r} is not a mapping", at)
            continue
        if "runs-on" not in job and "uses" not in job:
            problem(f"job {name!r} has no `runs-on`", at)
        for need in _needs(job):
            if need not in jobs:
                problem(f"job {name!r} needs {need!r}, which is not a job here (jobs: {', '.join(jobs)})", at + ("needs",))
            elif need == name:
                problem(f"job {name!r} needs itself", at + ("needs",))
    # cycles
    state: dict[str, int] = {}

    def visit(job: str, trail: list[str]) -> None:
        if state.get(job) == 2 or job not in jobs or not isinstance(jobs[job], dict):
            return
        if state.get(job) == 1:
            problem("jobs need each other in a cycle: " + " -> ".join(trail + [job]), ("jobs", job, "needs"))
            return
        state[job] = 1
        for need in _needs(jobs[job]):
            if need != job:
                visit(need, trail + [job])
        state[job] = 2

    for job in jobs:
        visit(job, [])

    cells = matrix.cells(include_disabled=True)
    every_cell_key = set.intersection(*(set(c.github()) for c in cells)) if cells else set()
    result.matrix_keys = tuple(sorted(every_cell_key))

    for name, job in jobs.items():
        if not isinstance(job, dict):
            continue
        at = ("jobs", name)
        needs = _needs(job)
        step_ids = {s.get("id"): s for s in job.get("steps") or [] if isinstance(s, dict) and s.get("id")}
        strategy = job.get("strategy") if isinstance(job.get("strategy"), dict) else {}
        job_matrix = strategy.get("matrix")
        dynamic = _FROM_JSON.match(job_matrix) if isinstance(job_matrix, str) else None
        if dynamic:
            keys: set[str] | None = every_cell_key
            plan_job, output = dynamic.groups()
            result.cells_job, result.plan_job = name, plan_job
            _check_plan_link(jobs, plan_job, output, matrix, problem, at + ("strategy", "matrix"))
            runs = " ".join(str(s.get("run", "")) for s in job.get("steps") or [] if isinstance(s, dict))
            if "ci.run_cell" not in runs:
                problem(f"job {name!r} runs the matrix cells but no step runs `python -m ci.run_cell`", at + ("steps",))
        elif isinstance(job_matrix, dict):
            keys = {k for k in job_matrix if k not in ("include", "exclude")}
            for entry in job_matrix.get("include") or []:
                if isinstance(entry, dict):
                    keys |= set(entry)
        elif job_matrix is not None:
            keys = None  # some other expression: cannot know its keys
        else:
            keys = set()
        for where, expression in _expressions(job, at):
            for match in _MATRIX_REF.finditer(expression):
                key = match.group(1)
                if keys is not None and key not in keys:
                    if dynamic:
                        problem(f"job {name!r} uses matrix.{key}, but not every cell of {matrix.path.name} has it "
                                f"(cell keys: {', '.join(sorted(keys))})", where)
                    elif not keys:
                        problem(f"job {name!r} uses matrix.{key} but has no strategy.matrix", where)
                    else:
                        problem(f"job {name!r} uses matrix.{key}, which its matrix does not define", where)
            for match in _NEEDS_REF.finditer(expression):
                other, out = match.groups()
                if other not in needs:
                    problem(f"job {name!r} reads needs.{other} but does not list {other!r} in `needs`", where)
                elif out and isinstance(jobs.get(other), dict) and out not in (jobs[other].get("outputs") or {}):
                    problem(f"job {name!r} reads needs.{other}.outputs.{out}, which job {other!r} does not declare", where)
            for match in _STEPS_REF.finditer(expression):
                step_id, out = match.groups()
                if step_id not in step_ids:
                    problem(f"job {name!r} reads steps.{step_id}, but it has no step with id {step_id!r}", where)
                elif "ci.plan" in str(step_ids[step_id].get("run", "")) and out not in PLAN_OUTPUTS:
                    problem(f"step {step_id!r} runs ci.plan, which writes the outputs {', '.join(PLAN_OUTPUTS)}, not {out!r}", where)
    if result.cells_job is None:
        problem(f"no job runs the cells: expected `strategy.matrix: ${{{{ fromJSON(needs.<plan job>.outputs.{OUTPUT_NAME}) }}}}`", ("jobs",))
    return result


def _check_plan_link(jobs: dict[str, Any], plan_job: str, output: str, matrix: Matrix, problem: Any, at: tuple) -> None:
    job = jobs.get(plan_job)
    if not isinstance(job, dict):
        return  # reported as a missing need
    outputs = job.get("outputs") or {}
    if output not in outputs:
        problem(f"the cells' matrix reads needs.{plan_job}.outputs.{output}, which job {plan_job!r} does not declare", at)
        return
    link = _STEP_OUTPUT.match(str(outputs[output]))
    if not link:
        problem(f"job {plan_job!r} output {output!r} should be ${{{{ steps.<id>.outputs.{OUTPUT_NAME} }}}}", ("jobs", plan_job, "outputs", output))
        return
    step_id, step_output = link.groups()
    steps = [s for s in job.get("steps") or [] if isinstance(s, dict) and s.get("id") == step_id]
    if not steps:
        problem(f"job {plan_job!r} has no step with id {step_id!r}", ("jobs", plan_job, "outputs", output))
        return
    run = str(steps[0].get("run", ""))
    if "ci.plan" not in run:
        problem(f"step {step_id!r} of job {plan_job!r} does not run `python -m ci.plan`", ("jobs", plan_job, "steps"))
        return
    if step_output != OUTPUT_NAME:
        problem(f"the cells' matrix comes from step output {step_output!r}, but ci.plan writes it to {OUTPUT_NAME!r}",
                ("jobs", plan_job, "outputs", output))
    if "--format" in run and "--format github" not in run and "--format=github" not in run:
        problem(f"step {step_id!r} must run ci.plan with --format github to write the matrix output", ("jobs", plan_job, "steps"))
    named = _plan_matrix_path(run)
    planned = (REPO / named).resolve() if named is not None else DEFAULT_MATRIX.resolve()
    if planned != matrix.path.resolve():
        problem(f"the plan step reads {planned}, not the matrix file being checked ({matrix.path})", ("jobs", plan_job, "steps"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.validate_workflow", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflow", default=str(DEFAULT_WORKFLOW), metavar="YAML", help="workflow file (default: .github/workflows/nightly.yml)")
    parser.add_argument("--matrix", default=str(DEFAULT_MATRIX), metavar="YAML", help="matrix file (default: ci/matrix.yaml)")
    args = parser.parse_args(argv)
    try:
        result = validate_workflow(args.workflow, args.matrix)
    except MatrixError as exc:
        print(f"ci.validate_workflow: error: {exc}", file=sys.stderr)
        return 2
    if result.problems:
        for item in result.problems:
            print(f"{result.path}: {item}", file=sys.stderr)
        print(f"ci.validate_workflow: {len(result.problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"ci.validate_workflow: {result.path} is consistent with {args.matrix}: job {result.plan_job!r} plans, "
          f"job {result.cells_job!r} runs the cells with matrix keys {', '.join(result.matrix_keys)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

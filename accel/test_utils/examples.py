"""Checks that a "complete" example script carries every feature of the ``examples/by_feature`` scripts.

Accelerate's ``tests/test_examples.py`` compares, section by section (``main()`` for the argument
parser, ``training_function()`` for the loop), what a feature script adds to the plain
``examples/nlp_example.py`` template with what the complete script adds to it: whatever the feature
adds that the complete script lacks is the difference, and an empty difference passes. Paths are
taken as Accelerate takes them: the template is ``examples/nlp_example.py`` under the current folder.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

__all__ = ["clean_lines", "compare_against_test", "get_function_contents_by_name"]

#: where each section ends: the next top-level piece the example scripts always have after it
_SECTION_END = {"training_function": "def main", "main": "if __name__"}
#: the template's data loading line, replaced by mocked loaders in tests (never a feature of its own)
_DATALOADER_LINE = "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)"
#: marks a test-only statement in the feature scripts; it and the statement after it are skipped
_MOCK_MARKER = "TESTING_MOCKED_DATALOADERS"


def clean_lines(lines: Iterable[str]) -> list[str]:
    """``lines`` without blank lines and comment lines (their meaning is not a feature)."""
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def get_function_contents_by_name(lines: list[str], name: str) -> list[str]:
    """The lines of function ``name`` (``training_function`` or ``main``), from its ``def`` up to the
    section that follows it in every example script (``def main`` / ``if __name__``)."""
    if name not in _SECTION_END:
        raise ValueError(f"Incorrect function name passed: {name}, choose either 'main' or 'training_function'")
    section: list[str] = []
    for line in lines:
        if not section:
            if f"def {name}" in line:
                section.append(line)
            continue
        if _SECTION_END[name] in line:
            break
        section.append(line)
    return section


def _read(path: str | os.PathLike[str]) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return fh.readlines()


def _added(lines: list[str], template: list[str]) -> list[str]:
    """What ``lines`` add to ``template``: lines it does not have, without the mocked-loader parts."""
    added: list[str] = []
    skip_next = False
    for line in lines:
        if skip_next:
            skip_next = False
            continue
        if _MOCK_MARKER in line:
            skip_next = True  # the statement under the marker only exists for the tests
            continue
        if line in template or line.strip() == _DATALOADER_LINE:
            continue
        added.append(line)
    return added


def compare_against_test(base_filename: str | os.PathLike[str], feature_filename: str | os.PathLike[str],
                         parser_only: bool, secondary_filename: Optional[str | os.PathLike[str]] = None) -> list[str]:
    """Lines a feature script adds to the template that the complete script ``base_filename`` lacks.

    ``parser_only`` compares the ``main()`` sections (the argument parser), else the
    ``training_function()`` sections. ``secondary_filename`` (e.g. ``examples/cv_example.py`` for
    ``complete_cv_example.py``): what the nlp template has and that script's section lacks is not
    counted as missing. An empty list means the complete script has every feature.
    """
    section = "main" if parser_only else "training_function"
    template_file = _read(os.path.abspath(os.path.join("examples", "nlp_example.py")))
    template = clean_lines(get_function_contents_by_name(template_file, section))
    feature = clean_lines(get_function_contents_by_name(_read(feature_filename), section))
    base = clean_lines(get_function_contents_by_name(_read(base_filename), section))
    missing = [line for line in _added(feature, template) if line not in _added(base, template)]
    if secondary_filename is not None:
        secondary = clean_lines(get_function_contents_by_name(_read(secondary_filename), section))
        template_only = {line for line in template_file if line not in secondary}
        missing = [line for line in missing if line not in template_only]
    return missing

"""Trackers that write files under the logging directory: JSON lines, a wide CSV, TensorBoard event files."""

from __future__ import annotations

import contextlib
import csv
import importlib
import json
import logging
import os
import tempfile
import time
from typing import Any

from ..io.files import atomic_write
from .base import GeneralTracker, on_main_process
from .values import _cell, _check_mapping, _flatten, _step, to_serialisable

logger = logging.getLogger(__name__)


def _write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and an atomic rename."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class _FileTracker(GeneralTracker):
    """Shared parts of the trackers that write into ``{logging_dir}/{run_name}/``."""

    requires_logging_directory = True
    filename = ""

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any):
        super().__init__()
        if kwargs:
            raise TypeError(f"the {self.name!r} tracker takes no init_kwargs; got {', '.join(sorted(kwargs))}")
        self.run_name = run_name
        self.logging_dir_param = os.fspath(logging_dir)
        self.logging_dir = os.path.join(self.logging_dir_param, run_name)
        self.path = os.path.join(self.logging_dir, self.filename)
        self.config_path = os.path.join(self.logging_dir, "config.json")
        self._file: Any = None
        self._finished = False

    @property
    def tracker(self) -> Any:
        """The open metrics file (None before ``start`` and after ``finish``)."""
        return self._file

    def _require_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"the {self.name!r} tracker for {self.run_name!r} was finished; it cannot log any more")
        if self._file is None:
            self.start()

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Write ``values`` to ``config.json`` (atomically: a crash leaves the old file or the new one)."""
        _check_mapping(values, "store_init_configuration")
        data = to_serialisable(values)
        os.makedirs(self.logging_dir, exist_ok=True)
        _write_json_atomic(self.config_path, data)

    @on_main_process
    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._finished = True


class JSONTracker(_FileTracker):
    """Metrics as JSON Lines in ``{logging_dir}/{run_name}/metrics.jsonl`` (appended, flushed per call).

    Each line is ``{"step": step or null, "values": {...}, "time": unix seconds}``. Non-finite
    floats are written as ``NaN``/``Infinity`` (Python's json reads them back).
    """

    name = "json"
    filename = "metrics.jsonl"

    @on_main_process
    def start(self) -> None:
        if self._file is not None:
            return
        os.makedirs(self.logging_dir, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._finished = False
        logger.debug("json tracker %r logging to %s", self.run_name, self.path)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"the 'json' tracker's log takes no keyword arguments; got {', '.join(sorted(kwargs))}")
        record = {"step": _step(step), "values": to_serialisable(values), "time": time.time()}
        line = json.dumps(record)
        self._require_open()
        self._file.write(line + "\n")
        self._file.flush()


class CSVTracker(_FileTracker):
    """Metrics in wide CSV, ``{logging_dir}/{run_name}/metrics.csv``, a row per ``log`` call.

    Columns: ``step``, ``time``, then each metric in order of first appearance (nested dicts become
    ``parent/child``; empty cells for metrics a call did not log). A new metric rewrites the file
    with the wider header (temporary file + atomic rename), so an interrupted rewrite leaves the
    previous file intact. An existing file is appended to, keeping its columns.
    """

    name = "csv"
    filename = "metrics.csv"
    fixed_columns = ("step", "time")

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any):
        super().__init__(run_name, logging_dir, **kwargs)
        self.columns: list[str] = list(self.fixed_columns)
        self._writer: Any = None

    @on_main_process
    def start(self) -> None:
        if self._file is not None:
            return
        os.makedirs(self.logging_dir, exist_ok=True)
        existing = self._read_header()
        if existing:
            self.columns = existing + [c for c in self.columns if c not in existing]
            if existing != self.columns:
                self._rewrite(self.columns)
        else:
            with open(self.path, "w", encoding="utf-8", newline="") as fh:
                csv.writer(fh).writerow(self.columns)
        self._open_for_append()
        self._finished = False
        logger.debug("csv tracker %r logging to %s", self.run_name, self.path)

    def _read_header(self) -> list[str]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8", newline="") as fh:
            return next(csv.reader(fh), [])

    def _open_for_append(self) -> None:
        self._file = open(self.path, "a", encoding="utf-8", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, restval="", extrasaction="raise")

    def _rewrite(self, columns: list[str]) -> None:
        """Copy the file under a wider header into a temporary file, then rename it over the old one."""
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".csv", dir=self.logging_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
                writer = csv.DictWriter(out, fieldnames=columns, restval="")
                writer.writeheader()
                if os.path.exists(self.path):
                    with open(self.path, encoding="utf-8", newline="") as src:
                        for row in csv.DictReader(src):
                            writer.writerow({k: v for k, v in row.items() if k is not None})
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"the 'csv' tracker's log takes no keyword arguments; got {', '.join(sorted(kwargs))}")
        flat = _flatten(to_serialisable(values))
        clash = [k for k in flat if k in self.fixed_columns]
        if clash:
            raise ValueError(f"the csv tracker reserves the column(s) {clash}; rename the logged key(s)")
        self._require_open()
        new = [k for k in flat if k not in self.columns]
        if new:
            self._file.close()
            self._file = None
            self.columns = self.columns + new
            self._rewrite(self.columns)
            self._open_for_append()
        row = {"step": "" if step is None else _step(step), "time": repr(time.time())}
        row.update({k: _cell(v) for k, v in flat.items()})
        self._writer.writerow(row)
        self._file.flush()


def _tensorboard_available() -> bool:
    from ..utils.imports import is_tensorboard_available

    return is_tensorboard_available()


def _summary_writer_class() -> Any:
    """``SummaryWriter`` from ``torch.utils.tensorboard``, else ``tensorboardX``, else a clear ImportError."""
    errors = []
    for module in ("torch.utils.tensorboard", "tensorboardX"):
        try:
            return importlib.import_module(module).SummaryWriter
        except ImportError as exc:
            errors.append(f"{module}: {exc}")
    raise ImportError(
        "log_with='tensorboard' needs the `tensorboard` package, which is not installed: "
        "`pip install tensorboard` (or install `tensorboardX`). Import errors: " + "; ".join(errors)
    )


class TensorBoardTracker(GeneralTracker):
    """TensorBoard event files in ``{logging_dir}/{run_name}/``.

    ``init_kwargs["tensorboard"]`` goes to ``SummaryWriter``; ``log_kwargs["tensorboard"]`` to
    ``add_scalar`` / ``add_text`` / ``add_scalars``. Numbers (and one-element tensors) become
    scalars, strings text, dicts of numbers ``add_scalars`` groups. The config is written with
    ``add_hparams`` and to ``config.json``.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = os.fspath(logging_dir)
        self.logging_dir = os.path.join(self.logging_dir_param, run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        if self.writer is None:
            self.writer = _summary_writer_class()(self.logging_dir, **self.init_kwargs)
            logger.debug("tensorboard tracker %r logging to %s", self.run_name, self.logging_dir)

    def _require_writer(self) -> Any:
        if self.writer is None:
            self.start()
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        data = to_serialisable(values)
        hparams = {k: (v if isinstance(v, (bool, int, float, str)) else json.dumps(v)) for k, v in _flatten(data).items()}
        writer = self._require_writer()
        writer.add_hparams(hparams, metric_dict={})
        writer.flush()
        os.makedirs(self.logging_dir, exist_ok=True)
        _write_json_atomic(os.path.join(self.logging_dir, "config.json"), data)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        writer = self._require_writer()
        step = _step(step)
        for key, value in to_serialisable(values).items():
            if isinstance(value, (int, float)):  # bool included
                writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
                writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                raise TypeError(
                    f"cannot log {key!r} to tensorboard: {type(value).__name__} values are not supported "
                    "(numbers, strings and dicts of numbers are)"
                )
        writer.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``add_images`` for each name -> batch of images (N, C, H, W by default)."""
        writer = self._require_writer()
        for key, images in values.items():
            writer.add_images(key, images, global_step=_step(step), **kwargs)
        writer.flush()

    @on_main_process
    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()

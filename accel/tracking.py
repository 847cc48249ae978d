"""Experiment trackers with Accelerate's interface, plus the trackers accel ships.

``Accelerator(log_with=...)`` names the trackers; ``Accelerator.init_trackers`` builds them through
:func:`init_trackers` on the main process only (the other processes get none and log nothing).
accel implements three trackers, all writing under ``{logging_dir}/{project_name}/``:

``"json"`` (:class:`JSONTracker`)
    ``metrics.jsonl``: one JSON object per ``log`` call, ``{"step": ..., "values": {...}, "time": ...}``,
    appended and flushed per call so a killed run keeps everything logged so far. ``config.json``
    (the ``init_trackers`` config) is written atomically.
``"csv"`` (:class:`CSVTracker`)
    ``metrics.csv`` in wide format: columns ``step``, ``time``, then one column per metric in the
    order metrics first appear; a row per ``log`` call, empty cells for metrics not logged in that
    call. When a new metric appears the file is rewritten with the wider header into a temporary
    file that atomically replaces the old one, so an interrupted rewrite leaves the previous file
    intact. Nested dicts become ``parent/child`` columns. ``config.json`` as for ``"json"``.
``"tensorboard"`` (:class:`TensorBoardTracker`)
    ``torch.utils.tensorboard.SummaryWriter`` (or ``tensorboardX``). The ``tensorboard`` package
    is optional; asking for this tracker without it raises an ``ImportError`` naming the package.

Accelerate's third-party trackers, each importing its package only when started:
:class:`WandBTracker` ("wandb"), :class:`MLflowTracker` ("mlflow"), :class:`AimTracker` ("aim"),
:class:`CometMLTracker` ("comet_ml"), :class:`ClearMLTracker` ("clearml"), :class:`DVCLiveTracker`
("dvclive"), :class:`SwanLabTracker` ("swanlab"), :class:`TrackioTracker` ("trackio"). Each also runs
offline / locally (``WANDB_MODE=offline``, a ``file://`` MLflow URI, a local Aim repo, comet
``online=False``, ``Task.set_offline(True)``, ``SWANLAB_MODE=local``). Asking for one whose package is
missing raises an ``ImportError`` naming the package (Accelerate drops it silently).

``"all"`` selects every tracker available here. A :class:`GeneralTracker` instance in ``log_with``
is used as is; :func:`register_tracker_class` makes a custom tracker class selectable by name.

Logged values may be Python scalars, strings, ``None``, one-element tensors or numpy scalars
(converted with ``.item()``) and, for json, lists and dicts of those; anything else raises a
``TypeError`` naming the key.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib
import importlib.util
import json
import logging
import math
import numbers
import os
import tempfile
import time
import warnings
from enum import Enum
from typing import Any, Callable

from .utils.dataclasses import LoggerType
from .utils.files import atomic_write

__all__ = [
    "AimTracker",
    "CSVTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONTracker",
    "LOGGER_TYPE_TO_CLASS",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "get_tracker",
    "init_trackers",
    "on_main_process",
    "register_tracker_class",
]

logger = logging.getLogger(__name__)



def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run a tracker method on the main process only when the tracker's ``main_process_only`` is true.

    The process is checked when the method runs, not when the tracker is built.
    """

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False):
            from .state import PartialState

            if not PartialState().is_main_process:
                return None
        return function(self, *args, **kwargs)

    return wrapper


class GeneralTracker:
    """Base class of every tracker.

    A subclass defines ``name`` (str), ``requires_logging_directory`` (bool) and a ``tracker``
    property (the underlying object: a writer, a run, a file), and overrides ``start``,
    ``store_init_configuration``, ``log`` and ``finish`` as needed. Methods decorated with
    :func:`on_main_process` run on the main process only while ``main_process_only`` is true (the
    default). Built-in trackers are constructed as ``cls(project_name, logging_dir, **init_kwargs)``
    when they need a directory, else ``cls(project_name, **init_kwargs)``; ``start()`` then opens
    files or connections.
    """

    main_process_only = True

    def __init__(self, _blank: bool = False):
        if _blank:
            return
        missing = [attr for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if "tracker" not in dir(self):  # a property: only its presence on the class can be checked
            missing.append("tracker")
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} is missing the tracker attribute(s) "
                f"{', '.join('`' + m + '`' for m in missing)}; define them in the class"
            )

    def start(self) -> None:
        """Open files or connections; called by ``init_trackers`` once the process group exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Record the run's hyperparameters ``values``."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (metric name -> value), optionally at ``step``."""

    def finish(self) -> None:
        """Flush and close whatever the tracker holds."""


# ---------------------------------------------------------------------- value conversion
def _plain(key: str, value: Any, nested: bool) -> Any:
    """``value`` as a JSON-ready Python value, or a TypeError naming ``key``.

    Tensors and numpy values with one element become Python numbers; with ``nested`` lists,
    tuples and dicts are converted item by item.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (e.g. a str enum) as its plain text
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Enum):
        return _plain(key, value.value, nested)
    numel = _element_count(value)
    if numel is not None:
        if numel != 1:
            shape = tuple(getattr(value, "shape", ()))
            raise TypeError(
                f"cannot log {key!r}: a {type(value).__name__} of shape {shape} is not a scalar; "
                "log one number per key (e.g. tensor.mean())"
            )
        return _plain(key, value.item(), nested)
    if nested and isinstance(value, dict):
        return {_key(k, key): _plain(f"{key}/{k}", v, nested) for k, v in value.items()}
    if nested and isinstance(value, (list, tuple)):
        return [_plain(f"{key}[{i}]", v, nested) for i, v in enumerate(value)]
    raise TypeError(
        f"cannot log {key!r}: values of type {type(value).__module__}.{type(value).__qualname__} are not "
        "serialisable; log numbers, strings, booleans, None or one-element tensors"
    )


def _element_count(value: Any) -> int | None:
    """Element count of a tensor or numpy array/scalar, None for anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel()
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        size = getattr(value, "size", None)
        if isinstance(size, int) and hasattr(value, "item"):
            return size
    return None


def _key(key: Any, parent: str | None = None) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (int, Enum)) and not isinstance(key, bool):
        return str(key.value if isinstance(key, Enum) else key)
    where = f" inside {parent!r}" if parent else ""
    raise TypeError(f"tracker keys must be strings; got {key!r} ({type(key).__name__}){where}")


def _check_mapping(values: Any, what: str) -> None:
    if not isinstance(values, dict):
        raise TypeError(f"{what} takes a dict of name -> value, got {type(values).__name__}")


def to_serialisable(values: dict, nested: bool = True) -> dict[str, Any]:
    """``values`` with every value converted for JSON (see the module docstring)."""
    _check_mapping(values, "log")
    return {_key(k): _plain(_key(k), v, nested) for k, v in values.items()}


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``parent/child`` keys; lists as JSON text (one CSV cell each)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix=f"{name}/"))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def _write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and an atomic rename."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# ---------------------------------------------------------------------- file trackers
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
    """Metrics in wide CSV, ``{logging_dir}/{run_name}/metrics.csv``; see the module docstring.

    Columns: ``step``, ``time``, then each metric in order of first appearance. A new metric
    rewrites the file with the wider header (temporary file + atomic rename). An existing file is
    appended to, keeping its columns.
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


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # nan, inf, -inf: what float() reads back
    if isinstance(value, float):
        return repr(value)
    return value


def _step(step: Any) -> int | None:
    if step is None:
        return None
    if isinstance(step, numbers.Integral) and not isinstance(step, bool):
        return int(step)
    if _element_count(step) == 1:
        return _step(step.item())
    raise TypeError(f"step must be an int or None, got {step!r}")


# ---------------------------------------------------------------------- tensorboard
def _tensorboard_available() -> bool:
    from .utils.imports import is_tensorboard_available

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


# ---------------------------------------------------------------------- third-party trackers
# Each imports its package only in start() (or in the method that needs it), so building a tracker
# neither imports the package nor touches the process group (Accelerate's "deferred initialisation").
def _import_tracker_package(tracker: str, module: str, install: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"the {tracker!r} tracker needs the {install} package, which is not installed "
                          f"(pip install {install}): {exc}") from exc


def _warn_dropped(tracker: str, key: str, value: Any, what: str) -> None:
    logger.warning(f"{tracker}: dropped {key!r} = {value!r} ({type(value).__name__}): {what}")


class _ProjectRunTracker(GeneralTracker):
    """Trackers whose package exposes ``init(project=...)`` returning a run with ``log``/``finish`` and a
    module-level ``config`` (wandb, trackio, swanlab). Built on the main process only unless the
    package itself coordinates processes (``main_process_only`` False, as in Accelerate)."""

    requires_logging_directory = False
    main_process_only = False
    _module = ""
    _install = ""

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def _package(self) -> Any:
        return _import_tracker_package(self.name, self._module, self._install)

    @on_main_process
    def start(self) -> None:
        """Open the run: ``<package>.init(project=run_name, **init_kwargs)``."""
        self.run = self._package().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The package's run object."""
        return self.run

    def _require_run(self) -> Any:
        if self.run is None:
            raise RuntimeError(f"the {self.name!r} tracker was not started: call accelerator.init_trackers(...) first")
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Add ``values`` to the run's config (changing values allowed)."""
        self._require_run()
        self._package().config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self._require_run().log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Close the run."""
        if self.run is not None:
            self.run.finish()


class WandBTracker(_ProjectRunTracker):
    """Weights & Biases (``wandb.init(project=run_name, **kwargs)``); ``WANDB_MODE=offline`` keeps it local."""

    name = "wandb"
    _module, _install = "wandb", "wandb"

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log each list of images under its key as ``wandb.Image``s."""
        wandb = self._package()
        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """Log a ``wandb.Table`` built from ``columns``+``data`` or a pandas ``dataframe``."""
        wandb = self._package()
        self.log({table_name: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step=step, **kwargs)


class TrackioTracker(_ProjectRunTracker):
    """trackio (local-first, ``trackio.init(project=run_name, **kwargs)``)."""

    name = "trackio"
    _module, _install = "trackio", "trackio"


class SwanLabTracker(_ProjectRunTracker):
    """SwanLab (``swanlab.init(project=run_name, **kwargs)``); ``SWANLAB_MODE=local`` keeps it local."""

    name = "swanlab"
    _module, _install = "swanlab", "swanlab"

    @on_main_process
    def start(self) -> None:
        """Open the run and record which framework drives it."""
        super().start()
        self._package().config["FRAMEWORK"] = "accel"

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log each list of images under its key as ``swanlab.Image``s."""
        swanlab = self._package()
        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)


class CometMLTracker(GeneralTracker):
    """Comet (``comet_ml.start(project_name=run_name, **kwargs)``; ``online=False`` writes an offline archive).

    Numbers are logged as metrics, strings as "other" values, dicts as metric groups.
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        """Start (or resume) the experiment."""
        comet_ml = _import_tracker_package(self.name, "comet_ml", "comet_ml")
        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``comet_ml`` experiment."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Log ``values`` as the experiment's parameters."""
        self.writer.log_parameters(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log numbers as metrics, strings as others, dicts as metric groups (at ``step`` when given)."""
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            if isinstance(value, bool) or isinstance(value, numbers.Number):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
            else:
                _warn_dropped(self.name, key, value, "comet_ml logs numbers, strings and dicts")

    @on_main_process
    def finish(self) -> None:
        """End the experiment (writes the offline archive)."""
        if self.writer is not None:
            self.writer.end()


class AimTracker(GeneralTracker):
    """Aim (a local repository at ``logging_dir``; ``aim.Run(repo=logging_dir, **kwargs)``)."""

    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = ".", **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs
        self.writer: Any = None

    @on_main_process
    def start(self) -> None:
        """Open an Aim run in the repository (created if missing) and name it ``run_name``."""
        aim = _import_tracker_package(self.name, "aim", "aim")
        self.writer = aim.Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The ``aim.Run``."""
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Store ``values`` as the run's ``hparams``."""
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Track each value under its key."""
        for key, value in values.items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, kwargs: dict[str, dict] | None = None) -> None:
        """Track images (``value`` or ``(value, caption)``); ``kwargs`` may hold ``aim_image`` and ``track`` options."""
        aim = _import_tracker_package(self.name, "aim", "aim")
        image_options = (kwargs or {}).get("aim_image", {})
        track_options = (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **image_options), name=key, step=step, **track_options)

    @on_main_process
    def finish(self) -> None:
        """Close the run."""
        if self.writer is not None:
            self.writer.close()


class MLflowTracker(GeneralTracker):
    """MLflow (local with ``mlflow.set_tracking_uri("file://...")``).

    ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN``
    (yes/no) override the arguments. Only numbers are logged as metrics (others are dropped with a
    warning); parameters longer than MLflow accepts are dropped without changing the caller's dict.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike | None = None,
                 run_id: str | None = None, tags: dict[str, Any] | str | None = None, nested_run: bool | None = False,
                 run_name: str | None = None, description: str | None = None):
        super().__init__()
        from .utils.environment import str_to_bool

        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = tags
        self.nested_run = bool(str_to_bool(nested)) if isinstance(nested, str) else bool(nested)
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None

    @staticmethod
    def _mlflow() -> Any:
        return _import_tracker_package("mlflow", "mlflow", "mlflow")

    @on_main_process
    def start(self) -> None:
        """Find or create the experiment (artifacts under ``logging_dir``) and start the run."""
        mlflow = self._mlflow()
        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if found:
            if len(found) > 1:
                logger.warning(f"several MLflow experiments are named {self.experiment_name!r}; using the first")
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(name=self.experiment_name, artifact_location=self.logging_dir,
                                                     tags=self.tags)
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        """The active ``mlflow`` run."""
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Log ``values`` as parameters, in batches MLflow accepts; over-long values are dropped."""
        mlflow = self._mlflow()
        validation = mlflow.utils.validation
        kept = []
        for key, value in values.items():
            if len(str(value)) > validation.MAX_PARAM_VAL_LENGTH:
                _warn_dropped(self.name, key, value, f"MLflow parameters hold at most {validation.MAX_PARAM_VAL_LENGTH} characters")
            else:
                kept.append((key, value))
        batch = validation.MAX_PARAMS_TAGS_PER_BATCH
        for start in range(0, len(kept), batch):
            mlflow.log_params(dict(kept[start:start + batch]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric values as metrics (``kwargs`` go to ``mlflow.log_metrics``)."""
        metrics = {}
        for key, value in values.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                metrics[key] = value
            else:
                _warn_dropped(self.name, key, value, "MLflow metrics are numbers")
        self._mlflow().log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib/plotly ``figure`` as the artifact ``artifact_file``."""
        self._mlflow().log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy every file of ``local_dir`` into the run's artifacts (under ``artifact_path``)."""
        self._mlflow().log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``)."""
        self._mlflow().log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        """End the run."""
        self._mlflow().end_run()


class ClearMLTracker(GeneralTracker):
    """ClearML (``Task.init``; ``Task.set_offline(True)`` keeps it local). Reuses a task the user already
    opened. Keys starting with ``train_``/``eval_``/``test_`` become series of the rest of the key;
    values logged without a step are reported as single values."""

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any):
        super().__init__()
        self.user_provided_run_name = run_name
        self._initialized_externally = False
        self.init_kwargs = kwargs
        self.task: Any = None

    @on_main_process
    def start(self) -> None:
        """Adopt the current ClearML task, or ``Task.init`` one named after the run (``CLEARML_PROJECT``/``CLEARML_TASK``)."""
        clearml = _import_tracker_package(self.name, "clearml", "clearml")
        current = clearml.Task.current_task()
        if current:
            self._initialized_externally = True
            self.task = current
            return
        options = dict(self.init_kwargs)
        options.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        options.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        self.task = clearml.Task.init(**options)

    @property
    def tracker(self) -> Any:
        """The ClearML ``Task``."""
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict) -> Any:
        """Connect ``values`` as the task's configuration."""
        return self.task.connect_configuration(values)

    @staticmethod
    def _get_title_series(name: str) -> tuple[str, str]:
        for prefix in ("eval", "test", "train"):
            if name.startswith(prefix + "_"):
                return name[len(prefix) + 1:], prefix
        return name, "train"

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Report numbers as scalars at ``step`` (single values without one); others are dropped."""
        reporter = self.task.get_logger()
        for key, value in values.items():
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                _warn_dropped(self.name, key, value, "ClearML scalars are numbers")
                continue
            if step is None:
                reporter.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = self._get_title_series(key)
                reporter.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Report each image (numpy array, PIL image or path) under its key."""
        reporter = self.task.get_logger()
        for key, image in values.items():
            title, series = self._get_title_series(key)
            reporter.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """Report a table from a pandas ``dataframe`` or from ``data`` rows (``columns`` as header)."""
        table = dataframe
        if table is None:
            if data is None:
                raise ValueError("`ClearMLTracker.log_table` requires that `data` to be supplied if `dataframe` is `None`")
            table = [columns] + data if columns else data
        title, series = self._get_title_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Close the task, unless the user opened it."""
        if self.task is not None and not self._initialized_externally:
            self.task.close()


class DVCLiveTracker(GeneralTracker):
    """DVCLive (``dvclive.Live(**kwargs)`` or a ``live`` you pass). Each ``log`` call is one step."""

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any):
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open a ``Live`` (unless one was given)."""
        if self.live is None:
            dvclive = _import_tracker_package(self.name, "dvclive", "dvclive")
            self.live = dvclive.Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live``."""
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """Write ``values`` to the params file."""
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log the loggable values at ``step`` (or the next step), then advance one step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                _warn_dropped(self.name, key, value, "DVCLive metrics are numbers")
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        """End the live session (writes summaries)."""
        if self.live is not None:
            self.live.end()


# ---------------------------------------------------------------------- selection
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "json": JSONTracker,
    "csv": CSVTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "trackio": TrackioTracker,
    "swanlab": SwanLabTracker,
    "comet_ml": CometMLTracker,
    "aim": AimTracker,
    "mlflow": MLflowTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
}

#: tracker name -> the module its package provides (what "all" and the availability check look for)
_TRACKER_MODULES = {"tensorboard": None, "wandb": "wandb", "trackio": "trackio", "swanlab": "swanlab",
                    "comet_ml": "comet_ml", "aim": "aim", "mlflow": "mlflow", "clearml": "clearml",
                    "dvclive": "dvclive"}

_BUILTIN_NAMES = tuple(LOGGER_TYPE_TO_CLASS)


def get_available_trackers() -> list[str]:
    """Names of the trackers usable here (what ``log_with="all"`` selects)."""
    found = []
    for name, cls in LOGGER_TYPE_TO_CLASS.items():
        if not _tracker_available(name, cls):
            continue
        found.append(LoggerType(name) if name in LoggerType.list() else name)
    return found


def _tracker_available(name: str, cls: type) -> bool:
    if cls is TensorBoardTracker:
        return _tensorboard_available()
    module = _TRACKER_MODULES.get(name)
    if module is None or LOGGER_TYPE_TO_CLASS.get(name) is not cls:
        return True  # json, csv and registered classes need no package
    return importlib.util.find_spec(module) is not None


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make a :class:`GeneralTracker` subclass selectable by its ``name`` in ``log_with``.

    It is built as ``cls(project_name, logging_dir, **init_kwargs)`` when
    ``requires_logging_directory`` is true, else ``cls(project_name, **init_kwargs)``.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class takes a GeneralTracker subclass, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{tracker_class.__name__} must define a non-empty string `name`")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(f"{tracker_class.__name__} must define `requires_logging_directory` (True or False)")
    if name in ("all",):
        raise ValueError("'all' is reserved and cannot name a tracker")
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"tracker {name!r} ({LOGGER_TYPE_TO_CLASS[name].__name__}) is replaced by {tracker_class.__name__}",
                      stacklevel=2)
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _supported() -> str:
    return ", ".join(["all", *LOGGER_TYPE_TO_CLASS])


def _normalise_name(entry: Any) -> str:
    if isinstance(entry, Enum):
        entry = entry.value
    if not isinstance(entry, str):
        raise TypeError(
            f"log_with entries are tracker names or GeneralTracker instances, got {entry!r} ({type(entry).__name__}); "
            f"supported names: {_supported()}"
        )
    return entry.strip().lower()


def filter_trackers(log_with: Any, logging_dir: str | os.PathLike | None = None) -> list[Any]:
    """Check ``log_with`` and return its trackers: names (``LoggerType`` for built-ins) and instances.

    Duplicates are dropped; ``"all"`` expands to :func:`get_available_trackers` (plus any instances
    given). Raises ``ValueError`` for unknown names and for a tracker that needs a logging
    directory when there is none, ``NotImplementedError`` for trackers accel does not implement,
    and ``ImportError`` for a tracker whose package is missing.
    """
    if log_with is None:
        return []
    entries = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    instances = [e for e in entries if isinstance(e, GeneralTracker)]
    names: list[str] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            continue
        name = _normalise_name(entry)
        if name == "all":
            names.extend(str(n) for n in get_available_trackers())
            continue
        if name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"unsupported tracker {entry!r} in log_with; supported: {_supported()}")
        cls = LOGGER_TYPE_TO_CLASS[name]
        if cls is TensorBoardTracker and not _tensorboard_available():
            _summary_writer_class()  # raises the ImportError naming the package
        if not _tracker_available(name, cls):
            raise ImportError(f"the {name!r} tracker needs the {_TRACKER_MODULES[name]} package, which is not "
                              f"installed (pip install {_TRACKER_MODULES[name]})")
        names.append(name)

    selected: list[Any] = []
    for name in dict.fromkeys(names):  # keep order, drop repeats
        cls = LOGGER_TYPE_TO_CLASS[name]
        if cls.requires_logging_directory and logging_dir is None:
            raise ValueError(
                f"Logging with `{name}` requires a `logging_dir` to be passed in: pass "
                "Accelerator(project_dir=...) or project_config=ProjectConfiguration(logging_dir=...)"
            )
        selected.append(LoggerType(name) if name in LoggerType.list() else name)
    seen: set[int] = set()
    for tracker in instances:
        if id(tracker) not in seen:
            seen.add(id(tracker))
            selected.append(tracker)
    return selected


def init_trackers(accelerator: Any, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
    """Build ``accelerator.log_with``'s trackers on the main process, start them and store ``config``.

    ``log_with`` is checked on every process (so a mistake fails everywhere alike); trackers exist
    on the main process only. ``init_kwargs`` maps tracker names to constructor keyword arguments.
    """
    init_kwargs = init_kwargs or {}
    if not isinstance(init_kwargs, dict):
        raise TypeError(f"init_kwargs must be a dict of tracker name -> dict, got {type(init_kwargs).__name__}")
    if config is not None:
        _check_mapping(config, "init_trackers config")
    selected = filter_trackers(accelerator.log_with, accelerator.logging_dir)
    if not accelerator.is_main_process:
        return
    built: list[GeneralTracker] = []
    for entry in selected:
        if isinstance(entry, GeneralTracker):
            built.append(entry)
            continue
        name = str(entry)
        cls = LOGGER_TYPE_TO_CLASS[name]
        kwargs = init_kwargs.get(name, {})
        if cls.requires_logging_directory:
            built.append(cls(project_name, accelerator.logging_dir, **kwargs))
        else:
            built.append(cls(project_name, **kwargs))
    for tracker in built:
        tracker.start()
    if config is not None:
        for tracker in built:
            tracker.store_init_configuration(config)
    accelerator.trackers.extend(built)


def get_tracker(accelerator: Any, name: str, unwrap: bool = False) -> Any:
    """The tracker called ``name`` (its underlying object with ``unwrap``).

    Where no tracker exists (every process but the main one) a blank :class:`GeneralTracker`
    whose methods do nothing is returned, so code can call it on every process.
    """
    trackers = accelerator.trackers
    if not trackers:
        return GeneralTracker(_blank=True)
    name = str(name.value if isinstance(name, Enum) else name)
    for tracker in trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    raise ValueError(
        f"{name!r} is not a tracker of this Accelerator; it has: {', '.join(repr(t.name) for t in trackers)}"
    )

"""Accelerate's third-party trackers (WandB, MLflow, Aim, CometML, ClearML, DVCLive, SwanLab, Trackio).

Each imports its package only when started, so building one neither imports the package nor touches
the process group.
"""

from __future__ import annotations

import importlib
import json
import logging
import numbers
import os
from typing import Any

from .base import GeneralTracker, on_main_process

logger = logging.getLogger(__name__)


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
        from ..utils.environment import str_to_bool

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

"""Trackers: json/csv files, tensorboard (fake writer; real one only when installed), selection rules."""

from __future__ import annotations

import csv
import json
import os
import sys
import types

import numpy as np
import pytest
import torch

from accel import Accelerator

from accel.test_utils import require_tensorboard
from accel.tracking import (
    CSVTracker,
    GeneralTracker,
    JSONTracker,
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from accel.utils import LoggerType
from accel.utils.imports import is_tensorboard_available
from dist_utils import run_distributed


def _read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _read_csv(path):
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


# ---------------------------------------------------------------------- json
def test_json_tracker_appends_one_flushed_object_per_call(tmp_path):
    acc = Accelerator(log_with="json", project_dir=tmp_path)
    acc.init_trackers("run1", config={"lr": torch.tensor(0.5), "layers": np.int64(3), "opt": "adam"})
    path = tmp_path / "run1" / "metrics.jsonl"

    acc.log({"loss": torch.tensor(2.0)}, step=0)
    # flushed per call: a reader sees it while the run is still going
    assert [r["values"] for r in _read_jsonl(path)] == [{"loss": 2.0}]
    acc.log({"loss": 1.5, "acc": np.float32(0.25)}, step=1)
    acc.log({"lr": 0.1, "nested": {"a": 1, "b": [1, 2]}})

    records = _read_jsonl(path)
    assert [r["step"] for r in records] == [0, 1, None]
    assert records[1]["values"] == {"loss": 1.5, "acc": 0.25}
    assert records[2]["values"] == {"lr": 0.1, "nested": {"a": 1, "b": [1, 2]}}
    assert all(isinstance(r["time"], float) for r in records)
    assert records[0]["time"] <= records[1]["time"] <= records[2]["time"]
    assert json.loads((tmp_path / "run1" / "config.json").read_text()) == {"lr": 0.5, "layers": 3, "opt": "adam"}
    assert sorted(os.listdir(tmp_path / "run1")) == ["config.json", "metrics.jsonl"]  # no temp files left
    acc.end_training()


def test_end_training_closes_files_and_later_logging_is_refused(tmp_path):
    acc = Accelerator(log_with=["json", "csv"], project_dir=tmp_path)
    acc.init_trackers("run")
    handles = [acc.get_tracker("json", unwrap=True), acc.get_tracker("csv", unwrap=True)]
    assert all(h is not None and not h.closed for h in handles)
    acc.log({"x": 1}, step=0)
    acc.end_training()
    assert all(h.closed for h in handles)
    with pytest.raises(RuntimeError, match="finished"):
        acc.get_tracker("json").log({"x": 2})


def test_values_that_cannot_be_serialised_name_the_key(tmp_path):
    acc = Accelerator(log_with="json", project_dir=tmp_path)
    acc.init_trackers("run")
    with pytest.raises(TypeError, match="'weights'.*not a scalar"):
        acc.log({"weights": torch.ones(3)})
    with pytest.raises(TypeError, match="'thing'.*builtins.object"):
        acc.log({"ok": 1, "thing": object()})
    with pytest.raises(TypeError, match="'cfg/inner'"):
        acc.get_tracker("json").store_init_configuration({"cfg": {"inner": {1, 2}}})
    # a failed call writes nothing, not half a record
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""
    acc.end_training()


# ---------------------------------------------------------------------- csv
def test_csv_columns_grow_and_earlier_rows_keep_their_values(tmp_path):
    acc = Accelerator(log_with="csv", project_dir=tmp_path)
    acc.init_trackers("run", config={"seed": 1})
    path = tmp_path / "run" / "metrics.csv"
    acc.log({"loss": 3.0}, step=0)
    acc.log({"loss": 2.0, "acc": torch.tensor(0.5)}, step=1)
    header_after_two, _ = _read_csv(path)  # rewritten header is on disk at once
    assert header_after_two == ["step", "time", "loss", "acc"]
    acc.log({"eval": {"f1": 0.75}, "note": "a,b"}, step=2)
    acc.log({"loss": float("nan")}, step=3)
    acc.end_training()

    header, rows = _read_csv(path)
    assert header == ["step", "time", "loss", "acc", "eval/f1", "note"]
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"]
    assert [r["loss"] for r in rows[:3]] == ["3.0", "2.0", ""]
    assert [r["acc"] for r in rows] == ["", "0.5", "", ""]
    assert rows[2]["eval/f1"] == "0.75" and rows[2]["note"] == "a,b"
    assert np.isnan(float(rows[3]["loss"]))
    assert all(float(r["time"]) > 0 for r in rows)
    assert sorted(os.listdir(tmp_path / "run")) == ["config.json", "metrics.csv"]  # temp files renamed away


def test_csv_appends_to_an_existing_file_keeping_its_columns(tmp_path):
    first = CSVTracker("run", tmp_path)
    first.start()
    first.log({"a": 1}, step=0)
    first.finish()
    second = CSVTracker("run", tmp_path)
    second.start()
    second.log({"b": 2}, step=1)
    second.finish()
    header, rows = _read_csv(tmp_path / "run" / "metrics.csv")
    assert header == ["step", "time", "a", "b"]
    assert [(r["step"], r["a"], r["b"]) for r in rows] == [("0", "1", ""), ("1", "", "2")]


def test_csv_refuses_keys_that_clash_with_its_own_columns(tmp_path):
    tracker = CSVTracker("run", tmp_path)
    tracker.start()
    with pytest.raises(ValueError, match="step"):
        tracker.log({"step": 3})
    tracker.finish()


# ---------------------------------------------------------------------- selection
def test_unknown_tracker_name_lists_the_supported_ones(tmp_path):
    with pytest.raises(ValueError, match="bogus") as info:  # at construction, on every rank
        Accelerator(log_with="bogus", project_dir=tmp_path)
    for name in ("all", "json", "csv", "tensorboard"):
        assert name in str(info.value)


@pytest.mark.parametrize("name, module", [("wandb", "wandb"), (LoggerType.MLFLOW, "mlflow"), ("comet_ml", "comet_ml"),
                                          ("aim", "aim"), ("clearml", "clearml"), ("dvclive", "dvclive"),
                                          ("swanlab", "swanlab"), ("trackio", "trackio")])
def test_a_tracker_whose_package_is_missing_is_an_error_naming_it(tmp_path, monkeypatch, name, module):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == module else real(n, *a))
    with pytest.raises(ImportError, match=f"pip install {module}"):
        Accelerator(log_with=["json", name], project_dir=tmp_path)  # checked before anything is built


def test_file_trackers_need_a_logging_directory():
    with pytest.raises(ValueError, match="Logging with `json` requires a `logging_dir`.*project_dir"):
        Accelerator(log_with="json")


def test_all_selects_every_available_tracker(tmp_path):
    import importlib.util

    optional = [n for n in ("wandb", "trackio", "swanlab", "comet_ml", "aim", "mlflow", "clearml", "dvclive")
                if importlib.util.find_spec(n) is not None]
    expected = ["json", "csv"] + (["tensorboard"] if is_tensorboard_available() else []) + optional
    assert [str(t) for t in get_available_trackers()] == expected
    custom = _RecordingTracker()
    selected = filter_trackers([LoggerType.ALL, custom, "json"], tmp_path)
    assert [str(t) for t in selected[:-1]] == expected and selected[-1] is custom
    assert filter_trackers(None, tmp_path) == []


class _HideTensorBoard:
    """A meta-path finder that makes the tensorboard packages unimportable, as on a machine without them."""

    HIDDEN = ("tensorboard", "tensorboardX", "torch.utils.tensorboard")

    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in self.HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def test_tensorboard_without_the_package_raises_a_clear_import_error(tmp_path, monkeypatch):
    import importlib.util
    import sys

    from accel.utils import imports

    for name in list(sys.modules):
        if any(name == h or name.startswith(h + ".") for h in _HideTensorBoard.HIDDEN):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_HideTensorBoard(), *sys.meta_path])
    monkeypatch.setattr(imports, "_package", lambda name: importlib.util.find_spec(name) is not None
                        if name not in ("tensorboard", "tensorboardX") else False)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        Accelerator(log_with="tensorboard", project_dir=tmp_path)


# ---------------------------------------------------------------------- custom trackers
class _RecordingTracker(GeneralTracker):
    name = "recorder"
    requires_logging_directory = False

    def __init__(self, run_name="unset"):
        super().__init__()
        self.run_name = run_name
        self.calls = []

    @property
    def tracker(self):
        return self.calls

    def start(self):
        self.calls.append(("start",))

    def store_init_configuration(self, values):
        self.calls.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.calls.append(("log", values, step, kwargs))

    def finish(self):
        self.calls.append(("finish",))


def test_a_general_tracker_instance_receives_every_call():
    tracker = _RecordingTracker()
    acc = Accelerator(log_with=tracker)
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 1.0}, step=4, log_kwargs={"recorder": {"commit": True}, "other": {"x": 1}})
    assert acc.get_tracker("recorder") is tracker
    assert acc.get_tracker("recorder", unwrap=True) is tracker.calls
    acc.end_training()
    assert tracker.calls == [
        ("start",),
        ("config", {"lr": 0.1}),
        ("log", {"loss": 1.0}, 4, {"commit": True}),
        ("finish",),
    ]
    with pytest.raises(ValueError, match="'json' is not a tracker.*'recorder'"):
        acc.get_tracker("json")


def test_a_tracker_class_without_the_required_attributes_is_rejected():
    class Incomplete(GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="`name`, `requires_logging_directory`, `tracker`"):
        Incomplete()


def test_registered_tracker_class_is_built_by_name_with_init_kwargs():
    class Named(_RecordingTracker):
        name = "named_recorder"

        def __init__(self, run_name, tag=None):
            super().__init__(run_name)
            self.tag = tag

    register_tracker_class(Named)
    try:
        acc = Accelerator(log_with="named_recorder")
        acc.init_trackers("proj", init_kwargs={"named_recorder": {"tag": "t1"}})
        tracker = acc.get_tracker("named_recorder")
        assert isinstance(tracker, Named) and (tracker.run_name, tracker.tag) == ("proj", "t1")
        assert tracker.calls == [("start",)]
    finally:
        LOGGER_TYPE_TO_CLASS.pop("named_recorder", None)
    with pytest.raises(ValueError, match="GeneralTracker subclass"):
        register_tracker_class(object)


# ---------------------------------------------------------------------- tensorboard through a fake writer
class _FakeWriter:
    instances: list = []

    def __init__(self, logdir, **kwargs):
        self.logdir, self.kwargs, self.calls, self.closed = logdir, kwargs, [], False
        _FakeWriter.instances.append(self)

    def __getattr__(self, name):
        if name.startswith("add_") or name == "flush":
            return lambda *args, **kwargs: self.calls.append((name, args, kwargs))
        raise AttributeError(name)

    def close(self):
        self.closed = True


def test_tensorboard_tracker_drives_the_summary_writer(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.instances = []
    acc = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    acc.init_trackers("tb", config={"lr": 0.1, "sizes": [1, 2]}, init_kwargs={"tensorboard": {"flush_secs": 5}})
    acc.log({"loss": torch.tensor(0.5), "note": "hi", "group": {"a": 1, "b": 2.5}}, step=3)
    with pytest.raises(TypeError, match="'bad'.*tensorboard"):
        acc.log({"bad": [1, 2]}, step=4)
    acc.end_training()

    (writer,) = _FakeWriter.instances
    assert writer.logdir == os.path.join(str(tmp_path), "tb") and writer.kwargs == {"flush_secs": 5}
    adds = [c for c in writer.calls if c[0] != "flush"]
    assert adds[0] == ("add_hparams", ({"lr": 0.1, "sizes": "[1, 2]"},), {"metric_dict": {}})
    assert adds[1:] == [
        ("add_scalar", ("loss", 0.5), {"global_step": 3}),
        ("add_text", ("note", "hi"), {"global_step": 3}),
        ("add_scalars", ("group", {"a": 1, "b": 2.5}), {"global_step": 3}),
    ]
    assert writer.closed
    assert json.loads((tmp_path / "tb" / "config.json").read_text()) == {"lr": 0.1, "sizes": [1, 2]}


@require_tensorboard
def test_real_tensorboard_writer_writes_event_files(tmp_path):
    acc = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    acc.init_trackers("tb")
    acc.log({"loss": 1.0}, step=0)
    acc.end_training()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))


# ---------------------------------------------------------------------- two processes
def _two_rank_logging(tmp):
    acc = Accelerator(log_with="json", project_dir=tmp)
    acc.init_trackers("shared", config={"rank_that_wrote": acc.process_index})
    acc.log({"rank": acc.process_index}, step=acc.process_index)
    blank = acc.get_tracker("json")
    # a tracker built by hand on a non-main process does nothing either (main_process_only)
    direct = JSONTracker("direct", tmp)
    direct.start()
    direct.log({"rank": acc.process_index})
    direct.finish()
    acc.end_training()
    return {"trackers": len(acc.trackers), "tracker_type": type(blank).__name__}


def test_only_the_main_process_builds_trackers_and_logs(tmp_path):
    results = run_distributed(_two_rank_logging, 2, str(tmp_path))
    assert results == [
        {"trackers": 1, "tracker_type": "JSONTracker"},
        {"trackers": 0, "tracker_type": "GeneralTracker"},
    ]
    records = _read_jsonl(tmp_path / "shared" / "metrics.jsonl")
    assert [(r["step"], r["values"]) for r in records] == [(0, {"rank": 0})]
    assert json.loads((tmp_path / "shared" / "config.json").read_text()) == {"rank_that_wrote": 0}
    assert [r["values"] for r in _read_jsonl(tmp_path / "direct" / "metrics.jsonl")] == [{"rank": 0}]


# ---------------------------------------------------------------------- third-party trackers, offline, real packages
def _built(accelerator, name):
    tracker = accelerator.get_tracker(name)
    assert tracker.name == name and tracker.tracker is not None
    return tracker


def test_trackers_do_not_touch_the_process_state_until_started(tmp_path):
    from accel.state import PartialState
    from accel.tracking import (AimTracker, ClearMLTracker, CometMLTracker, DVCLiveTracker, MLflowTracker,
                                SwanLabTracker, TrackioTracker, WandBTracker)

    PartialState._reset_state()
    for tracker in (WandBTracker("p"), TrackioTracker("p"), SwanLabTracker("p"), CometMLTracker("p"),
                    AimTracker("p", tmp_path), MLflowTracker("p", tmp_path), ClearMLTracker("p"), DVCLiveTracker()):
        assert tracker.tracker is None, tracker.name
    assert PartialState._shared_state == {}


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    accelerator = Accelerator(log_with="wandb")
    accelerator.init_trackers("accel_wandb", config={"lr": 0.5}, init_kwargs={"wandb": {"dir": str(tmp_path)}})
    run = _built(accelerator, "wandb").tracker
    accelerator.log({"loss": 1.5}, step=3)
    assert run.config["lr"] == 0.5
    accelerator.end_training()
    record, = tmp_path.glob("wandb/offline-run-*/run-*.wandb")  # wandb's binary record of the offline run
    data = record.read_bytes()
    assert b"accel_wandb" in data and b"loss" in data and b"1.5" in data


def test_comet_ml_offline_archive(tmp_path):
    comet_ml = pytest.importorskip("comet_ml")
    import zipfile

    from accel.tracking import CometMLTracker

    tracker = CometMLTracker("accel_comet", online=False,
                             experiment_config=comet_ml.ExperimentConfig(offline_directory=str(tmp_path)))
    accelerator = Accelerator(log_with=tracker)
    accelerator.init_trackers(None, {"lr": 0.25})
    accelerator.log({"loss": 0.5, "note": "text"}, step=2)
    accelerator.end_training()
    archive, = tmp_path.glob("*.zip")
    messages = zipfile.ZipFile(archive).open("messages.json").read().decode()
    assert '"lr"' in messages and '"loss"' in messages and '"note"' in messages


def test_aim_local_repository(tmp_path):
    pytest.importorskip("aim")
    accelerator = Accelerator(log_with="aim", project_dir=tmp_path)
    accelerator.init_trackers("accel_aim", {"lr": 0.125})
    run = _built(accelerator, "aim").tracker
    accelerator.log({"loss": 2.0}, step=0)
    accelerator.log({"loss": 1.0}, step=1)
    assert run["hparams"] == {"lr": 0.125}
    from aim.storage.context import Context

    values = list(run.get_metric("loss", Context({})).values.values_list())
    accelerator.end_training()
    assert values == [2.0, 1.0]


def test_mlflow_local_file_store(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow >= 3.x refuses file stores otherwise
    mlflow.set_tracking_uri("file://" + str(tmp_path))
    accelerator = Accelerator(log_with="mlflow")
    accelerator.init_trackers("accel_mlflow", {"lr": 0.5, "long": "x" * 100_000})
    run_id = _built(accelerator, "mlflow").tracker.info.run_id
    accelerator.log({"loss": 0.75, "text": "dropped"}, step=4)
    accelerator.end_training()
    data = mlflow.get_run(run_id).data
    assert data.metrics == {"loss": 0.75} and data.params == {"lr": "0.5"}


def test_clearml_offline_session(tmp_path, monkeypatch):
    clearml = pytest.importorskip("clearml")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path))
    clearml.Task.set_offline(True)
    accelerator = Accelerator(log_with="clearml")
    accelerator.init_trackers("accel_clearml", {"lr": 0.5})
    task = _built(accelerator, "clearml").tracker
    accelerator.log({"train_loss": 1.5, "eval_acc": 0.25}, step=1)
    offline = clearml.config.get_offline_dir(task_id=task.id)
    accelerator.end_training()
    reported = [json.loads(line) for line in (offline / "metrics.jsonl").read_text().splitlines()]
    flat = {(m["metric"], m["variant"]): m["value"] for batch in reported for m in batch}
    assert flat == {("loss", "train"): 1.5, ("acc", "eval"): 0.25}


def test_dvclive_local(tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    monkeypatch.setattr("dvclive.live.get_dvc_repo", lambda *a, **k: None)
    accelerator = Accelerator(log_with="dvclive")
    accelerator.init_trackers("accel_dvclive", {"lr": 0.5},
                              init_kwargs={"dvclive": {"dir": str(tmp_path), "save_dvc_exp": False, "dvcyaml": None}})
    live = _built(accelerator, "dvclive").tracker
    accelerator.log({"loss": 1.0})
    accelerator.log({"loss": 0.5}, step=5)
    accelerator.end_training()
    rows = (tmp_path / "plots" / "metrics" / "loss.tsv").read_text().split()
    assert rows[0:2] == ["step", "loss"] and rows[2:] == ["0", "1.0", "5", "0.5"]
    assert "lr: 0.5" in (tmp_path / "params.yaml").read_text() and live.step == 5


def test_swanlab_local(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    monkeypatch.setenv("SWANLAB_MODE", "local")
    monkeypatch.chdir(tmp_path)
    accelerator = Accelerator(log_with="swanlab")
    accelerator.init_trackers("accel_swanlab", {"lr": 0.5}, init_kwargs={"swanlab": {"logdir": str(tmp_path)}})
    run = _built(accelerator, "swanlab").tracker
    accelerator.log({"loss": 1.25}, step=1)
    import swanlab

    assert swanlab.config["lr"] == 0.5 and swanlab.config["FRAMEWORK"] == "accel"
    accelerator.end_training()
    assert any(tmp_path.rglob("*")) and run is not None


def test_trackio_local(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    import uuid

    from trackio.sqlite_storage import SQLiteStorage

    project = f"accel_trackio_{uuid.uuid4().hex[:8]}"
    database = SQLiteStorage.get_project_db_path(project)  # trackio's local store (under HF_HOME)
    try:
        accelerator = Accelerator(log_with="trackio")
        accelerator.init_trackers(project, {"lr": 0.5})
        run = _built(accelerator, "trackio").tracker
        accelerator.log({"loss": 1.25}, step=1)
        accelerator.end_training()
        assert run.config["lr"] == 0.5
        assert database.exists()
    finally:
        for path in database.parent.glob(database.name + "*"):
            path.unlink()

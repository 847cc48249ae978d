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
from tests.dist_utils import run_distributed


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


@pytest.mark.parametrize("name", ["wandb", LoggerType.MLFLOW, "comet_ml", "aim", "clearml", "dvclive"])
def test_trackers_accel_does_not_implement_are_an_error(tmp_path, name):
    with pytest.raises(NotImplementedError, match=f"{name}.*json, csv, tensorboard"):
        Accelerator(log_with=["json", name], project_dir=tmp_path)  # checked before anything is built


def test_file_trackers_need_a_logging_directory():
    with pytest.raises(ValueError, match="'json' tracker.*project_dir"):
        Accelerator(log_with="json")


def test_all_selects_every_available_tracker(tmp_path):
    expected = ["json", "csv"] + (["tensorboard"] if is_tensorboard_available() else [])
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

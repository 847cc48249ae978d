"""A rank's error file is written whole or not at all (accel.launch.bootstrap): torch elastic's agent reads a
failed rank's file as soon as it sees the failure, and fails the whole launch on one it cannot parse."""

import json
import os

from accel.launch import bootstrap


def test_the_error_file_takes_its_name_only_once_written_whole(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import error_handler

    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))
    seen = []
    original = error_handler.ErrorHandler.record_exception

    def watched(self, exc):
        seen.append(("before", target.exists(), os.environ["TORCHELASTIC_ERROR_FILE"]))
        original(self, exc)
        seen.append(("after", target.exists()))

    monkeypatch.setattr(error_handler.ErrorHandler, "record_exception", watched)
    try:
        raise ValueError("a broken batch")
    except ValueError as exc:
        bootstrap._record_error(exc)
    (_, existed, written_to), (_, existed_after) = seen
    assert not existed and not existed_after, "the error file was there while it was being written"
    assert written_to != str(target)
    assert json.loads(target.read_text())["message"]["message"] == "ValueError: a broken batch"
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == str(target)
    assert os.listdir(tmp_path) == ["error.json"], "the partial file was left behind"


def test_a_rank_without_an_error_file_records_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    bootstrap._record_error(ValueError("x"))
    assert os.listdir(tmp_path) == []

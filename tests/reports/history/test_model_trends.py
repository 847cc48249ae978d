"""accel_reports.history.model_trends: a model x mode that learned in an earlier stored run and does not now."""

from __future__ import annotations

import pytest

from _report_data import run_file

from accel_harness.records import make_record
from accel_reports.history.model_trends import model_regressions, model_test_parts, regression_text
from accel_reports.history.store import open_history
from accel_reports.load.loaders import load_results
from accel_reports.load.model_records import MODEL_TEST

TWO_RANKS = "suites/test_models.py::test_model_trains_to_target_at_two_ranks"
GATE = "AssertionError: llama in mode bf16 on cpu: failed: steps-to-target: 40.0 steps vs 1.15 x reference 20.0 = 23.0"


def _figures(steps_to_target, reference_steps=20.0, accuracy=1.0, losses=(2.0, 1.0, 0.5)):
    reference = {"steps": 60, "steps_to_target": reference_steps, "final_accuracy": 1.0, "loss_every": 1,
                 "losses": [2.0, 0.9, 0.4]}
    return {"model": "x", "mode": "x", "steps": 60, "steps_to_target": steps_to_target, "final_accuracy": accuracy,
            "seconds_to_target": 1.0, "samples_per_second": 100.0, "loss_every": 1, "losses": list(losses),
            "reference": reference}


def _record(run_id, param, outcome, figures=None, *, two_ranks=False, text=None):
    test = TWO_RANKS if two_ranks else MODEL_TEST
    return make_record(run_id=run_id, nodeid=f"{test}[cpu-{param}]", backend="cpu", outcome=outcome, duration=1.0,
                       world_size=2 if two_ranks else 1, text=text,
                       extra={"model_run": figures} if figures is not None else {})


def _night(folder, day, records, *, torch="2.8.0", accel="0.2.0"):
    run_id = f"night-{torch}-{day}"
    for record in records:
        record.run_id = run_id
    return run_file(folder, run_id, "cpu", records, torch=torch, accel=accel, start=f"2025-06-{day:02d}T00:00:00.000+00:00")


def _last_night():
    return [
        _record("", "ws1-llama-bf16", "passed", _figures(20.0)),
        _record("", "ws2-vit-ddp", "passed", _figures(20.0), two_ranks=True),
        _record("", "ws1-cnn-single", "passed", _figures(20.0)),
        _record("", "ws1-bert-fp8", "passed", _figures(20.0, accuracy=1.0)),
        _record("", "ws1-mixtral-fp16", "failed", _figures(None), text=GATE),
        _record("", "ws1-t5-single", "passed", _figures(30.0)),
    ]


def _tonight():
    return [
        _record("", "ws1-llama-bf16", "failed", _figures(None, losses=(2.0, 2.5, float("nan"))), text=GATE),
        _record("", "ws2-vit-ddp", "passed", _figures(26.0), two_ranks=True),  # within the test's gate? 1.3x: no; a trend
        _record("", "ws1-cnn-single", "passed", _figures(20.8)),  # 1.04x: inside the 1.05 gate
        _record("", "ws1-bert-fp8", "passed", _figures(20.0, accuracy=0.95)),  # fp8's quality gate 0.97: 0.95 < 0.97
        _record("", "ws1-mixtral-fp16", "failed", _figures(None), text=GATE),  # failed before too: not new
        _record("", "ws1-t5-single", "xfailed", _figures(None)),  # an expected failure: no regression
        _record("", "ws1-gpt2-single", "failed", _figures(None), text=GATE),  # no earlier record: nothing to compare
    ]


def _regressions(tmp_path):
    _night(tmp_path / "a", 1, _last_night())
    _night(tmp_path / "b", 2, _tonight())
    stored, current = load_results([tmp_path / "a"]), load_results([tmp_path / "b"])
    return model_regressions(current.tests, stored.tests)


def test_a_model_that_passed_last_night_and_fails_now_is_named_with_its_figures_and_curves(tmp_path):
    found = {row["model"]: row for row in _regressions(tmp_path).to_dict("records")}
    assert sorted(found) == ["bert", "llama", "vit"]
    llama = found["llama"]
    assert (llama["mode"], llama["world_size"], llama["outcome"], llama["previous_outcome"]) == ("bf16", 1, "failed", "passed")
    assert llama["reasons"] == ("fails now: failed after passing in run night-2.8.0-1; not reached: the target was "
                                "reached at step 20.0 in run night-2.8.0-1, not now")
    assert llama["losses"][:2] == [2.0, 2.5] and llama["losses"][2] is None  # a non-finite loss is a gap
    assert llama["reference_losses"] == [2.0, 0.9, 0.4] and llama["previous_losses"] == [2.0, 1.0, 0.5]
    assert regression_text(llama).startswith("llama in mode bf16 on cpu (torch 2.8.0, accel 0.2.0 vs 0.2.0): fails now")


def test_steps_to_target_beyond_the_modes_gate_against_last_time_is_a_regression_within_it_is_not(tmp_path):
    found = {row["model"]: row for row in _regressions(tmp_path).to_dict("records")}
    vit = found["vit"]
    assert vit["outcome"] == "passed" and (vit["steps_ratio"], vit["previous_steps_ratio"]) == (1.3, 1.0)
    assert vit["reasons"] == ("steps-to-target: 1.300 x its reference's steps vs 1.000 x in run night-2.8.0-1 "
                              "(gate 1.05 x that = 1.050)")
    assert found["bert"]["reasons"].startswith("quality: final accuracy 0.9500 vs 1.0000")
    assert "cnn" not in found  # 1.04 x: inside the gate


def test_the_current_run_in_the_history_is_not_its_own_past_and_other_torch_versions_are_not_compared(tmp_path):
    db = tmp_path / "h.db"
    _night(tmp_path / "a", 1, _last_night(), torch="2.7.1")  # another torch: another series
    _night(tmp_path / "b", 2, _last_night(), accel="0.1.9")
    _night(tmp_path / "c", 3, _tonight(), accel="0.2.1")
    with open_history(db) as history:
        for folder in "abc":
            history.ingest(load_results([tmp_path / folder]))
        stored = history.model_records()
    assert set(stored["run_id"]) == {"night-2.7.1-1", "night-2.8.0-2", "night-2.8.0-3"}
    current = load_results([tmp_path / "c"]).tests
    found = {row["model"]: row for row in model_regressions(current, stored).to_dict("records")}
    assert sorted(found) == ["bert", "llama", "vit"]
    assert {row["previous_run"] for row in found.values()} == {"night-2.8.0-2"}
    assert found["llama"]["previous_accel_version"] == "0.1.9" and found["llama"]["accel_version"] == "0.2.1"
    assert found["vit"]["reference_losses"] == [2.0, 0.9, 0.4]  # the curves come back from the history
    assert model_regressions(load_results([tmp_path / "b"]).tests, stored).empty  # the same figures: unchanged
    with open_history(db, read_only=True) as history:  # what a report with --history asks
        assert history.model_regressions(current)[["model", "mode"]].values.tolist() == [
            ["llama", "bf16"], ["vit", "ddp"], ["bert", "fp8"]]


def test_test_ids_name_model_mode_and_ranks_and_bad_frames_are_refused():
    assert model_test_parts(f"{TWO_RANKS}[emu-ws2-llama-zero3]") == ("llama", "zero3", 2)
    assert model_test_parts(f"{MODEL_TEST}[cpu-ws1-cnn]") == ("cnn", "single", 1)  # from before the modes
    assert model_test_parts(f"{TWO_RANKS}[cpu-ws2-cnn]") == ("cnn", "ddp", 2)
    assert model_test_parts("suites/test_training.py::test_step[cpu-ws1]") is None
    import pandas as pd

    with pytest.raises(ValueError, match="needs the columns .*model_run"):
        model_regressions(pd.DataFrame({"test_id": []}), pd.DataFrame())

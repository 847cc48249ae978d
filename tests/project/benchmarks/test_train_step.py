"""suites/benchmarks/train_step.py: the ratio's confidence interval, the verdict, and a tiny end-to-end run."""

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from _waits import SAFETY_NET_S

SCRIPT = Path(__file__).resolve().parents[3] / "suites" / "benchmarks" / "train_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_step_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_median_interval_is_the_order_statistics_interval(bench):
    assert bench.median_interval(list(range(100))) == (39, 60)  # the textbook ranks 40 and 61 of 100
    assert bench.median_interval([2.0]) == (2.0, 2.0)
    rng = random.Random(7)
    covered = 0
    for _ in range(2000):
        sample = [rng.expovariate(1.0) for _ in range(61)]  # skewed: the interval assumes no shape
        low, high = bench.median_interval(sample)
        covered += low <= 0.6931471805599453 <= high  # the exponential's true median, ln 2
    assert 0.93 <= covered / 2000 <= 0.99
    with pytest.raises(ValueError, match="at least one value"):
        bench.median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        bench.median_interval([1.0], confidence=1.5)


def test_verdict_needs_the_whole_interval_on_one_side(bench):
    assert bench.verdict((0.991, 1.004), 0.99) == "at or above 0.99"
    assert bench.verdict((0.95, 0.989), 0.99) == "below 0.99"
    assert bench.verdict((0.985, 0.995), 0.99) == "not distinguishable from 0.99 at this noise"


def test_summarize_pairs_each_block_with_the_hand_written_block_of_its_round(bench):
    def rows(rates):
        return [{"block": b, "steps": 10, "cpu_s": 10 / r, "wall_s": 10 / r, "steps_per_cpu_s": r, "steps_per_s": r}
                for b, r in enumerate(rates)]

    out = bench.summarize({"torch": rows([100.0, 50.0, 100.0]), "accel": rows([99.0, 49.5, 99.0])})
    assert out["torch"]["ratio_vs_torch"] == 1.0
    assert out["accel"]["block_ratios"] == pytest.approx([0.99, 0.99, 0.99])  # the slow round cancels out
    assert out["accel"]["ratio_of_totals"] == pytest.approx(0.99)


def test_a_tiny_run_prints_the_load_the_interval_and_the_verdict(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "2", "--blocks", "6", "--epoch-steps", "5",
                           "--builds", "2", "--self-check", "--floor", "--no-accelerate", "--json", str(out)],
                          capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "load average" in proc.stdout and "95% CI" in proc.stdout and "accel vs torch: median ratio" in proc.stdout
    doc = json.loads(out.read_text())
    accel = doc["results"]["accel"]
    assert len(accel["block_ratios"]) == 6 and accel["ratio_ci95"][0] <= accel["ratio_vs_torch"] <= accel["ratio_ci95"][1]
    assert doc["host"]["before"]["cpus"] >= 1 and doc["goal"] == 0.99 and doc["verdict"] and doc["builds"] == 2
    assert len(doc["results"]["torch-again"]["block_ratios"]) == 6
    assert "torch-again vs torch: median ratio" in proc.stdout
    assert len(doc["results"]["pass-through"]["block_ratios"]) == 6
    assert "pass-through vs torch: median ratio" in proc.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--blocks", "0"], capture_output=True, text=True,
                         timeout=SAFETY_NET_S)
    assert bad.returncode == 2 and "must be positive" in bad.stderr
    too_many = subprocess.run([sys.executable, str(SCRIPT), "--blocks", "3", "--builds", "4"], capture_output=True,
                              text=True, timeout=SAFETY_NET_S)
    assert too_many.returncode == 2 and "--builds (4) cannot exceed --blocks (3)" in too_many.stderr


def test_rounds_are_spread_over_fresh_builds_made_in_a_rotated_order(bench, monkeypatch):
    built = []

    def fake_build(variant, batches, world):
        built.append(variant)
        return (lambda x, y: None), [(0, 0)] * batches

    monkeypatch.setattr(bench, "build_variant", fake_build)
    rows = bench.run_blocks(["torch", "accel", "accelerate"], steps=1, blocks=7, world=1, epoch_steps=2, builds=3)
    assert built == ["torch", "accel", "accelerate", "accel", "accelerate", "torch", "accelerate", "torch", "accel"]
    for variant in ("torch", "accel", "accelerate"):  # every round once per variant, none lost at the seams
        assert sorted(b for b, v, *_ in rows if v == variant) == list(range(7))


def test_the_pass_through_variant_steps_over_the_hand_written_loops_batches_and_loses_none(bench):
    import torch

    seen = {}
    for variant in ("torch", bench.PASS_THROUGH):
        step, loader = bench.build_variant(variant, 4, 1)
        batches = list(loader)
        assert len(batches) == 4  # the look-ahead loses no batch and adds none
        for x, y in batches:
            step(x, y)
        seen[variant] = torch.cat([x for x, _ in batches])
    assert torch.equal(seen["torch"], seen[bench.PASS_THROUGH])  # the same batches, in the same order
    assert list(bench._LookAheadLoader([])) == []

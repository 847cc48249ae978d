"""accel_harness.models: the tasks are deterministic with a known optimum, the gates judge as
documented, and a broken run (its optimizer step skipped every other step) fails a gate that the
plain training mechanics would not notice, while a correct run passes."""

from __future__ import annotations

import pytest
import torch

from accel_harness.models import tasks
from accel_harness.models.gates import judge
from accel_harness.models.tasks import IGNORE, TASKS, correct_and_count, make_task
from accel_harness.models.train import RunRecord, train
from accel_harness.models.zoo import MODELS, build_model, quick_models


# ---------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_task_is_the_same_for_the_same_seed_and_differs_for_another(name):
    a, b, c = make_task(name, 16, 8, seed=3), make_task(name, 16, 8, seed=3), make_task(name, 16, 8, seed=4)
    for split in ("train", "eval"):
        assert getattr(a, split).keys() == getattr(b, split).keys()
        assert all(torch.equal(getattr(a, split)[k], getattr(b, split)[k]) for k in getattr(a, split))
    assert not all(torch.equal(a.train[k], c.train[k]) for k in a.train)
    assert not torch.equal(a.train[next(iter(a.train))][:8], a.eval[next(iter(a.eval))]), "eval repeats train"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_answering_with_the_labels_scores_the_optimum_and_every_sample_scores_alike(name):
    data = make_task(name, 32, 8)
    labels = data.train["labels"]
    classes = max(int(labels.max()) + 1, 2)
    safe = labels.clamp(min=0)
    logits = torch.nn.functional.one_hot(safe, classes).float()
    if data.kind == "causal":  # the logits at t answer the label at t + 1
        logits = torch.cat([logits[:, 1:], torch.zeros_like(logits[:, :1])], dim=1)
    correct, count = correct_and_count(data.kind, logits, labels)
    assert count > 0 and correct == count
    scored = (labels != IGNORE).reshape(len(labels), -1).sum(dim=1)
    assert bool((scored == scored[0]).all()), "every sample must score the same number of positions"
    wrong, _ = correct_and_count(data.kind, torch.roll(logits, 1, dims=-1), labels)
    assert wrong == 0


def test_the_token_answers_are_the_documented_functions_of_the_prompt():
    copy, rev, add = (make_task(n, 8, 4).train for n in ("copy", "reverse", "modular-addition"))
    n = tasks.LENGTH
    assert torch.equal(copy["input_ids"][:, n + 1:], copy["input_ids"][:, :n])
    assert torch.equal(rev["input_ids"][:, n + 1:], rev["input_ids"][:, :n].flip(1))
    values = add["input_ids"] - tasks.FIRST_SYMBOL
    assert torch.equal(values[:, 3], (values[:, 0] + values[:, 1]) % tasks.MODULUS)
    assert bool((copy["input_ids"][:, n] == tasks.SEP).all())


def test_the_image_classes_are_never_the_same_picture(monkeypatch):
    """Without noise each image's sign pattern determines its class: no two classes share a pattern
    (the optimum is 1.0), e.g. a fine diagonal is not a checkerboard."""
    monkeypatch.setattr(tasks, "NOISE", 0.0)
    data = make_task("pattern-images", 512, 1).train
    signs = (data["pixel_values"][:, 0] > 0)
    seen: dict[bytes, int] = {}
    for pattern, label in zip(signs, data["labels"].tolist()):
        key = pattern.numpy().tobytes()
        assert seen.setdefault(key, label) == label, "two classes draw the same picture"
    assert len(set(seen.values())) == tasks.IMAGE_CLASSES


def test_correct_and_count_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown task kind"):
        correct_and_count("ranking", torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))


# ---------------------------------------------------------------------------- zoo
def test_the_zoo_builds_the_same_weights_from_a_seed_and_leaves_the_global_rng_alone():
    assert set(quick_models()) <= set(MODELS) and quick_models()
    state = torch.random.get_rng_state()
    a, b = build_model("cnn", seed=1), build_model("cnn", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = build_model("cnn", seed=2)
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))


def test_the_llama_row_uses_grouped_query_attention():
    if "llama" not in MODELS:
        pytest.skip("[needs-package] this transformers has no LlamaConfig")
    config = build_model("llama").config
    assert config.num_key_value_heads < config.num_attention_heads


# ---------------------------------------------------------------------------- gates
def _record(steps_to_target: int | None = 40, accuracy: float = 1.0, losses=(2.0, 1.0, 0.5)) -> RunRecord:
    return RunRecord("m", "t", "cpu", "single", 1, 80, 32, 0.9, losses=list(losses),
                     steps_to_target=steps_to_target, final_accuracy=accuracy)


def test_a_run_like_the_reference_passes_and_says_what_it_compared():
    verdict = judge(_record(42), _record(40))
    assert verdict.passed and not verdict.reasons
    assert "42.0 steps vs 1.05 x reference 40.0" in verdict.checks["steps-to-target"]


@pytest.mark.parametrize("run, gate, words", [
    (_record(43), "steps-to-target", "43.0 steps vs 1.05 x reference 40.0 = 42.0"),
    (_record(None), "steps-to-target", "never reached accuracy 0.9 in 80 steps"),
    (_record(40, accuracy=0.98), "quality", "final accuracy 0.9800 vs 0.99 x reference 1.0000"),
    (_record(40, losses=(2.0, float("nan"))), "loss", "not finite (nan) at step 2"),
])
def test_each_gate_fails_with_a_reason_naming_it(run, gate, words):
    verdict = judge(run, _record(40))
    assert not verdict.passed and verdict.failed_gates() == {gate}
    assert words in verdict.reasons[0] and str(verdict).startswith("failed: ")


def test_the_factors_are_settable_and_checked():
    assert judge(_record(48), _record(40), steps_factor=1.2).passed
    assert not judge(_record(48), _record(40)).passed
    assert judge(_record(40, accuracy=0.9), _record(40), quality_factor=0.9).passed
    with pytest.raises(ValueError, match="quality_factor"):
        judge(_record(), _record(), quality_factor=1.5)
    with pytest.raises(ValueError, match="steps_factor"):
        judge(_record(), _record(), steps_factor=0.5)


def test_a_reference_that_never_learned_makes_the_verdict_fail_naming_the_reference():
    verdict = judge(_record(40), _record(None, accuracy=0.5))
    assert "reference" in verdict.failed_gates()


# ---------------------------------------------------------------------------- the broken double
class _SkipsEveryOtherStep(torch.optim.AdamW):
    """A backend fault the mechanics tests would not catch: every other optimizer step does nothing."""

    calls = 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls % 2 == 0:
            return None
        return super().step(closure)


@pytest.fixture(scope="module")
def cnn_reference():
    torch.set_num_threads(1)
    return train("cnn")


def test_a_correct_run_passes_and_a_run_that_skips_every_other_step_fails_a_gate(cnn_reference):
    assert cnn_reference.steps_to_target is not None, "the reference must learn for the comparison to mean anything"
    correct = judge(train("cnn"), cnn_reference)
    assert correct.passed, str(correct)

    broken_run = train("cnn", optimizer_factory=lambda params, lr: _SkipsEveryOtherStep(params, lr=lr))
    assert broken_run.losses[-1] < broken_run.losses[0], "the broken run still trains: only the gates tell"
    broken = judge(broken_run, cnn_reference)
    assert not broken.passed
    assert broken.failed_gates() & {"steps-to-target", "quality"}, broken.reasons

"""accel.test_utils.examples: what a feature example adds that a complete example lacks (Accelerate's
tests/test_examples.py imports it); compared with Accelerate's own function on the same files."""

import textwrap

import pytest

from accel.test_utils.examples import clean_lines, compare_against_test, get_function_contents_by_name

TEMPLATE = textwrap.dedent('''
    import argparse

    def training_function(config, args):
        accelerator = Accelerator(cpu=args.cpu)
        # a comment
        train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
        model = make_model()
        for epoch in range(3):
            train(model)

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--cpu", action="store_true")
        args = parser.parse_args()

    if __name__ == "__main__":
        main()
''')

FEATURE = TEMPLATE.replace(
    "    model = make_model()\n",
    "    model = make_model()\n"
    "    # New Code #\n"
    "    if os.environ.get(\"TESTING_MOCKED_DATALOADERS\", None) == \"1\":\n"
    "        config[\"num_epochs\"] = 2\n"
    "    accelerator.save_state(\"ckpt\")\n",
).replace(
    "    args = parser.parse_args()\n",
    "    parser.add_argument(\"--checkpointing_steps\", type=str)\n    args = parser.parse_args()\n",
)
assert FEATURE.count("\n") == TEMPLATE.count("\n") + 5


def _layout(tmp_path, complete: str):
    examples = tmp_path / "examples"
    (examples / "by_feature").mkdir(parents=True)
    (examples / "nlp_example.py").write_text(TEMPLATE)
    (examples / "complete_nlp_example.py").write_text(complete)
    (examples / "by_feature" / "checkpointing.py").write_text(FEATURE)
    return examples


@pytest.mark.parametrize("parser_only", [True, False])
def test_a_complete_example_with_the_feature_has_no_difference(tmp_path, monkeypatch, parser_only):
    examples = _layout(tmp_path, FEATURE)
    monkeypatch.chdir(tmp_path)
    assert compare_against_test(examples / "complete_nlp_example.py", examples / "by_feature" / "checkpointing.py",
                                parser_only) == []


def test_a_missing_feature_is_the_difference_and_matches_accelerate(tmp_path, monkeypatch):
    examples = _layout(tmp_path, TEMPLATE)
    monkeypatch.chdir(tmp_path)
    args = (examples / "complete_nlp_example.py", examples / "by_feature" / "checkpointing.py")
    assert compare_against_test(*args, False) == ['    accelerator.save_state("ckpt")\n']
    assert compare_against_test(*args, True) == ['    parser.add_argument("--checkpointing_steps", type=str)\n']
    reference = pytest.importorskip("accelerate.test_utils.examples")
    for parser_only in (True, False):
        assert compare_against_test(*args, parser_only) == reference.compare_against_test(*args, parser_only)


def test_sections_and_cleaning():
    lines = TEMPLATE.splitlines(keepends=True)
    body = get_function_contents_by_name(lines, "training_function")
    assert body[0].startswith("def training_function") and not any("def main" in line for line in body)
    assert clean_lines(get_function_contents_by_name(lines, "main"))[-1].strip() == "args = parser.parse_args()"
    assert all(line.strip() and not line.lstrip().startswith("#") for line in clean_lines(body))
    with pytest.raises(ValueError, match="training_function"):
        get_function_contents_by_name(lines, "evaluate")

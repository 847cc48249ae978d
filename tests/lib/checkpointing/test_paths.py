"""accel.checkpointing: a manifest entry that leaves its checkpoint folder is refused before any file is
opened, and the error names the entry without revealing anything about the place it points to."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from accel import checkpointing as C
from accel.checkpointing import CheckpointError
from _checkpoint_helpers import make, same_weights

# ---------------------------------------------------------------------------------------------- open() spy
# An audit hook sees every open() of the process (builtins, io, os.open, torch's and safetensors' readers
# through Python). Hooks cannot be removed, so this one records only while a test switches it on.
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event in ("open", "os.open") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


class OpenSpy:
    def __enter__(self) -> list[str]:
        global _OPENED
        _OPENED = []
        return _OPENED

    def __exit__(self, *exc: object) -> None:
        global _OPENED
        _OPENED = None


# ---------------------------------------------------------------------------------------------- helpers
def _saved(tmp_path: Path):
    s = make()
    folder = Path(s.accelerator.save_state(tmp_path / "ck"))
    outside = tmp_path / "outside"
    outside.mkdir()
    return s, folder, outside


def _edit_manifest(folder: Path, edit) -> None:
    path = folder / C.MANIFEST_NAME
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _refused(s, folder: Path, outside: Path, entry: str) -> str:
    """load_state refuses, names ``entry``, opens nothing outside ``folder`` and changes nothing."""
    s.train(max_steps=1)
    trained = s.weights()
    with OpenSpy() as opened, pytest.raises(CheckpointError) as info:
        s.accelerator.load_state(folder)
    message = str(info.value)
    assert repr(entry) in message and "refused" in message
    assert not [p for p in opened if os.path.realpath(p).startswith(str(outside))], opened
    # nothing the manifest names was opened either: the refusal comes before any of it is read
    assert not [p for p in opened if Path(p).name != C.MANIFEST_NAME and Path(p).parent == folder], opened
    assert same_weights(s.weights(), trained)
    return message


# ---------------------------------------------------------------------------------------------- the four ways out
def test_an_entry_through_dotdot_is_refused(tmp_path):
    s, folder, outside = _saved(tmp_path)
    (outside / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())  # a loadable file
    entry = "../outside/model.safetensors"

    def edit(manifest):
        manifest["models"] = [entry]
        manifest["checksums"][entry] = manifest["checksums"].pop("model.safetensors")

    _edit_manifest(folder, edit)
    message = _refused(s, folder, outside, entry)
    assert "'..'" in message


@pytest.mark.parametrize("field", ["models", "optimizers", "custom_objects", "scaler"])
def test_an_absolute_entry_is_refused(tmp_path, field):
    s, folder, outside = _saved(tmp_path)
    entry = str(outside / "state.bin")
    (outside / "state.bin").write_bytes(b"x")

    def edit(manifest):
        manifest[field] = entry if field == "scaler" else [entry]

    _edit_manifest(folder, edit)
    message = _refused(s, folder, outside, entry)
    assert "absolute path" in message and f"'{field}'" in message


@pytest.mark.parametrize("absolute", [True, False])
def test_a_symlink_leading_outside_is_refused(tmp_path, absolute):
    s, folder, outside = _saved(tmp_path)
    real = outside / "optimizer.bin"
    os.replace(folder / "optimizer.bin", real)  # the very file that was saved, only moved out
    (folder / "optimizer.bin").symlink_to(real if absolute else Path("..") / "outside" / "optimizer.bin")
    message = _refused(s, folder, outside, "optimizer.bin")
    assert "symbolic link" in message
    assert str(real) not in message and "outside" not in message.replace(str(folder), "")


def test_a_linked_folder_leading_outside_is_refused(tmp_path):
    s, folder, outside = _saved(tmp_path)
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    (outside / "scheduler.bin").write_bytes((folder / "scheduler.bin").read_bytes())
    _edit_manifest(folder, lambda m: m.update(schedulers=["sub/scheduler.bin"]))
    assert "symbolic link" in _refused(s, folder, outside, "sub/scheduler.bin")


def test_links_that_stay_inside_are_followed(tmp_path):
    s, folder, _ = _saved(tmp_path)
    weights = s.weights()
    (folder / "blobs").mkdir()
    os.replace(folder / "scheduler.bin", folder / "blobs" / "scheduler.bin")
    (folder / "scheduler.bin").symlink_to(Path("blobs") / ".." / "blobs" / "scheduler.bin")
    s.train(max_steps=1)
    s.accelerator.load_state(folder, verify_checksums=False)  # the checksum entry still names the link, fine
    assert same_weights(s.weights(), weights)


@pytest.mark.parametrize("exists", [True, False])
def test_a_checksum_key_outside_reveals_nothing(tmp_path, exists):
    """The error is the same whether the outside file exists or not, and holds no size or digest."""
    s, folder, outside = _saved(tmp_path)
    secret = outside / "passwd"
    if exists:
        secret.write_text("root:x:0:0\n" * 3)
    entry = os.path.relpath(secret, folder)  # ../outside/passwd, as deep as the machine's layout makes it
    _edit_manifest(folder, lambda m: m["checksums"].update({entry: {"sha256": "0" * 64, "size": 1}}))
    message = _refused(s, folder, outside, entry)
    assert message == (f"checkpoint {folder} was refused: the manifest's 'checksums' entry {entry!r} goes up a "
                       "folder with '..'; a checkpoint's files lie inside its folder")


@pytest.mark.parametrize("entry", ["/etc/passwd", "../../../../etc/passwd"])
def test_a_checksum_key_naming_a_system_file_is_refused(tmp_path, entry):
    s, folder, outside = _saved(tmp_path)
    _edit_manifest(folder, lambda m: m["checksums"].update({entry: {"sha256": "0" * 64, "size": 1}}))
    message = _refused(s, folder, outside, entry)
    assert "bytes" not in message and "missing" not in message


def test_the_manifest_itself_may_not_be_a_link_outside(tmp_path):
    s, folder, outside = _saved(tmp_path)
    os.replace(folder / C.MANIFEST_NAME, outside / C.MANIFEST_NAME)
    (folder / C.MANIFEST_NAME).symlink_to(outside / C.MANIFEST_NAME)
    s.train(max_steps=1)
    with OpenSpy() as opened, pytest.raises(CheckpointError, match="symbolic link"):
        s.accelerator.load_state(folder)
    assert not [p for p in opened if str(outside) in os.path.realpath(p)]


@pytest.mark.parametrize("entry, problem", [
    ("", "not a file name"), (3, "not a file name"), (".", "the checkpoint folder itself"),
    ("a\\..\\b", "backslashes"), ("C:/x.bin", "absolute path"), ("a/\x00", "NUL byte"),
])
def test_malformed_entries_are_named(tmp_path, entry, problem):
    s, folder, _ = _saved(tmp_path)
    _edit_manifest(folder, lambda m: m.update(optimizers=[entry]))
    with pytest.raises(CheckpointError, match=problem) as info:
        s.accelerator.load_state(folder)
    assert repr(entry) in str(info.value)


def test_strategy_files_are_checked_too(tmp_path):
    s, folder, outside = _saved(tmp_path)
    _edit_manifest(folder, lambda m: m.update(strategy={"name": "single", "owns": [], "files": ["../outside"]}))
    assert "'strategy' files" in _refused(s, folder, outside, "../outside")


@pytest.mark.parametrize("exists", [True, False])
def test_a_checkpoint_written_by_accelerate_with_a_link_outside_is_refused(tmp_path, exists):
    """No manifest: the files are found by name, and a link among them is judged by where it leads, never
    by whether its target exists (the error is the same either way)."""
    s, folder, outside = _saved(tmp_path)
    (folder / C.MANIFEST_NAME).unlink()
    (folder / "random_states_0.json").unlink()  # what Accelerate writes: no manifest, only the pkl RNG file
    os.replace(folder / "model.safetensors", outside / "model.safetensors")
    if not exists:
        (outside / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    s.train(max_steps=1)
    trained = s.weights()
    with pytest.warns(UserWarning, match="written by Accelerate"), pytest.raises(CheckpointError) as info:
        s.accelerator.load_state(folder)
    assert str(info.value) == (f"checkpoint {folder} was refused: the manifest's 'models' entry 'model.safetensors' "
                               "leads out of the checkpoint folder through a symbolic link; a checkpoint's files lie "
                               "inside its folder")
    assert same_weights(s.weights(), trained)


@pytest.mark.parametrize("exists", [True, False])
def test_a_linked_rng_file_does_not_tell_an_incomplete_checkpoint_by_its_target(tmp_path, exists):
    s, folder, outside = _saved(tmp_path)
    (folder / C.MANIFEST_NAME).unlink()
    os.replace(folder / "random_states_0.json", outside / "random_states_0.json")
    if not exists:
        (outside / "random_states_0.json").unlink()
    (folder / "random_states_0.json").symlink_to(outside / "random_states_0.json")
    with OpenSpy() as opened, pytest.raises(CheckpointError, match="incomplete accel checkpoint"):
        s.accelerator.load_state(folder)
    assert not [p for p in opened if str(outside) in os.path.realpath(p)]

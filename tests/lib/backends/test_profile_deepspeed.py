"""A device profile names the DeepSpeed accelerator its device brings (``hooks.deepspeed_accelerator``)."""

from __future__ import annotations

import pytest

from accel.backends.profile import ProfileBackend, ProfileError, load_profile

PROFILE = """\
device: {name: mydev, device_type: cpu}
hooks:
  deepspeed_accelerator: "vendor_ds.accelerator:VendorAccelerator"
"""


def test_the_profile_names_the_class_and_the_backend_answers_it_without_importing_it(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PROFILE)
    profile = load_profile(path)
    assert profile.deepspeed_accelerator == "vendor_ds.accelerator:VendorAccelerator"
    backend = ProfileBackend(profile)
    assert backend.deepspeed_accelerator == "vendor_ds.accelerator:VendorAccelerator"  # vendor_ds is not importable
    with pytest.raises(ModuleNotFoundError, match="vendor_ds"):
        backend.create_deepspeed_accelerator()


def test_without_the_hook_the_built_in_backends_answer_stands(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("device: {name: mydev, device_type: cpu}\n")
    backend = ProfileBackend(load_profile(path))
    assert backend.deepspeed_accelerator is None  # the cpu backend leaves the choice to DeepSpeed


@pytest.mark.parametrize("value", ["vendor_ds.accelerator", "vendor ds:Cls", ":Cls", "1mod:Cls"])
def test_a_malformed_name_is_refused_with_its_line(tmp_path, value):
    path = tmp_path / "p.yaml"
    path.write_text(f'device: {{name: mydev, device_type: cpu}}\nhooks:\n  deepspeed_accelerator: "{value}"\n')
    with pytest.raises(ProfileError, match=r"line 3.*hooks\.deepspeed_accelerator: expected 'module:Class'"):
        load_profile(path)

"""A device profile for a device type no built-in backend covers: streams, events, the timer and device
properties come from ``torch.<device_type>`` (a fake device module here), or are unsupported features."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from accel.backends.profile import ProfileBackend, load_profile


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


FAKEDEV_PROFILE = "device: {name: fakedev, device_type: fakedev}\n"


def _fakedev_backend(tmp_path, monkeypatch, module):
    """A profile backend for a device type no built-in backend covers, with ``module`` as ``torch.fakedev``."""
    if module is None:
        monkeypatch.delattr(torch, "fakedev", raising=False)
    else:
        monkeypatch.setattr(torch, "fakedev", module, raising=False)
    backend = ProfileBackend(load_profile(write(tmp_path, "fakedev.yaml", FAKEDEV_PROFILE)))
    assert backend.base is None
    return backend


def test_streams_events_and_properties_come_from_the_device_module(tmp_path, monkeypatch):
    from _backend_fakes import GiB, FakeDeviceModule, FakeEvent, FakeStream

    fake = FakeDeviceModule(count=2, elapsed_ms=250.0)
    backend = _fakedev_backend(tmp_path, monkeypatch, fake)
    stream = backend.stream()
    assert isinstance(stream, FakeStream) and stream.label == "new"
    assert backend.current_stream().label == "current"
    with backend.stream_context(stream):
        assert fake.streams_entered == [stream]
    event = backend.event(enable_timing=True)
    assert isinstance(event, FakeEvent) and event.enable_timing
    assert backend.use_host_timers is False  # the module has events, so the timer uses them
    with backend.timer() as timer:
        pass
    assert timer.elapsed == pytest.approx(0.25) and fake.called("Event.elapsed_time")
    props = backend.device_properties(1)
    assert (props.index, props.name, props.total_memory) == (1, "Fake Accelerator 1", 16 * GiB)
    assert props.extra["major"] == 8 and props.extra["profile"] == "fakedev"
    assert fake.called("get_device_properties") == [(1,)]


def test_without_device_events_the_timer_reads_the_host_clock(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from accel.backends import UnsupportedFeatureError

    synced = []
    backend = _fakedev_backend(tmp_path, monkeypatch, SimpleNamespace(synchronize=lambda *a: synced.append(a)))
    assert backend.use_host_timers is True
    for call, missing in ((backend.stream, "Stream"), (backend.current_stream, "current_stream"),
                          (lambda: backend.stream_context(None), "stream"), (backend.event, "Event")):
        with pytest.raises(UnsupportedFeatureError, match=f"no built-in backend for 'fakedev' and torch.fakedev has no {missing}"):
            call()
    with backend.timer() as timer:
        pass
    assert isinstance(timer.elapsed, float) and timer.elapsed >= 0 and len(synced) == 2
    props = backend.device_properties(0)
    assert props.name == "fakedev" and props.total_memory is None
    backend.use_host_timers = False  # an explicit setting wins over the module's answer
    assert backend.use_host_timers is False


def test_a_device_module_registered_late_is_found(tmp_path, monkeypatch):
    from _backend_fakes import FakeDeviceModule

    from accel.backends import UnsupportedFeatureError

    backend = _fakedev_backend(tmp_path, monkeypatch, None)
    assert backend.module is None and backend.use_host_timers is True
    with pytest.raises(UnsupportedFeatureError, match="torch has no fakedev module"):
        backend.stream()
    fake = FakeDeviceModule()
    monkeypatch.setattr(torch, "fakedev", fake, raising=False)  # as a plug-in's is_available hook would
    assert backend.module is fake and backend.use_host_timers is False
    assert backend.stream().module is fake

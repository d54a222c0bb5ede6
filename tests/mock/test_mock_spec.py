"""The mock's BackendSpec answers availability as the mock runtime would: a device count the
runtime refuses makes the backend unavailable with the runtime's own message (every check
UNAVAILABLE, not ERROR in every worker)."""

from __future__ import annotations

import pytest
from accelkit.backends import mock_spec


@pytest.mark.parametrize("value", ["100", "65", "-2", "eight", ""])
def test_a_device_count_the_runtime_refuses_is_unavailable_with_its_message(monkeypatch, value):
    monkeypatch.setenv("ACCELKIT_MOCK_DEVICES", value)
    ok, reason = mock_spec.SPEC.probe(1)
    assert not ok
    assert reason == (f"ACCELKIT_MOCK_DEVICES={value} is not a device count: use an integer "
                      "from 0 to 64, e.g. ACCELKIT_MOCK_DEVICES=8")


@pytest.mark.parametrize("value,world_size,ok", [("64", 64, True), ("1", 1, True),
                                                 ("2", 4, False), (None, 8, True)])
def test_device_counts_the_runtime_accepts(monkeypatch, value, world_size, ok):
    if value is None:
        monkeypatch.delenv("ACCELKIT_MOCK_DEVICES", raising=False)
    else:
        monkeypatch.setenv("ACCELKIT_MOCK_DEVICES", value)
    assert mock_spec.SPEC.probe(world_size)[0] is ok


def test_no_devices_is_unavailable_with_the_runtimes_reason(monkeypatch):
    """ACCELKIT_MOCK_DEVICES=0 models a host without the card: unavailable, saying why."""
    monkeypatch.setenv("ACCELKIT_MOCK_DEVICES", "0")
    assert mock_spec.SPEC.probe(1) == (
        False, "the mock runtime reports no devices (ACCELKIT_MOCK_DEVICES=0); set "
               "ACCELKIT_MOCK_DEVICES to 1..64")

"""accelkit.core.device_module without a device: the module it builds over a stand-in
extension, and the process-wide state it keeps (one fork hook, whatever the number of
modules built)."""

from __future__ import annotations

import os
from pathlib import Path

from accelkit.core import device_module


class FakeExtension:
    """Answers every binding build_device_module needs; initialised, not host-accessible
    (a device whose driver state does not survive fork, as CUDA's)."""

    def __init__(self, initialized: bool = True) -> None:
        self.initialized = initialized

    def __getattr__(self, name):
        if name in device_module.REQUIRED_BINDINGS:
            return lambda *args: 0
        raise AttributeError(name)

    def is_initialized(self) -> bool:
        return self.initialized

    def host_accessible(self) -> bool:
        return False


def test_building_device_modules_registers_no_fork_hook_per_module(monkeypatch):
    hooks = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kwargs: hooks.append(kwargs))
    for _ in range(3):
        device_module.build_device_module("fakedev", FakeExtension())
    assert hooks == []


def test_a_fork_after_first_use_is_bad_only_for_the_initialised_device():
    used = device_module.build_device_module("fakedev", FakeExtension(initialized=True))
    fresh = device_module.build_device_module("fakedev", FakeExtension(initialized=False))
    assert (used._is_in_bad_fork(), fresh._is_in_bad_fork()) == (False, False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports what each module says, then leaves at once
        os.write(write, f"{used._is_in_bad_fork():d}{fresh._is_in_bad_fork():d}".encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 2).decode()
    os.waitpid(pid, 0)
    assert child == "10"
    assert used._is_in_bad_fork() is False  # the parent is unaffected


def test_an_extension_without_the_bindings_is_refused_naming_the_header_and_the_call():
    """The refusal names the header that declares bind_device and the call to make."""
    import types

    import pytest
    from accelkit.core import cpp

    bare = types.SimpleNamespace(__name__="bare_ext")
    with pytest.raises(TypeError) as info:
        device_module.build_device_module("bare", bare)
    message = str(info.value)
    assert message.startswith("extension 'bare_ext' lacks device_count, ")
    header = message.split("on <", 1)[1].split(">", 1)[0]
    assert (Path(cpp.include_dir()) / header).is_file(), header
    assert "accelkit::bind_device(m)" in message

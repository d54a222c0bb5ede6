"""The backend registry: built-in discovery, unknown names, duplicates, and third-party entry
points that fail (a temporary ``*.dist-info`` on sys.path stands in for an installed
distribution)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from accelkit.core import registry
from accelkit.core.spec import BackendSpec


def _spec(name: str, origin: str = "", device_type: str = "cpu") -> BackendSpec:
    return BackendSpec(name=name, device_type=device_type, collective_backend="gloo",
                       setup=lambda: None, probe=lambda world_size=1: (True, "ok"), origin=origin)


@pytest.fixture
def fresh(monkeypatch):
    """An empty registry that discovers again (the real one is restored afterwards)."""
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_discovered", False)
    return registry


def _install_dist(tmp_path, monkeypatch, dist: str, entries: dict[str, str]) -> None:
    info = tmp_path / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[accelkit.backends]\n{lines}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_builtin_backends_are_discovered(fresh):
    assert {"cpu", "cuda", "mock"} <= set(fresh.names())
    cpu = fresh.get("cpu")
    assert (cpu.device_type, cpu.collective_backend) == ("cpu", "gloo")
    assert cpu.origin == ("entry point 'cpu' = 'accelkit.backends.cpu:SPEC' of distribution "
                          "'accelkit'")


def test_unknown_name_lists_known_closest_first(fresh):
    with pytest.raises(registry.BackendRegistryError) as err:
        fresh.get("mokc")
    message = str(err.value)
    assert message.startswith("unknown backend 'mokc'; known backends: mock, ")
    assert set(message.split(": ", 1)[1].split(", ")) >= {"cpu", "cuda", "mock"}


def test_duplicate_name_names_both_origins(fresh):
    fresh.register(_spec("vendor"), origin="package one")
    assert fresh.register(_spec("vendor"), origin="package one").origin == "package one"
    with pytest.raises(registry.BackendRegistryError) as err:
        fresh.register(_spec("vendor", device_type="meta"), origin="package two")
    assert str(err.value) == ("backend name 'vendor' is registered twice: by package one and by "
                              "package two; rename one of them (the name is what --backend takes)")


def test_register_takes_only_a_spec(fresh):
    with pytest.raises(registry.BackendRegistryError,
                       match=r"^register\(\) takes an accelkit.core.BackendSpec, got dict$"):
        fresh.register({"name": "x"})


def test_entry_point_that_fails_to_import_names_the_distribution(fresh, tmp_path, monkeypatch):
    _install_dist(tmp_path, monkeypatch, "acme_accel", {"acme": "acme_missing_module:SPEC"})
    with pytest.raises(registry.BackendRegistryError) as err:
        fresh.names()
    assert str(err.value) == (
        "backend entry point 'acme' of distribution 'acme_accel' failed to import "
        "(acme_missing_module:SPEC): ModuleNotFoundError: No module named 'acme_missing_module'")


def test_entry_point_that_is_not_a_spec(fresh, tmp_path, monkeypatch):
    (tmp_path / "acme_notspec.py").write_text("SPEC = 42\n")
    _install_dist(tmp_path, monkeypatch, "acme_accel", {"acme": "acme_notspec:SPEC"})
    with pytest.raises(registry.BackendRegistryError) as err:
        fresh.get("acme")
    assert str(err.value) == ("entry point 'acme' = 'acme_notspec:SPEC' of distribution "
                              "'acme_accel' is a int, not an accelkit.core.BackendSpec")


def test_third_party_entry_point_and_duplicate_of_a_builtin(fresh, tmp_path, monkeypatch):
    (tmp_path / "acme_specs.py").write_text(
        "from accelkit.core.spec import BackendSpec\n"
        "def _probe(world_size=1):\n    return False, 'no acme card'\n"
        "ACME = BackendSpec(name='acme', device_type='acme', collective_backend='accl',\n"
        "                   setup=lambda: None, probe=_probe)\n"
        "CPU = BackendSpec(name='cpu', device_type='cpu', collective_backend='gloo',\n"
        "                  setup=lambda: None, probe=_probe)\n")
    _install_dist(tmp_path, monkeypatch, "acme_accel", {"acme": "acme_specs:ACME"})
    assert fresh.get("acme").probe(1) == (False, "no acme card")
    assert fresh.get("acme").origin == ("entry point 'acme' = 'acme_specs:ACME' of "
                                        "distribution 'acme_accel'")

    other = tmp_path / "second"
    other.mkdir()
    _install_dist(other, monkeypatch, "acme_cpu", {"cpu": "acme_specs:CPU"})
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_discovered", False)
    with pytest.raises(registry.BackendRegistryError) as err:
        fresh.names()
    message = str(err.value)
    assert message.startswith("backend name 'cpu' is registered twice: by entry point 'cpu' = ")
    assert "of distribution 'accelkit'" in message and "of distribution 'acme_cpu'" in message


def test_importing_core_and_registry_does_not_import_torch():
    code = ("import sys, accelkit, accelkit.core, accelkit.core.registry, accelkit.core.handle\n"
            "accelkit.core.registry.names()\n"
            "assert accelkit.core.DeviceHandle is accelkit.core.handle.DeviceHandle\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"

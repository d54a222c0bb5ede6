"""Markers to select tests by what they cost, applied per module from one table, so a new
module is classified where every other one is (tests/test_architecture.py fails on a module
missing from it, or on a name that is no module):

- ``slow``: the module takes more than half a minute on two cores (measured with ``pytest
  --durations=0``: these 15 modules are about 1,100 s of the suite's 1,330); ``pytest -m "not slow"``
  is the quick run (the other modules: about 270 s of test time, plus collection);
- ``multi_process``: it starts rank processes that run collectives (a conformance run, a
  pool, torchrun, mockccl's ranks);
- ``cpp_build``: it builds C++ of its own beyond the mock's cached extensions (the layer's
  tests, a device from the template, the fault build, a sanitizer's);
- ``namespaces``: it makes network namespaces (simulated hosts), so it needs root.

``pytest -m "not slow and not namespaces"``, for example, runs what is quick and needs no root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import TESTS

DESCRIPTIONS = {
    "slow": "the module takes more than half a minute on two cores (tests/support/markers.py)",
    "multi_process": "starts rank processes that run collectives (tests/support/markers.py)",
    "cpp_build": "builds C++ of its own beyond the mock's cached extensions (tests/support/markers.py)",
    "namespaces": "makes network namespaces (simulated hosts); needs root (tests/support/markers.py)",
}

SLOW, MULTI, CPP, NS = "slow", "multi_process", "cpp_build", "namespaces"

#: Each test module (relative to tests/) and its markers.
MARKERS: dict[str, tuple[str, ...]] = {
    "test_architecture.py": (),
    "bench/test_bench_cli.py": (),
    "bench/test_bench_mutate.py": (),
    "bench/test_bench_suite_time.py": (),
    "catalogue/test_catalogue.py": (SLOW, MULTI),
    "catalogue/test_conformance_world_sizes.py": (MULTI,),
    "catalogue/test_coverage.py": (),
    "catalogue/test_mutants.py": (SLOW, MULTI, CPP),
    "catalogue/test_async_launch.py": (),
    "catalogue/test_ops_area.py": (),
    "catalogue/test_ops_area_expectations.py": (),
    "catalogue/test_training_area.py": (MULTI,),
    "cli/test_cli_backends_doctor.py": (SLOW,),
    "cli/test_compare.py": (MULTI,),
    "core/test_accelerator.py": (),
    "core/test_after_import.py": (),
    "core/test_checker.py": (),
    "core/test_compile.py": (SLOW,),
    "core/test_device_module.py": (),
    "core/test_registry.py": (),
    "core/test_torch_internals.py": (),
    "core/test_torch_versions.py": (),
    "core/test_vendor_failures.py": (MULTI,),
    "cpp/test_cpp_layer.py": (SLOW, CPP),
    "engine/test_engine_cli.py": (MULTI,),
    "engine/test_engine_expectations.py": (),
    "engine/test_engine_fail_fast.py": (MULTI,),
    "engine/test_engine_pool.py": (SLOW, MULTI),
    "engine/test_engine_pytest_plugin.py": (MULTI,),
    "engine/test_engine_torchrun.py": (SLOW, MULTI),
    "engine/test_engine_units.py": (),
    "engine/test_engine_usage.py": (MULTI,),
    "engine/test_hosts.py": (NS,),
    "engine/test_scale.py": (MULTI,),
    "engine/test_two_hosts.py": (SLOW, MULTI, NS),
    "mock/test_mock_device.py": (SLOW,),
    "mock/test_mock_device_first_use.py": (SLOW,),
    "mock/test_mock_driver.py": (CPP,),
    "mock/test_mock_ops.py": (),
    "mock/test_mock_process.py": (),
    "mock/test_mock_random.py": (),
    "mock/test_mock_spec.py": (),
    "mockccl/test_mockccl_collectives.py": (SLOW, MULTI),
    "mockccl/test_mockccl_failures.py": (SLOW, MULTI, NS),
    "mockccl/test_mockccl_hostile.py": (SLOW, MULTI, NS),
    "mockccl/test_mockccl_teardown.py": (MULTI,),
    "templates/test_new_cli.py": (),
    "templates/test_templates.py": (SLOW, MULTI, CPP),
    "upstream/test_upstream.py": (SLOW, MULTI),
}


def module_key(path: Path) -> str:
    """A module's key in :data:`MARKERS`: its path under tests/."""
    return path.resolve().relative_to(TESTS).as_posix()


def pytest_configure(config: pytest.Config) -> None:
    for name, text in DESCRIPTIONS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each item gets its module's markers (an item of a module outside tests/, such as a
    test's own temporary module, gets none); then the ``slow`` modules' items go first, each
    module's in its own order, so that under ``pytest -n`` (tox.ini: whole modules per worker)
    the long modules start at once and the short ones fill in around them."""
    for item in items:
        try:
            key = module_key(item.path)
        except ValueError:
            continue
        for name in MARKERS.get(key, ()):
            item.add_marker(name)
    items.sort(key=lambda item: item.get_closest_marker(SLOW) is None)

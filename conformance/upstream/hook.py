"""The start-up hook of an ``accelkit upstream`` run, active in every Python process of the run
(the pytest process and each rank the harness spawns or forks).

``accelkit upstream`` puts ``startup/`` on ``PYTHONPATH`` and the path of the file's run
configuration in ``ACCELKIT_UPSTREAM`` (a JSON file: backend, records directory, adaptations
to apply, and for the plugin the results file and the expectations). Python imports
``startup/sitecustomize.py`` at interpreter start (children started by multiprocessing's
spawn and forkserver, and plain subprocesses, inherit the environment), which calls
:func:`install_from_env`. That installs one import hook (:class:`_AfterImport`) that runs code
right after a module has executed, before whoever imported it gets it:

- after ``torch``: ``spec.setup()`` (the backend's device and collective library are
  registered before any harness module or test module picks its device at import);
- after ``torch.distributed.distributed_c10d``: the process-group recorder
  (:mod:`accelkit.conformance.upstream.groups`);
- after ``torch.testing._internal.common_distributed``: test attribution and device records
  in the ranks;
- after each harness module an adaptation names: that adaptation
  (:mod:`accelkit.conformance.upstream.adaptations`).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
from collections.abc import Callable
from types import ModuleType

#: Environment variable holding the path of the run's configuration (a JSON file).
CONFIG_ENV = "ACCELKIT_UPSTREAM"


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then ``after(module)``."""

    def __init__(self, loader, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for inspect and linecache
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders return for watched modules."""

    def __init__(self, actions: dict[str, list[Callable[[ModuleType], None]]]) -> None:
        self.actions = actions

    def find_spec(self, name, path, target=None):
        if name not in self.actions:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _Loader(spec.loader, self._run(name))
        return spec

    def _run(self, name: str) -> Callable[[ModuleType], None]:
        def after(module: ModuleType) -> None:
            for action in self.actions.pop(name, []):
                action(module)

        return after


def install(config: dict) -> None:
    """Install the hook for ``config`` (keys: ``backend``, ``records``, ``adaptations``)."""
    from accelkit.conformance.upstream import adaptations as adaptations_mod
    from accelkit.conformance.upstream import groups
    from accelkit.core import registry

    spec = registry.get(config["backend"])
    chosen = [adaptations_mod.BY_NAME[n] for n in config.get("adaptations", [])]
    actions: dict[str, list[Callable[[ModuleType], None]]] = {
        "torch": [lambda _: spec.setup()],
        "torch.distributed.distributed_c10d": [
            lambda m: groups.install(m, config["records"], spec.device_type)],
        "torch.testing._internal.common_distributed": [groups.track_tests],
    }
    for module, items in adaptations_mod.for_module(chosen).items():
        actions.setdefault(module, []).extend(
            (lambda m, a=a: a.apply(m, spec)) for a in items)
    finder = _AfterImport(actions)
    for name in list(actions):  # already imported (not at interpreter start): run now
        if name in sys.modules:
            finder._run(name)(sys.modules[name])
    sys.meta_path.insert(0, finder)


def config_from_env() -> dict | None:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def install_from_env() -> None:
    config = config_from_env()
    if config is not None:
        install(config)

"""The start-up hook of an ``accelkit upstream`` run, active in every Python process of the run
(the pytest process and each rank the harness spawns or forks).

``accelkit upstream`` puts ``startup/`` on ``PYTHONPATH`` and the path of the file's run
configuration in ``ACCELKIT_UPSTREAM`` (a JSON file: backend, records directory, adaptations
to apply, and for the plugin the results file and the expectations). Python imports
``startup/sitecustomize.py`` at interpreter start (children started by multiprocessing's
spawn and forkserver, and plain subprocesses, inherit the environment), which calls
:func:`install_from_env`. That runs code right after a module has executed, before whoever
imported it gets it (:func:`accelkit.core.after_import.after_import`):

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

import json
import os
from collections.abc import Callable
from types import ModuleType

from accelkit.core.after_import import after_import

#: Environment variable holding the path of the run's configuration (a JSON file).
CONFIG_ENV = "ACCELKIT_UPSTREAM"


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
    for module, callbacks in actions.items():
        for callback in callbacks:
            after_import(module, callback)


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

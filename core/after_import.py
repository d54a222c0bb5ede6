"""Code that runs right after a module has executed, before whoever imported it gets it.

:func:`after_import` is the one import hook accelkit installs: registration uses it to attach
a device to ``torch._dynamo`` and ``torch._inductor`` when (and only if) they load
(:mod:`accelkit.core.compiler`), and an ``accelkit upstream`` run to set up the backend after
``torch`` and adapt PyTorch's test harness as its modules load
(:mod:`accelkit.conformance.upstream.hook`). One meta-path finder (:class:`_AfterImport`) is
first on ``sys.meta_path`` while callbacks wait: it finds nothing itself, and wraps the loader
the other finders return for a watched module so that the callbacks run after the module's
code. It removes itself once no callback waits.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_lock = threading.Lock()


def after_import(module: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``module`` is imported, else right after it has
    executed. An exception from the callback propagates to the import statement."""
    if module in sys.modules:
        callback(sys.modules[module])
        return
    with _lock:
        finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
        if finder is None:
            finder = _AfterImport()
            sys.meta_path.insert(0, finder)
        finder.callbacks.setdefault(module, []).append(callback)


class _AfterImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that leaves finding to the others and runs callbacks after the
    module they wait for has executed."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RunAfter(spec.loader, self, fullname)
                return spec
        return None

    def take(self, fullname: str) -> list[Callable[[ModuleType], None]]:
        """The callbacks waiting for ``fullname``, no longer waiting; the finder leaves
        ``sys.meta_path`` when none is left."""
        with _lock:
            callbacks = self.callbacks.pop(fullname, [])
            if not self.callbacks and self in sys.meta_path:
                sys.meta_path.remove(self)
        return callbacks


class _RunAfter(importlib.abc.Loader):
    """The module's own loader, followed by the callbacks waiting for it."""

    def __init__(self, loader: Any, finder: _AfterImport, fullname: str) -> None:
        self._loader = loader
        self._finder = finder
        self._fullname = fullname

    def __getattr__(self, attr: str) -> Any:  # get_source, get_code, ... of the real loader
        return getattr(self._loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._finder.take(self._fullname):
            callback(module)

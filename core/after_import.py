"""Code that runs right after a module has executed, before whoever imported it gets it.

:func:`after_import` is the one import hook accelkit installs: registration uses it to attach
a device to ``torch._dynamo`` and ``torch._inductor`` when (and only if) they load
(:mod:`accelkit.core.compiler`), and an ``accelkit upstream`` run to set up the backend after
``torch`` and adapt PyTorch's test harness as its modules load
(:mod:`accelkit.conformance.upstream.hook`). One meta-path finder (:class:`_AfterImport`) is
first on ``sys.meta_path`` while callbacks wait: it finds nothing itself, and wraps the loader
the other finders return for a watched module so that the callbacks run after the module's
code. It removes itself once no callback waits. A module that is executing when a callback is
registered (it is in ``sys.modules`` already) gets the callback when the import machinery marks
its spec initialized (:class:`_Initializing`).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_lock = threading.Lock()


def after_import(module: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``module`` is imported, else right after it has
    executed: also when it is executing now (``after_import`` called from its own code, or
    from a module it imports), since ``sys.modules`` holds a module from the start of its
    execution. An exception from the callback propagates to the import statement."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        spec = getattr(loaded, "__spec__", None)
        if isinstance(spec, ModuleSpec) and getattr(spec, "_initializing", False):
            _when_initialized(spec, callback)
        else:
            callback(loaded)
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


class _Initializing(ModuleSpec):
    """The class a spec of a module that is executing takes while callbacks wait for it. The
    import machinery (``importlib._bootstrap._load_unlocked``) sets ``spec._initializing`` to
    False once the module's code has run, in a ``finally``: that assignment runs the callbacks
    (when the module is in ``sys.modules``, that is, its code succeeded) and gives the spec its
    class back."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "_initializing" and not value:
            with _lock:
                callbacks = self.__dict__.pop("_accelkit_after_import", [])
                object.__setattr__(self, "__class__", ModuleSpec)
            module = sys.modules.get(self.name)
            if module is not None:
                for callback in callbacks:
                    callback(module)


def _when_initialized(spec: ModuleSpec, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback`` when the module of ``spec``, executing now, has executed."""
    with _lock:
        spec.__dict__.setdefault("_accelkit_after_import", []).append(callback)
        if type(spec) is ModuleSpec:
            object.__setattr__(spec, "__class__", _Initializing)

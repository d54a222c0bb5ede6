"""accelkit.core.after_import: callbacks run right after a module executes, before the
importer gets it; at once for a module already imported; the hook leaves ``sys.meta_path``
when nothing waits; a callback's exception reaches the import statement."""

from __future__ import annotations

import importlib
import sys

import pytest
from accelkit.core.after_import import _AfterImport, after_import


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def make(name: str, text: str = "VALUE = 1\n") -> str:
        (tmp_path / f"{name}.py").write_text(text)
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


def _hooks() -> list:
    return [f for f in sys.meta_path if isinstance(f, _AfterImport)]


def test_callbacks_run_after_the_module_executed_in_order(module_dir):
    name = module_dir("accelkit_after_import_a")
    seen = []
    after_import(name, lambda m: seen.append(("first", m.VALUE)))
    after_import(name, lambda m: seen.append(("second", m.__name__)))
    assert seen == [] and len(_hooks()) == 1
    importlib.import_module(name)
    assert seen == [("first", 1), ("second", name)]
    assert _hooks() == []


def test_an_imported_module_runs_the_callback_at_once(module_dir):
    name = module_dir("accelkit_after_import_b")
    module = importlib.import_module(name)
    seen = []
    after_import(name, seen.append)
    assert seen == [module] and _hooks() == []


def test_a_failing_callback_fails_the_import(module_dir):
    name = module_dir("accelkit_after_import_c")

    def fail(_module):
        raise RuntimeError("callback failed")

    after_import(name, fail)
    with pytest.raises(RuntimeError, match="callback failed"):
        importlib.import_module(name)
    assert _hooks() == []


def test_the_hook_waits_only_for_its_modules(module_dir):
    watched = module_dir("accelkit_after_import_d")
    other = module_dir("accelkit_after_import_e")
    seen = []
    after_import(watched, lambda m: seen.append(m.__name__))
    importlib.import_module(other)
    assert seen == [] and len(_hooks()) == 1
    importlib.import_module(watched)
    assert seen == [watched] and _hooks() == []


def test_a_module_that_is_executing_gets_the_callback_once_it_has_executed(module_dir):
    """A callback registered while its module executes (from the module's own code, or from a
    module it imports, as a device registered during ``import torch`` would) runs once the
    module's code has finished, not on the half-made module ``sys.modules`` holds meanwhile."""
    watched = module_dir("accelkit_after_import_f", (
        "from accelkit.core.after_import import after_import\n"
        "SEEN = []\n"
        "after_import(__name__, lambda m: SEEN.append(('own', hasattr(m, 'LATE'))))\n"
        "import accelkit_after_import_g\n"
        "LATE = 1\n"))
    module_dir("accelkit_after_import_g", (
        "from accelkit.core.after_import import after_import\n"
        "import accelkit_after_import_f as parent\n"
        "after_import('accelkit_after_import_f',\n"
        "             lambda m: m.SEEN.append(('imported', hasattr(m, 'LATE'))))\n"))
    module = importlib.import_module(watched)
    assert module.SEEN == [("own", True), ("imported", True)]
    assert type(module.__spec__).__name__ == "ModuleSpec" and _hooks() == []


def test_a_module_that_fails_while_callbacks_wait_runs_none(module_dir):
    name = module_dir("accelkit_after_import_h", (
        "from accelkit.core.after_import import after_import\n"
        "import builtins\n"
        "after_import(__name__, lambda m: builtins.accelkit_seen.append(m))\n"
        "raise ValueError('broken module')\n"))
    import builtins

    builtins.accelkit_seen = []
    try:
        with pytest.raises(ValueError, match="broken module"):
            importlib.import_module(name)
        assert builtins.accelkit_seen == []
    finally:
        del builtins.accelkit_seen

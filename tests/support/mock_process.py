"""Test modules that run inside the mock, one fresh interpreter per mode, with each test an
item of its own.

Registering the mock claims PrivateUse1 for the whole process, and the mock reads its mode
(``ACCELKIT_MOCK_HOST_ACCESSIBLE``, ``ACCELKIT_MOCK_ASYNC``) once, so a module that tests the
mock in-process cannot be imported by the pytest process that collects it. Such a module says
so on its first statements, as a literal the collector reads without importing it::

    pytestmark = pytest.mark.mock_process(modes=("default", "discrete"),
                                          env={"ACCELKIT_MOCK_MEMORY": "64MiB"})

and imports the mock at its top. This plugin collects it by a pytest run in a fresh
interpreter (``--collect-only``), and makes each test an item per mode, named
``test_x[discrete]`` (``test_x[float16-discrete]`` for a parametrized one): ``pytest
tests/mock/test_mock_ops.py::test_x`` runs it in every mode, ``...::test_x[discrete]`` in one. The
items of one module and mode that a session runs run together, at the first of them, in one
fresh interpreter with the mode's settings; its JUnit XML gives each test's outcome and
report, so a failing test fails as itself with its own traceback. A test that hangs there is
ended after ``TEST_TIMEOUT`` seconds with every thread's stack (faulthandler), and a module's
run that outlives ``TIMEOUT`` fails all of its items at once, with its output so far: a hang
costs one timeout, never one per item.
"""

from __future__ import annotations

import ast
import faulthandler
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from accelkit.backends.mock_spec import MODES as MOCK_MODES

#: Set in the fresh interpreter, where the module's tests are collected and run as usual.
INSIDE = "ACCELKIT_MOCK_TEST_PROCESS"
#: A module's run in one mode (its collection, then its tests), in seconds.
TIMEOUT = 900
#: One test in the fresh interpreter, in seconds (``ACCELKIT_MOCK_TEST_TIMEOUT`` sets another):
#: past it, the interpreter writes every thread's stack to the file ``STACKS`` names, and exits.
TEST_TIMEOUT = float(os.environ.get("ACCELKIT_MOCK_TEST_TIMEOUT", "240"))
STACKS = "ACCELKIT_MOCK_TEST_STACKS"


def inside() -> bool:
    """True in the fresh interpreter this plugin starts."""
    return os.environ.get(INSIDE) == "1"


def declared(path: Path) -> dict | None:
    """The ``mock_process`` marker's arguments of the module at ``path`` (its ``modes`` and
    ``env``), None when it has none; a marker that is not a literal is an error naming it."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets]
                == ["pytestmark"] and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "pytest.mark.mock_process"):
            try:
                args = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
            except ValueError as exc:
                raise pytest.UsageError(f"{path}: mock_process(...) takes literals only") from exc
            unknown = set(args.get("modes", ())) - set(MOCK_MODES)
            if unknown or not args.get("modes") or set(args) - {"modes", "env"}:
                raise pytest.UsageError(
                    f"{path}: mock_process(modes=..., env=...) takes modes of "
                    f"{', '.join(MOCK_MODES)} (got {args})")
            return args
    return None


def _environment(mode: str, env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            **MOCK_MODES[mode], **env, INSIDE: "1"}


def _pytest(path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """pytest in a fresh interpreter; one that outlives ``TIMEOUT`` is killed and returned with
    exit code None and its output so far."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT, cwd=path.parent)
    except subprocess.TimeoutExpired as exc:
        def text(out) -> str:
            return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
        return subprocess.CompletedProcess(
            command, None, text(exc.stdout),
            f"{text(exc.stderr)}\nkilled after {TIMEOUT} s (tests/support/mock_process.py TIMEOUT)")


class MockProcessModule(pytest.File):
    """A module marked ``mock_process``: its tests, per mode, collected in a fresh interpreter."""

    def collect(self):
        spec = declared(self.path)
        first = spec["modes"][0]
        proc = _pytest(self.path, ["--collect-only", "-q", self.path.name],
                       _environment(first, spec.get("env", {})))
        names = [line.split("::", 1)[1] for line in proc.stdout.splitlines()
                 if "::" in line and Path(line.split("::", 1)[0]).name == self.path.name]
        if proc.returncode != 0 or not names:
            raise self.CollectError(f"collecting {self.path.name} in a mock process (mode "
                                    f"{first}) failed, exit {proc.returncode}:\n"
                                    f"{proc.stdout[-6000:]}{proc.stderr[-3000:]}")
        self.results: dict[str, dict[str, tuple[str, str]]] = {}
        for mode in spec["modes"]:
            for name in names:
                base, _, params = name.partition("[")
                label = f"{params.rstrip(']')}-{mode}" if params else mode
                yield MockProcessItem.from_parent(self, name=f"{base}[{label}]", inner=name,
                                                  mode=mode, env=spec.get("env", {}))

    def run_mode(self, mode: str, env: dict[str, str], inner: list[str]) -> dict[str, tuple[str, str]]:
        """Run ``inner`` (test names) in one fresh interpreter in ``mode``: name -> (outcome,
        report), from its JUnit XML."""
        with tempfile.TemporaryDirectory(prefix="accelkit-mock-process-") as tmp:
            xml = Path(tmp) / "junit.xml"
            stacks = Path(tmp) / "stacks.txt"
            proc = _pytest(self.path, ["-q", f"--junitxml={xml}", "-o", "junit_family=xunit1",
                                       *[f"{self.path.name}::{n}" for n in inner]],
                           {**_environment(mode, env), STACKS: str(stacks)})
            if not xml.is_file():
                text = f"exit {proc.returncode}:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
                if stacks.is_file():
                    text += f"\n{stacks.read_text()[-8000:]}"
                return {n: ("failed", text) for n in inner}
            results = {}
            for case in ET.parse(xml).iter("testcase"):
                outcome, report = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error"):
                        outcome, report = "failed", (child.text or child.get("message") or "")
                    elif child.tag == "skipped":
                        outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                        report = child.get("message") or ""
                results[case.get("name")] = (outcome, report)
        for n in inner:
            results.setdefault(n, ("failed", f"not run in the mock process (exit "
                                              f"{proc.returncode}):\n{proc.stdout[-6000:]}"))
        return results


class MockProcessItem(pytest.Item):
    """One test of a ``mock_process`` module in one mode."""

    def __init__(self, *, inner: str, mode: str, env: dict[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner, self.mode, self.env = inner, mode, env

    def runtest(self) -> None:
        module: MockProcessModule = self.parent
        if self.mode not in module.results:
            mine = [item.inner for item in self.session.items
                    if isinstance(item, MockProcessItem) and item.parent is module
                    and item.mode == self.mode]
            module.results[self.mode] = module.run_mode(self.mode, self.env, mine)
        outcome, report = module.results[self.mode][self.inner]
        if outcome == "failed":
            raise MockProcessFailure(report)
        if outcome == "skipped":
            pytest.skip(report)
        if outcome == "xfailed":
            pytest.xfail(report)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, MockProcessFailure):
            return f"in the mock process, mode {self.mode}:\n{excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.name} (mock process, mode {self.mode})"


class MockProcessFailure(Exception):
    """A test that failed in the mock process, with its report there."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mock_process(modes, env): the module runs inside the mock, a fresh "
        "interpreter per mode (tests/support/mock_process.py)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """In the fresh interpreter, a test that runs past ``TEST_TIMEOUT`` writes every thread's
    stack to ``STACKS`` and ends the interpreter (the parent reports it, with the stacks, for
    the module's tests of that mode)."""
    if not inside() or STACKS not in os.environ:
        yield
        return
    # pytest holds stderr (fd 2) for the test's report, which an exit loses: a file keeps it
    with open(os.environ[STACKS], "a") as stacks:
        stacks.write(f"{item.nodeid} ran past {TEST_TIMEOUT:g} s "
                     f"(tests/support/mock_process.py TEST_TIMEOUT); its threads:\n")
        stacks.flush()
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=stacks)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            stacks.seek(0)
            stacks.truncate()


def pytest_pycollect_makemodule(module_path: Path, parent):
    """A ``mock_process`` module is collected by a fresh interpreter, never imported here
    (that would register the mock in this process); in that interpreter, as any module."""
    if not inside() and declared(module_path) is not None:
        return MockProcessModule.from_parent(parent, path=module_path)
    return None

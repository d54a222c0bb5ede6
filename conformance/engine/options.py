"""The options of a conformance run, declared once for its three entry points.

``accelkit conformance`` (``cli``), ``python -m accelkit.conformance`` under torchrun
(``torchrun``) and the pytest plugin (``pytest``, every option prefixed ``--accelkit-``) build
their command lines from :data:`OPTIONS` and read them back into one :class:`Options`. An
option an entry point has no use for is left out of it (pytest has its own ``-k`` and
``--co``; a torchrun launch has its own world size).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The backend run when none is named.
DEFAULT_BACKEND = "mock"
#: Seconds a check may take unless it sets its own ``timeout``.
DEFAULT_TIMEOUT_S = 60.0

CLI, TORCHRUN, PYTEST = "cli", "torchrun", "pytest"
EVERYWHERE = frozenset({CLI, TORCHRUN, PYTEST})


@dataclass(frozen=True)
class Option:
    """One option: ``flag`` on the command line (``--accelkit-<flag>`` under pytest)."""

    flag: str
    dest: str
    help: str
    action: str = "store"  # or "append", "store_true", "store_false"
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    short: str | None = None
    entry_points: frozenset[str] = EVERYWHERE

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "action": self.action, "help": self.help}
        if self.action in ("store", "append"):
            kwargs.update(type=self.type, metavar=self.metavar)
        if self.action == "append":
            kwargs["default"] = []
        return kwargs


OPTIONS: tuple[Option, ...] = (
    Option("backend", "backend", f"backend to test (default {DEFAULT_BACKEND}; `accelkit backends` "
           "lists them); under pytest, naming one turns the plugin on", metavar="NAME"),
    Option("area", "areas", "only checks of this area (repeatable)", action="append",
           metavar="AREA"),
    Option("k", "patterns", "only checks whose id contains PATTERN, or matches it as a glob when "
           "it has *?[ (repeatable: any may match)", action="append", metavar="PATTERN",
           short="-k", entry_points=frozenset({CLI, TORCHRUN})),
    Option("world-size", "world_sizes", "run the checks written for N ranks on N ranks "
           "(repeatable: every size given; default: each check at its own size, many are also "
           "written for 2 and 8); the checks left out are named in the report",
           action="append", type=int, metavar="N", entry_points=frozenset({CLI, PYTEST})),
    Option("timeout", "timeout_s", f"per-check budget in seconds (default {DEFAULT_TIMEOUT_S:g}); "
           "a check's own timeout wins", type=float, metavar="S"),
    Option("report-dir", "report_dir", "write report.json, junit.xml and report.md there",
           metavar="DIR"),
    Option("expectations", "expectations", "expectations TOML to use instead of the backend's "
           "own (format: the docstring of accelkit.conformance.engine.expectations)", metavar="FILE"),
    Option("strict", "strict", "an unexpected pass (XPASS) fails the run", action="store_true"),
    Option("list", "list_only", "list the selected checks and exit", action="store_true",
           entry_points=frozenset({CLI})),
    Option("checks-module", "modules", "also load checks from this module (dotted name or .py "
           "path; repeatable)", action="append", metavar="MODULE"),
    Option("no-builtin-checks", "builtin", "do not load the built-in catalogue (only "
           "--checks-module checks; the backend's expectations file is then not used)",
           action="store_false"),
    Option("require-available", "require_available", "exit 3 instead of 0 when the backend "
           "cannot run here", action="store_true", entry_points=frozenset({CLI, TORCHRUN})),
    Option("keep-going", "keep_going", "run every check of an area even after the rank pool "
           "crashed on several consecutive ones (by default the area stops there, its other "
           "checks ERROR 'not run')", action="store_true", entry_points=frozenset({CLI})),
    Option("memory-limit", "memory_limit_mb", "let each rank grow its data segment by at most "
           "MIB beyond its start-up size (RLIMIT_DATA); a check exceeding it gets MemoryError "
           "(ERROR, 'out of memory')", type=int, metavar="MIB",
           entry_points=frozenset({CLI, PYTEST})),
)


@dataclass
class Options:
    """Everything that shapes a run, whichever entry point it came from."""

    backend: str = DEFAULT_BACKEND
    areas: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S
    report_dir: str | None = None
    expectations: str | None = None
    strict: bool = False
    list_only: bool = False
    modules: list[str] = field(default_factory=list)
    builtin: bool = True
    require_available: bool = False
    memory_limit_mb: int | None = None
    keep_going: bool = False

    def problem(self) -> str | None:
        """What is wrong with these options, or None."""
        if self.timeout_s <= 0:
            return f"--timeout must be positive, got {self.timeout_s:g}"
        bad = [n for n in self.world_sizes if n < 1]
        if bad:
            return f"--world-size must be at least 1, got {bad[0]}"
        if self.memory_limit_mb is not None and self.memory_limit_mb <= 0:
            return f"--memory-limit must be positive, got {self.memory_limit_mb}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """What a report records of the options (the entry-point-only ones left out)."""
        return {"areas": self.areas, "patterns": self.patterns, "world_sizes": self.world_sizes,
                "timeout_s": self.timeout_s, "strict": self.strict, "modules": self.modules,
                "builtin": self.builtin, "memory_limit_mb": self.memory_limit_mb}


def for_entry_point(entry_point: str) -> list[Option]:
    return [o for o in OPTIONS if entry_point in o.entry_points]


def add_to_parser(parser: argparse.ArgumentParser, entry_point: str) -> None:
    """Declare the options of ``entry_point`` (``cli`` or ``torchrun``) on ``parser``."""
    for option in for_entry_point(entry_point):
        flags = [option.short] if option.short else [f"--{option.flag}"]
        parser.add_argument(*flags, **option.argparse_kwargs())


def add_to_pytest(parser) -> None:
    """Declare the pytest options (``--accelkit-<flag>``, destination ``accelkit_<dest>``)."""
    group = parser.getgroup("accelkit", "accelkit conformance checks")
    for option in for_entry_point(PYTEST):
        kwargs = option.argparse_kwargs()
        kwargs["dest"] = f"accelkit_{option.dest}"
        group.addoption(f"--accelkit-{option.flag}", **kwargs)


def from_values(entry_point: str, get: Callable[[str], Any]) -> Options:
    """An :class:`Options` from the parsed values of ``entry_point``'s options; ``get(dest)``
    reads one (None when unset: the default applies)."""
    values = {}
    for option in for_entry_point(entry_point):
        value = get(option.dest)
        if value is not None:
            values[option.dest] = list(value) if option.action == "append" else value
    return Options(**values)


def from_namespace(args: argparse.Namespace, entry_point: str) -> Options:
    return from_values(entry_point, lambda dest: getattr(args, dest, None))


def from_pytest(config) -> Options:
    return from_values(PYTEST, lambda dest: config.getoption(f"accelkit_{dest}"))

"""``accelkit conformance``: run the conformance suite on a backend (issue #3).

Exit codes: 0 when nothing FAILED, ERRORED, TIMED OUT or CRASHED (and, under ``--strict``,
nothing XPASSED); 1 otherwise (also after Ctrl-C: the checks run so far are summarised and
reported); 2 for a usage error (unknown backend or area, malformed
expectations, a check module that does not import, nothing selected); 3 when the backend is
unavailable here and ``--require-available`` was given. Without that flag an unavailable
backend exits 0: every check is reported UNAVAILABLE with the reason, so a CI matrix can list
backends that only some runners have.
"""

from __future__ import annotations

import argparse
import sys

from accelkit.conformance import expectations as expectations_mod
from accelkit.conformance import loader
from accelkit.conformance.api import CheckDef
from accelkit.conformance.runner import DEFAULT_TIMEOUT_S, RunOptions

#: The backend run when ``--backend`` is not given (issue #3: the embedded mock).
DEFAULT_BACKEND = "mock"


class UsageError(Exception):
    """Bad input on the command line; printed and exit code 2."""


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the CLI and the torchrun mode (``python -m accelkit.conformance``)."""
    parser.add_argument("--backend", default=DEFAULT_BACKEND,
                        help=f"backend to test (default: {DEFAULT_BACKEND}); "
                             "`accelkit backends` lists them")
    parser.add_argument("--area", action="append", default=[], metavar="AREA",
                        help="only checks of this area (repeatable)")
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN",
                        help="only checks whose id contains PATTERN, or matches it as a glob "
                             "when it has *?[ (repeatable: any may match)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"per-check budget in seconds (default {DEFAULT_TIMEOUT_S:g}); "
                             "a check's own timeout= wins")
    parser.add_argument("--report-dir", metavar="DIR",
                        help="write report.json, junit.xml and report.md there")
    parser.add_argument("--expectations", metavar="FILE",
                        help="expectations TOML to use instead of the backend's own")
    parser.add_argument("--strict", action="store_true",
                        help="an unexpected pass (XPASS) fails the run")
    parser.add_argument("--list", action="store_true",
                        help="list the selected checks and exit")
    parser.add_argument("--checks-module", dest="modules", action="append", default=[],
                        metavar="MODULE",
                        help="also load checks from this module (dotted name or .py path; "
                             "repeatable)")
    parser.add_argument("--no-builtin-checks", dest="builtin", action="store_false",
                        help="do not load the built-in catalogue (only --checks-module checks; "
                             "the backend's expectations file is then not used)")
    parser.add_argument("--require-available", action="store_true",
                        help="exit 3 instead of 0 when the backend cannot run here")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument("--world-size", type=int, metavar="N",
                        help="only checks written for N ranks, run on N ranks (default: every "
                             "check at its own size; many are also written for 2 and 8)")
    parser.add_argument("--memory-limit", type=int, metavar="MIB", dest="memory_limit_mb",
                        help="let each rank grow its data segment by at most MIB beyond its "
                             "start-up size (RLIMIT_DATA); a check exceeding it gets "
                             "MemoryError (ERROR, 'out of memory')")


def options_from_args(args: argparse.Namespace) -> RunOptions:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    return RunOptions(timeout_s=args.timeout, strict=args.strict, modules=list(args.modules),
                      builtin=args.builtin,
                      memory_limit_mb=getattr(args, "memory_limit_mb", None))


def resolve(args: argparse.Namespace, world_size: int | None = None):
    """(spec, options, selected checks, expectations) from parsed arguments; UsageError on
    bad input."""
    from accelkit.core import registry

    try:
        spec = registry.get(args.backend)
    except registry.BackendRegistryError as exc:
        raise UsageError(str(exc)) from None
    options = options_from_args(args)
    try:
        checks = loader.load(options.modules, builtin=options.builtin)
    except loader.CheckLoadError as exc:
        raise UsageError(str(exc)) from None
    areas = sorted({c.area for c in checks.values()})
    unknown = [a for a in args.area if a not in areas]
    if unknown:
        raise UsageError(f"unknown area(s) {', '.join(unknown)}; known: {', '.join(areas) or '(none)'}")
    selected = loader.select(checks, areas=args.area, patterns=args.patterns,
                             world_size=world_size)
    if not selected:
        raise UsageError(_nothing_selected(args, world_size, checks))
    path = args.expectations or (str(spec.expectations) if spec.expectations and options.builtin
                                 else None)
    expectations = {}
    if path:
        from accelkit.conformance.runner import torch_version

        try:
            expectations = expectations_mod.load(path, checks, torch_version())
        except expectations_mod.ExpectationsError as exc:
            raise UsageError(str(exc)) from None
        options.expectations_path = path
    return spec, options, selected, expectations


def _nothing_selected(args, world_size, checks: dict[str, CheckDef]) -> str:
    parts = [f"area {a}" for a in args.area] + [f"-k {p}" for p in args.patterns]
    if world_size is not None:
        parts.append(f"world size {world_size}")
    sizes = sorted({n for c in checks.values() for n in c.world_sizes})
    return (f"no check matches {', '.join(parts) or 'anything'} "
            f"({len(checks)} checks known, world sizes {sizes}); try --list without filters")


def _print_list(selected: list[CheckDef], expectations: dict) -> None:
    for c in selected:
        doc = c.doc.strip().splitlines()[0] if c.doc.strip() else ""
        extra = f" requires={','.join(c.requires)}" if c.requires else ""
        exp = expectations_mod.lookup(expectations, c.id, c.world_size)
        note = f"  [expected {exp.status}: {exp.reason}]" if exp else ""
        sizes = f" (also {','.join(map(str, c.also_at))})" if c.also_at else ""
        print(f"{c.id}  ws={c.world_size}{sizes}{extra}  {doc}{note}")
    print(f"{len(selected)} check(s)")


def run(args: argparse.Namespace) -> int:
    from accelkit.conformance import reports, terminal
    from accelkit.conformance.runner import Runner

    try:
        spec, options, selected, expectations = resolve(args, args.world_size)
    except UsageError as exc:
        print(f"accelkit conformance: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        _print_list(selected, expectations)
        return 0
    progress = terminal.Progress(len(selected))
    runner = Runner(spec, options, expectations, progress=progress)
    try:
        report = runner.run(selected)  # tears its pool down whatever happens
    except KeyboardInterrupt:
        report = runner.report
        report.aborted = (f"interrupted after {len(report.results)} of {len(selected)} "
                          "check(s); worker pool torn down")
    print()
    print(terminal.summary(report))
    if args.report_dir:
        for path in reports.write(report, args.report_dir):
            print(f"wrote {path}")
    if not report.ok():
        return 1
    if report.unavailable and args.require_available:
        return 3
    return 0

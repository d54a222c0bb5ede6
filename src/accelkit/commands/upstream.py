"""``accelkit upstream --backend NAME --tests PATH [pytest args]``: PyTorch's own distributed
tests on an accelkit backend, with the harness adapted to its device, the backend's
``[upstream]`` expectations, one report, and proof of the process groups the tests used.

Arguments ``accelkit upstream`` does not know go to pytest (``-k pattern``, ``-x``, ``-v``...).
Exit codes: 0 when every selected file ran and no test FAILED, ERRORED, TIMED OUT or CRASHED
(under ``--strict`` also no XPASS, no test on another real backend's process group and no
expectation matching nothing); 1 otherwise; 2 for a usage error (unknown backend, area,
adaptation or file, a checkout of another torch version, an adaptation not written for the
installed torch, a malformed expectations file); 3 when the backend cannot run here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

from accelkit.conformance.engine import expectations as expectations_mod
from accelkit.conformance.upstream import adaptations as adaptations_mod
from accelkit.conformance.upstream import selection as selection_mod

#: Lets ``accelkit`` hand the arguments it does not know to :func:`run` (for pytest).
ACCEPTS_EXTRA_ARGS = True
DEFAULT_FILE_TIMEOUT_S = 3600.0


class UsageError(Exception):
    """Printed with exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False  # an abbreviation must not swallow a pytest option
    parser.add_argument("--backend", default="mock",
                        help="backend to run the tests on (default: mock)")
    parser.add_argument("--tests", metavar="PATH",
                        help="a PyTorch checkout at the installed torch's version (runs the "
                             "default set) or a folder of test files (runs its test_*.py)")
    parser.add_argument("--area", action="append", default=[], metavar="AREA",
                        help="only the default files of this area (repeatable): "
                             + ", ".join(selection_mod.DEFAULT_FILES))
    parser.add_argument("--file", dest="files", action="append", default=[], metavar="FILE",
                        help="run this file instead of the default set (path under --tests; "
                             "repeatable)")
    parser.add_argument("--expectations", metavar="FILE",
                        help="TOML whose [upstream] table to use instead of the backend's")
    parser.add_argument("--report-dir", default="reports/upstream", metavar="DIR",
                        help="where the report and each file's log go "
                             "(default: reports/upstream)")
    parser.add_argument("--baseline", metavar="BACKEND",
                        help="also run the same files on BACKEND (e.g. cpu) first and compare")
    parser.add_argument("--compare", metavar="REPORT",
                        help="compare with the report.json of an earlier run")
    parser.add_argument("--no-adapt", action="append", default=[], metavar="NAME",
                        help="run without this harness adaptation (repeatable; 'all' for "
                             "none); --explain lists them")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="files run at the same time (default 1; see docs/upstream.md)")
    parser.add_argument("--file-timeout", type=float, default=DEFAULT_FILE_TIMEOUT_S,
                        metavar="S", help="kill a file's tests after S seconds "
                                          f"(default {DEFAULT_FILE_TIMEOUT_S:g})")
    parser.add_argument("--strict", action="store_true",
                        help="also fail on XPASS, on tests that used another backend's "
                             "process groups and on expectations that match nothing")
    parser.add_argument("--ignore-version", action="store_true",
                        help="run a checkout whose version.txt is not the installed torch's")
    parser.add_argument("--list", action="store_true",
                        help="list the selected files and the expectations, and exit")
    parser.add_argument("--explain", action="store_true",
                        help="list the harness adaptations and what the run sets up, and exit")


def _explain(spec, chosen_names: set[str], torch_version: str) -> str:
    needed = adaptations_mod.needed_for(spec)
    lines = [
        f"accelkit upstream on {spec.name} ({spec.device_type} through "
        f"{spec.collective_backend}), torch {torch_version}", "",
        "Every process of the run (pytest and each rank the harness spawns) starts with "
        "accelkit's start-up hook: spec.setup() right after `import torch`, before any harness "
        "or test module picks its device; the process-group recorder; then the adaptations "
        "below, each right after its harness module is imported.", ""]
    env = adaptations_mod.environment(spec)
    if env:
        lines += ["Environment for the tests: "
                  + ", ".join(f"{k}={v}" for k, v in env.items())
                  + " (device-type test classes for the device only; set it yourself to "
                  "change)", ""]
    lines.append("Adaptations:" if needed else
                 f"Adaptations (none applies: torch's harness knows {spec.device_type}):")
    for a in adaptations_mod.ADAPTATIONS:
        state = ("applied" if a.name in chosen_names else "disabled (--no-adapt)") if needed \
            else "not needed"
        if needed and a.not_needed(torch_version):
            state = f"not needed: fixed in torch {a.fixed_in[0]}"
        elif needed and not a.supports(torch_version):
            state = f"refused: written for torch {a.torch_versions}"
        lines += ["", f"- {a.describe()}\n  here:   {state}"]
    return "\n".join(lines)


def _resolve(args):
    from accelkit.conformance.engine.session import torch_version
    from accelkit.core import registry

    try:
        spec = registry.get(args.backend)
        base = registry.get(args.baseline) if args.baseline else None
    except registry.BackendRegistryError as exc:
        raise UsageError(str(exc)) from None
    version = torch_version()
    try:
        chosen = adaptations_mod.select(args.no_adapt)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return spec, base, chosen, version


def _require_test_packages() -> None:
    import importlib.util

    missing = [m for m in ("pytest", "expecttest") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not installed: PyTorch's test harness needs "
                         "them (pip install 'accelkit[upstream]')")


def _chosen_for(spec, chosen, version) -> list:
    if not adaptations_mod.needed_for(spec):
        return []
    refused = adaptations_mod.refused(chosen, version)
    if refused:
        raise UsageError("\n".join(refused))
    return adaptations_mod.applicable(chosen, version)


def _expectations(spec, path: str | None, version: str, files: list[str]):
    """The ``[upstream]`` expectations of ``spec`` (or ``path``) for this torch that can match
    tests of the selected ``files``: the entries of files not selected are left out, so they
    neither apply nor count as matching nothing under ``--strict``."""
    path = path or (str(spec.expectations) if spec.expectations else None)
    if not path:
        return None, []
    try:
        exps = expectations_mod.load_upstream(path, version)
    except expectations_mod.ExpectationsError as exc:
        raise UsageError(str(exc)) from None
    return path, [e for e in exps if any(e.applies_to_file(f) for f in files)]


def _progress(total: int):
    done = [0]

    def show(run) -> None:
        done[0] += 1
        counts: dict[str, int] = {}
        for t in run.tests:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        text = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no tests"
        status = "" if run.status == "ok" else f" [{run.status}]"
        errors = f", {len(run.collect_errors)} collection error(s)" if run.collect_errors else ""
        print(f"[{done[0]}/{total}] {run.path}: {text}{errors}{status} "
              f"({run.duration_s:.1f} s)", flush=True)

    return show


def _test_done(path: str, record: dict) -> None:
    """One line per finished test while its file runs (files take many minutes)."""
    reason = (record.get("reason") or "").splitlines()
    note = f": {reason[0][:120]}" if reason and record["outcome"] != "pass" else ""
    print(f"  {record['nodeid']}: {record['outcome']} ({record['duration_s']:.1f} s){note}",
          flush=True)


def _run_backend(spec, selection, chosen, exp_path, exps, out_dir: Path, args,
                 pytest_args: list[str], version: str):
    from accelkit.conformance.upstream import report as report_mod
    from accelkit.conformance.upstream import runner

    ok, why = spec.probe(1)
    if not ok:
        raise _Unavailable(f"backend {spec.name} cannot run here: {why}")
    if spec.prepare is not None:
        spec.prepare()
    env = adaptations_mod.environment(spec)
    config = {"backend": spec.name, "adaptations": [a.name for a in chosen],
              "expectations": [e.to_dict() for e in exps], "strict": args.strict}
    report = report_mod.UpstreamReport(
        spec=spec, torch=version, root=str(selection.root), kind=selection.kind,
        version=selection.version, strict=args.strict, missing=selection.missing,
        pytest_args=pytest_args, environment=env, expectations_path=exp_path,
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    names = {a.name for a in chosen}
    needed = adaptations_mod.needed_for(spec)

    def why_not(a) -> str | None:
        if a.name in names:
            return None
        if not needed:
            return "not needed"
        if a.not_needed(version):
            return f"not needed: fixed in torch {a.fixed_in[0]}"
        return "disabled (--no-adapt)"

    report.adaptations = [{"name": a.name, "target": a.target, "torch_versions": a.torch_versions,
                           "applied": a.name in names, "why_not": why_not(a)}
                          for a in adaptations_mod.ADAPTATIONS]
    print(f"accelkit upstream: {len(selection.files)} file(s) from {selection.root} on "
          f"{spec.name}, reports in {out_dir}", flush=True)
    start = time.monotonic()
    args_for_pytest = ["--confcutdir", str(selection.root), *pytest_args]
    runs = runner.run_files(selection.root, selection.files, out_dir, config, args_for_pytest,
                            args.file_timeout, env, args.jobs,
                            progress=_progress(len(selection.files)), on_test=_test_done)
    report.duration_s = round(time.monotonic() - start, 3)
    matched: dict[str, int] = {}
    for run in runs:
        report_mod.add_file(report, run, selection.areas.get(run.path))
        for pattern, n in run.matched.items():
            matched[pattern] = matched.get(pattern, 0) + n
    report.patterns = [{**e.to_dict(), "matched": matched.get(e.pattern, 0)} for e in exps]
    return report


class _Unavailable(Exception):
    pass


def _load_report(path: str) -> dict:
    from accelkit.conformance.upstream.report import SCHEMA

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--compare {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"--compare {path}: not an accelkit upstream report.json "
                         f"(schema {SCHEMA})")
    return data


def _summary(report) -> str:
    from accelkit.conformance.upstream.report import OUTCOMES

    counts = report.counts()
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
    lines = [f"{report.spec.name}: {', '.join(parts) or 'no tests'} in {len(report.files)} "
             f"file(s), {report.duration_s:.1f} s"]
    comp = report.comparison
    if comp:
        lines.append(f"against {comp['against']['backend']}: {len(comp['regressions'])} pass "
                     f"there and fail here, {len(comp['skipped_here'])} pass there and are "
                     "skipped or expected to fail here")
        lines += [f"  REGRESSION {e['test']}: {e['reason_here']}" for e in comp["regressions"]]
    if report.foreign:
        lines.append(f"{len(report.foreign)} test(s) ran on process groups of another backend:")
        lines += [f"  {t.nodeid}: {t.flag}" for t in report.foreign]
    simulated = len(report.flagged) - len(report.foreign)
    if simulated:
        lines.append(f"{simulated} test(s) ran only on simulated groups (fake, threaded); "
                     "see report.md")
    for p in report.unmatched:
        lines.append(f"expectation pattern matched no test: {p['pattern']!r}")
    for f in report.files:
        if f.status != "ok":
            lines.append(f"{f.path}: {f.status} (exit {f.exit_code}); log {f.log}")
        for err in f.collect_errors:
            lines.append(f"{f.path}: collection error {err['nodeid']}: {err['reason']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from accelkit.conformance.upstream import compare as compare_mod
    from accelkit.conformance.upstream import report as report_mod

    pytest_args = [a for a in getattr(args, "extra", []) if a != "--"]
    try:
        spec, base, chosen, version = _resolve(args)
        if args.explain:
            print(_explain(spec, {a.name for a in chosen}, version))
            return 0
        if not args.tests:
            raise UsageError("--tests PATH is required: a PyTorch checkout at torch "
                             f"{version} or a folder of test files")
        if args.jobs < 1 or args.file_timeout <= 0:
            raise UsageError("--jobs must be at least 1 and --file-timeout positive")
        if args.baseline and args.compare:
            raise UsageError("--baseline runs the comparison run, --compare reads one: "
                             "give one of them")
        selection = selection_mod.select(args.tests, areas=args.area, files=args.files,
                                         torch_version=version,
                                         ignore_version=args.ignore_version)
        _require_test_packages()
        spec_chosen = _chosen_for(spec, chosen, version)
        base_chosen = _chosen_for(base, chosen, version) if base else []
        exp_path, exps = _expectations(spec, args.expectations, version, selection.files)
        base_exps = _expectations(base, None, version, selection.files)[1] if base else []
        other = _load_report(args.compare) if args.compare else None
    except (UsageError, selection_mod.SelectionError) as exc:
        print(f"accelkit upstream: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for rel in selection.files:
            area = selection.areas.get(rel)
            print(f"{rel}" + (f"  [{area}]" if area else ""))
        for rel in selection.missing:
            print(f"{rel}  (not in this checkout)")
        print(f"{len(selection.files)} file(s); {len(exps)} [upstream] expectation(s)"
              + (f" from {exp_path}" if exp_path else ""))
        return 0
    out = Path(args.report_dir).resolve()  # the pytest processes run in --tests
    try:
        if base is not None:
            baseline = _run_backend(base, selection, base_chosen, None, base_exps,
                                    out / "baseline", args, pytest_args, version)
            report_mod.write(baseline, out / "baseline")
            other = report_mod.to_json(baseline)
            args.compare = str(out / "baseline" / "report.json")
        report = _run_backend(spec, selection, spec_chosen, exp_path, exps, out, args,
                              pytest_args, version)
    except _Unavailable as exc:
        print(f"accelkit upstream: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("accelkit upstream: interrupted", file=sys.stderr)
        return 1
    if other is not None:
        report.comparison = compare_mod.compare(report_mod.to_json(report), other, args.compare)
    paths = report_mod.write(report, out)
    print()
    print(_summary(report))
    for path in paths:
        print(f"wrote {path}")
    return 0 if report.ok() else 1

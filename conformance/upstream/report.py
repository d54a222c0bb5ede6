"""The report of an ``accelkit upstream`` run: ``report.json`` (schema :data:`SCHEMA`),
``junit.xml`` (through :mod:`accelkit.conformance.upstream.bridge`, the conformance suite's
writer) and ``report.md``.

``report.json`` holds: ``backend`` (name, device type, collective backend), ``torch``,
``python``, ``host``, ``started``, ``duration_s``, ``tests`` (root, kind, version, files
missing from the checkout), ``pytest_args``, ``adaptations`` (name, target, torch versions,
applied or why not), ``environment`` (variables set for the tests), ``expectations`` (file,
patterns with their match counts, ``unmatched``), ``summary`` (counts per outcome), ``groups``
(tests per backend string; flagged tests, ``foreign`` when they used another real backend,
``simulated`` when only fake/threaded groups), ``files`` (path, area, status, exit code, wall
time, log, counts, ``classes`` with their counts, collection errors), ``tests`` (node id, file,
class, name, outcome, reason, details, duration, expectation, groups, devices, flag) and
``comparison`` (see :mod:`accelkit.conformance.upstream.compare`) or null.

Outcomes: ``pass``, ``fail`` (the test raised), ``error`` (its setup or teardown raised, or the
file did not collect), ``skip``, ``xfail``, ``xpass``, ``timeout`` (the file ran past its
timeout while the test ran), ``crash`` (the pytest process died while the test ran),
``not-run`` (the file was killed, or its pytest process died, before the test started).
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelkit.conformance.upstream import groups as groups_mod
from accelkit.conformance.upstream.runner import FileRun
from accelkit.core.spec import BackendSpec

SCHEMA = "accelkit.upstream/1"
OUTCOMES = ("pass", "fail", "error", "timeout", "crash", "skip", "xfail", "xpass", "not-run")
FAILING = ("fail", "error", "timeout", "crash")


@dataclass
class TestResult:
    nodeid: str
    file: str
    cls: str | None
    name: str
    outcome: str
    reason: str = ""
    details: str = ""
    duration_s: float = 0.0
    expectation: dict | None = None
    groups: list[dict] = field(default_factory=list)   # {"backend", "ranks", "devices"}
    devices: list[str] = field(default_factory=list)    # devices the ranks ended the test on
    flag: str | None = None      # why the groups are not the backend's, if they are not
    flag_kind: str | None = None  # "foreign" (another backend) or "simulated" (fake, threaded)


@dataclass
class FileResult:
    path: str
    area: str | None
    status: str
    exit_code: int | None
    duration_s: float
    log: str
    collect_errors: list[dict] = field(default_factory=list)
    unattributed_groups: list[dict] = field(default_factory=list)  # made outside any test
    recorder_errors: list[str] = field(default_factory=list)


@dataclass
class UpstreamReport:
    spec: BackendSpec
    torch: str
    started: str
    root: str
    kind: str
    version: str | None
    strict: bool
    duration_s: float = 0.0
    missing: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)
    adaptations: list[dict] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    expectations_path: str | None = None
    patterns: list[dict] = field(default_factory=list)
    files: list[FileResult] = field(default_factory=list)
    tests: list[TestResult] = field(default_factory=list)
    comparison: dict | None = None
    host: str = field(default_factory=platform.node)

    def counts(self, tests: list[TestResult] | None = None) -> dict[str, int]:
        tests = self.tests if tests is None else tests
        counts = {o: 0 for o in OUTCOMES}
        for t in tests:
            counts[t.outcome] += 1
        counts["total"] = len(tests)
        return counts

    def by_file(self) -> dict[str, list[TestResult]]:
        result: dict[str, list[TestResult]] = {f.path: [] for f in self.files}
        for t in self.tests:
            result.setdefault(t.file, []).append(t)
        return result

    @staticmethod
    def by_class(tests: list[TestResult]) -> dict[str, list[TestResult]]:
        result: dict[str, list[TestResult]] = {}
        for t in tests:
            result.setdefault(t.cls or "(module)", []).append(t)
        return result

    @property
    def unmatched(self) -> list[dict]:
        return [p for p in self.patterns if not p["matched"]]

    @property
    def flagged(self) -> list[TestResult]:
        return [t for t in self.tests if t.flag]

    @property
    def foreign(self) -> list[TestResult]:
        """Tests that used a real process group of another backend (e.g. cpu/gloo)."""
        return [t for t in self.tests if t.flag_kind == "foreign"]

    def failed(self) -> list[TestResult]:
        bad = set(FAILING) | ({"xpass"} if self.strict else set())
        return [t for t in self.tests if t.outcome in bad]

    def ok(self) -> bool:
        """Exit code 0: nothing failed, every file ran to its end (and, under ``strict``, no
        XPASS, no test on another real backend's group and no expectation that matched nothing)."""
        if self.failed() or any(f.status != "ok" or f.collect_errors for f in self.files):
            return False
        return not (self.strict and (self.foreign or self.unmatched))

    def group_counts(self) -> dict[str, int]:
        """How many tests created groups of each backend string."""
        counts: dict[str, int] = {}
        for t in self.tests:
            for backend in {g["backend"] for g in t.groups}:
                counts[backend] = counts.get(backend, 0) + 1
        return dict(sorted(counts.items()))


def _split(nodeid: str) -> tuple[str, str | None, str]:
    parts = nodeid.split("::")
    if len(parts) >= 3:
        return parts[0], parts[1], "::".join(parts[2:])
    return parts[0], None, parts[-1]


def _attribute(run: FileRun) -> tuple[dict[str, list[dict]], dict[str, list[str]], list[dict],
                                       list[str]]:
    """This file's group and device records by node id, the groups no test claims, and the
    recorder's own errors."""
    by_unittest = {t["unittest_id"]: t["nodeid"] for t in run.collected if t["unittest_id"]}
    per_test: dict[str, list[dict]] = {}
    devices: dict[str, list[str]] = {}
    loose, errors = [], []
    for record in groups_mod.load(run.records):
        if record.get("kind") == "error":
            errors.append(record["error"])
            continue
        kind, ident = record.get("test") or (None, None)
        if kind == "node":
            owners = [ident]
        elif kind == "unittest":
            owners = [by_unittest[ident]] if ident in by_unittest else []
        elif kind == "class":
            owners = [n for u, n in by_unittest.items() if u.startswith(ident + ".")]
        else:
            owners = []
        if not owners and record.get("kind") == "group":
            loose.append(record)
        for owner in owners:
            if record.get("kind") == "device":
                devices.setdefault(owner, []).append(record["device"])
            else:
                per_test.setdefault(owner, []).append(record)
    return per_test, devices, loose, errors


def _summarise(records: list[dict]) -> list[dict]:
    summary: dict[tuple, dict] = {}
    for r in records:
        key = (r["backend"], r["size"])
        entry = summary.setdefault(key, {"backend": r["backend"], "size": r["size"],
                                         "ranks": 0, "bound_devices": []})
        entry["ranks"] += 1
        if r.get("bound_device") and r["bound_device"] not in entry["bound_devices"]:
            entry["bound_devices"].append(r["bound_device"])
    return list(summary.values())


#: c10d backends that communicate nothing between processes (simulated ranks).
SIMULATED = ("fake", "threaded")


def flag_for(spec: BackendSpec, group_list: list[dict]) -> tuple[str | None, str | None]:
    """``(kind, why)`` when ``group_list`` shows the test did not run on ``spec``'s backend:
    ``foreign`` for another real backend, ``simulated`` for fake/threaded groups only."""
    other = sorted({g["backend"] for g in group_list
                    if not groups_mod.is_backends(g["backend"], spec.device_type,
                                                  spec.collective_backend)})
    if not other:
        return None, None
    expected = f"{spec.device_type} through {spec.collective_backend}"
    if all(set(groups_mod.parse_backend(b).values()) <= set(SIMULATED) for b in other):
        return "simulated", (f"simulated process group(s) {', '.join(other)}: ranks simulated "
                             f"in one process, {spec.collective_backend} not exercised")
    return "foreign", f"process group(s) {', '.join(other)}, not {expected}"


def add_file(report: UpstreamReport, run: FileRun, area: str | None) -> None:
    per_test, devices, loose, errors = _attribute(run)
    report.files.append(FileResult(run.path, area, run.status, run.exit_code, run.duration_s,
                                   str(run.log), run.collect_errors, _summarise(loose),
                                   sorted(set(errors))))
    for record in run.tests:
        file, cls, name = _split(record["nodeid"])
        group_list = _summarise(per_test.get(record["nodeid"], []))
        kind, why = flag_for(report.spec, group_list)
        report.tests.append(TestResult(
            record["nodeid"], run.path, cls, name, record["outcome"], record["reason"],
            record["details"], record["duration_s"], record["expectation"], group_list,
            sorted(set(devices.get(record["nodeid"], []))), why, kind))


def to_json(report: UpstreamReport) -> dict:
    spec = report.spec
    files = []
    by_file = report.by_file()
    for f in report.files:
        tests = by_file.get(f.path, [])
        files.append({**asdict(f), "counts": report.counts(tests),
                      "classes": {c: report.counts(ts)
                                  for c, ts in report.by_class(tests).items()}})
    return {
        "schema": SCHEMA,
        "backend": {"name": spec.name, "device_type": spec.device_type,
                    "collective_backend": spec.collective_backend, "origin": spec.origin},
        "torch": report.torch, "python": platform.python_version(), "host": report.host,
        "started": report.started, "duration_s": report.duration_s,
        "tests_root": {"path": report.root, "kind": report.kind, "version": report.version,
                       "missing": report.missing},
        "pytest_args": report.pytest_args, "strict": report.strict,
        "adaptations": report.adaptations, "environment": report.environment,
        "expectations": {"path": report.expectations_path, "patterns": report.patterns,
                         "unmatched": [p["pattern"] for p in report.unmatched]},
        "summary": report.counts(),
        "groups": {"by_backend": report.group_counts(),
                   "flagged": [{"nodeid": t.nodeid, "kind": t.flag_kind, "flag": t.flag}
                               for t in report.flagged]},
        "files": files,
        "tests": [asdict(t) for t in report.tests],
        "comparison": report.comparison,
    }


def write(report: UpstreamReport, directory: str | Path) -> list[Path]:
    """Write report.json, junit.xml and report.md into ``directory``."""
    from accelkit.conformance.upstream import bridge, markdown

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "junit.xml", directory / "report.md"]
    paths[0].write_text(json.dumps(to_json(report), indent=2) + "\n")
    bridge.write_junit(report, paths[1])
    paths[2].write_text(markdown.render(report))
    return paths

"""The pytest plugin of an ``accelkit upstream`` run (``-p accelkit.conformance.upstream.plugin``
in each pytest process ``accelkit upstream`` starts; inert without ``ACCELKIT_UPSTREAM``).

At collection it applies the ``[upstream]`` expectations (first matching pattern wins: ``xfail``
becomes ``pytest.mark.xfail(strict=--strict)``, ``skip`` becomes ``pytest.mark.skip``) and
records which patterns matched. It writes one JSON line per event to the run's results file,
flushed at once so that a file killed for its timeout still reports what finished:
``collected`` (node ids, unittest ids, matched patterns), ``collect_error``, ``start`` (a test
begins) and ``test`` (final outcome, reason, details with the whole traceback, duration,
expectation). Before each test it puts the node id in the
environment (:data:`accelkit.conformance.upstream.groups.TEST_ENV`) so that the ranks the test
spawns attribute their process groups to it.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from accelkit.conformance.engine.expectations import UpstreamExpectation
from accelkit.conformance.upstream import groups
from accelkit.conformance.upstream.groups import TEST_ENV
from accelkit.conformance.upstream.hook import config_from_env

_EXCEPTION = re.compile(
    r"^(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Failed|Timeout|Interrupt)\b.*)$")
_RANK_WRAPPER = re.compile(r"RuntimeError: Process \d+ exited with error code")
_RANK_EXIT = re.compile(r"Expected exit code \d+ but got (-?\d+)")
_XPASS_STRICT = "[XPASS(strict)]"


def headline(text: str) -> str:
    """The line that says why a test failed: the innermost exception a rank raised (the
    harness wraps them in 'Process N exited with error code 10'), else the last exception
    line, else the last line."""
    found = [m.group(1).strip() for line in text.splitlines()
             if (m := _EXCEPTION.match(line.strip()))]
    inner = [line for line in found if not _RANK_WRAPPER.match(line)]
    lines = inner or found or text.strip().splitlines() or [""]
    return lines[-1][:400]


def _failure(report) -> tuple[str, str]:
    """(reason, details) of a failed phase. A rank that died outside the test (exit code 1:
    an exception in the harness's start-up of the rank) leaves only its exit code in the
    failure; its traceback is in the captured stderr, which then gives the reason."""
    text = report.longreprtext
    stderr = "".join(content for title, content in report.sections if "stderr" in title)
    reason = headline(text)
    died = _RANK_EXIT.search(text)
    if died and stderr.strip():
        reason = f"a rank exited with code {died.group(1)}: {headline(stderr)}"
    details = text + (f"\n--- captured stderr (tail) ---\n{stderr[-4000:]}" if stderr else "")
    return reason, details


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def outcome(phases: dict) -> tuple[str, str, str]:
    """(outcome, reason, details) of one test from its setup/call/teardown reports."""
    setup, call, teardown = (phases.get(w) for w in ("setup", "call", "teardown"))
    for rep in (setup, call):
        if rep is None:
            continue
        if hasattr(rep, "wasxfail"):
            if rep.skipped:
                return "xfail", rep.wasxfail, _failure(rep)[1]
            return "xpass", rep.wasxfail, ""
        if rep.failed and str(rep.longrepr).startswith(_XPASS_STRICT):
            return "xpass", str(rep.longrepr).removeprefix(_XPASS_STRICT).strip(), ""
    if setup is not None and setup.failed:
        return ("error", *_failure(setup))
    if setup is not None and setup.skipped:
        return "skip", _skip_reason(setup), ""
    if call is not None and call.failed:
        return ("fail", *_failure(call))
    if call is not None and call.skipped:
        return "skip", _skip_reason(call), ""
    if teardown is not None and teardown.failed:
        return ("error", *_failure(teardown))
    return "pass", "", ""


def unittest_id(item) -> str | None:
    cls = getattr(item, "cls", None)
    if cls is None:
        return None
    return f"{cls.__module__}.{cls.__qualname__}.{item.name}"


#: HardwareClassification values that tie a test class to one kind of device.
_DEVICE_CLASSIFICATIONS = ("cpu", "cuda", "mps", "xpu")


def hardware_of(item, device_type: str) -> str | None:
    """The other device ``item``'s test class declares it needs (``hw_classification``, a
    ``common_utils.HardwareClassification``: torch's own from 2.14, the names adaptation
    hardware-classification-names defines on 2.13), else None: GENERIC and ACCELERATOR
    classes, unclassified ones and classes of ``device_type`` run."""
    cls = getattr(item, "cls", None)
    value = getattr(getattr(cls, "hw_classification", None), "value", None)
    if value in _DEVICE_CLASSIFICATIONS and value != device_type:
        return value.upper()
    return None


class _Upstream:
    def __init__(self, config: dict) -> None:
        from accelkit.core import registry

        self.device_type = registry.get(config["backend"]).device_type
        self.results = open(config["results"], "a", buffering=1)  # noqa: SIM115 (session-long)
        self.strict = bool(config.get("strict"))
        self.expectations = [UpstreamExpectation(**e) for e in config.get("expectations", [])]
        self.applied: dict[str, dict] = {}
        self.phases: dict[str, dict] = {}

    def _write(self, record: dict) -> None:
        self.results.write(json.dumps(record) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        matched: dict[str, int] = {}
        tests = []
        for item in items:
            exp = next((e for e in self.expectations if e.matches(item.nodeid)), None)
            other_hardware = hardware_of(item, self.device_type)
            if other_hardware is not None:
                item.add_marker(pytest.mark.skip(
                    reason=f"the test class is classified for {other_hardware} hardware "
                           "(hw_classification, torch.testing._internal.common_utils"
                           f".HardwareClassification), not {self.device_type}"))
            elif exp is not None:
                matched[exp.pattern] = matched.get(exp.pattern, 0) + 1
                self.applied[item.nodeid] = exp.to_dict()
                note = f"[{exp.category}] {exp.reason}"
                if exp.status == "xfail":
                    item.add_marker(pytest.mark.xfail(reason=note, strict=self.strict))
                else:
                    item.add_marker(pytest.mark.skip(reason=f"expected skip: {note}"))
            tests.append({"nodeid": item.nodeid, "unittest_id": unittest_id(item)})
        self._write({"kind": "collected", "tests": tests, "matched": matched})

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._write({"kind": "collect_error", "nodeid": report.nodeid,
                         "reason": headline(report.longreprtext),
                         "details": report.longreprtext[-6000:]})

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        os.environ[TEST_ENV] = nodeid
        self._write({"kind": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report) -> None:
        self.phases.setdefault(report.nodeid, {})[report.when] = report

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        groups.record_device()  # the device of tests that ran in this process
        os.environ.pop(TEST_ENV, None)
        phases = self.phases.pop(nodeid, {})
        kind, reason, details = outcome(phases)
        self._write({"kind": "test", "nodeid": nodeid, "outcome": kind, "reason": reason,
                     "details": details,
                     "duration_s": round(sum(r.duration for r in phases.values()), 3),
                     "expectation": self.applied.get(nodeid)})

    def pytest_unconfigure(self, config) -> None:
        self.results.close()


def pytest_configure(config: pytest.Config) -> None:
    upstream = config_from_env()
    if upstream is not None:
        config.pluginmanager.register(_Upstream(upstream), "accelkit-upstream")

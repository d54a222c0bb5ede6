"""Comparison of two ``accelkit upstream`` runs of the same test files, typically the device
run against the cpu/gloo baseline (``--baseline cpu``) or against an earlier report
(``--compare report.json``), so the tests a device breaks come first.

Tests are matched by node id with the device name made generic: device-type test classes and
tests carry it (``TestFooMOCK::test_bar_mock`` on mock is ``TestFooCPU::test_bar_cpu`` on
cpu). Buckets, in the order reports show them:

- ``regressions``: passes there, fails here (FAIL, ERROR, TIMEOUT, CRASH);
- ``skipped_here``: passes there, skipped or expected to fail here (coverage the device lacks);
- ``both_fail``: fails in both runs (a test or harness problem more than a device one);
- ``fixed``: fails there, passes here;
- ``only_here`` / ``only_there``: node ids without a counterpart.
"""

from __future__ import annotations

import re

_FAILING = {"fail", "error", "timeout", "crash"}
_NOT_RUN = {"skip", "xfail"}


def generic(nodeid: str, device_type: str) -> str:
    """``nodeid`` with ``device_type`` replaced by ``<device>`` in its class and test names."""
    parts = nodeid.split("::")
    for i in range(1, len(parts)):
        if i == 1 and len(parts) > 2:
            parts[i] = re.sub(re.escape(device_type.upper()) + "$", "<DEVICE>", parts[i])
        parts[i] = re.sub(r"_" + re.escape(device_type) + r"(?=_|$|\[)", "_<device>",
                          parts[i])
    return "::".join(parts)


def _index(report: dict) -> dict[str, dict]:
    device = report["backend"]["device_type"]
    return {generic(t["nodeid"], device): t for t in report["tests"]}


def compare(here: dict, there: dict, there_path: str | None = None) -> dict:
    """Compare two ``report.json`` documents (``here`` is the run being reported)."""
    mine, theirs = _index(here), _index(there)
    buckets: dict[str, list[dict]] = {k: [] for k in (
        "regressions", "skipped_here", "both_fail", "fixed")}
    for key in sorted(set(mine) & set(theirs)):
        a, b = mine[key], theirs[key]
        entry = {"test": key, "here": a["outcome"], "there": b["outcome"],
                 "reason_here": a["reason"], "reason_there": b["reason"]}
        if b["outcome"] == "pass" and a["outcome"] in _FAILING:
            buckets["regressions"].append(entry)
        elif b["outcome"] == "pass" and a["outcome"] in _NOT_RUN:
            buckets["skipped_here"].append(entry)
        elif b["outcome"] in _FAILING and a["outcome"] in _FAILING:
            buckets["both_fail"].append(entry)
        elif b["outcome"] in _FAILING and a["outcome"] == "pass":
            buckets["fixed"].append(entry)
    return {"against": {"backend": there["backend"]["name"], "started": there["started"],
                        "report": there_path},
            "matched": len(set(mine) & set(theirs)),
            **buckets,
            "only_here": sorted(set(mine) - set(theirs)),
            "only_there": sorted(set(theirs) - set(mine))}

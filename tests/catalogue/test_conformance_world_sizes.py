"""``--world-size``: a run at the sizes given runs every check written for each of them (its
``world_size``, its ``also_at`` sizes, any size for ``any_world_size``) on that many ranks, and
names the checks it left out; too few devices for a check's size is a SKIP that names the size
that fits. The whole catalogue at 2, 8 and 16 ranks is part of the main job (``tox -e
conformance`` writes reports/conformance-sizes/, and ``tox -e same-results`` holds each of its
checks to the outcome in tests/fixtures/reports/mock-sizes-baseline.json); these tests keep the
selection and the rank counts true on a few checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from accelkit.conformance.engine import loader

#: Sizes the main job runs the catalogue at besides each check's own (tox.ini, conformance).
SIZES = (2, 8, 16)

#: A check for any world size, one written for 4 ranks and also for 2 and 8, and one written
#: for 8 ranks only.
CHECKS = ("registration.device_handle_contract", "collectives.all_reduce_sum",
          "devicemesh.mesh_3d")


def _conformance(*args: str, devices: int, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
             "ACCELKIT_MOCK_DEVICES": str(devices)})


def test_the_sizes_given_select_every_check_written_for_them():
    """``--list`` at 2, 8 and 16 lists each check at every one of those sizes it runs at,
    and names each check that runs at none of them with the sizes it is written for."""
    catalogue = loader.select(loader.load([]))
    proc = _conformance("--list", *[f"--world-size={n}" for n in SIZES], devices=16,
                        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    listed = set(re.findall(r"^(\S+)  ws=(\d+)", proc.stdout, re.M))
    expected = {(c.id, str(n)) for c in catalogue for n in SIZES if c.runs_at(n)}
    assert listed == expected
    assert len(expected) > 400, len(expected)
    left = set(re.findall(r"^left out: (\S+) ", proc.stdout, re.M))
    assert left == {c.id for c in catalogue if not any(c.runs_at(n) for n in SIZES)}


def test_each_check_runs_on_as_many_ranks_as_its_size(tmp_path):
    """At 2 and 8 ranks: the any-size and the (2, 8) check run at both, each on that many
    rank processes and passing; the check written for 8 runs at 8 only."""
    proc = _conformance("--world-size", "2", "--world-size", "8",
                        *[a for c in CHECKS for a in ("-k", c)],
                        "--report-dir", str(tmp_path), devices=8, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    checks = json.loads((tmp_path / "report.json").read_text())["checks"]
    ran = {(c["id"], c["world_size"]): c for c in checks}
    assert set(ran) == {(CHECKS[0], 2), (CHECKS[0], 8), (CHECKS[1], 2), (CHECKS[1], 8),
                        (CHECKS[2], 8)}
    for (check, size), c in ran.items():
        assert c["outcome"] == "pass", (check, size, c["reason"])
        assert len(c["ranks"]) == size, (check, size, c["ranks"])


def test_too_few_devices_skip_names_the_world_size_that_fits(tmp_path):
    """With 2 devices, a default run SKIPs the 4-rank checks and says --world-size 2 runs them;
    a check not written for 2 ranks gets no such hint."""
    proc = _conformance("-k", "collectives.all_reduce_sum", "-k", "collectives.subgroup_half",
                        "--report-dir", str(tmp_path), devices=2, timeout=300)
    # every check skipped: the run says so and fails (a run where nothing ran is not OK)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAILED: no check ran (2 planned, all skipped" in proc.stdout
    checks = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    assert checks["collectives.all_reduce_sum"]["outcome"] == "skip"
    assert checks["collectives.all_reduce_sum"]["reason"] == (
        "4 devices needed, 2 present; --world-size 2 runs it on 2 ranks")
    assert checks["collectives.subgroup_half"]["reason"] == "4 devices needed, 2 present"

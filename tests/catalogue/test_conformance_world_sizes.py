"""The catalogue on the mock at the other world sizes it declares (``also_at``) and past 8:
every check written for 2 ranks passes on 2, every one written for 8 passes on 8, every one
written for any world size passes on 16 real rank processes (with the ``scale`` area's
simulated checks at 16), each run at that size (but the checks torch itself refuses on a
PrivateUse1 device, ``TORCH_REFUSES``, which SKIP with torch's reason). This keeps the
``also_at`` and ``any_world_size`` declarations true (``--world-size``: a 2-device machine,
an 8-rank torchrun launch and a 16-rank one get a report). About 50 s, 100 s and 120 s here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from accelkit.conformance.engine import loader

#: Checks torch itself refuses on the mock: each SKIPs with a reason starting "unsupported by
#: torch". torch 2.13 compiles DTensor random ops for CUDA only (docs/compile.md) and has DTensor
#: sharding rules for CUDA's fused attention ops only (docs/porting.md, Training); its c10d
#: Backend.Options have no value equality (pytorch/pytorch#175571), and TorchComms is not
#: installed here.
TORCH_REFUSES = {"compile.dtensor_random_aot_eager", "compile.dtensor_random_inductor",
                 "training.tp_attention_sdpa", "registration.backend_options_cache_key",
                 "registration.torchcomms_routing", "training.context_parallel"}

#: Stream-ordering checks, which cannot fail on the mock's default synchronous mode and SKIP
#: there with that reason (they run in the asynchronous modes of `tox -e conformance-modes`).
SYNCHRONOUS_SKIPS = {"streams.collective_ordering", "streams.side_stream_events",
                     "streams.record_stream", "streams.event_record_stream",
                     "streams.ops_do_not_wait", "streams.stream_query"}


@pytest.mark.parametrize("world_size", [2, 8, 16])
def test_mock_passes_every_check_written_for_the_world_size(world_size, tmp_path):
    catalogue = loader.select(loader.load([]))
    expected = {c.id for c in catalogue if c.runs_at(world_size)}
    simulated = {c.id for c in catalogue if c.simulated}
    proc = subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock",
         "--world-size", str(world_size), "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
             "ACCELKIT_MOCK_DEVICES": str(max(8, world_size))})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    checks = json.loads((tmp_path / "report.json").read_text())["checks"]
    assert {c["id"] for c in checks} == expected
    assert all(c["world_size"] == world_size for c in checks)
    assert all(len(c["ranks"]) == (1 if c["id"] in simulated else world_size) for c in checks)
    assert len(checks) - len(simulated & expected) >= {2: 150, 8: 150, 16: 60}[world_size]
    refused = {c["id"] for c in checks if c["outcome"] == "skip"
               and c["reason"].startswith("unsupported by torch")
               and (c["id"] in TORCH_REFUSES or c["id"] in simulated)}
    assert refused & TORCH_REFUSES == TORCH_REFUSES & expected
    # the scale area's expected failure of torch's own RNG offsets (the mock's expectations)
    refused |= {c["id"] for c in checks if c["id"] in simulated and c["outcome"] == "xfail"}
    synchronous = {c["id"] for c in checks if c["outcome"] == "skip"
                   and "mock is synchronous (torch.mock.is_async() is False)" in c["reason"]}
    assert synchronous <= SYNCHRONOUS_SKIPS, synchronous
    failed = {c["id"]: c["reason"] for c in checks
              if c["outcome"] != "pass" and c["id"] not in refused | synchronous}
    assert not failed, failed


def test_too_few_devices_skip_names_the_world_size_that_fits(tmp_path):
    """With 2 devices, a default run SKIPs the 4-rank checks and says --world-size 2 runs them;
    a check not written for 2 ranks gets no such hint."""
    proc = subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock",
         "-k", "collectives.all_reduce_sum", "-k", "collectives.subgroup_half",
         "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ACCELKIT_MOCK_DEVICES": "2", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    # every check skipped: the run says so and fails (a run where nothing ran is not OK)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAILED: no check ran (2 planned, all skipped" in proc.stdout
    checks = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    assert checks["collectives.all_reduce_sum"]["outcome"] == "skip"
    assert checks["collectives.all_reduce_sum"]["reason"] == (
        "4 devices needed, 2 present; --world-size 2 runs it on 2 ranks")
    assert checks["collectives.subgroup_half"]["reason"] == "4 devices needed, 2 present"

"""The ``training`` conformance area (FSDP2, DDP, HSDP, FSDP2 x TP, activation checkpointing,
resume, TP attention): its checks catch a collective library that loses data, and the device
pieces it needed on the mock (``torch.mock._initialized`` for torch.utils.checkpoint, a
``torch._fused_sdp_choice`` answer that matches the path SDPA takes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.python import json_result, run_python

DROPPING_LIBRARY = '''
"""Fault injection: a collective library whose reduce-scatter drops rank 1's contribution
(every rank's shard is short by rank 1's share; the call still completes on time)."""
import torch
import torch.distributed as dist

_reduce_scatter_single = dist.reduce_scatter_single


def _drops_rank_1(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    if dist.get_rank() == 1:
        input = torch.zeros_like(input)
    return _reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)


dist.reduce_scatter_single = _drops_rank_1
'''


def test_training_checks_catch_a_dropped_reduce_scatter_contribution(tmp_path):
    """FSDP2 parity, FSDP2 x TP and both resume checks FAIL (not pass, not hang) when the reduce-scatter
    FSDP2 uses loses one rank's gradients, while DDP (all_reduce, intact) still passes: the
    training checks compare with one device, not only with themselves. One 2-rank mock run."""
    broken = tmp_path / "dropping_library.py"
    broken.write_text(DROPPING_LIBRARY)
    expected = {"training.fsdp2_parity": "fail", "training.fsdp2_tp_2d": "fail",
                "training.resume": "fail", "training.resume_2d": "fail", "training.ddp_parity": "pass"}
    argv = [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock", "--world-size", "2",
            "--checks-module", str(broken), "--report-dir", str(tmp_path / "report"), "--timeout", "120"]
    for cid in expected:
        argv += ["-k", cid]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    outcomes = {c["id"]: c["outcome"] for c in report["checks"]}
    assert outcomes == expected, outcomes
    reasons = {c["id"]: c["reason"].splitlines()[0] for c in report["checks"] if c["reason"]}
    for cid, what in (("training.fsdp2_parity", "FSDP2 reshard_after_forward=True"),
                      ("training.fsdp2_tp_2d", "FSDP2 x TP"), ("training.resume", "FSDP2 uninterrupted run"),
                      ("training.resume_2d", "FSDP2 x TP uninterrupted run")):
        assert f"{what}: first-step gradient of" in reasons[cid], reasons[cid]


def test_mock_module_reports_initialized_and_answers_math_for_sdpa():
    """torch.mock._initialized follows the device's first use (torch.utils.checkpoint reads
    it before saving the device RNG state), and torch._fused_sdp_choice answers MATH for mock
    tensors, the path F.scaled_dot_product_attention takes there (CPU tensors keep theirs)."""
    result = json_result(run_python("""
        import json
        import torch
        import accelkit.backends.mock  # noqa: F401
        before = torch.mock._initialized
        q = torch.randn(1, 2, 4, 8, device="mock:0")
        print(json.dumps({
            "before": before, "after": torch.mock._initialized,
            "missing": hasattr(torch.mock, "no_such_member"),
            "mock": int(torch._fused_sdp_choice(q, q, q)),
            "cpu": int(torch._fused_sdp_choice(q.cpu(), q.cpu(), q.cpu())),
        }))
    """))
    from torch.nn.attention import SDPBackend

    assert result == {"before": False, "after": True, "missing": False,
                      "mock": SDPBackend.MATH.value, "cpu": SDPBackend.FLASH_ATTENTION.value}, result

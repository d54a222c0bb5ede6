"""The ``ops`` area's rows: torch's OpInfo database on the mock against the CPU
(accelkit/conformance/checks/_opinfo.py), inside the mock (tests/support/mock_process.py); the area
itself runs in ``tox -e conformance`` and every mode of ``conformance-modes``, its
expectations in tests/catalogue/test_ops_area_expectations.py."""

from __future__ import annotations

import accelkit.backends.mock  # noqa: F401
import pytest
import torch
from accelkit.conformance.checks import _opinfo

pytestmark = pytest.mark.mock_process(modes=("default",))


DEVICE = torch.device("mock", 0)


def _op(name):
    return next(op for op in _opinfo.op_db() if _opinfo.full_name(op) == name)


def test_a_wrong_kernel_is_a_failing_row_with_the_first_wrong_value():
    """The rows can fail: sgn is right on the mock, then a kernel registered for
    PrivateUse1 that returns zeros makes every float row fail with the difference."""
    sgn = _op("sgn")
    rows = _opinfo.check_op(sgn, DEVICE, dtypes=(torch.float32, torch.float16), which="quick")
    assert [(r["status"], r["backward"]) for r in rows] == [("pass", True), ("pass", False)]
    assert all(1 <= r["samples"] <= _opinfo.QUICK_SAMPLES for r in rows), rows
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("sgn", lambda x: torch.zeros(x.shape, dtype=x.dtype, device=x.device), "PrivateUse1")
        rows = _opinfo.check_op(sgn, DEVICE, dtypes=(torch.float32, torch.float16), which="quick")
    finally:
        lib._destroy()
    assert [r["status"] for r in rows] == ["fail", "fail"], rows
    assert "output 0: Tensor-likes are not close" in rows[0]["detail"]
    assert "Greatest absolute difference" in rows[0]["detail"]


def test_an_op_the_device_refuses_is_an_error_row():
    """An op the device refuses is an error row naming the exception."""
    def refuse(x):
        raise NotImplementedError("no sgn kernel on this device")

    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("sgn", refuse, "PrivateUse1")
        rows = _opinfo.check_op(_op("sgn"), DEVICE, dtypes=(torch.float32,), which="quick")
    finally:
        lib._destroy()
    assert rows[0]["status"] == "error" and "NotImplementedError" in rows[0]["detail"]
    assert "no sgn kernel on this device" in rows[0]["detail"]


def test_a_result_left_on_the_host_fails_its_row_though_its_values_are_right():
    """A kernel whose result stays on the CPU (as a boxed fallback that forgets to move a
    returned list back would leave it) is a failing row naming the output and its device;
    the foreach ops, which return lists, are rows of their own family."""
    (norm,) = _opinfo.check_op(_op("_foreach_norm"), DEVICE, dtypes=(torch.float32,), which="quick")
    assert norm["status"] == "pass", norm
    assert _opinfo.family(_op("_foreach_norm")) == "foreach"

    def on_host(self, ord=2, dtype=None):
        return [torch.linalg.vector_norm(t.cpu(), ord, dtype=dtype) for t in self]

    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("_foreach_norm.Scalar", on_host, "PrivateUse1")
        (norm,) = _opinfo.check_op(_op("_foreach_norm"), DEVICE, dtypes=(torch.float32,),
                                   which="quick")
    finally:
        lib._destroy()
    assert norm["status"] == "fail", norm
    assert "output 0 is on cpu, not on the mock device" in norm["detail"]


def test_random_ops_and_torchs_own_skips_are_skipped_with_the_reason():
    """Ops that draw random numbers (an aten op tagged nondeterministic_seeded) and ops
    torch's test_compare_cpu skips are skipped rows that say why."""
    (randn,) = _opinfo.check_op(_op("randn"), DEVICE, dtypes=(torch.float32,), which="quick")
    assert randn["status"] == "skip"
    assert "aten.randn is nondeterministic_seeded" in randn["detail"]
    (empty,) = _opinfo.check_op(_op("empty_like"), DEVICE, dtypes=(torch.float32,), which="quick")
    assert empty["status"] == "skip" and empty["detail"].startswith("torch skips it in test_compare_cpu")


def test_full_level_takes_every_sample_and_checks_backward_in_half_precision():
    (quick,) = _opinfo.check_op(_op("mul"), DEVICE, dtypes=(torch.float16,), which="quick")
    (full,) = _opinfo.check_op(_op("mul"), DEVICE, dtypes=(torch.float16,), which="full")
    assert quick["status"] == full["status"] == "pass"
    assert not quick["backward"] and full["backward"]
    assert full["samples"] > quick["samples"] == _opinfo.QUICK_SAMPLES


def test_registry_sweep_finds_a_path_for_every_op_but_documented_families(monkeypatch):
    """On the mock every aten op without a path is in a documented family (a skipped row
    with its reason), the layer's ops have one; without the families each is a wrong row
    naming the keys torch has kernels for."""
    from accelkit.conformance.checks import _op_paths

    rows = _op_paths.rows()
    assert rows and all(r["status"] == "skip" and r["detail"].startswith("no path on the device: ")
                        for r in rows), [r for r in rows if r["status"] != "skip"]
    names = {r["op"].removeprefix("aten::") for r in rows}
    assert {"cudnn_convolution", "miopen_rnn", "_flash_attention_forward"} <= names
    assert not names & {"batch_norm_stats", "batch_norm_gather_stats_with_counts",
                        "_thnn_fused_lstm_cell", "_coalesce",
                        "to_padded_tensor", "sparse_sampled_addmm"}
    monkeypatch.setattr(_op_paths, "families", lambda: [])
    undocumented = {r["op"]: r for r in _op_paths.rows()}
    assert undocumented.keys() == {f"aten::{n}" for n in names}
    assert all(r["status"] == "error" for r in undocumented.values())
    assert "register a kernel for the device" in undocumented["aten::cudnn_convolution"]["detail"]
    assert "(kernels for: MkldnnCPU)" in undocumented["aten::mkldnn_max_pool2d"]["detail"]


def test_bad_level_names_the_setting(monkeypatch):
    monkeypatch.setenv("ACCELKIT_OPS_LEVEL", "fast")
    with pytest.raises(ValueError, match="ACCELKIT_OPS_LEVEL='fast': set it to one of quick, full"):
        _opinfo.level()

"""The ``ops`` area: torch's OpInfo database on the device against the CPU
(accelkit/conformance/checks/_opinfo.py), its ``[ops]`` expectations and how the engine judges
a check's rows. The row tests register the mock, so they run in a pytest subprocess of their
own (the area itself runs in ``tox -e conformance`` and every mode of ``conformance-modes``)."""

from __future__ import annotations

import pytest
from conftest import IN_MOCK_PROCESS, run_module_with_mock

if not IN_MOCK_PROCESS:
    from accelkit.conformance.expectations import ExpectationsError, load_ops
    from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult
    from accelkit.conformance.runner import judge_rows

    def test_rows_in_own_process():
        """Registering the mock claims PrivateUse1 for the whole process."""
        run_module_with_mock(__file__, "1")

    def _load(tmp_path, text, known=frozenset({"to_sparse", "linalg.eigh", "add"})):
        path = tmp_path / "exp.toml"
        path.write_text(text)
        return load_ops(path, set(known), "2.13.0")

    def test_ops_entries_with_and_without_dtypes(tmp_path):
        exp = _load(tmp_path, '''
[ops."to_sparse"]
status = "xfail"
reason = "no sparse kernels"

[ops."linalg.eigh"]
status = "xfail"
reason = "eigenvector order"
dtypes = ["complex64"]
torch = ">=2.14"
''')
        assert set(exp) == {"to_sparse"}  # the eigh entry is for torch >= 2.14 only
        assert exp["to_sparse"].covers({"op": "to_sparse", "dtype": "bool"})
        assert not exp["to_sparse"].covers({"op": "add", "dtype": "bool"})
        exp = _load(tmp_path, '[ops."linalg.eigh"]\nstatus = "xfail"\nreason = "r"\ndtypes = ["complex64"]\n')
        assert exp["linalg.eigh"].covers({"op": "linalg.eigh", "dtype": "complex64"})
        assert not exp["linalg.eigh"].covers({"op": "linalg.eigh", "dtype": "float32"})

    @pytest.mark.parametrize("text,message", [
        ('[ops."linalg.eig"]\nstatus = "xfail"\nreason = "r"\n', "no OpInfo 'linalg.eig'; did you mean linalg.eigh"),
        ('[ops."add"]\nstatus = "skip"\nreason = "r"\n', 'status must be "xfail"'),
        ('[ops."add"]\nstatus = "xfail"\nreason = "r"\ndtypes = "float16"\n', "dtypes must be a list"),
        ('[ops."add"]\nstatus = "xfail"\n', "reason is missing"),
        ('[ops.linalg.eigh]\nstatus = "xfail"\nreason = "r"\n', "quote dotted names"),
    ])
    def test_bad_ops_entries_name_the_fix(tmp_path, text, message):
        with pytest.raises(ExpectationsError, match=message.replace("(", r"\(")) as info:
            _load(tmp_path, text)
        assert "exp.toml" in str(info.value)

    def _result(*rows):
        ranks = [RankResult(rank=r, status="pass", rows=[dict(row) for row in rows[r::2]]) for r in range(2)]
        return CheckResult("ops.other", 2, Outcome.PASS, ranks=ranks)

    def _row(op, dtype, status, detail=""):
        return {"op": op, "dtype": dtype, "status": status, "samples": 1, "backward": False,
                "detail": detail}

    def test_a_wrong_row_fails_the_check_naming_op_dtype_and_value(tmp_path):
        result = _result(_row("add", "float32", "pass"),
                         _row("sgn", "float16", "fail", "output 0: Greatest absolute difference: 1.0"),
                         _row("randn", "float32", "skip", "draws random numbers"))
        judge_rows(result, {})
        assert result.outcome is Outcome.FAIL
        assert "1 of 3 cases differ" in result.reason
        assert "sgn float16: output 0: Greatest absolute difference: 1.0" in result.reason

    def test_expected_rows_are_xfail_and_a_stale_entry_is_xpass(tmp_path):
        exp = _load(tmp_path, '[ops."to_sparse"]\nstatus = "xfail"\nreason = "no sparse kernels"\n'
                              '[ops."add"]\nstatus = "xfail"\nreason = "was wrong once"\n')
        result = _result(_row("to_sparse", "float32", "error", "NotImplementedError"),
                         _row("add", "float32", "pass"))
        judge_rows(result, exp)
        assert result.outcome is Outcome.PASS
        assert [(r["op"], r["status"], r["expectation"]) for r in result.rows] == [
            ("to_sparse", "xfail", "no sparse kernels"), ("add", "xpass", "was wrong once")]
        strict = _result(_row("add", "float32", "pass"))
        judge_rows(strict, exp, strict=True)
        assert strict.outcome is Outcome.FAIL and "add float32" in strict.reason

else:
    import accelkit.backends.mock  # noqa: F401
    import torch
    from accelkit.conformance.checks import _opinfo

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
        """An op with no path on the device is an error row naming the exception."""
        rows = _opinfo.check_op(_op("to_sparse"), DEVICE, dtypes=(torch.float32,), which="quick")
        assert rows[0]["status"] == "error" and "NotImplementedError" in rows[0]["detail"]

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

    def test_bad_level_names_the_setting(monkeypatch):
        monkeypatch.setenv("ACCELKIT_OPS_LEVEL", "fast")
        with pytest.raises(ValueError, match="ACCELKIT_OPS_LEVEL='fast': set it to one of quick, full"):
            _opinfo.level()

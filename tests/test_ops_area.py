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

    #: Ops that only the layer gives a path: SyncBatchNorm's (CUDA kernels only), a fused RNN
    #: cell's (CUDA only), sparse COO and CSR ops (SparseCPU, SparseCsrCPU only), a nested one
    #: (NestedTensorCPU only).
    LAYER_PATHS = {"batch_norm_stats", "batch_norm_gather_stats_with_counts", "_thnn_fused_lstm_cell",
                   "_coalesce", "to_padded_tensor", "sparse_sampled_addmm"}

    def test_without_the_layer_its_ops_have_no_path():
        """Before a device registers, the sweep finds no path for the ops the layer adds (the
        same sweep on the mock finds every one of them)."""
        from accelkit.conformance.checks import _op_paths

        assert LAYER_PATHS <= set(_op_paths.without_path())

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

"""The ``ops`` area's expectations and verdict: ``[ops]`` entries of an expectations file
(accelkit/conformance/expectations.py) and how the engine judges a check's op x dtype rows
(accelkit/conformance/verdict.py ``judge_rows``); and, before any device registers, the registry
sweep finding no path for the ops accelkit's layer adds (tests/catalogue/test_ops_area.py runs the rows
themselves inside the mock)."""

from __future__ import annotations

import pytest
from accelkit.conformance.engine.expectations import ExpectationsError, load_ops
from accelkit.conformance.engine.verdict import judge_rows
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult

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

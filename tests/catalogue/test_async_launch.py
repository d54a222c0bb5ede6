"""``ops.async_launch``'s rows (accelkit/conformance/checks/_launches.py) inside the
asynchronous mock, in both memory modes (tests/support/mock_process.py): an op that launches is
a passing row, a listed op that blocks a skipped row with its kind and reason, an unlisted op
that blocks a failing row naming it; the list itself is checked against torch's OpInfo names.
The check itself runs in the asynchronous modes of ``tox -e conformance-modes``."""

from __future__ import annotations

import accelkit.backends.mock  # noqa: F401
import pytest
import torch
from accelkit.conformance.checks import _launches, _opinfo

pytestmark = pytest.mark.mock_process(modes=("async", "discrete-async"))

DEVICE = torch.device("mock", 0)


def _op(name):
    return next(op for op in _opinfo.op_db() if _opinfo.full_name(op) == name)


def _rows(name, dtypes=(torch.float32,)):
    return _launches.check_op(_op(name), DEVICE, torch.mock._Hold, torch.mock.synchronize,
                              dtypes=dtypes)


def test_an_op_that_launches_passes_and_a_listed_one_is_skipped_with_why():
    rows = _rows("sgn", dtypes=(torch.float32, torch.float16))
    assert [r["status"] for r in rows] == ["pass", "pass"], rows
    assert "with the stream held" in rows[0]["detail"]
    (row,) = _rows("nonzero")
    assert row["status"] == "skip", row
    assert row["detail"] == ("blocks, as listed (host read: the output's length is the count of "
                             "nonzero values)")


def test_an_unlisted_op_that_waits_for_the_device_is_a_failing_row():
    """A PrivateUse1 kernel for sgn that reads its input on the host (a .cpu() copy, which waits
    for the held stream): the watchdog releases the stream, and the row fails naming the op."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("sgn", lambda x: torch.sgn(x.cpu()).to(x.device), "PrivateUse1")
        (row,) = _rows("sgn")
    finally:
        lib._destroy()
    assert row["op"] == "sgn" and row["status"] == "fail", row
    assert f"did not return within {_launches.WATCHDOG} s" in row["detail"]


def test_the_list_names_opinfo_ops_with_a_kind_and_a_reason(tmp_path, monkeypatch):
    listed = _launches.blocking_ops()
    assert "item" in listed and listed["geqrf"].startswith("fallback: ")
    bad = tmp_path / "blocking_ops.toml"
    bad.write_text('["nonzero"]\nkind = "slow"\nreason = "x"\n["no_such_op"]\nkind = "fallback"\n'
                   'reason = "y"\n')
    monkeypatch.setattr(_launches, "BLOCKING_OPS", bad)
    _launches.blocking_ops.cache_clear()
    try:
        with pytest.raises(ValueError, match="no_such_op are not OpInfo names"):
            _launches.blocking_ops()
        bad.write_text('["nonzero"]\nkind = "slow"\nreason = "x"\n')
        _launches.blocking_ops.cache_clear()
        with pytest.raises(ValueError, match=r"nonzero need a kind \(host read or fallback\)"):
            _launches.blocking_ops()
    finally:
        _launches.blocking_ops.cache_clear()

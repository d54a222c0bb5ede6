"""Expectations files: format, torch ranges, and the errors for bad files."""

from __future__ import annotations

import pytest
from accelkit.conformance.engine.expectations import ExpectationsError, load, version_matches

KNOWN = {"rng.offset_exact", "rng.tracker_seed", "collectives.all_reduce_sum"}


def _load(tmp_path, text, torch="2.13.0+cpu"):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return load(path, KNOWN, torch), path


def test_xfail_and_skip_entries(tmp_path):
    exp, _ = _load(tmp_path, '''
[checks."rng.offset_exact"]
status = "xfail"
reason = "  dropout uses the CPU generator "
link = "https://example.invalid/1"

[checks."collectives.all_reduce_sum"]
status = "skip"
reason = "hangs"
''')
    assert set(exp) == {"rng.offset_exact", "collectives.all_reduce_sum"}
    assert exp["rng.offset_exact"].status == "xfail"
    assert exp["rng.offset_exact"].reason == "dropout uses the CPU generator"
    assert exp["rng.offset_exact"].link == "https://example.invalid/1"
    assert exp["collectives.all_reduce_sum"].to_dict() == {
        "key": "collectives.all_reduce_sum", "status": "skip", "reason": "hangs", "link": None,
        "torch": None}


def test_torch_range_selects_entries(tmp_path):
    text = '''
[checks."rng.offset_exact"]
status = "xfail"
reason = "old torch"
torch = ">=2.13,<2.15"
'''
    assert "rng.offset_exact" in _load(tmp_path, text, "2.13.0+cpu")[0]
    assert "rng.offset_exact" in _load(tmp_path, text, "2.14.1")[0]
    assert _load(tmp_path, text, "2.15.0")[0] == {}
    assert _load(tmp_path, text, "2.12.9")[0] == {}


@pytest.mark.parametrize("version,spec,ok", [
    ("2.13.0+cpu", ">=2.13", True), ("2.13.0", "==2.13", True), ("2.13.1", "==2.13", False),
    ("2.13.0", "!=2.13.0", False), ("2.14.0a0+git", "<2.15, >2.13", True),
    ("2.13.0", ">2.13", False), ("2.13.0", "<=2.13.0", True),
])
def test_version_matches(version, spec, ok):
    assert version_matches(version, spec) is ok


def test_unknown_id_names_it_and_close_matches(tmp_path):
    with pytest.raises(ExpectationsError) as err:
        _load(tmp_path, '\n[checks."rng.ofset_exact"]\nstatus = "xfail"\nreason = "x"\n')
    msg = str(err.value)
    assert msg.endswith(":2: unknown check id 'rng.ofset_exact'; did you mean rng.offset_exact?")
    assert "exp.toml" in msg


def test_malformed_toml_names_file_and_line(tmp_path):
    with pytest.raises(ExpectationsError) as err:
        _load(tmp_path, '[checks."rng.offset_exact"]\nstatus = xfail\n')
    assert "exp.toml: not valid TOML: " in str(err.value)
    assert "line 2" in str(err.value)


def test_bad_status_names_line_and_key(tmp_path):
    with pytest.raises(ExpectationsError) as err:
        _load(tmp_path, '# c\n[checks."rng.offset_exact"]\nstatus = "fail"\nreason = "x"\n')
    assert str(err.value).endswith(
        ':2: checks."rng.offset_exact".status is \'fail\'; expected one of xfail, skip')


def test_missing_reason(tmp_path):
    with pytest.raises(ExpectationsError, match=r'checks."rng.offset_exact".reason is missing'):
        _load(tmp_path, '[checks."rng.offset_exact"]\nstatus = "skip"\n')


def test_unknown_key(tmp_path):
    with pytest.raises(ExpectationsError, match=r"unknown key\(s\) reson; allowed: link, reason"):
        _load(tmp_path, '[checks."rng.offset_exact"]\nstatus = "skip"\nreson = "x"\n')


def test_unquoted_dotted_id(tmp_path):
    with pytest.raises(ExpectationsError) as err:
        _load(tmp_path, '[checks.rng.offset_exact]\nstatus = "skip"\nreason = "x"\n')
    assert 'looks like an unquoted id; write [checks."rng.offset_exact"]' in str(err.value)


def test_unknown_top_level_key(tmp_path):
    with pytest.raises(ExpectationsError, match="unknown top-level key"):
        _load(tmp_path, 'check = 1\n')


def test_bad_torch_range(tmp_path):
    with pytest.raises(ExpectationsError) as err:
        _load(tmp_path, '[checks."rng.offset_exact"]\nstatus = "skip"\nreason = "x"\n'
                        'torch = "~=2.13"\n')
    assert ":1: checks.\"rng.offset_exact\".torch: bad version clause '~=2.13'" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ExpectationsError, match="cannot read expectations file .*nope.toml"):
        load(tmp_path / "nope.toml", KNOWN, "2.13.0")


def test_an_entry_for_one_world_size_wins_over_the_plain_one(tmp_path):
    from accelkit.conformance.engine.expectations import lookup

    exp, _ = _load(tmp_path, '''
[checks."rng.offset_exact"]
status = "xfail"
reason = "everywhere"

[checks."rng.offset_exact@8"]
status = "skip"
reason = "hangs on 8 ranks"
''')
    assert set(exp) == {"rng.offset_exact", "rng.offset_exact@8"}
    assert lookup(exp, "rng.offset_exact", 8).reason == "hangs on 8 ranks"
    assert lookup(exp, "rng.offset_exact", 4).reason == "everywhere"
    assert exp["rng.offset_exact@8"].to_dict()["key"] == "rng.offset_exact@8"
    assert lookup(exp, "collectives.all_reduce_sum", 4) is None


def test_world_size_entry_errors(tmp_path):
    from accelkit.conformance.api import CheckDef

    with pytest.raises(ExpectationsError, match=r"after '@' comes the world size"):
        _load(tmp_path, '[checks."rng.offset_exact@x"]\nstatus = "skip"\nreason = "x"\n')
    path = tmp_path / "sized.toml"
    path.write_text('[checks."a.b@3"]\nstatus = "skip"\nreason = "x"\n')
    known = {"a.b": CheckDef(id="a.b", fn=lambda ctx: None, world_size=4, also_at=(2,), doc="d")}
    with pytest.raises(ExpectationsError, match=r":1: checks.\"a.b@3\": a.b is written for "
                                                r"world sizes 4, 2, not 3"):
        load(path, known, "2.13.0")

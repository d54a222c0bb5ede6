"""The coverage table: every member of the device-handle contract and every c10d parameter in
``accelkit.conformance.coverage.CONTRACT`` has a catalogue check declaring it covers it, and
``docs/coverage.md`` is the table the declarations make."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelkit.conformance import coverage
from accelkit.conformance.api import check
from accelkit.core.handle import DeviceHandle, StreamDeviceHandle, members

DOC = Path(__file__).resolve().parents[1] / "docs" / "coverage.md"


def _catalogue():
    from accelkit.conformance import loader

    return [c for c in loader.load([]).values()
            if c.module.startswith("accelkit.conformance.checks.")]


def test_every_contract_item_has_a_check():
    uncovered = [item for item, ids in coverage.covering(_catalogue()).items() if not ids]
    assert uncovered == [], f"contract items no check covers: {uncovered}"


def test_the_contract_lists_every_handle_member():
    named = {item.rsplit(".", 1)[1] for item in coverage.HANDLE}
    assert named == {*members(DeviceHandle), *members(StreamDeviceHandle)}


def test_docs_table_is_generated_from_the_declarations():
    assert DOC.read_text() == coverage.table(_catalogue()), (
        "docs/coverage.md is out of date: run python -m accelkit.conformance.coverage "
        "docs/coverage.md")


def test_an_unknown_item_is_refused_with_where_to_look():
    with pytest.raises(ValueError, match="covers unknown contract items.*coverage.CONTRACT"):
        @check(covers=("all_reduce(op=SUMM)",))
        def not_a_check(ctx):
            """Never registered."""

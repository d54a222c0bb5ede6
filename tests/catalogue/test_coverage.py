"""The coverage table: every member of the device-handle contract and every c10d parameter in
``accelkit.conformance.reports.coverage.CONTRACT`` has a catalogue check declaring it covers it, and
``docs/coverage.md`` is the table the declarations make."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelkit.conformance.api import check
from accelkit.conformance.reports import coverage
from accelkit.core.handle import DeviceHandle, StreamDeviceHandle, members

DOC = Path(__file__).resolve().parents[2] / "docs" / "coverage.md"


def _catalogue():
    from accelkit.conformance.engine import loader

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
        "docs/coverage.md is out of date: run python -m accelkit.conformance.reports.coverage "
        "docs/coverage.md")


def test_an_unknown_item_is_refused_with_where_to_look():
    with pytest.raises(ValueError, match="covers unknown contract items.*coverage.CONTRACT"):
        @check(covers=("all_reduce(op=SUMM)",))
        def not_a_check(ctx):
            """Never registered."""


ROOT = Path(__file__).resolve().parents[2]
#: Each seam: its header (or the layer's implementation), the table's prefix, how a method is
#: found in the text.
SEAM_SOURCES = {
    "guard.": (ROOT / "core" / "csrc" / "runtime" / "guard.cpp",
               r"(\w+)\([^;{]*?\)(?:\s+const)?(?:\s+noexcept)?\s+override"),
    "Runtime::": (ROOT / "core" / "include" / "accelkit" / "runtime.h", r"virtual [^(;~]*?\b(\w+)\("),
    "Transport::": (ROOT / "core" / "include" / "accelkit" / "c10d" / "transport.h",
                    r"virtual [^(;~]*?\b(\w+)\("),
}


def _methods_in_table(prefix: str) -> set[str]:
    """The methods the seam's rows and UNOBSERVED name ("Runtime::copy (host to device)" and
    "Runtime::allocate / release" name copy, allocate and release)."""
    names = set()
    for item in [*coverage.SEAMS, *coverage.UNOBSERVED]:
        if item.startswith(prefix):
            head = item[len(prefix):].split(" <- ")[0].split(" (")[0]
            names.update(n.strip().removeprefix(prefix) for n in head.split(" / "))
    return names


@pytest.mark.parametrize("prefix", list(SEAM_SOURCES))
def test_every_method_of_the_seams_is_a_row_or_said_unobservable(prefix):
    """Every method of the device guard (core/csrc/runtime/guard.cpp's overrides), the runtime
    and the transport (their headers' virtuals) is a row of the coverage table or in UNOBSERVED
    with its reason: a method added to a seam needs a check, or a reason why none can see it."""
    import re

    path, pattern = SEAM_SOURCES[prefix]
    declared = set(re.findall(pattern, path.read_text()))
    assert declared, f"no method found in {path}"
    assert declared == _methods_in_table(prefix), (
        f"{path.name}: not in the table {sorted(declared - _methods_in_table(prefix))}; in the "
        f"table but not the seam {sorted(_methods_in_table(prefix) - declared)}")


def test_every_collective_of_the_glue_reaches_the_table():
    """Each c10d::Backend collective TransportBackend implements (the layer's private
    transport_backend.h) is an entry point of coverage.ENTRY_POINTS, whose rows are in the
    transport table, and every row of that
    table but the abort and the shutdown (reached from a group's teardown) is reached from one:
    a collective added to the glue needs its row and a check."""
    import re

    header = ROOT / "core" / "csrc" / "c10d" / "transport_backend.h"
    declared = set(re.findall(r"Work> (\w+)\([^;{]*?\)\s*override", header.read_text()))
    assert declared == set(coverage.ENTRY_POINTS), (
        f"in transport_backend.h, not ENTRY_POINTS: "
        f"{sorted(declared - set(coverage.ENTRY_POINTS))}; "
        f"in ENTRY_POINTS only: {sorted(set(coverage.ENTRY_POINTS) - declared)}")
    reached = {row for rows in coverage.ENTRY_POINTS.values() for row in rows}
    assert reached <= set(coverage.TRANSPORT), sorted(reached - set(coverage.TRANSPORT))
    assert set(coverage.TRANSPORT) - reached == {
        "Transport::abort <- a collective past its timeout",
        "Transport::shutdown <- destroy_process_group right after a collective"}

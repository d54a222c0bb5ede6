"""The mutant matrix: the conformance catalogue catches every mutant of the mock's fault build.

A mutant is the mock with one realistic bug switched on: the fault build
(``ACCELKIT_MOCK_FAULTS=1``; ``core/csrc/testing/faults.cpp`` lists the faults with their stories)
runs with ``ACCELKIT_FAULT=<fault>``. Per mode of the mock one ``accelkit conformance`` run
at 2 ranks runs, with each fault on, the catalogue checks that catch it (:data:`CATCHERS`, a
cheap subset of the whole score that ``bench/mutants.py`` measures and bench/README.md
records), and the same checks with no fault (the control, which must pass). The default run
also holds the fault test of the asynchronous and discrete modes: their mutants pass there
(the synchronous host-memory mock cannot see them) and are caught in their own mode.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mutant_faults  # tests/fixtures (tests/conftest.py)
import pytest

#: fault -> the catalogue checks that catch it in its mode, the cheapest of each mutant's
#: catching checks in bench/README.md's "Mutation score" (2 ranks).
CATCHERS: dict[str, tuple[str, ...]] = {
    "unreduced_above_4kib": ("collectives.sweep_all_reduce_sum", "dtensor.large_partial"),
    "bfloat16_reduced_as_float16": ("collectives.all_reduce_sum",),
    "chunk_boundary_off_by_one": ("collectives.sweep_all_gather", "dtensor.large_redistribute"),
    "reduction_drops_last_rank": ("collectives.all_reduce_sum",),
    "broadcast_from_rank0": ("collectives.broadcast_every_root",),
    "allgather_stale_result": ("collectives.sweep_all_gather", "dtensor.redistribute_1d"),
    "rng_offset_not_advanced": ("rng.state_layout",),
    "rng_offset_unrounded": ("rng.offset_rounding",),
    "rng_state_24_bytes": ("rng.state_layout",),
    "is_initialized_always": ("registration.device_handle_contract",),
    "set_device_ignored": ("registration.accelerator_api",),
    "copy_strided_as_dense": ("dtensor.redistribute_1d",),
    "work_wait_unordered": ("collectives.async_work",),
    "record_stream_ignored": ("streams.record_stream",),
    "collective_skips_producers": ("streams.collective_ordering", "collectives.all_reduce_sum"),
    "transport_reads_device_memory": ("collectives.all_reduce_sum",),
    "seed_truncated_to_32_bits": ("rng.seed_width",),
    "elapsed_time_zero": ("streams.event_timing",),
    "p2p_ignores_tags": ("collectives.p2p_tags_out_of_order",),
    "copy_drops_half_above_1mib": ("registration.runtime_copies",),
    "synchronize_noop": ("streams.device_handle_streams",),
    "guard_keeps_new_device": ("registration.guard_restores_device",),
    "device_barrier_noop": ("collectives.device_barrier",),
    "peer_copy_dropped": ("registration.runtime_copies", "registration.device_copies"),
    "stream_query_always_done": ("streams.stream_query",),
    "event_records_on_current_stream": ("streams.event_record_stream",),
    "elapsed_time_host_clock": ("streams.event_timestamps",),
    "stream_priority_ignored": ("streams.stream_priority",),
    "fallback_waits": ("ops.async_launch",),
    "wait_event_unordered": ("streams.side_stream_events",),
    "split_shares_parent": ("devicemesh.eager_init_split", "collectives.capability_levels"),
}

WORLD_SIZE = 2

#: Stream-ordering checks SKIP on the synchronous mock (the ordering cannot go wrong there):
#: the asynchronous mutants they catch pass the other modes unseen, as the fault test expects.
SYNCHRONOUS_SKIPS = {"streams.record_stream", "streams.collective_ordering",
                     "streams.stream_query", "streams.event_record_stream",
                     "streams.side_stream_events", "streams.stream_priority",
                     "ops.async_launch"}


def test_every_mutant_has_catchers_and_the_build_lists_the_same_faults():
    """The table covers every fault, and the fault build has exactly these faults."""
    assert set(CATCHERS) == set(mutant_faults.MUTANTS)
    code = ("from accelkit.backends import mock; "
            "print(' '.join(name for name, _ in mock._C._faults()))")
    env = {**__import__("os").environ, **mutant_faults.FAULT_BUILD,
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == list(mutant_faults.MUTANTS)


def test_the_default_build_has_no_fault_code():
    """The shipped build (library() and the mock's extensions without defines) holds none of the
    fault points, which read ACCELKIT_FAULT; the fault build does."""
    from accelkit.backends.mock_spec import EXTENSIONS, FAULT_DEFINES
    from accelkit.core.cpp import _Build, library

    default = [Path(library()), _Build(**EXTENSIONS["device"]).path,
               _Build(**EXTENSIONS["mockccl"]).path]
    for path in default:
        if path.exists():
            assert b"ACCELKIT_FAULT" not in path.read_bytes(), f"fault code in {path}"
    assert b"ACCELKIT_FAULT" in Path(library(FAULT_DEFINES)).read_bytes()


def _plan(mode: str) -> list[tuple[str, tuple[str, ...]]]:
    """The mode's mutants with their catchers; the default mode also runs the others' (the
    fault test); the control runs every check used."""
    faults = [f for f, m in mutant_faults.MUTANTS.items() if mode in m or mode == "default"]
    used = tuple(dict.fromkeys(cid for f in faults for cid in CATCHERS[f]))
    return [*((f, CATCHERS[f]) for f in faults), (mutant_faults.CONTROL, used)]


@pytest.mark.parametrize("mode", list(mutant_faults.MODES))
def test_every_mutant_is_caught_in_its_mode_and_only_there(mode, tmp_path):
    outcomes = mutant_faults.run(mode, _plan(mode), WORLD_SIZE, tmp_path)
    control = outcomes.pop(mutant_faults.CONTROL)
    synchronous = mutant_faults.MODES[mode]["ACCELKIT_MOCK_ASYNC"] == "0"
    wanted = {cid: "skip" if synchronous and cid in SYNCHRONOUS_SKIPS else "pass"
              for cid in control}
    assert control == wanted, f"control (no fault): {control}"
    for fault, by_check in outcomes.items():
        caught = sorted(cid for cid, o in by_check.items() if o in mutant_faults.CAUGHT)
        if mode in mutant_faults.MUTANTS[fault]:
            assert caught, f"{fault} not caught in mode {mode}: {by_check}"
            print(f"{fault} ({mode}): caught by {', '.join(caught)}")
        else:  # the fault test: an async/discrete mutant passes the default mode
            assert not caught, f"{fault} caught in mode {mode}, expected only in " \
                               f"{', '.join(mutant_faults.MUTANTS[fault])}: {by_check}"
            print(f"{fault} ({mode}): passes, as expected")


def test_ordering_mutants_are_caught_under_a_seeded_schedule(tmp_path):
    """With the streams interleaved from a seed (``ACCELKIT_MOCK_SCHEDULE``: one worker, an
    order drawn from the seed) the asynchronous mutants (a missing stream wait, record_stream
    or producers' event) are still caught, and the control passes: the scheduler's order is
    one the catalogue's ordering checks see through; so are the mutants only a schedule that
    runs one stream at a time shows (stream priority ignored)."""
    faults = [f for f, m in mutant_faults.MUTANTS.items() if "async" in m or "scheduled" in m]
    used = tuple(dict.fromkeys(cid for f in faults for cid in CATCHERS[f]))
    plan = [*((f, CATCHERS[f]) for f in faults), (mutant_faults.CONTROL, used)]
    outcomes = mutant_faults.run("async", plan, WORLD_SIZE, tmp_path,
                                 env={"ACCELKIT_MOCK_SCHEDULE": "1"})
    control = outcomes.pop(mutant_faults.CONTROL)
    assert control == {cid: "pass" for cid in used}, f"control (no fault): {control}"
    for fault, by_check in outcomes.items():
        assert any(o in mutant_faults.CAUGHT for o in by_check.values()), \
            f"{fault} not caught under a seeded schedule: {by_check}"


DOCTOR_PROBES = r"""
import json, os
from accelkit.core import check_device_handle, registry

registry.get("mock").setup()
found = {}
for fault in ("", "seed_truncated_to_32_bits", "elapsed_time_zero"):
    os.environ["ACCELKIT_FAULT"] = fault
    report = check_device_handle("mock")
    found[fault] = sorted({f.member for f in report.errors
                           if f.member in ("initial_seed", "manual_seed", "Event.elapsed_time")})
print(json.dumps(found))
"""


def test_the_device_handle_checker_probes_seed_width_and_event_timing():
    """check_device_handle (what ``accelkit doctor`` and registration.device_handle_contract
    run) on the fault build: a seed kept to 32 bits is an error of initial_seed and
    manual_seed, events without timestamps one of Event.elapsed_time; neither without a
    fault (one process, the fault switched between runs)."""
    import json
    import os

    env = {**os.environ, **mutant_faults.FAULT_BUILD, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", DOCTOR_PROBES], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "": [], "seed_truncated_to_32_bits": ["initial_seed", "manual_seed"],
        "elapsed_time_zero": ["Event.elapsed_time"]}

"""Static tests of the conformance catalogue: what is in it, not whether it passes (the engine
runs it: ``accelkit conformance --backend cpu``); and, end to end, that it catches broken
collective libraries.

Every area module is present, ids are unique and match their module, every docstring names
its source, requirements are consistent, and every behaviour described by the PyTorch PRs the
design rests on (103235: DTensor's RNG tracker; 102468: cuda-like devices in DeviceMesh and
DTensor; 102336: DeviceMesh on the dispatchable process group; 134247: the ambient mesh of
parallelize_module) and every item of the catalogue's floor list (what each area must check)
maps to checks that exist.
"""

from __future__ import annotations

import re

import pytest
from accelkit.conformance.api import CHECKS
from accelkit.conformance.checks import load_all
from support import TESTS

AREAS = ("registration", "collectives", "devicemesh", "dtensor", "rng", "tp", "checkpoint",
         "compile", "training", "streams", "scale", "ops", "pipelining")
PACKAGE = "accelkit.conformance.checks"

#: Each behaviour the design PRs describe -> the checks that exercise it.
DESIGN_PR_COVERAGE: dict[str, dict[str, tuple[str, ...]]] = {
    "103235": {
        "the tracker keeps RNG state as a ByteTensor (16-byte Philox seed + offset)":
            ("rng.state_layout", "rng.supported", "rng.offset_rounding"),
        "_distribute_region runs every random DTensor op (OffsetBasedRNGTracker is the default)":
            ("rng.tracker_type", "rng.offset_advance", "dtensor.factory_random"),
        "the default policy: shards get distinct streams, replicas equal ones":
            ("rng.shard_distinct", "rng.replicate_equal", "rng.mesh_2d", "rng.dropout",
             "tp.dropout_deterministic"),
        "RNG states are shared and synchronized among ranks":
            ("rng.manual_seed_sync", "rng.run_state_sync", "rng.determinism", "rng.offset_exact",
             "tp.dropout_offset_exact"),
        "the RNG state may be asynchronous outside participating ranks (sub-mesh)":
            ("rng.submesh",),
        "a user generator and fork_rng around the region":
            ("rng.user_generator", "rng.fork_rng", "training.activation_checkpoint_dtensor_rng"),
        "parameter init goes through the tracker":
            ("rng.init_weights", "tp.meta_init_2d"),
        "the tracker only supports cuda-like devices (cpu refused)":
            ("rng.cpu_mesh_refused",),
    },
    "102468": {
        "Backend has a default backend per device (registered for a new device)":
            ("registration.default_backend_for_device", "devicemesh.device_selection"),
        "DeviceMesh uses the device handle for cuda-like devices (device_count, set_device)":
            ("devicemesh.device_selection", "registration.device_handle_contract",
             "registration.device_module", "rng.supported"),
        "DTensor supports cuda-like devices":
            ("dtensor.local_device_index", "dtensor.distribute_1d", "registration.accelerator_api",
             "registration.manual_seed_reaches_device"),
    },
    "102336": {
        "DeviceMesh uses the dispatchable process group (backends integrate through c10d only)":
            ("registration.group_backend_for_device", "devicemesh.dim_group_dispatch",
             "devicemesh.mesh_2d_names", "devicemesh.submesh_collective_members",
             "devicemesh.eager_init_split", "collectives.functional"),
    },
    "134247": {
        "device_mesh is optional: parallelize_module takes it from the ambient `with mesh:`":
            ("tp.ambient_mesh", "training.fsdp2_tp_2d"),
        "the FeedForward example calls parallelize_module inside __init__ under `with mesh:`":
            ("tp.feedforward_in_init",),
        "w2's Partial output may be returned as is or redistributed to Replicate":
            ("tp.partial_output",),
        "parallelize_plan=None warns and does nothing (also the description's positional call)":
            ("tp.plan_none_warns",),
        "no mesh argument and no ambient mesh is an error":
            ("tp.no_mesh_raises",),
        "an n-D ambient mesh is taken whole: the user must pick the intended (TP) mesh":
            ("tp.nd_ambient_mesh",),
        "distribute_tensor / distribute_module / from_local also take the ambient mesh":
            ("dtensor.ambient_mesh",),
        "out-of-model annotation with FQNs remains available":
            ("tp.dict_plan_wildcards",),
        "inputs and activations may be redistributed by the model itself":
            ("tp.prepare_module_io", "dtensor.redistribute_1d"),
    },
}

#: The floor list: what each area must check, by check name.
FLOOR: dict[str, tuple[str, ...]] = {
    "registration": ("default_backend_for_device", "group_backend_for_device",
                     "device_handle_contract", "accelerator_api", "manual_seed_reaches_device"),
    "collectives": ("all_reduce_sum", "all_reduce_product", "all_reduce_min", "all_reduce_max",
                    "all_reduce_avg", "all_reduce_bitwise", "broadcast_every_root", "reduce",
                    "all_gather", "all_gather_single", "all_gather_into_tensor", "all_gather_in_place",
                    "reduce_scatter",
                    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single_equal",
                    "all_to_all_single_uneven", "all_to_all", "gather", "scatter", "send_recv_ring",
                    "barrier", "async_work", "functional", "subgroup_half", "non_contiguous",
                    "all_reduce_64mib", "sweep_all_reduce_sum", "sweep_all_reduce_views",
                    "sweep_all_reduce_product", "sweep_all_reduce_min_max", "sweep_all_reduce_avg",
                    "sweep_all_reduce_bitwise", "sweep_broadcast", "sweep_reduce",
                    "sweep_all_gather", "sweep_all_gather_single", "sweep_reduce_scatter",
                    "sweep_reduce_scatter_single", "sweep_all_to_all_single", "sweep_all_to_all",
                    "sweep_gather", "sweep_scatter", "sweep_send_recv", "p2p_tags_out_of_order",
                    "p2p_same_tag_fifo", "p2p_tags_in_batch", "p2p_any_source_tag",
                    "group_roots", "group_timeout"),
    "devicemesh": ("mesh_1d", "mesh_2d_names", "mesh_3d", "slice_by_name", "coordinate_local_rank",
                   "flatten", "context_manager", "device_selection", "mesh_larger_than_world",
                   "from_group", "submesh_collective_members"),
    "dtensor": ("distribute_1d", "distribute_2d", "from_local_to_local", "redistribute_1d",
                "redistribute_2d", "partial", "elementwise", "matmul", "reductions", "view_ops",
                "softmax", "layer_norm", "embedding", "autograd", "factory", "factory_random",
                "local_device_index", "distribute_module", "ambient_mesh", "comm_counts",
                "from_local_run_check", "submesh_non_members", "meta_to_empty", "save_load",
                "large_redistribute", "large_partial"),
    "rng": ("supported", "state_layout", "manual_seed_sync", "tracker_type", "offset_advance",
            "shard_distinct", "replicate_equal", "mesh_2d", "determinism", "offset_exact",
            "offset_rounding", "dropout", "user_generator", "fork_rng", "run_state_sync",
            "init_weights", "submesh", "seed_width", "seed_every_device"),
    "tp": ("colwise", "rowwise", "mlp", "sequence_parallel", "prepare_module_io",
           "dict_plan_wildcards", "ambient_mesh", "feedforward_in_init", "partial_output",
           "plan_none_warns", "no_mesh_raises", "transformer_block", "dropout_deterministic",
           "dropout_offset_exact", "optimizer_step", "meta_init_2d", "comm_counts", "large_mlp"),
    "checkpoint": ("sharded_roundtrip", "reshard_shard1", "reshard_replicate", "reshard_2d",
                   "tp_model_roundtrip"),
    "compile": ("registration", *(f"{program}_{backend}" for program in (
        "ops", "functional_collectives", "dtensor_program", "tp_block", "dtensor_random")
        for backend in ("aot_eager", "inductor"))),
    # the training area's issue: FSDP2, DDP, HSDP, FSDP2 x TP, checkpointing, resume, attention
    "training": ("ddp_parity", "fsdp2_parity", "fsdp2_mixed_precision", "fsdp2_grad_accumulation",
                 "fsdp2_prefetch", "fsdp2_cpu_offload", "fsdp2_ops", "fsdp2_divide_factor", "hsdp_2d",
                 "fsdp2_tp_2d", "activation_checkpoint_rng", "activation_checkpoint_dtensor_rng",
                 "resume", "resume_2d", "sdpa_choice", "tp_attention", "tp_attention_sdpa",
                 "context_parallel"),
    "pipelining": ("p2p_batched_tags", "schedule_gpipe", "schedule_1f1b", "schedule_interleaved_1f1b",
                   "schedule_looped_bfs", "schedule_interleaved_zero_bubble", "schedule_zbv_zero_bubble",
                   "schedule_dualpipev", "pipeline_split", "pp_fsdp2", "pp_tp", "train_3d"),
    "streams": ("device_handle_streams", "collective_ordering", "side_stream_events",
                "record_stream", "memory_statistics", "event_timing"),
}

SOURCE = re.compile(r"PR \d{6}|torch\.|DTensor\.|DeviceMesh\.|accelkit\.core")


@pytest.fixture(scope="module")
def catalogue():
    load_all()
    return {cid: c for cid, c in CHECKS.items() if c.module.startswith(PACKAGE + ".")}


def test_every_area_has_its_module_and_only_those(catalogue):
    assert {c.area for c in catalogue.values()} == set(AREAS)
    for cid, c in catalogue.items():
        assert c.module == f"{PACKAGE}.{c.area}", f"{cid} is defined in {c.module}"


def test_ids_are_unique_and_well_formed(catalogue):
    names = [c.fn.__module__ + "." + c.fn.__qualname__ for c in catalogue.values()]
    assert len(names) == len(set(names)), "one function registered under two ids"
    for cid in catalogue:
        assert re.fullmatch(r"[a-z]+\.[a-z0-9_]+", cid), cid


def test_every_docstring_states_the_behaviour_and_its_source(catalogue):
    for cid, c in catalogue.items():
        assert len(c.doc.split()) >= 12, f"{cid}: docstring too short to state the behaviour"
        assert SOURCE.search(c.doc), f"{cid}: docstring names no source (PR number or torch API)"


def test_design_pr_behaviours_map_to_existing_checks(catalogue):
    for pr, behaviours in DESIGN_PR_COVERAGE.items():
        for behaviour, ids in behaviours.items():
            missing = [cid for cid in ids if cid not in catalogue]
            assert not missing, f"PR {pr} '{behaviour}': no check {missing}"


def test_checks_citing_a_design_pr_are_in_its_table(catalogue):
    covered = {pr: {cid for ids in table.values() for cid in ids}
               for pr, table in DESIGN_PR_COVERAGE.items()}
    for cid, c in catalogue.items():
        for pr in re.findall(r"PR (\d{6})", c.doc):
            assert pr in covered, f"{cid} cites PR {pr}, which is not a design PR of the table"


def test_floor_list_is_covered(catalogue):
    for area, names in FLOOR.items():
        missing = [f"{area}.{n}" for n in names if f"{area}.{n}" not in catalogue]
        assert not missing, f"floor items without a check: {missing}"


def test_requirements_are_consistent(catalogue):
    for cid, c in catalogue.items():
        if c.area == "compile" and cid.endswith("_inductor"):
            assert "inductor" in c.requires, f"{cid} must require inductor (SKIP without one)"
        if c.area == "rng" and cid != "rng.cpu_mesh_refused":
            assert "rng-tracker" in c.requires, f"{cid} must require rng-tracker (SKIP on cpu)"
        if "offset-exact" in c.requires:
            assert "rng-tracker" in c.requires, f"{cid}: offset-exact implies rng-tracker"
        if c.simulated:
            assert c.area == "scale", f"{cid}: simulated checks live in the scale area"
            assert c.world_size == 16 and set(c.world_sizes) <= {16, 64, 256, 1024}, (
                f"{cid}: simulated sizes {c.world_sizes}")
            continue
        assert c.world_size in (4, 8), f"{cid}: world_size {c.world_size}"
        if c.world_size == 8:
            assert cid in ("devicemesh.mesh_3d", "pipelining.train_3d"), (
                f"{cid} needs 8 ranks; only the 3-D mesh and the 3-D training run should")
        assert set(c.also_at) <= {2, 8}, f"{cid}: also_at {c.also_at} (verified sizes: 2, 8)"


def test_most_checks_also_run_on_2_and_8_ranks(catalogue):
    """A 2-device machine and an 8-rank launch get a report: the catalogue is written against
    ctx.world_size; the few checks tied to 4 ranks' shapes are the named exceptions."""
    real = {cid for cid, c in catalogue.items() if not c.simulated}
    at2 = {cid for cid, c in catalogue.items() if 2 in c.world_sizes}
    at8 = {cid for cid, c in catalogue.items() if 8 in c.world_sizes}
    assert real - at2 == {"collectives.subgroup_half", "devicemesh.mesh_3d", "pipelining.train_3d"}
    assert real - at8 == {"dtensor.embedding", "dtensor.matmul",
                                    "checkpoint.reshard_shard1", "tp.transformer_block"}


def test_checks_for_any_world_size_are_not_tied_to_some_sizes(catalogue):
    """A check written for any world size runs at 2 and 8 too; the ones tied to shapes of 4
    ranks (the named exceptions above) are not for any size, nor are simulated ones."""
    anywhere = {cid for cid, c in catalogue.items() if c.any_world_size}
    assert len(anywhere) >= 40
    for cid in anywhere:
        c = catalogue[cid]
        assert not c.simulated and {2, 4, 8} <= set(c.world_sizes), f"{cid}: {c.world_sizes}"


def test_cpu_backend_runs_every_check_it_can(catalogue):
    from accelkit.core import registry

    cpu = registry.get("cpu")
    skipped = {cid for cid, c in catalogue.items() if cpu.capabilities.missing(c.requires, "cpu")}
    allowed = {cid for cid, c in catalogue.items()
               if {"rng-tracker", "accelerator"} & set(c.requires)}
    assert skipped == allowed
    assert len(catalogue) - len(skipped) >= 80, "the cpu backend should run most of the catalogue"


BROKEN_LIBRARY = '''
"""Fault injection for the catalogue test: a collective library whose all_reduce and
broadcast return at once without communicating (a library that "returns success")."""
import torch.distributed as dist


def _returns_success(tensor, *args, **kwargs):
    return None


dist.all_reduce = _returns_success
dist.broadcast = _returns_success
'''


def test_checks_catch_a_library_that_does_not_communicate(tmp_path):
    """The catalogue's value checks fail (not pass, not hang) when all_reduce/broadcast do
    nothing, while a check of an intact collective still passes: the checks cannot pass
    vacuously. One 4-rank cpu run of four checks (~30 s here)."""
    import json
    import os
    import subprocess
    import sys

    broken = tmp_path / "broken_library.py"
    broken.write_text(BROKEN_LIBRARY)
    ids = ("collectives.all_reduce_sum", "collectives.broadcast_every_root",
           "devicemesh.mesh_1d", "collectives.reduce_scatter_single")
    argv = [sys.executable, "-m", "accelkit", "conformance", "--backend", "cpu",
            "--checks-module", str(broken), "--report-dir", str(tmp_path / "report"), "--timeout", "60"]
    for cid in ids:
        argv += ["-k", cid]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    outcomes = {c["id"]: c["outcome"] for c in report["checks"]}
    assert outcomes == {"collectives.all_reduce_sum": "fail", "collectives.broadcast_every_root": "fail",
                        "devicemesh.mesh_1d": "fail", "collectives.reduce_scatter_single": "pass"}, outcomes


def test_expect_raises_fails_when_nothing_or_the_wrong_message_is_raised():
    from accelkit.conformance.checks._util import expect_raises

    with expect_raises(ValueError, "bad", "input", what="parse") as raised:
        raise ValueError("bad input")
    assert raised.message == "bad input"
    with pytest.raises(AssertionError, match="parse did not raise ValueError"):
        with expect_raises(ValueError, what="parse"):
            pass
    with pytest.raises(AssertionError, match=r"parse raised ValueError without \['input'\]: bad"):
        with expect_raises(ValueError, "input", what="parse"):
            raise ValueError("bad")
    with pytest.raises(KeyError):  # another exception type is not swallowed
        with expect_raises(ValueError, what="parse"):
            raise KeyError("x")


WRAPPER = '''
import sys
sys.path.insert(0, {fixtures!r})
import unreduced_fault
unreduced_fault.wrap_catalogue(__name__, {threshold}, ("collectives", "dtensor", "tp"))
'''

#: The fault's threshold: a library wrong above 1 MiB (the mutant matrix, tests/catalogue/test_mutants.py,
#: has the C++ layer's version of the same bug above 4 KiB).
THRESHOLDS = {"unreduced_above_1mib": 1024 * 1024}


def test_a_library_wrong_above_a_size_is_caught_across_collectives_dtensor_and_tp(tmp_path):
    """A collective library that returns reductions unreduced above 1 MiB (a protocol switch
    at a size most unit tests stay under) is caught (FAIL or ERROR) by at least 5 checks, among
    them checks of collectives, DTensor and TP. One run of the three areas on the mock at 2
    ranks (tests/fixtures/unreduced_fault.py wraps the catalogue's checks)."""
    import json
    import os
    import subprocess
    import sys

    fixtures = str(TESTS / "fixtures")
    argv = [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock",
            "--world-size", "2", "--report-dir", str(tmp_path / "report")]
    for name, threshold in THRESHOLDS.items():
        (tmp_path / f"{name}.py").write_text(WRAPPER.format(fixtures=fixtures, threshold=threshold))
        argv += ["--checks-module", str(tmp_path / f"{name}.py"), "--area", name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    for name in THRESHOLDS:
        caught = sorted(c["id"].split(".", 1)[1].replace("__", ".", 1) for c in report["checks"]
                        if c["area"] == name and c["outcome"] in ("fail", "error"))
        areas = {cid.split(".")[0] for cid in caught}
        assert len(caught) >= 5 and areas == {"collectives", "dtensor", "tp"}, (name, caught)
        print(f"{name}: caught by {len(caught)} checks: {', '.join(caught)}")

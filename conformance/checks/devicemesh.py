"""DeviceMesh on the backend's device: layouts, names, slicing, per-dimension process groups,
the ambient ``with mesh:`` context and device selection.

Sources: PR 102336 (DeviceMesh builds its groups as dispatchable process groups, so a backend
only integrates with c10d), PR 102468 (DeviceMesh uses the cuda-like device handle
``torch.<device>`` and the default backend for the device), torch.distributed.device_mesh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import ALSO_AT, assert_equal, assert_value, expect_raises
from torch.distributed.device_mesh import DeviceMesh, _mesh_resources

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)


def _expected_group(shape: tuple[int, ...], rank: int, dim: int) -> list[int]:
    """The ranks of ``rank``'s group along ``dim`` of a row-major mesh of ``shape``."""
    layout = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    index = list((layout == rank).nonzero()[0].tolist())
    index[dim] = slice(None)
    return layout[tuple(index)].flatten().tolist()


def _expected_coordinate(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    layout = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    return tuple((layout == rank).nonzero()[0].tolist())


def _assert_group(ctx, group, expected: list[int], what: str) -> None:
    """``group`` holds exactly ``expected`` ranks, uses the backend's library for the device,
    and an all_reduce over it sums over exactly those ranks."""
    ranks = dist.get_process_group_ranks(group)
    device_backend = group._get_backend(torch.device(ctx.device_type)).name()
    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(t, group=group)  # before any assert, so a failing rank cannot strand the others
    assert ranks == expected, f"{what}: group ranks {ranks}, expected {expected}"
    assert device_backend == ctx.spec.collective_backend, (
        f"{what}: the group's {ctx.device_type} backend is {device_backend!r}, "
        f"expected {ctx.spec.collective_backend!r}")
    assert_equal(t, torch.tensor([float(sum(r + 1 for r in expected))]),
                 f"{what}: all_reduce over the group (must involve its members only)")


@check
def mesh_1d(ctx):
    """init_device_mesh(device, (world,)) gives a 1-D mesh over every rank on the backend's
    device type whose group is the whole world on the backend's library (PR 102336)."""
    mesh = ctx.mesh((ctx.world_size,))
    assert_value(mesh.device_type, ctx.device_type, "mesh.device_type")
    assert_value(mesh.shape, (ctx.world_size,), "mesh.shape")
    assert_value(mesh.mesh.tolist(), list(range(ctx.world_size)), "mesh.mesh")
    assert_value(mesh.size(), ctx.world_size, "mesh.size()")
    assert_value(mesh.get_rank(), ctx.rank, "mesh.get_rank()")
    _assert_group(ctx, mesh.get_group(), list(range(ctx.world_size)), "1-D mesh group")


@check(any_world_size=False)
def mesh_2d_names(ctx):
    """A 2-D mesh (2, world/2) with mesh_dim_names ("dp", "tp") has the row-major layout, its
    names, and one group per dimension with exactly the expected ranks, addressable by index
    and by name (torch.distributed.device_mesh.init_device_mesh, PR 102336)."""
    shape = (2, ctx.world_size // 2)
    mesh = ctx.mesh(shape, ("dp", "tp"))
    assert_value(mesh.mesh_dim_names, ("dp", "tp"), "mesh_dim_names")
    assert_value(mesh.shape, shape, "mesh.shape")
    assert_value(mesh.mesh.tolist(), torch.arange(ctx.world_size).reshape(shape).tolist(),
                 "mesh.mesh.tolist()")
    assert_value([mesh.size(d) for d in range(2)], list(shape), "[mesh.size(d) for d in range(2)]")
    groups = mesh.get_all_groups()
    assert_value(len(groups), 2, "the number of groups get_all_groups() returned")
    for dim, name in enumerate(("dp", "tp")):
        expected = _expected_group(shape, ctx.rank, dim)
        _assert_group(ctx, mesh.get_group(dim), expected, f"2-D mesh dim {dim}")
        assert mesh.get_group(name) is mesh.get_group(dim), f"get_group({name!r}) != get_group({dim})"
        assert groups[dim] is mesh.get_group(dim)


@check(world_size=8, also_at=(), any_world_size=False)
def mesh_3d(ctx):
    """A 3-D mesh (2, 2, 2) named ("dp", "cp", "tp"): each dimension's group, coordinates,
    slicing two non-adjacent dims (mesh["dp", "tp"]) and flattening mesh["dp", "cp"] into
    "dp_cp" give the ranks of torch's documented example (torch.distributed.device_mesh)."""
    shape, names = (2, 2, 2), ("dp", "cp", "tp")
    mesh = ctx.mesh(shape, names)
    assert_value(mesh.get_coordinate(), _expected_coordinate(shape, ctx.rank),
                 "mesh.get_coordinate()")
    for dim, name in enumerate(names):
        expected = _expected_group(shape, ctx.rank, dim)
        _assert_group(ctx, mesh[name].get_group(), expected, f"3-D mesh[{name!r}]")
        assert_value(mesh.get_local_rank(name), expected.index(ctx.rank),
                     "mesh.get_local_rank(name)")
    dp_tp = mesh["dp", "tp"]
    cp = _expected_coordinate(shape, ctx.rank)[1]
    expected = torch.arange(8).reshape(shape)[:, cp, :]
    assert dp_tp.mesh.tolist() == expected.tolist(), f'mesh["dp","tp"] {dp_tp.mesh.tolist()}'
    assert_value(dp_tp.mesh_dim_names, ("dp", "tp"), "dp_tp.mesh_dim_names")
    flat = mesh["dp", "cp"]._flatten()
    tp = _expected_coordinate(shape, ctx.rank)[2]
    expected_flat = [r for r in range(8) if r % 2 == tp]  # docstring: [0, 2, 4, 6] / [1, 3, 5, 7]
    assert_value(flat.mesh_dim_names, ("dp_cp",), "the flattened mesh's dim names")
    _assert_group(ctx, flat.get_group(), expected_flat, 'mesh["dp","cp"]._flatten()')
    assert mesh["dp", "cp"]._flatten() is flat, "flattening again built a new mesh"


@check(any_world_size=False)
def slice_by_name(ctx):
    """Slicing a 2-D mesh by name: mesh["dp"] and mesh["tp"] are 1-D meshes of the rank's
    column and row with the parent's groups, mesh["dp", "tp"] is the whole mesh, and an unknown
    name raises KeyError naming it (torch.distributed.device_mesh.DeviceMesh.__getitem__)."""
    shape = (2, ctx.world_size // 2)
    mesh = ctx.mesh(shape, ("dp", "tp"))
    for dim, name in enumerate(("dp", "tp")):
        sub = mesh[name]
        expected = _expected_group(shape, ctx.rank, dim)
        assert sub.ndim == 1 and sub.mesh_dim_names == (name,)
        assert sub.mesh.tolist() == expected, f"mesh[{name!r}].mesh {sub.mesh.tolist()}"
        assert_value(sub.device_type, ctx.device_type, "sub.device_type")
        assert sub.get_group() is mesh.get_group(name), f"mesh[{name!r}] has a new group"
        _assert_group(ctx, sub.get_group(), expected, f"mesh[{name!r}]")
    both = mesh["dp", "tp"]
    assert both.mesh.tolist() == mesh.mesh.tolist() and both.mesh_dim_names == ("dp", "tp")
    with expect_raises(KeyError, "pp", what='mesh["pp"] on a ("dp", "tp") mesh'):
        mesh["pp"]


@check(any_world_size=False)
def coordinate_local_rank(ctx):
    """get_coordinate() is the rank's (row, column) in a 2-D mesh and get_local_rank(dim) its
    index in each dimension's group (by index and by name); a 1-D mesh's local rank is the
    global rank (torch.distributed.device_mesh.DeviceMesh)."""
    shape = (2, ctx.world_size // 2)
    mesh = ctx.mesh(shape, ("dp", "tp"))
    coord = _expected_coordinate(shape, ctx.rank)
    assert_value(mesh.get_coordinate(), coord, "get_coordinate()")
    for dim, name in enumerate(("dp", "tp")):
        assert_value(mesh.get_local_rank(dim), coord[dim], f"get_local_rank({dim})")
        assert_value(mesh.get_local_rank(name), coord[dim], f"get_local_rank({name!r})")
    assert_value(ctx.mesh((ctx.world_size,)).get_local_rank(), ctx.rank,
                 "ctx.mesh((ctx.world_size,)).get_local_rank()")


@check(any_world_size=False)
def flatten(ctx):
    """mesh["dp", "tp"]._flatten() on a 2-D mesh is a 1-D mesh "dp_tp" over every rank whose
    group works on the device; flattening again returns the same mesh and a custom name is
    honoured (torch.distributed.device_mesh.DeviceMesh._flatten)."""
    if not hasattr(DeviceMesh, "_flatten"):
        ctx.skip(f"torch {torch.__version__} has no DeviceMesh._flatten")
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    flat = mesh["dp", "tp"]._flatten()
    assert_value(flat.mesh_dim_names, ("dp_tp",), "the flattened mesh's dim names")
    assert_value(flat.mesh.tolist(), list(range(ctx.world_size)), "the flattened mesh")
    _assert_group(ctx, flat.get_group(), list(range(ctx.world_size)), "flattened dp_tp")
    assert mesh["dp", "tp"]._flatten() is flat, "flattening again built a new mesh"
    named = mesh["dp", "tp"]._flatten("world")
    assert_value(named.mesh_dim_names, ("world",), "named.mesh_dim_names")


@check
def context_manager(ctx):
    """``with mesh:`` makes mesh the current mesh, a nested ``with`` makes the inner one current
    and restores the outer on exit, and leaving the outer leaves no current mesh ("No device
    mesh is currently active!") (torch.distributed.device_mesh, used by PR 134247)."""
    outer = ctx.mesh((ctx.world_size,))
    inner = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    depth = len(_mesh_resources.mesh_stack)
    with outer as entered:
        assert entered is outer, "`with mesh as m` did not bind the mesh"
        assert _mesh_resources.get_current_mesh() is outer
        with inner:
            assert _mesh_resources.get_current_mesh() is inner
        assert _mesh_resources.get_current_mesh() is outer, "leaving the inner mesh lost the outer"
    assert_value(len(_mesh_resources.mesh_stack), depth, "len(_mesh_resources.mesh_stack)")
    if depth == 0:
        with expect_raises(RuntimeError, "No device mesh is currently active",
                           what="get_current_mesh() after leaving every `with mesh:`"):
            _mesh_resources.get_current_mesh()


_DEVICE_SELECTION_PROBE = r"""
import json, os, sys
backend, rank, world, init_file, user_device = sys.argv[1:6]
import torch, torch.distributed as dist
from accelkit.core import registry
spec = registry.get(backend)
spec.setup()
handle = getattr(torch, spec.device_type)
if user_device != "-":
    handle.set_device(int(user_device))
dist.init_process_group(init_method="file://" + init_file, rank=int(rank), world_size=int(world))
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh(spec.device_type, (int(world),))
current = handle.current_device()
t = torch.ones(2, device=torch.device(spec.device_type, current))
dist.all_reduce(t, group=mesh.get_group())
print(json.dumps({"current_device": current, "device_count": handle.device_count(),
                  "all_reduce": t.cpu().tolist(), "backend": dist.get_default_backend_for_device(spec.device_type)}))
dist.destroy_process_group()
"""


def _handle(ctx):
    return getattr(torch, ctx.device_type)


def _launch(ctx, script, args, env_local_rank=None):
    """Start ``script`` in a fresh interpreter with the backend name and ``args``; the
    launcher's rank variables are removed so the probe sets up its own world."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if env_local_rank is not None:
        env["LOCAL_RANK"] = str(env_local_rank)
    argv = [sys.executable, "-c", script, ctx.spec.name, *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _probe_result(proc, what):
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{what}: the probe process did not finish in 90 s") from None
    assert proc.returncode == 0, f"{what}: probe exited {proc.returncode}: {err.strip()[-1500:]}"
    return json.loads(out.strip().splitlines()[-1])


@check(requires=("accelerator",), timeout=150)
def device_selection(ctx):
    """DeviceMesh selects the process's device only if the user has not: with LOCAL_RANK set it
    takes that device, without it rank % device_count(), and a device set by the user before
    init_device_mesh is kept. Checked in fresh processes started by rank 0 (a 2-rank and a
    1-rank world, init_process_group() with no backend, so the device's default backend is
    used) (torch.distributed.device_mesh._setup_world_group_and_device, PR 102468)."""
    if ctx.rank != 0:
        return
    count = _handle(ctx).device_count()
    if count < 2:
        ctx.skip(f"needs 2 {ctx.device_type} devices to tell the rules apart, {count} present")
    with tempfile.TemporaryDirectory(prefix="accelkit-devsel-") as tmp:
        pair = os.path.join(tmp, "pair")
        solo = os.path.join(tmp, "solo")
        user = 1 % count
        procs = {
            "rank 0 with LOCAL_RANK": (_launch(ctx, _DEVICE_SELECTION_PROBE, ["0", "2", pair, "-"],
                                               env_local_rank=count - 1), count - 1),
            "rank 1 without LOCAL_RANK": (_launch(ctx, _DEVICE_SELECTION_PROBE, ["1", "2", pair, "-"]),
                                          1 % count),
            "user-set device": (_launch(ctx, _DEVICE_SELECTION_PROBE, ["0", "1", solo, str(user)]), user),
        }
        for what, (proc, expected) in procs.items():
            got = _probe_result(proc, what)
            assert got["current_device"] == expected, (
                f"{what}: current_device() is {got['current_device']} after init_device_mesh, "
                f"expected {expected} ({got['device_count']} devices)")
            assert_value(got["backend"], ctx.spec.collective_backend, f"{what}: the backend")
            world = 1 if what == "user-set device" else 2
            assert_value(got["all_reduce"], [float(world)] * 2, f"{what}: all_reduce of ones")


_EAGER_INIT_PROBE = r"""
import json, sys
backend, rank, world, init_file = sys.argv[1:5]
rank, world = int(rank), int(world)
import torch, torch.distributed as dist
from accelkit.core import registry
spec = registry.get(backend)
spec.setup()
device = torch.device(spec.device_type, rank)
getattr(torch, spec.device_type).set_device(rank)
dist.init_process_group(spec.process_group_backend, init_method="file://" + init_file, rank=rank,
                        world_size=world, device_id=device)
bound = dist.distributed_c10d._get_default_group().bound_device_id
if bound != device:
    sys.exit(f"init_process_group(device_id={device}) left the default group's bound_device_id "
             f"= {bound}: eager init is lost, so DeviceMesh and split_group cannot split it")
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh(spec.device_type, (world, 1), mesh_dim_names=("dp", "tp"))
sums = {}
for name, group in (("dp", mesh["dp"].get_group()), ("tp", mesh["tp"].get_group()),
                    ("split", dist.split_group(split_ranks=[list(range(world))])),
                    ("solo", dist.split_group(split_ranks=[[r] for r in range(world)]))):
    t = torch.ones(2, device=device)
    dist.all_reduce(t, group=group)
    sums[name] = t.cpu().tolist()
print(json.dumps({**sums, "tp_size": mesh["tp"].get_group().size()}))
dist.destroy_process_group()
"""


#: What each rank of the 2-rank eager-init probe prints: an all_reduce of ones over the mesh's
#: dimensions (the whole world, then a group of one rank), over a split_group of the whole world
#: and over a split_group into groups of one rank each, then the size of the mesh's "tp" group.
SPLIT_PROBE_SUMS = {"dp": [2.0, 2.0], "tp": [1.0, 1.0], "split": [2.0, 2.0], "solo": [1.0, 1.0],
                    "tp_size": 1}


@check(requires=("accelerator",), timeout=150)
def eager_init_split(ctx):
    """init_process_group(device_id=...) (eager init, the setup torch recommends) keeps the
    device bound to the default group, and then DeviceMesh builds its sub-groups with
    split_group, so the backend must support splitting: the binding, a (world, 1) mesh and
    explicit split_groups work in a fresh 2-rank world started by rank 0, each sub-group
    reducing over its own ranks only (a group of one rank sums to its own value)
    (torch.distributed.device_mesh, torch.distributed.split_group)."""
    if ctx.rank == 0:
        split_probe(ctx)


def split_probe(ctx) -> None:
    """Run the eager-init probe in a fresh 2-rank world of this backend (skips with fewer than
    2 devices) and check that each rank prints :data:`SPLIT_PROBE_SUMS`."""
    if _handle(ctx).device_count() < 2:
        ctx.skip(f"needs 2 {ctx.device_type} devices, {_handle(ctx).device_count()} present")
    with tempfile.TemporaryDirectory(prefix="accelkit-split-") as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [_launch(ctx, _EAGER_INIT_PROBE, [str(r), "2", init_file]) for r in range(2)]
        for r, proc in enumerate(procs):
            got = _probe_result(proc, f"eager-init rank {r}")
            assert_value(got, SPLIT_PROBE_SUMS, f"rank {r}'s results")


@check
def mesh_larger_than_world(ctx):
    """A mesh with more ranks than the world raises RuntimeError naming both sizes ("Mesh
    should not be bigger than default world size") (torch.distributed.device_mesh)."""
    with expect_raises(RuntimeError, "bigger than default world size", str(ctx.world_size),
                       what=f"a mesh of {ctx.world_size * 2} ranks on a world of {ctx.world_size}"):
        ctx.mesh((ctx.world_size * 2,))


@check(any_world_size=False)
def from_group(ctx):
    """DeviceMesh.from_group wraps existing groups without creating new ones: the world group
    (1-D), a half-world group (1-D, its own ranks), and a (dp, tp) pair of groups with a mesh
    tensor (2-D); get_group returns the very groups passed (DeviceMesh.from_group)."""
    ws, half = ctx.world_size, ctx.world_size // 2
    world = DeviceMesh.from_group(dist.group.WORLD, ctx.device_type)
    assert world.mesh.tolist() == list(range(ws)) and world.get_group() is dist.group.WORLD
    halves = [dist.new_group(list(range(half))), dist.new_group(list(range(half, ws)))]
    mine = halves[ctx.rank // half]
    sub = DeviceMesh.from_group(mine, ctx.device_type, mesh_dim_names=("tp",))
    _assert_group(ctx, sub.get_group(), list(range(half * (ctx.rank // half), half * (ctx.rank // half + 1))),
                  "from_group(half group)")
    assert sub.get_group() is mine, "from_group made a new group instead of using the given one"
    # 2-D: dp groups are columns, tp groups rows of (2, world/2)
    shape = (2, half)
    layout = torch.arange(ws).reshape(shape)
    tp_groups = [dist.new_group(layout[i].tolist()) for i in range(2)]
    dp_groups = [dist.new_group(layout[:, j].tolist()) for j in range(half)]
    row, col = _expected_coordinate(shape, ctx.rank)
    mesh2 = DeviceMesh.from_group([dp_groups[col], tp_groups[row]], ctx.device_type,
                                  mesh=layout, mesh_dim_names=("dp", "tp"))
    assert mesh2.get_group("dp") is dp_groups[col] and mesh2.get_group("tp") is tp_groups[row]
    assert_value(mesh2.get_coordinate(), (row, col), "get_coordinate()")
    _assert_group(ctx, mesh2["tp"].get_group(), layout[row].tolist(), "from_group 2-D tp")


@check(any_world_size=False)
def submesh_collective_members(ctx):
    """A collective on a sub-mesh's group involves only its members: all_gather over
    mesh["tp"] returns exactly the row's ranks, over mesh["dp"] the column's
    (torch.distributed.device_mesh, PR 102336)."""
    shape = (2, ctx.world_size // 2)
    mesh = ctx.mesh(shape, ("dp", "tp"))
    for dim, name in enumerate(("dp", "tp")):
        group = mesh[name].get_group()
        expected = _expected_group(shape, ctx.rank, dim)
        out = torch.empty(len(expected), device=ctx.device)
        dist.all_gather_single(out, torch.tensor([float(ctx.rank)], device=ctx.device), group=group)
        assert_equal(out, torch.tensor([float(r) for r in expected]), f"all_gather over mesh[{name!r}]")


@check(requires=("cpu-collectives",), any_world_size=False)
def dim_group_dispatch(ctx):
    """A mesh dimension's group is a dispatchable process group: the same group reduces a
    device tensor through the backend's library and a CPU tensor through gloo (PR 102336)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    group = mesh["tp"].get_group()
    members = dist.get_process_group_ranks(group)
    for device in (ctx.device, torch.device("cpu")):
        t = torch.tensor([float(ctx.rank)], device=device)
        dist.all_reduce(t, group=group)
        assert_value(t.device, device, "t.device")
        assert_equal(t, torch.tensor([float(sum(members))]), f"all_reduce of a {device} tensor on mesh['tp']")
    cpu_backend = group._get_backend(torch.device("cpu")).name()
    assert cpu_backend == "gloo", f"the group's cpu backend is {cpu_backend!r}, expected 'gloo'"

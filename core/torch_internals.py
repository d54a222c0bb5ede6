"""The private torch internals accelkit relies on, in one place.

The conformance engine puts every rank back into a known state before each check, and the
device-handle checker restores every generator ``torch.manual_seed`` touches; torch has no
public API for either, so both reach into torch's private state here and nowhere else. Each
function names what it touches.

:data:`PRIVATE_APIS` lists every private torch name accelkit's code reaches (here, in the C++
registration glue's Python side, the compiler integration, the catalogue's checks, ``accelkit
upstream``), with what it is used for and the torch versions it exists on. They were read
against, and tested on, the torch releases in :data:`VERIFIED_ON`.
``tests/core/test_torch_internals.py`` finds every private torch name in accelkit's code and fails when
one is not listed, when a listed one does not resolve on the installed torch (naming it), or when
the installed release is not in :data:`VERIFIED_ON`; ``accelkit doctor`` prints
:func:`render_private_apis`. Moving to a new torch release: run that test on it, re-read each
entry against the new source, then add the release to :data:`VERIFIED_ON`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from accelkit.core.versions import torch_build, version_matches

#: torch releases (major.minor) these functions and :data:`PRIVATE_APIS` were read against and
#: tested on (``tox -e torch213,torch214,torch215``).
VERIFIED_ON: tuple[str, ...] = ("2.13", "2.14", "2.15")


@dataclass(frozen=True)
class PrivateAPI:
    """One private torch name accelkit uses: a dotted path from ``torch`` (a module, or an
    attribute reached from one), what accelkit uses it for, and the torch versions it is
    expected on (clauses as in expectations files; ``None``: every supported version)."""

    name: str
    used_for: str
    torch: str | None = None


_C10D = "torch.distributed.distributed_c10d"
_INDUCTOR = "torch._inductor"

#: Every private torch name accelkit reaches, by the code that reaches it.
PRIVATE_APIS: tuple[PrivateAPI, ...] = (
    # registration (core/accelerator.py, core/device_module.py, core/kernels.py)
    PrivateAPI("torch._register_device_module", "installs the torch.<device> module"),
    PrivateAPI("torch._C", "the dispatcher and PrivateUse1 queries below"),
    PrivateAPI("torch._C._get_privateuse1_backend_name", "the name PrivateUse1 was renamed to"),
    PrivateAPI("torch._C._get_accelerator", "registration check: the current accelerator"),
    PrivateAPI("torch._C._dispatch_dump", "`accelkit doctor`: who registered each kernel"),
    PrivateAPI("torch._C._dispatch_dump_table", "`accelkit doctor`: the kernel a key resolves to"),
    PrivateAPI("torch._C._dispatch_get_registrations_for_dispatch_key",
               "`accelkit doctor`: the ops with a PrivateUse1 kernel"),
    PrivateAPI("torch._C._dispatch_has_backend_fallback", "whether a boxed fallback exists"),
    PrivateAPI("torch._C._dispatch_get_all_op_names", "the ops area's registry sweep: every op"),
    PrivateAPI("torch._C._dispatch_has_kernel_for_dispatch_key",
               "the ops area's registry sweep: the keys an op has a kernel for"),
    PrivateAPI("torch._subclasses.fake_tensor.is_fake",
               "device-module RNG state calls under FakeTensorMode / LocalTensor"),
    PrivateAPI("torch.distributed.Backend._plugins", "the backend creator a name is bound to"),
    PrivateAPI("torch.random._seed_custom_device",
               "torch.manual_seed's path into a PrivateUse1 generator (checker)"),
    PrivateAPI("torch.cuda._lazy_seed_tracker", "generators_kept: cuda's queued seed"),
    PrivateAPI("torch.xpu._lazy_seed_tracker", "generators_kept: xpu's queued seed"),
    PrivateAPI("torch.mtia._lazy_seed_tracker", "generators_kept: mtia's queued seed"),
    # the engine's reset between checks (this module)
    PrivateAPI(f"{_C10D}._get_default_group", "destroy_groups_but_the_default"),
    PrivateAPI(f"{_C10D}._get_default_store", "the default group's store (torchrun results)"),
    PrivateAPI(f"{_C10D}._world", "the process-group map and the group counter"),
    PrivateAPI("torch.distributed.device_mesh._mesh_resources",
               "leave_ambient_meshes: the `with mesh:` stack (pytorch/pytorch PR 134247)"),
    PrivateAPI("torch.distributed.tensor._random", "drop_rng_tracker"),
    PrivateAPI("torch.distributed.tensor._random._rng_tracker",
               "drop_rng_tracker (pytorch/pytorch PR 103235)"),
    PrivateAPI("torch.distributed.tensor.debug._clear_sharding_prop_cache",
               "clear_sharding_caches"),
    # torch.compile (core/compiler.py, core/host_codegen.py)
    PrivateAPI("torch._dynamo", "Dynamo's device registry"),
    PrivateAPI("torch._dynamo.device_interface", "register_interface_for_device"),
    PrivateAPI("torch._dynamo.device_interface.get_interface_for_device", "compile checks"),
    PrivateAPI("torch._dynamo.lookup_backend", "compile checks"),
    PrivateAPI(_INDUCTOR, "Inductor's backend registry"),
    PrivateAPI(f"{_INDUCTOR}.codegen.common", "register_backend_for_device"),
    PrivateAPI(f"{_INDUCTOR}.codegen.common.DeviceOpOverrides", "the device's op overrides"),
    PrivateAPI(f"{_INDUCTOR}.codegen.cpp.CppScheduling", "C++ kernels on device memory"),
    PrivateAPI(f"{_INDUCTOR}.codegen.wrapper.PythonWrapperCodegen", "the host wrapper"),
    PrivateAPI(f"{_INDUCTOR}.codegen.wrapper.SubgraphPythonWrapperCodegen",
               "the host wrapper of subgraphs"),
    PrivateAPI(f"{_INDUCTOR}.compile_fx", "the compile entry the checks call"),
    PrivateAPI(f"{_INDUCTOR}.config", "Inductor settings of the device's code generator"),
    PrivateAPI(f"{_INDUCTOR}.custom_graph_pass.CustomGraphModulePass", "the host graph pass"),
    PrivateAPI(f"{_INDUCTOR}.scheduler.BaseScheduling", "the scheduling interface"),
    PrivateAPI(f"{_INDUCTOR}.virtualized.V", "Inductor's virtualized graph handlers"),
    # the catalogue's checks (conformance/checks/)
    PrivateAPI("torch._chunk_cat", "training: FSDP2's gradient packing op"),
    PrivateAPI("torch._fused_sdp_choice", "training: the SDPA backend chosen for the device"),
    PrivateAPI("torch._foreach_add_",
               "streams: the foreach kernel optimizers launch, one of the ops that must queue"),
    PrivateAPI("torch._C._distributed_c10d",
               "registration: c10d's Backend.Options (the options-cache drift check)"),
    PrivateAPI("torch._has_compatible_shallow_copy_type",
               "registration: Module.to keeps parameter identity"),
    PrivateAPI(f"{_C10D}._coalescing_manager",
               "collectives: coalesced collectives, the way FSDP and DDP issue them"),
    PrivateAPI(f"{_C10D}._time_estimator",
               "collectives: the TimeEstimation capability a backend advertises, used as "
               "torch's estimator uses it"),
    PrivateAPI("torch.distributed._functional_collectives", "collectives: functional forms"),
    PrivateAPI("torch.distributed._make_nccl_premul_sum", "training: FSDP2's divide factor"),
    PrivateAPI("torch.distributed.fsdp._fully_shard._fsdp_collectives",
               "collectives: FSDP2's all-gather path"),
    PrivateAPI("torch.distributed.tensor.placement_types._StridedShard",
               "training: FSDP2 x TP placements"),
    PrivateAPI("torch.utils._python_dispatch.TorchDispatchMode", "training: op tracing"),
    PrivateAPI("torch.distributed.tensor.experimental._attention.context_parallel_unshard",
               "training: context parallelism's output and gradients gathered along the sequence"),
    PrivateAPI("torch.distributed._local_tensor",
               "scale: LocalTensorMode, every simulated rank's numerics in one process"),
    PrivateAPI("torch.distributed.tensor._random._PhiloxState",
               "scale: the RNG tracker's Philox state of every coordinate"),
    PrivateAPI("torch.distributed.tensor._random._calc_first_shard_size",
               "scale: the RNG tracker's offsets of every coordinate"),
    PrivateAPI("torch.distributed.tensor._random._calc_shard_info",
               "scale: the RNG tracker's shard index of every coordinate"),
    PrivateAPI("torch.distributed.tensor._utils._compute_local_shape_and_global_offset",
               "scale: the shard of every coordinate"),
    # the ops area (conformance/checks/_opinfo.py): torch's own OpInfo database and tolerances
    PrivateAPI("torch.testing._internal.common_methods_invocations",
               "ops: torch's OpInfo database (op_db), the ops and their sample inputs"),
    PrivateAPI("torch.testing._internal.opinfo.core",
               "ops: the OpInfo classes that sort ops into families"),
    PrivateAPI("torch.testing._comparison.default_tolerances",
               "ops: assert_close's tolerance of each dtype"),
    PrivateAPI("torch.utils._pytree", "ops: the tensors of sample inputs and outputs"),
    # accelkit upstream (conformance/upstream/; its harness changes are version-gated in
    # adaptations.py)
    PrivateAPI(f"{_C10D}._register_pg_in_world", "records every process group a test makes"),
    PrivateAPI("torch.testing._internal.common_distributed", "the harness adapted"),
    PrivateAPI("torch.testing._internal.common_device_type", "the harness adapted"),
    PrivateAPI("torch.testing._internal.common_fsdp", "the harness adapted"),
    PrivateAPI("torch.testing._internal.distributed._tensor.common_dtensor",
               "the harness adapted"),
    PrivateAPI("torch.testing._internal.distributed.fake_pg", "the harness adapted"),
    # simulated checks (conformance/launchers/simulate.py, through this module)
    PrivateAPI("torch.testing._internal.distributed.fake_pg._create_fake_pg",
               "fake_group_creator: the fake process group of simulated checks"),
    PrivateAPI("torch.testing._internal.distributed.fake_pg.FakeStore",
               "fake_store: the fake process group's store"),
)


def resolve(name: str) -> None:
    """Raise ImportError or AttributeError, naming what is missing, unless dotted ``name``
    exists: a module is found without running it (test-harness modules pick devices when
    imported), an attribute is looked up on its imported module."""
    try:
        if importlib.util.find_spec(name) is not None:
            return
    except (ImportError, AttributeError, ValueError):
        pass  # a parent is not a package: name is an attribute
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                raise AttributeError(f"{'.'.join(parts[:i])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return
    raise ImportError(f"no module named {parts[0]!r}")


def torch_release() -> str:
    """The installed torch's major.minor, e.g. ``2.15``."""
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def missing_private_apis() -> list[tuple[PrivateAPI, str]]:
    """The listed private names that apply to the installed torch and do not resolve on it,
    each with the error."""
    import torch

    found = []
    for api in PRIVATE_APIS:
        if api.torch is not None and not version_matches(torch.__version__, api.torch):
            continue
        try:
            resolve(api.name)
        except (ImportError, AttributeError) as exc:
            found.append((api, f"{type(exc).__name__}: {exc}"))
    return found


def render_private_apis() -> str:
    """What ``accelkit doctor`` prints: the installed torch, whether accelkit was verified on
    it, and every private torch name accelkit uses that this torch lacks."""
    import torch

    release = torch_release()
    verified = ("verified" if release in VERIFIED_ON else
                f"NOT verified (accelkit was verified on torch {', '.join(VERIFIED_ON)})")
    missing = missing_private_apis()
    lines = [f"torch {torch.__version__} ({torch_build()} build): {verified}; "
             f"{len(PRIVATE_APIS) - len(missing)} of {len(PRIVATE_APIS)} private torch APIs "
             "accelkit uses are present"]
    lines += [f"  MISSING {api.name} (used for: {api.used_for}): {why}" for api, why in missing]
    return "\n".join(lines)


#: torch's built-in accelerator modules that ``torch.manual_seed`` seeds (``torch.random``).
_SEEDED_BY_MANUAL_SEED = ("cuda", "xpu", "mtia")


def privateuse1_name() -> str:
    """The name PrivateUse1 is renamed to (``privateuseone`` before any rename):
    ``torch._C._get_privateuse1_backend_name``."""
    import torch

    return torch._C._get_privateuse1_backend_name()


def default_store():
    """The default process group's store: ``distributed_c10d._get_default_store``."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def destroy_groups_but_the_default() -> int:
    """Destroy every process group but the default one (c10d keeps them in
    ``distributed_c10d._world.pg_map``); returns how many there were."""
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    stale = [pg for pg in c10d._world.pg_map if pg is not default]
    for pg in stale:
        c10d.destroy_process_group(pg)
    return len(stale)


def clear_sharding_caches(device=None) -> None:
    """Clear DTensor's sharding-propagation caches
    (``torch.distributed.tensor.debug._clear_sharding_prop_cache``). DeviceMesh equality ignores
    process groups, so a cached sharding would hand a later mesh equal to a destroyed one the
    destroyed groups ("Could not resolve the process group"). The Python cache is per thread
    (``_sharding_prop.LocalLRUCache`` is a ``threading.local``): it is cleared on this thread
    and, when ``device`` (a ``torch.device``) is given, through a one-node backward on the
    autograd engine's thread for that device, where backward ops on its tensors run."""
    import torch
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    if device is None:
        return

    class ClearInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            _clear_sharding_prop_cache()
            return grad

    ClearInBackward.apply(torch.zeros((), device=device, requires_grad=True)).backward()


def group_counter() -> int:
    """c10d's counter that names the next ``new_group`` (``distributed_c10d._world.group_count``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.group_count


def raise_group_counter(value: int) -> None:
    """Move c10d's group counter up to ``value`` (every rank agreeing on it keeps the next
    group's name the same everywhere)."""
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    world.group_count = max(world.group_count, value)


def leave_ambient_meshes() -> None:
    """Forget every ``with mesh:`` still entered: ``device_mesh._mesh_resources.mesh_stack``
    (PR 134247)."""
    from torch.distributed import device_mesh

    device_mesh._mesh_resources.mesh_stack.clear()


def drop_rng_tracker() -> None:
    """Drop DTensor's RNG tracker, so the next random DTensor op makes a new one:
    ``torch.distributed.tensor._random._rng_tracker`` (PR 103235)."""
    from torch.distributed.tensor import _random

    _random._rng_tracker = None


def preload_distributed() -> None:
    """Import what the first DTensor/DeviceMesh check would (``device_mesh`` and
    ``torch.distributed.tensor._random``), so its time is not charged to that check."""
    import torch.distributed.device_mesh  # noqa: F401
    import torch.distributed.tensor._random  # noqa: F401


def fake_group_creator():
    """The creator torch registers its fake process group with (backend ``"fake"``):
    ``torch.testing._internal.distributed.fake_pg._create_fake_pg``."""
    from torch.testing._internal.distributed import fake_pg

    return fake_pg._create_fake_pg


def fake_store():
    """A store for a fake process group: ``torch.testing._internal.distributed.fake_pg
    .FakeStore`` (nothing is exchanged)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


@contextmanager
def generators_kept() -> Iterator[None]:
    """Run the block, then put back every generator ``torch.manual_seed`` reseeds besides a
    PrivateUse1 device's (the caller restores that one): the CPU's, and cuda's, xpu's and
    mtia's (their states when initialised, else the seed queued for their lazy init:
    ``<module>._lazy_seed_tracker``), and mps's when present."""
    import torch

    cpu = torch.get_rng_state()
    kept = []
    for name in _SEEDED_BY_MANUAL_SEED:
        module = getattr(torch, name)
        if module.is_initialized():
            kept.append((module, "states", module.get_rng_state_all()))
        else:
            kept.append((module, "queued", copy.copy(module._lazy_seed_tracker)))
    mps = torch.mps.get_rng_state() if torch.backends.mps.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        for module, kind, value in kept:
            if kind == "states":
                module.set_rng_state_all(value)
            else:
                module._lazy_seed_tracker = value
        if mps is not None:
            torch.mps.set_rng_state(mps)

"""The adaptations ``accelkit upstream`` makes to PyTorch's test harness
(``torch.testing._internal``) so that it runs on an accelerator that is not CUDA, HPU or XPU.

Each :class:`Adaptation` names the harness object it changes, the gap it closes (what the
harness does on a PrivateUse1 device without it) and the torch versions it was written and
verified for. It is applied by the start-up hook (:mod:`accelkit.conformance.upstream.hook`)
right after its harness module has executed, in the pytest process and in every rank, before
any test module can bind the names it changes. Nothing is applied for ``cpu`` or for the
devices the harness already knows (``cuda``, ``xpu``, ``hpu``). An adaptation is not applied
from the torch release whose harness closed its gap (``fixed_in``), and ``accelkit upstream``
refuses to run one on a torch outside its ``torch_versions`` (the harness is internal and
changes between releases); ``--no-adapt NAME`` runs without it, which also shows whether an
adaptation is still needed.

Verified on torch 2.13.0, 2.14.1 and 2.15.0 by reading ``torch/testing/_internal`` of each and
by the fixture tests in ``tests/fixtures/upstream`` (each fails or skips on ``mock`` without its
adaptation; ``tox -e torch213,torch214,torch215`` runs them on each release).
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from accelkit.core.spec import BackendSpec
from accelkit.core.versions import release, version_matches

#: Device types ``torch.testing._internal`` knows by name: nothing to adapt for them.
HARNESS_DEVICES = ("cpu", "cuda", "xpu", "hpu")

_COMMON_DISTRIBUTED = "torch.testing._internal.common_distributed"
_COMMON_DTENSOR = "torch.testing._internal.distributed._tensor.common_dtensor"
_COMMON_DEVICE_TYPE = "torch.testing._internal.common_device_type"
_COMMON_UTILS = "torch.testing._internal.common_utils"
_COMMON_FSDP = "torch.testing._internal.common_fsdp"
_FAKE_PG = "torch.testing._internal.distributed.fake_pg"


class AdaptationError(RuntimeError):
    """An adaptation cannot be applied: the harness is not the one it was written for."""


@dataclass(frozen=True)
class Adaptation:
    """One change to the upstream harness, applied after ``module`` is imported."""

    name: str
    module: str
    target: str          # the harness object changed, as a dotted name
    gap: str             # what the harness does on a PrivateUse1 device without the change
    change: str          # what accelkit does instead
    torch_versions: str  # clauses as in expectations files, e.g. ">=2.13,<2.14"
    apply: Callable[[ModuleType, BackendSpec], None]
    #: The torch release whose harness closes the gap (the adaptation is not applied there and
    #: after), with how; None while every supported release has the gap.
    fixed_in: tuple[str, str] | None = None

    def supports(self, torch_version: str) -> bool:
        """Written and verified for ``torch_version`` (or not needed there)."""
        return self.not_needed(torch_version) or version_matches(torch_version,
                                                                 self.torch_versions)

    def not_needed(self, torch_version: str) -> bool:
        """``torch_version``'s harness has no gap for this adaptation to close."""
        return self.fixed_in is not None and release(torch_version) >= release(self.fixed_in[0])

    def describe(self) -> str:
        fixed = (f"\n  fixed:  in torch {self.fixed_in[0]}: {self.fixed_in[1]}"
                 if self.fixed_in else "")
        return (f"{self.name}  [{self.target}]  torch {self.torch_versions}\n"
                f"  gap:    {self.gap}\n  change: {self.change}{fixed}")


def needed_for(spec: BackendSpec) -> bool:
    """Whether ``spec``'s device needs the adaptations at all (not cpu, cuda, xpu, hpu)."""
    return spec.device_type not in HARNESS_DEVICES


def _device_count(spec: BackendSpec) -> int:
    import torch

    return torch.get_device_module(spec.device_type).device_count()


def _expect(condition: bool, adaptation: str, what: str) -> None:
    if not condition:
        raise AdaptationError(
            f"adaptation {adaptation!r} cannot be applied: {what}; this torch's harness is not "
            "the one it was written for (run with --no-adapt "
            f"{adaptation} and see `accelkit upstream --explain`)")


def _device_type_test_base(mod: ModuleType, spec: BackendSpec) -> None:
    base = getattr(mod, "PrivateUse1TestBase", None)
    _expect(base is not None and base.device_type in ("privateuse1", spec.device_type),
            "device-type-test-base", "common_device_type.PrivateUse1TestBase.device_type is "
            f"{getattr(base, 'device_type', None)!r}, expected 'privateuse1'")
    base.device_type = spec.device_type


def _skip_if_lt_x_gpu(mod: ModuleType, spec: BackendSpec) -> None:
    original = getattr(mod, "skip_if_lt_x_gpu", None)
    _expect(callable(original), "skip-if-lt-x-gpu", "common_distributed has no skip_if_lt_x_gpu")

    @functools.wraps(original)
    def skip_if_lt_x_gpu(x, *, allow_cpu=False):
        upstream_decorator = original(x, allow_cpu=allow_cpu)

        def decorator(func):
            upstream = upstream_decorator(func)

            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if _device_count(spec) >= x:
                    return func(*args, **kwargs)
                return upstream(*args, **kwargs)

            return wrapper

        return decorator

    mod.skip_if_lt_x_gpu = skip_if_lt_x_gpu


def _dtensor_init_pg(mod: ModuleType, spec: BackendSpec) -> None:
    base = getattr(mod, "DTensorTestBase", None)
    _expect(base is not None and callable(getattr(base, "init_pg", None)), "dtensor-init-pg",
            "common_dtensor.DTensorTestBase.init_pg is missing")
    original = base.init_pg

    @functools.wraps(original)
    def init_pg(self, eager_init, backend=None):
        backend = self.backend if backend is None else backend
        if spec.collective_backend not in backend:
            return original(self, eager_init, backend)
        import torch
        import torch.distributed as dist

        if _device_count(spec) < self.world_size:
            skips = mod.TEST_SKIPS  # "multi-gpu-N" until torch 2.14, "multi-device-N" from 2.15
            key = next(k for k in (f"multi-device-{self.world_size}",
                                   f"multi-gpu-{self.world_size}") if k in skips)
            sys.exit(skips[key].exit_code)
        torch.accelerator.set_device_index(self.rank)
        device_id = torch.device(f"{self.device_type}:{self.rank}") if eager_init else None
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"file://{self.file_name}", device_id=device_id)

    base.init_pg = init_pg


def _fsdp_device_selection(mod: ModuleType, spec: BackendSpec) -> None:
    _expect(getattr(mod, "DEVICE_TYPE", None) == "cpu", "fsdp-device-selection",
            f"common_fsdp.DEVICE_TYPE is {getattr(mod, 'DEVICE_TYPE', None)!r} (another "
            "accelerator was selected, or the constant is gone), expected 'cpu'")
    mod.DEVICE_TYPE = spec.device_type
    mod.DISTRIBUTED_BACKEND = spec.collective_backend
    mod.DEVICE_COUNT = _device_count(spec)


def _bind_rank_device(original, spec: BackendSpec, count: Callable[[], int]):
    """Wrap the classmethod ``original(cls, rank, ...)`` so the rank's device is current first."""
    func = original.__func__

    @functools.wraps(func)
    def wrapper(cls, rank, *args, **kwargs):
        import torch

        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None and accelerator.type == spec.device_type:
            torch.accelerator.set_device_index(rank % count())
        return func(cls, rank, *args, **kwargs)

    return classmethod(wrapper)


def _fsdp_rank_device(mod: ModuleType, spec: BackendSpec) -> None:
    test, continuous = getattr(mod, "FSDPTest", None), getattr(mod, "FSDPTestContinuous", None)
    _expect(test is not None and "_run" in vars(test), "fsdp-rank-device",
            "common_fsdp.FSDPTest._run is missing")
    test._run = _bind_rank_device(test._run, spec, lambda: mod.DEVICE_COUNT)
    if continuous is not None and "_init_pg" in vars(continuous):
        continuous._init_pg = _bind_rank_device(continuous._init_pg, spec,
                                                lambda: mod.DEVICE_COUNT)


def _fake_pg_device(mod: ModuleType, spec: BackendSpec) -> None:
    import torch.distributed as dist

    devices = dist.Backend.backend_capability.get("fake")
    _expect(devices is not None, "fake-pg-device", "c10d has no 'fake' backend registered")
    if spec.device_type not in devices:
        dist.Backend.backend_capability["fake"] = [*devices, spec.device_type]


class _HardwareClassification(enum.Enum):
    """The names of ``common_utils.HardwareClassification`` (torch 2.14), for test files newer
    than a torch 2.13 harness: they import it and set ``hw_classification`` on their classes."""

    GENERIC = "generic"
    ACCELERATOR = "accelerator"
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"
    XPU = "xpu"


def _hardware_classification_names(mod: ModuleType, spec: BackendSpec) -> None:
    _expect(not hasattr(mod, "HardwareClassification"), "hardware-classification-names",
            "common_utils already defines HardwareClassification")
    mod.HardwareClassification = _HardwareClassification


_V213 = ">=2.13,<2.14"
_V213_214 = ">=2.13,<2.15"
_V213_215 = ">=2.13,<2.16"
_ACCELERATOR_HARNESS = "2.15"

ADAPTATIONS: tuple[Adaptation, ...] = (
    Adaptation(
        name="device-type-test-base",
        module=_COMMON_DEVICE_TYPE,
        target=f"{_COMMON_DEVICE_TYPE}.PrivateUse1TestBase.device_type",
        gap="stays 'privateuse1' until the class's setUpClass runs, which never happens in a "
            "rank process: instantiate_device_type_tests classes see "
            "self.device_type == 'privateuse1' there (torch.device('privateuse1') fails), and "
            "classes instantiated after a first setUpClass are named ...<DEVICE> in the pytest "
            "process but ...PRIVATEUSE1 in a rank, which then cannot find its test class",
        change="set to the backend's device name at harness import, in every process",
        torch_versions=_V213_215, apply=_device_type_test_base),
    Adaptation(
        name="skip-if-lt-x-gpu",
        module=_COMMON_DISTRIBUTED,
        target=f"{_COMMON_DISTRIBUTED}.skip_if_lt_x_gpu",
        gap="counts only CUDA, HPU and XPU devices: every test it decorates skips "
            "('Need at least N CUDA devices') on a PrivateUse1 device",
        change="runs the test when the backend's device module counts at least N devices, "
               "else defers to torch's decorator (which skips with its own message)",
        torch_versions=_V213_214, apply=_skip_if_lt_x_gpu,
        fixed_in=(_ACCELERATOR_HARNESS, "skip_if_lt_x_gpu counts torch.accelerator devices")),
    Adaptation(
        name="dtensor-init-pg",
        module=_COMMON_DTENSOR,
        target=f"{_COMMON_DTENSOR}.DTensorTestBase.init_pg",
        gap="refuses every backend name outside a fixed list ('Backend <name> not supported!'; "
            "with_comms tests fail) and binds each rank to its device only for nccl/xccl",
        change="for a backend string naming the backend's collective library: skips when "
               "there are fewer devices than ranks, makes device <rank> current and passes "
               "device_id for eager_init, as torch does for nccl; other strings go to torch's "
               "init_pg unchanged",
        torch_versions=_V213_215, apply=_dtensor_init_pg),
    Adaptation(
        name="fsdp-device-selection",
        module=_COMMON_FSDP,
        target=f"{_COMMON_FSDP}.DEVICE_TYPE, DISTRIBUTED_BACKEND, DEVICE_COUNT",
        gap="chosen at import among cuda/hpu/xpu, else 'cpu', 'gloo' and 1 device: FSDPTest "
            "ranks join a gloo group, then die in their first barrier (device_ids select the "
            "PrivateUse1 device: 'No backend type associated with device type <name>'); tests "
            "that get further run on cpu/gloo",
        change="the backend's device type, its collective library and its device count",
        torch_versions=_V213_214, apply=_fsdp_device_selection,
        fixed_in=(_ACCELERATOR_HARNESS, "common_fsdp takes torch.accelerator's device and its default backend")),
    Adaptation(
        name="fsdp-rank-device",
        module=_COMMON_FSDP,
        target=f"{_COMMON_FSDP}.FSDPTest._run, FSDPTestContinuous._init_pg",
        gap="make device <rank> current only when TEST_CUDA or TEST_XPU: every rank of a "
            "PrivateUse1 run stays on device 0",
        change="make device rank % DEVICE_COUNT current before torch's code runs",
        torch_versions=_V213_214, apply=_fsdp_rank_device,
        fixed_in=(_ACCELERATOR_HARNESS, "FSDPTest._run sets the device whenever torch.accelerator is available")),
    Adaptation(
        name="fake-pg-device",
        module=_FAKE_PG,
        target=f"{_FAKE_PG} (c10d backend 'fake', devices)",
        gap="registers the 'fake' backend for cpu, cuda, hpu and xpu only: a test that "
            "creates a fake group (init_process_group('fake', store=FakeStore()), FSDP's "
            "fake_pg runs) and runs a collective or a DTensor op on the device fails with 'No "
            "backend type associated with device type <name>'",
        change="adds the backend's device to the 'fake' backend's devices (a fake group "
               "communicates nothing: the report flags tests that only used one)",
        torch_versions=_V213_215, apply=_fake_pg_device),
    Adaptation(
        name="hardware-classification-names",
        module=_COMMON_UTILS,
        target=f"{_COMMON_UTILS}.HardwareClassification",
        gap="missing before torch 2.14: test files of a newer PyTorch import it (to declare "
            "their classes' hw_classification) and fail to collect on a torch 2.13 harness",
        change="defines the enum's names (GENERIC, ACCELERATOR, CPU, CUDA, MPS, XPU) only; "
               "accelkit upstream's plugin then skips classes classified for another device, "
               "as on later releases",
        torch_versions=_V213, apply=_hardware_classification_names,
        fixed_in=("2.14", "common_utils defines HardwareClassification; accelkit upstream "
                  "then skips classes classified for another device (plugin)")),
)

BY_NAME: dict[str, Adaptation] = {a.name: a for a in ADAPTATIONS}


def select(disabled: list[str]) -> list[Adaptation]:
    """The adaptations left after ``--no-adapt`` (``all`` disables every one); an unknown
    name is a ValueError listing the known ones."""
    if "all" in disabled:
        return []
    unknown = sorted(set(disabled) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown adaptation(s) {', '.join(unknown)}; known: "
                         f"{', '.join(BY_NAME)} (or 'all')")
    return [a for a in ADAPTATIONS if a.name not in disabled]


def refused(adaptations: list[Adaptation], torch_version: str) -> list[str]:
    """One message per adaptation not written for ``torch_version``."""
    return [f"adaptation {a.name!r} ({a.target}) was written and verified for torch "
            f"{a.torch_versions}, not {torch_version}: the harness it changes may differ; "
            f"run with --no-adapt {a.name} to go without it"
            for a in adaptations if not a.supports(torch_version)]


def applicable(adaptations: list[Adaptation], torch_version: str) -> list[Adaptation]:
    """The adaptations ``torch_version``'s harness still needs (those it fixed left out)."""
    return [a for a in adaptations if not a.not_needed(torch_version)]


def for_module(adaptations: list[Adaptation]) -> dict[str, list[Adaptation]]:
    by_module: dict[str, list[Adaptation]] = {}
    for a in adaptations:
        by_module.setdefault(a.module, []).append(a)
    return by_module


def environment(spec: BackendSpec) -> dict[str, str]:
    """Environment ``accelkit upstream`` sets for the tests of ``spec`` (unless already set):
    device-type test classes only for the backend's device, as a device's CI runs them."""
    if spec.device_type == "cpu" or os.environ.get("PYTORCH_TESTING_DEVICE_ONLY_FOR"):
        return {}
    return {"PYTORCH_TESTING_DEVICE_ONLY_FOR": spec.device_type}

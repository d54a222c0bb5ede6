"""What a backend is, for accelkit: :class:`BackendSpec` and its :class:`Capabilities`.

A backend plugs into the registry (and so into ``accelkit conformance``) with one
``BackendSpec`` object, exposed through the ``accelkit.backends`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

RNGClass = Literal["offset-exact", "offset-consistent", "unsupported"]
RNG_CLASSES: tuple[str, ...] = ("offset-exact", "offset-consistent", "unsupported")

#: Requirement tokens a conformance check may name in ``requires=`` and what each means.
REQUIREMENTS: dict[str, str] = {
    "accelerator": "a non-CPU device with a device handle (torch.<device>)",
    "rng-tracker": "DTensor's OffsetBasedRNGTracker accepts the device (torch refuses cpu meshes)",
    "offset-exact": "random op element i at offset o depends only on (seed, o + i)",
    "cpu-collectives": "CPU tensors work on the default process group beside device tensors",
    "inductor": "torch.compile's default backend (Inductor) generates code for the device",
    "p2p-tags": "point-to-point messages match by tag: a recv takes the send with its tag",
    "serial-streams": ("the device runs one stream's work at a time, the highest-priority stream "
                       "with work first: stream priority shows as order"),
}


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares it can do; checks that need more are SKIPped with the reason.

    ``rng``: ``offset-exact`` (a Shard(0) random DTensor equals the single-device op bit for bit),
    ``offset-consistent`` (the tracker's offsets are honoured, values differ from one device),
    ``unsupported`` (torch's RNG tracker does not run on this device).
    ``max_world_size``: how many ranks (devices) one host can run; ``None`` for no limit.
    ``cpu_collectives``: CPU tensors ride along on the default group (through gloo).
    ``inductor``: the device has an Inductor backend, so ``torch.compile(fn)`` with the default
    backend compiles for it (accelkit.core.compiler); without one only ``aot_eager`` does.
    ``p2p_tags``: send/recv match messages by tag.
    ``serial_streams``: the device runs one stream's task at a time, choosing among the streams
    with work the one of highest priority (the mock's seeded schedule, a single-queue device):
    there a check can see that stream priorities are honoured, which on a device that runs
    streams concurrently is a scheduling preference no order proves.
    """

    rng: RNGClass = "unsupported"
    max_world_size: int | None = None
    cpu_collectives: bool = True
    inductor: bool = False
    p2p_tags: bool = True
    serial_streams: bool = False

    def __post_init__(self) -> None:
        if self.rng not in RNG_CLASSES:
            raise ValueError(f"Capabilities.rng={self.rng!r}: expected one of {', '.join(RNG_CLASSES)}")

    def missing(self, requires: tuple[str, ...], device_type: str) -> str | None:
        """The reason a check needing ``requires`` cannot run, or None if it can."""
        for req in requires:
            if req not in REQUIREMENTS:
                raise ValueError(f"unknown requirement {req!r}; known: {', '.join(REQUIREMENTS)}")
            if req == "accelerator" and device_type == "cpu":
                return "needs an accelerator device; cpu has no device handle"
            if req == "rng-tracker" and (device_type == "cpu" or self.rng == "unsupported"):
                return ("unsupported by torch: DTensor's RNG tracker requires a CUDA/CUDA-like/XPU device"
                        if device_type == "cpu" else "backend declares rng='unsupported'")
            if req == "offset-exact" and self.rng != "offset-exact":
                return f"backend declares rng='{self.rng}', not 'offset-exact'"
            if req == "cpu-collectives" and not self.cpu_collectives:
                return "backend declares cpu_collectives=False"
            if req == "inductor" and not self.inductor:
                return ("backend declares inductor=False: the device has no Inductor backend "
                        "(torch.compile's default); the aot_eager variant runs instead")
            if req == "p2p-tags" and not self.p2p_tags:
                return ("backend declares p2p_tags=False: its collective library ignores the tag "
                        "of send/recv and matches messages in order")
            if req == "serial-streams" and not self.serial_streams:
                return ("backend declares serial_streams=False: its streams run concurrently, "
                        "where priority is a preference no order proves (the mock declares it "
                        "under a seeded schedule, ACCELKIT_MOCK_ASYNC=1 ACCELKIT_MOCK_SCHEDULE=1)")
        return None


@dataclass(frozen=True)
class BackendSpec:
    """One backend, as the registry, the CLI and the conformance runner see it.

    ``setup()`` makes the device and its collective library usable in the calling process
    (imports, registration); it is called once per worker process, never at discovery time.
    ``probe(world_size)`` answers ``(available, reason)`` without claiming PrivateUse1.
    ``prepare()``, if given, compiles or fetches what ``setup()`` needs without claiming the
    device; the conformance runner calls it once in its own process before starting ranks.
    ``settings()``, if given, returns the backend's settings and modes that shape a run (its
    environment switches, a driver or firmware version) as a ``{name: value}`` dict of
    strings; every conformance report records them.
    """

    name: str
    device_type: str
    collective_backend: str
    setup: Callable[[], None]
    probe: Callable[[int], tuple[bool, str]]
    capabilities: Capabilities = field(default_factory=Capabilities)
    expectations: Path | None = None
    prepare: Callable[[], None] | None = None
    settings: Callable[[], dict[str, str]] | None = None
    origin: str = ""

    def __post_init__(self) -> None:
        for attr in ("name", "device_type", "collective_backend"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value.isidentifier():
                raise ValueError(f"BackendSpec.{attr}={value!r} must be a Python identifier")

    @property
    def process_group_backend(self) -> str:
        """The ``backend=`` string for ``init_process_group``: device tensors through the
        backend's collective library, CPU tensors through gloo when they ride along."""
        if self.device_type == "cpu":
            return self.collective_backend
        if self.capabilities.cpu_collectives:
            return f"{self.device_type}:{self.collective_backend},cpu:gloo"
        return f"{self.device_type}:{self.collective_backend}"

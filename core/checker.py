"""``check_device_handle``: probe the *behaviour* of ``torch.<device>`` against what torch's
distributed stack does with it (:class:`accelkit.core.DeviceHandle`), and say for each problem
which torch API breaks and how to fix it.

The probes restore what they change: the current device, the device's RNG states, and every
other generator ``torch.manual_seed`` reseeds (the CPU's, other accelerators').
``is_initialized()`` is read first, before anything can initialise the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from accelkit.core import torch_internals
from accelkit.core.handle import PRIVATEUSE1_ONLY, DeviceHandle, StreamDeviceHandle, members

Severity = Literal["error", "warning", "info", "unsupported"]
SEVERITIES: tuple[str, ...] = ("error", "warning", "info", "unsupported")
_LABEL = {"error": "ERROR", "warning": "WARNING", "info": "info",
          "unsupported": "unsupported by torch"}

#: The two members ``torch.manual_seed`` needs before it seeds a PrivateUse1 device.
_SEED_PAIR = ("manual_seed_all", "_is_in_bad_fork")
_PHILOX_BYTES = 16
_TRACKER = "DTensor's OffsetBasedRNGTracker"
_FORMS_FIX = "accept the device as an int, a '<name>:<i>' str and a torch.device"


@dataclass(frozen=True)
class Finding:
    """One problem (or torch-side limit): which member, what is wrong, which torch API
    breaks because of it, and the fix in one sentence."""

    severity: Severity
    member: str
    problem: str
    breaks: str
    fix: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity={self.severity!r}: expected one of {SEVERITIES}")

    def render(self) -> str:
        return (f"[{_LABEL[self.severity]}] {self.member}: {self.problem}\n"
                f"    breaks: {self.breaks}\n    fix: {self.fix}")


@dataclass
class HandleReport:
    """The checker's result for one device type."""

    device_type: str
    findings: list[Finding] = field(default_factory=list)
    probes: int = 0
    touched_device: bool = True
    #: The host has no device (is_available() False, device_count() 0): a state, not an error.
    no_device: bool = False

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings, infos and torch-side limits allowed)."""
        return not self.errors

    def render(self) -> str:
        """The report as text: a summary line, then each finding with what breaks and the fix."""
        counts = ", ".join(f"{sum(f.severity == s for f in self.findings)} {_LABEL[s]}"
                           for s in SEVERITIES)
        scope = "" if self.touched_device else " (device left untouched: no RNG/device probes)"
        head = (f"torch.{self.device_type}: {self.probes} probes{scope}; {counts}; "
                + ("OK" if self.ok else "FAILED"))
        return "\n".join([head, *(f.render() for f in self.findings)])

    __str__ = render

    def to_dict(self) -> dict[str, Any]:
        return {"device_type": self.device_type, "ok": self.ok, "probes": self.probes,
                "touched_device": self.touched_device,
                "findings": [asdict(f) for f in self.findings]}


def check_device_handle(device_type: str, *, touch_device: bool = True) -> HandleReport:
    """Probe ``torch.<device_type>`` and return a :class:`HandleReport`.

    ``touch_device=False`` runs only the probes that cannot initialise the device (member
    presence, ``is_initialized``, ``is_available``, ``device_count``, ``_is_in_bad_fork``,
    ``get_amp_supported_dtype``, registrations); :func:`register_accelerator` uses it so that
    registering leaves DeviceMesh free to pick each rank's device. ``accelkit doctor`` runs
    everything in a process of its own.

    On ``cpu`` the report lists torch's own limits as ``unsupported``, never as errors.
    """
    import torch

    prober = _Prober(torch, device_type, touch_device)
    prober.run()
    return prober.report


class _Skip(Exception):
    """A probe could not continue; its finding is already recorded."""


class _Prober:
    def __init__(self, torch: Any, device_type: str, touch_device: bool) -> None:
        self.torch = torch
        self.dt = device_type
        self.report = HandleReport(device_type, touched_device=touch_device)
        self.handle: Any = None

    # -- recording -------------------------------------------------------------------------
    def add(self, severity: Severity, member: str, problem: str, breaks: str, fix: str) -> None:
        self.report.findings.append(Finding(severity, member, problem, breaks, fix))

    def call(self, member: str, *args: Any, breaks: str, fix: str) -> Any:
        """Call ``torch.<dt>.<member>(*args)``; a missing member or an exception is an error."""
        self.report.probes += 1
        fn = getattr(self.handle, member, None)
        if fn is None:
            raise _Skip  # the presence probe already reported it
        try:
            return fn(*args)
        except Exception as exc:
            shown = ", ".join(map(repr, args))
            self.add("error", member, f"{member}({shown}) raised {type(exc).__name__}: {exc}",
                     breaks, fix)
            raise _Skip from exc

    def probe(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except _Skip:
            pass

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> None:
        if self.dt == "cpu":
            self.cpu_limits()
            return
        try:
            self.torch.device(self.dt)
        except RuntimeError as exc:
            self.add("error", "<device type>",
                     f"torch does not know the device type {self.dt!r} ({exc})",
                     "every torch API on this device", "register the device first with "
                     "accelkit.core.register_accelerator(name, module) (renames PrivateUse1)")
            return
        self.handle = getattr(self.torch, self.dt, None)
        if self.handle is None:
            self.add("error", f"torch.{self.dt}", f"no module torch.{self.dt}",
                     "DeviceMesh, DTensor, fork_rng, torch.manual_seed, torch.accelerator",
                     f"register it with torch._register_device_module({self.dt!r}, module) "
                     "(register_accelerator does it)")
            return
        self.probe(self.not_initialized_before_use)
        self.presence()
        steps = [self.registration, self.available, self.device_count, self.bad_fork]
        if self.dt == torch_internals.privateuse1_name():
            steps.append(self.amp_dtypes)
        for step in steps:
            self.probe(step)
        if not self.report.touched_device:
            self.probe(self.still_uninitialized)
            return
        if self.report.no_device or any(
                f.member in ("is_available", "device_count") and f.severity == "error"
                for f in self.report.findings):
            self.add("info", "<probes>", "RNG and device probes skipped: no usable device",
                     "nothing more", "fix the errors above and run the checker again")
            return
        self.probe(self.devices)
        self.probe(self.rng)
        self.probe(self.seed_width)
        self.probe(self.event_timing)
        self.probe(self.initialized_after_use)

    # -- cpu -------------------------------------------------------------------------------
    def cpu_limits(self) -> None:
        """cpu is torch's own device: report what torch refuses on it, not errors."""
        self.report.probes += 2
        cpu = self.torch.cpu
        self.add("unsupported", "OffsetBasedRNGTracker",
                 "the tracker refuses cpu meshes ('requires the presence of CUDA/CUDA-like/XPU "
                 "device. Got cpu instead.')",
                 f"DTensor random ops with {_TRACKER} (torch.distributed.tensor._random)",
                 "nothing to fix: RNG conformance checks on cpu are skipped as unsupported by "
                 "torch; use an accelerator for DTensor RNG")
        if not hasattr(cpu, "set_rng_state"):
            self.add("unsupported", "set_rng_state",
                     "torch.cpu has no set_rng_state, so is_rng_supported_mesh() is False on cpu",
                     "torch.distributed.tensor.random.is_rng_supported_mesh",
                     "nothing to fix: DTensor on cpu uses the CPU generator without offsets")

    # -- presence --------------------------------------------------------------------------
    def presence(self) -> None:
        self.report.probes += 1
        private = self.dt == torch_internals.privateuse1_name()
        missing = [m for m in members(DeviceHandle) if not hasattr(self.handle, m)
                   and (private or m not in PRIVATEUSE1_ONLY)]
        for member in missing:
            if member in _SEED_PAIR:
                other = _SEED_PAIR[1 - _SEED_PAIR.index(member)]
                self.add("error", member, f"torch.{self.dt}.{member} is missing",
                         f"torch.manual_seed() skips the device (it needs both {member} and "
                         f"{other}; torch.random._seed_custom_device only warns)",
                         f"add {member}() to the device module")
            else:
                self.add("error", member, f"torch.{self.dt}.{member} is missing",
                         members(DeviceHandle)[member], f"add {member} to the device module")
        for member, caller in members(StreamDeviceHandle).items():
            if not hasattr(self.handle, member):
                self.add("warning", member, f"torch.{self.dt}.{member} is missing", caller,
                         f"add {member} (a stream API like torch.cuda.{member}) if FSDP "
                         "or DCP should run on the device")

    # -- probes that leave the device alone ------------------------------------------------
    def not_initialized_before_use(self) -> None:
        initialized = self.call("is_initialized", breaks=members(DeviceHandle)["is_initialized"],
                                fix="make is_initialized() a cheap read that never fails")
        if initialized is True:
            self.add("error", "is_initialized",
                     "is_initialized() is True before the device was used",
                     "DeviceMesh never selects a device (set_device(LOCAL_RANK or rank % "
                     "device_count()) is skipped), so every rank stays on device 0",
                     "return False until the runtime is initialised by first use (set_device, a "
                     "tensor, an RNG call), like torch.cuda; run the checker in a fresh process")
        elif initialized is not False:
            self.add("error", "is_initialized",
                     f"is_initialized() returned {initialized!r}, not a bool",
                     members(DeviceHandle)["is_initialized"], "return True or False")

    def still_uninitialized(self) -> None:
        if self.call("is_initialized", breaks="DeviceMesh device selection",
                     fix="keep is_initialized() a plain read") is True:
            self.add("error", "is_initialized",
                     "is_initialized() became True during the no-touch probes (is_available, "
                     "device_count, _is_in_bad_fork, get_amp_supported_dtype)",
                     "DeviceMesh never selects a device once any of these ran",
                     "do not initialise the runtime in those queries")

    def registration(self) -> None:
        """torch-side registration: get_device_module, Tensor methods, default c10d backend."""
        torch = self.torch
        self.report.probes += 1
        try:
            module = torch.get_device_module(self.dt)
        except Exception as exc:
            module = exc
        if module is not self.handle:
            self.add("error", f"torch.{self.dt}",
                     f"torch.get_device_module({self.dt!r}) is not torch.{self.dt} ({module!r})",
                     "torch.random.fork_rng, torch.accelerator.device_count/is_available",
                     f"register the module with torch._register_device_module({self.dt!r}, mod)")
        if self.dt == torch_internals.privateuse1_name():
            if not hasattr(torch.Tensor, f"is_{self.dt}"):
                self.add("warning", f"Tensor.{self.dt}",
                         f"Tensor.{self.dt}() / Tensor.is_{self.dt} are not generated",
                         f"code written for cuda-like devices (tensor.{self.dt}(), "
                         f"module.{self.dt}())",
                         "call torch.utils.generate_methods_for_privateuse1_backend() after the "
                         "rename (register_accelerator does it)")
            self.accelerator_hooks()
        import torch.distributed as dist

        if dist.is_available() and self.dt not in dist.Backend.default_device_backend_map:
            self.add("warning", "<collective backend>",
                     f"no c10d backend is registered for {self.dt!r} devices",
                     f"init_process_group() without a backend, DeviceMesh collectives on "
                     f"{self.dt!r} tensors",
                     "register one with dist.Backend.register_backend(name, creator, "
                     f"devices=[{self.dt!r}]) (register_accelerator's collective_backend=)")

    def accelerator_hooks(self) -> None:
        self.report.probes += 1
        try:
            acc = self.torch.accelerator.current_accelerator()
        except Exception as exc:
            self.add("error", "<PrivateUse1 hooks>",
                     f"torch.accelerator.current_accelerator() raised {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0]}",
                     "torch.accelerator.*, init_process_group() without a backend, "
                     "torch.Generator(device=...)",
                     "register an at::PrivateUse1HooksInterface from the C++ extension "
                     "(REGISTER_PRIVATEUSE1_HOOKS) before registering the device")
            return
        if acc is None or acc.type != self.dt:
            self.add("info", "<torch.accelerator>",
                     f"torch.accelerator.current_accelerator() is {acc}, not {self.dt!r}",
                     "torch.accelerator.* and fork_rng() without device_type address another "
                     "device", "nothing to fix if that build has another accelerator")

    def available(self) -> None:
        """No device (is_available() False, device_count() 0) is a state, not an error: a host
        without the card registers the device and reports it unavailable, so ``import torch``
        works there. is_available() False with devices present is an error."""
        available = self.call("is_available", breaks=members(DeviceHandle)["is_available"],
                              fix="make is_available() a cheap query that never fails")
        if available is False and _quietly(getattr(self.handle, "device_count", None)) == 0:
            self.report.no_device = True
            self.add("info", "is_available",
                     "no device here: is_available() is False and device_count() is 0",
                     "nothing on this host; the device's checks need a host with the device",
                     "nothing to fix if this host has no device; otherwise check the "
                     "driver/runtime")
        elif available is not True:
            self.add("error", "is_available", f"is_available() returned {available!r}, not True",
                     f"{_TRACKER} ('requires the presence of {self.dt} device'), "
                     "torch.accelerator.is_available",
                     "return True when at least one device is usable (check the driver/runtime)")

    def device_count(self) -> None:
        count = self.call("device_count", breaks=members(DeviceHandle)["device_count"],
                          fix="make device_count() return the number of devices")
        if count == 0 and self.report.no_device:
            return
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            self.add("error", "device_count", f"device_count() returned {count!r}, not an int > 0",
                     "DeviceMesh skips device selection (count 0); DTensor _resolve_device "
                     "divides by it; fork_rng(devices=None) forks nothing",
                     "return the number of visible devices (at least 1 when is_available())")

    def bad_fork(self) -> None:
        bad = self.call("_is_in_bad_fork", breaks=members(DeviceHandle)["_is_in_bad_fork"],
                        fix="return whether this process is a fork of an initialised parent")
        if bad is not False:
            self.add("error", "_is_in_bad_fork",
                     f"_is_in_bad_fork() returned {bad!r} in a fresh process, not False",
                     "torch.manual_seed() skips seeding the device",
                     "return True only in a child forked after the runtime was initialised")

    def amp_dtypes(self) -> None:
        dtypes = self.call("get_amp_supported_dtype",
                           breaks=members(DeviceHandle)["get_amp_supported_dtype"],
                           fix="return the list of dtypes autocast may use")
        if not isinstance(dtypes, list | tuple) or not all(
                isinstance(d, self.torch.dtype) for d in dtypes):
            self.add("error", "get_amp_supported_dtype",
                     f"get_amp_supported_dtype() returned {dtypes!r}, not a list of torch.dtype",
                     members(DeviceHandle)["get_amp_supported_dtype"],
                     "return e.g. [torch.float16, torch.bfloat16]")

    # -- probes that use the device --------------------------------------------------------
    def devices(self) -> None:
        fix_cur = "return the index of the current device as an int"
        current = self.call("current_device", breaks=members(DeviceHandle)["current_device"],
                            fix=fix_cur)
        count = self.handle.device_count()
        if not isinstance(current, int) or not 0 <= current < count:
            self.add("error", "current_device",
                     f"current_device() returned {current!r}, not an int in [0, {count})",
                     members(DeviceHandle)["current_device"], fix_cur)
            raise _Skip
        set_breaks = members(DeviceHandle)["set_device"]
        targets = [i for i in (count - 1, current) if i != current] + [current]
        try:
            for target in targets:
                self.call("set_device", target, breaks=set_breaks,
                          fix="accept the device index DeviceMesh passes (an int)")
                now = self.handle.current_device()
                if now != target:
                    self.add("error", "set_device",
                             f"after set_device({target}) current_device() is {now}",
                             "DeviceMesh's device selection: ranks share one device",
                             "make set_device(i) change the device current_device() reports")
                    break
        finally:
            _restore(self.handle.set_device, current)
        self.call("synchronize", breaks=members(DeviceHandle)["synchronize"],
                  fix="accept synchronize() with no argument (the current device)")

    def rng(self) -> None:
        torch = self.torch
        state_breaks = members(DeviceHandle)["get_rng_state"]
        state = self.call("get_rng_state", breaks=state_breaks,
                          fix="accept get_rng_state() with no argument (the current device)")
        if not isinstance(state, torch.Tensor):
            self.add("error", "get_rng_state",
                     f"get_rng_state() returned {type(state).__name__}, not a torch.Tensor",
                     state_breaks, "return the generator state as a uint8 CPU tensor")
            raise _Skip
        philox = (state.dtype == torch.uint8 and state.device.type == "cpu"
                  and state.dim() == 1 and state.numel() == _PHILOX_BYTES)
        if not philox:
            self.add("error", "get_rng_state",
                     f"get_rng_state() is a {state.numel()}-element {state.dtype} tensor on "
                     f"{state.device}, not 16 uint8 bytes on cpu (uint64 seed + int64 offset)",
                     f"{_TRACKER}: it reads seed = state[:8], offset = state[8:] and asserts "
                     "in the offset setter; every random DTensor op fails",
                     "use a Philox-style generator whose state is seed (8 bytes) + offset (8 "
                     "bytes), returned as torch.uint8 on the CPU")
        try:
            saved = [(i, self.handle.get_rng_state(i)) for i in range(self.handle.device_count())]
        except Exception:  # an int device argument is refused: device_forms reports it
            saved = []
        # torch.manual_seed in seeding() reseeds the CPU and every other accelerator too
        with torch_internals.generators_kept():
            try:
                self.device_forms(state)
                if philox:
                    self.round_trip(state)
                    self.seeding()
            finally:
                for i, device_state in saved:
                    _restore(self.handle.set_rng_state, device_state, i)
                _restore(self.handle.set_rng_state, state)

    def forms(self) -> list[Any]:
        index = self.handle.current_device()
        return [index, f"{self.dt}:{index}", self.torch.device(self.dt, index)]

    def device_forms(self, state: Any) -> None:
        torch = self.torch
        for form in self.forms():
            try:
                self.report.probes += 1
                got = self.handle.get_rng_state(form)
                same = isinstance(got, torch.Tensor) and torch.equal(got, state)
                problem = None if same else f"get_rng_state({form!r}) differs from get_rng_state()"
            except Exception as exc:
                problem = f"get_rng_state({form!r}) raised {type(exc).__name__}: {exc}"
            if problem:
                self.add("error", "get_rng_state", problem, self.forms_breaks(), _FORMS_FIX)

    def round_trip(self, state: Any) -> None:
        for k, form in enumerate([None, *self.forms()]):
            wanted = _with_offset(self.torch, state, 4 * (k + 1))
            args = (wanted,) if form is None else (wanted, form)
            shown = "set_rng_state(state" + ("" if form is None else f", {form!r}") + ")"
            try:
                self.report.probes += 1
                self.handle.set_rng_state(*args)
                got = self.handle.get_rng_state()
            except Exception as exc:
                self.add("error", "set_rng_state", f"{shown} raised {type(exc).__name__}: {exc}",
                         self.forms_breaks(), _FORMS_FIX)
                continue
            if not self.torch.equal(got, wanted):
                self.add("error", "set_rng_state",
                         f"{shown} then get_rng_state() gives {got.tolist()}, not "
                         f"{wanted.tolist()}",
                         f"{_TRACKER}._distribute_region sets a per-shard offset and fork_rng "
                         "restores the state: random DTensor ops repeat or diverge across ranks",
                         "store the given state so get_rng_state() returns it")

    def forms_breaks(self) -> str:
        return (f"torch.random.fork_rng(devices=[torch.device('{self.dt}:i')]), which "
                f"{_TRACKER} runs every random op in")

    def seeding(self) -> None:
        torch = self.torch
        for member, seed in (("manual_seed", 1234), ("manual_seed_all", 4321)):
            self.call(member, seed, breaks=members(DeviceHandle)[member],
                      fix=f"make {member}(seed) reset the generator to (seed, offset 0)")
            got = _seed_offset(torch, self.handle.get_rng_state())
            if got != (seed, 0):
                self.add("error", member,
                         f"after {member}({seed}) the state's (seed, offset) is {got}, not "
                         f"({seed}, 0)", members(DeviceHandle)[member] if member != "manual_seed"
                         else f"{_TRACKER} (ranks seeded alike draw different numbers)",
                         f"make {member}(seed) set seed bytes [0:8] to seed and offset to 0")
        initial = self.call("initial_seed", breaks=members(DeviceHandle)["initial_seed"],
                            fix="return the seed the generator was last seeded with")
        if initial != 4321:
            self.add("warning", "initial_seed",
                     f"initial_seed() is {initial!r} after manual_seed_all(4321)",
                     members(DeviceHandle)["initial_seed"],
                     "return the seed the generator was last seeded with")
        self.report.probes += 1
        torch.manual_seed(2468)
        got = _seed_offset(torch, self.handle.get_rng_state())
        if got != (2468, 0):
            self.add("error", "manual_seed_all",
                     f"torch.manual_seed(2468) left the device state at (seed, offset) {got}",
                     "torch.manual_seed() does not seed the device: ranks draw unrelated numbers",
                     "provide manual_seed_all(seed) and _is_in_bad_fork() -> False")

    def seed_width(self) -> None:
        """manual_seed keeps all 64 bits of a seed (Philox's key, as CUDA's generator):
        initial_seed() and the state's seed bytes return a seed above 2**32 whole."""
        torch = self.torch
        seed = 2**32 + 5
        state = self.call("get_rng_state", breaks=members(DeviceHandle)["get_rng_state"],
                          fix="accept get_rng_state() with no argument (the current device)")
        breaks = ("torch.manual_seed / torch.random.seed() (64-bit seeds): runs or ranks seeded "
                  "with seeds that differ above bit 31 draw the same numbers")
        fix = "keep the seed as a uint64 (Philox's key is 64 bits), as torch.cuda does"
        with torch_internals.generators_kept():
            try:
                self.call("manual_seed", seed, breaks=breaks, fix=fix)
                initial = self.call("initial_seed", breaks=breaks, fix=fix)
                kept = _seed_offset(torch, self.handle.get_rng_state())
            finally:
                _restore(self.handle.set_rng_state, state)
        if initial != seed:
            self.add("error", "initial_seed",
                     f"initial_seed() is {initial!r} after manual_seed({seed})"
                     + (" (its low 32 bits: the seed is truncated)" if initial == seed & 0xFFFFFFFF
                        else ""), breaks, fix)
        if kept is not None and kept[0] != seed:
            self.add("error", "manual_seed",
                     f"after manual_seed({seed}) the state's seed bytes hold {kept[0]}", breaks, fix)

    def event_timing(self) -> None:
        """Event(enable_timing=True).elapsed_time is positive for recorded work and no longer
        than the host waited for it (milliseconds, as torch.cuda.Event); only for a handle
        with the stream API (StreamDeviceHandle)."""
        if not hasattr(self.handle, "Event"):
            return  # presence() reported the missing stream API
        torch = self.torch
        self.report.probes += 1
        device = torch.device(self.dt, self.handle.current_device())
        breaks = ("torch.Event / torch.<device>.Event.elapsed_time: profilers, FSDP and "
                  "training loops that time steps with events report nothing or nonsense")
        fix = ("timestamp each event when the stream reaches it and return the difference in "
               "milliseconds")
        try:
            a = torch.ones(256, 256, device=device)
            start, end = (self.handle.Event(enable_timing=True) for _ in range(2))
            self.handle.synchronize()
            begun = time.perf_counter()
            start.record()
            for _ in range(8):
                a = a @ a / 256
            end.record()
            end.synchronize()
            host_ms = (time.perf_counter() - begun) * 1000
            ms = start.elapsed_time(end)
        except Exception as exc:
            self.add("error", "Event.elapsed_time",
                     f"timing 8 matmuls with Event(enable_timing=True) raised "
                     f"{type(exc).__name__}: {exc}", breaks, fix)
            return
        if not ms > 0:
            self.add("error", "Event.elapsed_time",
                     f"elapsed_time() is {ms} ms over 8 recorded matmuls (the host waited "
                     f"{host_ms:.3f} ms), expected > 0", breaks, fix)
        elif ms > host_ms * 1.1 + 1.0:
            self.add("error", "Event.elapsed_time",
                     f"elapsed_time() is {ms:.3f} ms for work the host saw finish in "
                     f"{host_ms:.3f} ms (not milliseconds?)", breaks, fix)

    def initialized_after_use(self) -> None:
        self.report.probes += 1
        if getattr(self.handle, "_initialized", False) is not True:
            self.add("error", "_initialized",
                     f"torch.{self.dt}._initialized is not True after the device was used",
                     "torch.utils.checkpoint saves and restores the device RNG state around a "
                     "recompute only when it is True: dropout in a checkpointed block draws "
                     "new masks in backward and the gradients are silently wrong",
                     "expose _initialized (True once the device is initialised) as torch.cuda "
                     "does; accelkit.core.build_device_module does")
        if self.call("is_initialized", breaks="DeviceMesh device selection",
                     fix="keep is_initialized() a plain read") is False:
            self.add("warning", "is_initialized",
                     "is_initialized() is still False after set_device/get_rng_state were used",
                     "DeviceMesh calls set_device(rank % device_count()) even when the user "
                     "already chose a device",
                     "return True once the runtime is initialised by first use")


def _with_offset(torch: Any, state: Any, delta: int) -> Any:
    out = state.clone()
    out[8:].view(torch.int64).add_(delta)
    return out


def _seed_offset(torch: Any, state: Any) -> tuple[int, int] | None:
    """(seed, offset) of a Philox state: little-endian uint64 seed, then int64 offset."""
    if not (isinstance(state, torch.Tensor) and state.numel() == _PHILOX_BYTES):
        return None
    raw = bytes(state.tolist())
    return (int.from_bytes(raw[:8], "little"),
            int.from_bytes(raw[8:], "little", signed=True))


def _quietly(fn: Callable[[], Any] | None) -> Any:
    """``fn()``, or None when it is missing or raises (its own probe reports that)."""
    try:
        return None if fn is None else fn()
    except Exception:
        return None


def _restore(fn: Callable[..., Any], *args: Any) -> None:
    """Put back what a probe changed; a failure here was already reported by the probe."""
    try:
        fn(*args)
    except Exception:
        pass


def check_random_op(device_type: str, *, offset_exact: bool) -> list[Finding]:
    """Probe that a plain random op on the device (``torch.rand(64)`` on the current device)
    draws from the device's default generator and advances its offset: by exactly
    ``ceil4(64) = 64`` when the backend declares ``offset-exact``, by something otherwise. A
    kernel that draws from the CPU generator, or saves and restores the state around the op,
    is caught here. The state is restored afterwards. Findings (none when it holds); run it
    after :func:`check_device_handle` found the state layout sound."""
    import torch

    handle = getattr(torch, device_type)
    device = torch.device(device_type, handle.current_device())
    shown = f"torch.rand(64, device='{device}')"
    breaks = (f"{_TRACKER}: it runs each random DTensor op at a per-shard offset and moves the "
              "offset past it; an op that does not consume offsets repeats its numbers across "
              "ops and ranks")
    before = handle.get_rng_state(device)
    try:
        torch.rand(64, device=device)
        after = handle.get_rng_state(device)
    except Exception as exc:
        return [Finding("error", "<random op>", f"{shown} raised {type(exc).__name__}: {exc}",
                        breaks, "register random kernels for the device (accelkit's "
                        "<accelkit/random.h> has them)")]
    finally:
        _restore(handle.set_rng_state, before, device)
    (seed, offset), (seed_after, offset_after) = _seed_offset(torch, before), _seed_offset(torch, after)
    fix = ("draw from the device's default generator and advance its offset by ceil4(numel) "
           "per op (do not restore the state after the op; do not fall back to the CPU "
           "generator)")
    if seed_after != seed or offset_after <= offset:
        return [Finding("error", "<random op>",
                        f"{shown} left the generator at (seed, offset) ({seed_after}, "
                        f"{offset_after}); expected seed {seed} and an offset above {offset}",
                        breaks, fix)]
    if offset_exact and offset_after != offset + 64:
        return [Finding("error", "<random op>",
                        f"{shown} moved the offset from {offset} to {offset_after}; expected "
                        f"{offset + 64} (ceil4(64)) for a backend declaring rng='offset-exact'",
                        f"{_TRACKER}'s shards draw other numbers than one device would",
                        "advance by ceil4(numel), or declare rng='offset-consistent'")]
    return []


#: Copy sizes the runtime probes use: 1 byte to just over 64 MiB, odd sizes and sizes just
#: around page, 1 MiB and power-of-two boundaries, where a DMA path splits or changes protocol.
COPY_SIZES: tuple[int, ...] = (1, 3, 4095, 4097, 65537, 1 << 20, (1 << 20) + 7, (16 << 20) + 3,
                               (64 << 20) + 1)
#: Byte offsets into the buffers (cycled over the sizes): unaligned starts.
COPY_OFFSETS: tuple[int, ...] = (0, 1, 7)

_COPY_BREAKS = ("every transfer of that size between host and device: .cpu(), .to(device), "
                "checkpoint save/load, collectives that stage through the host")


def check_copies(device_type: str, *, max_bytes: int = COPY_SIZES[-1]) -> tuple[int, list[Finding]]:
    """Copy known random bytes in every direction (pageable host -> device, pinned host ->
    device, device -> pageable host, device -> pinned host, device -> same device, device ->
    another device when there are two) at every size of :data:`COPY_SIZES` up to
    ``max_bytes``, at the offsets of :data:`COPY_OFFSETS`, and compare byte for byte: once
    through torch (``Tensor.copy_``, the layer's copy kernel) and, for an accelkit device
    (``torch.<device>._runtime_copy``), once through the runtime's own ``Runtime::copy``, which
    the layer never calls where device memory is host memory. Returns (probes, findings); a
    finding names the function, the direction, the size and the offset."""
    import torch

    handle = getattr(torch, device_type)
    index = handle.current_device()
    device = torch.device(device_type, index)
    sizes = [s for s in COPY_SIZES if s <= max_bytes]
    room = sizes[-1] + max(COPY_OFFSETS)
    source = torch.randint(0, 256, (room,), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(20))
    copiers = [("Tensor.copy_", lambda dst, src: dst.copy_(src))]
    if hasattr(handle, "_runtime_copy"):
        copiers.append(("Runtime::copy", handle._runtime_copy))
    peer = torch.device(device_type, (index + 1) % handle.device_count())
    findings: list[Finding] = []

    def settle() -> None:  # both devices' queued work done (Runtime::copy is not stream-ordered)
        handle.synchronize(index)
        handle.synchronize(peer.index)

    probes = 0
    for i, size in enumerate(sizes):
        offset = COPY_OFFSETS[i % len(COPY_OFFSETS)]
        want = source[offset:offset + size]
        on_device = torch.empty(room, dtype=torch.uint8, device=device)
        on_device[offset:offset + size].copy_(want)
        handle.synchronize()
        for function, copy in copiers:
            for direction, make_src, make_dst in _directions(torch, device, peer, want, on_device,
                                                              offset, size, room):
                probes += 1
                try:
                    src, dst = make_src(), make_dst()
                    # every byte differs from the one expected: a copy that moves nothing
                    # cannot pass on what a freed buffer of the same size left behind
                    dst[offset:offset + size].copy_(torch.bitwise_not(want))
                    settle()
                    copy(dst[offset:offset + size], src)
                    settle()
                    got = dst[offset:offset + size].cpu()
                except Exception as exc:
                    findings.append(Finding(
                        "error", function, f"{function} {direction} of {size} bytes (offset "
                        f"{offset}) raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                        _COPY_BREAKS, "make every direction and size work"))
                    continue
                wrong = got != want
                if bool(wrong.any()):
                    first = int(wrong.nonzero()[0, 0])
                    findings.append(Finding(
                        "error", function, f"{function} {direction} of {size} bytes (offset "
                        f"{offset}): {int(wrong.sum())} of {size} bytes differ, the first at "
                        f"byte {first}", _COPY_BREAKS,
                        f"make {function} move every byte it is asked to (check how the "
                        "transfer's size is computed and split into chunks)"))
    return probes, findings


def _directions(torch: Any, device: Any, peer: Any, want: Any, on_device: Any, offset: int,
                size: int, room: int) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """(direction, source, destination buffer) of each copy :func:`check_copies` makes; a
    device source is the prepared ``on_device`` slice, a host one ``want`` (pinned or not)."""
    def device_source() -> Any:
        return on_device[offset:offset + size]

    def host(pinned: bool) -> Callable[[], Any]:
        return lambda: torch.empty(room, dtype=torch.uint8, pin_memory=pinned)

    def on(where: Any) -> Callable[[], Any]:
        return lambda: torch.empty(room, dtype=torch.uint8, device=where)

    out = [("pageable host→device", lambda: want.clone(), on(device)),
           ("pinned host→device", lambda: want.pin_memory(), on(device)),
           ("device→pageable host", device_source, host(False)),
           ("device→pinned host", device_source, host(True)),
           ("device→same device", device_source, on(device))]
    if peer != device:
        out.append((f"device {device.index}→device {peer.index}", device_source, on(peer)))
    return out


def check_synchronization(device_type: str) -> tuple[int, list[Finding]]:
    """The waiting calls keep their word on an asynchronous runtime (``is_async()``; on a
    synchronous one they hold trivially and nothing is probed): after ``synchronize()`` the current stream has no
    work left (``Stream.query()`` True) and the work's result is there; after
    ``Event.synchronize()`` that event and every event recorded before it on the stream are
    complete (events ordered, ``Event.query()`` truthful); after ``Stream.synchronize()``
    ``Stream.query()`` is True. The work is 16 in-place adds on 16 MiB, long enough to be
    still queued when a waiting call returns at once. Returns (probes, findings), each naming
    the call that did not wait."""
    import torch

    handle = getattr(torch, device_type)
    device = torch.device(device_type, handle.current_device())
    ops = 16
    work = f"{ops} in-place adds on a 16 MiB tensor"
    findings: list[Finding] = []

    def busy_work() -> Any:
        x = torch.zeros(1 << 22, device=device)
        for _ in range(ops):
            x.add_(1)
        return x

    def finding(member: str, problem: str, breaks: str) -> None:
        findings.append(Finding("error", member, problem, breaks,
                                f"make {member} return only once the work queued before it has "
                                "finished (CUDA: cudaDeviceSynchronize, cudaEventSynchronize, "
                                "cudaStreamSynchronize)"))

    is_async = getattr(handle, "is_async", None)
    if is_async is not None and not is_async():
        return 0, findings  # every call is done when it returns: nothing to wait for
    stream = handle.current_stream()
    x = busy_work()
    handle.synchronize()
    idle = stream.query()
    last = x[-1:].clone()  # read through a 4-byte copy: a broken large copy is not blamed here
    if not idle:
        finding("synchronize", f"synchronize() returned while the current stream still had "
                f"queued work (Stream.query() False right after it; {work})",
                "every caller that reads results after torch.<device>.synchronize(): "
                "benchmarks, DeviceMesh/DTensor tests, checkpointing, the conformance suite")
    elif float(last) != ops:
        finding("synchronize", f"after synchronize() the result of {work} is {float(last)}, "
                f"not {ops}", "every caller that reads results after synchronize()")
    first, second = handle.Event(), handle.Event()
    busy_work()
    first.record()
    busy_work()
    second.record()
    second.synchronize()
    if not second.query():
        finding("Event.synchronize", f"Event.query() is False right after Event.synchronize() "
                f"({work} before the event)", "Work.wait(), stream-ordered allocator reuse, "
                "FSDP's and DCP's event waits")
    elif not first.query():
        finding("Event.query", "an event recorded earlier on the stream is not complete once a "
                "later one is (events out of order)", "every wait on an event: the waiter "
                "may run before the work it waits for")
    busy_work()
    stream.synchronize()
    if not stream.query():
        finding("Stream.synchronize", f"Stream.query() is False right after "
                f"Stream.synchronize() ({work})", "stream waits in FSDP, DCP and collectives")
    return 3, findings

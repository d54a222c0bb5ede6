"""The ``mock`` backend's spec and its ``torch.backends`` autoload hook, kept outside
:mod:`accelkit.backends.mock` because importing that package registers the mock device under
PrivateUse1; listing backends and ``import torch`` must not, unless asked."""

import os
from pathlib import Path

from accelkit.core.spec import BackendSpec, Capabilities

_CSRC = Path(__file__).resolve().parent / "mock" / "csrc"

#: The mock's two C++ extensions, as keyword arguments of ``accelkit.core.load_extension``:
#: the device (the host-memory runtime registered with accelkit's C++ layer, and its native
#: kernels, one file per group in ``csrc/kernels/``) and mockccl (its collectives: the module
#: in ``mockccl.cpp``, the transport's parts in ``mockccl_*.cpp``).
EXTENSIONS: dict[str, dict] = {
    "device": {"name": "accelkit_mock_C",
               "sources": [_CSRC / "mock_device.cpp", *sorted((_CSRC / "driver").glob("*.cpp")),
                           *sorted((_CSRC / "kernels").glob("*.cpp"))],
               "include_dirs": [str(_CSRC)], "cflags": ["-O3", "-std=c++20"]},
    "mockccl": {"name": "accelkit_mock_mockccl", "sources": sorted(_CSRC.glob("mockccl*.cpp")),
             "include_dirs": [str(_CSRC)], "cflags": ["-O3"]},
}


#: The mock's modes, each its settings (read once, by the driver, ``csrc/driver/mockrt.cpp``): its memory
#: (host-accessible, which the layer uses without copies, or a discrete device's, which the host
#: cannot address) and whether its work is queued on streams. Both are set in each, so a mode
#: does not inherit the other's from the environment. The runs in every mode (tox's
#: conformance-modes, the mutation tests, the benchmarks, tests/support/mock_process.py) take them here.
MODES: dict[str, dict[str, str]] = {
    "default": {"ACCELKIT_MOCK_HOST_ACCESSIBLE": "1", "ACCELKIT_MOCK_ASYNC": "0"},
    "discrete": {"ACCELKIT_MOCK_HOST_ACCESSIBLE": "0", "ACCELKIT_MOCK_ASYNC": "0"},
    "async": {"ACCELKIT_MOCK_HOST_ACCESSIBLE": "1", "ACCELKIT_MOCK_ASYNC": "1"},
    "discrete-async": {"ACCELKIT_MOCK_HOST_ACCESSIBLE": "0", "ACCELKIT_MOCK_ASYNC": "1"},
}


#: The preprocessor macro of the fault build (``core/csrc/testing/faults.h``).
FAULT_DEFINES = ("ACCELKIT_FAULTS",)


#: The switch of the fault build.
FAULT_BUILD_SWITCH = "ACCELKIT_MOCK_FAULTS"


def fault_build() -> bool:
    """True when ``ACCELKIT_MOCK_FAULTS=1`` asks for the fault build."""
    return os.environ.get(FAULT_BUILD_SWITCH, "0") not in ("", "0")


def extensions() -> dict[str, dict]:
    """The extensions this process builds and loads: :data:`EXTENSIONS`, or with
    ``ACCELKIT_MOCK_FAULTS=1`` their fault build, for accelkit's own mutation tests
    (``tests/catalogue/test_mutants.py``): the same sources and accelkit's library compiled with
    ``-DACCELKIT_FAULTS``, named ``<name>_faults`` and cached apart. In it the environment
    variable ``ACCELKIT_FAULT`` switches on one of the faults ``core/csrc/testing/faults.cpp``
    lists; the default build has no fault code at all."""
    if not fault_build():
        return EXTENSIONS
    return {key: {**ext, "name": f"{ext['name']}_faults", "defines": FAULT_DEFINES}
            for key, ext in EXTENSIONS.items()}


def _setup() -> None:
    import accelkit.backends.mock  # noqa: F401  (registers torch.mock and mockccl)


def _prepare() -> None:
    """Compile both extensions (if not cached) without registering anything in this process:
    accelkit's library first (both link it), then the two extensions side by side."""
    from concurrent.futures import ThreadPoolExecutor

    from accelkit.core.cpp import build_extension, library

    chosen = extensions()
    library(FAULT_DEFINES if fault_build() else ())
    with ThreadPoolExecutor(len(chosen)) as pool:
        for future in [pool.submit(build_extension, **ext) for ext in chosen.values()]:
            future.result()


#: The device counts the mock driver accepts (csrc/driver/mockrt.cpp refuses others); 0 models a
#: host without the card: the device registers, ``torch.mock.is_available()`` is False.
DEVICE_COUNTS = range(0, 65)


def _device_count() -> int | None:
    """``ACCELKIT_MOCK_DEVICES``, or None when the runtime would refuse it; unset: 8, or under
    torchrun the host's ranks (``LOCAL_WORLD_SIZE``), as the driver counts (driver/mockrt.cpp)."""
    default = "8"
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if "TORCHELASTIC_RUN_ID" in os.environ and local.isdigit() and 1 <= int(local) <= 64:
        default = local
    value = os.environ.get("ACCELKIT_MOCK_DEVICES", default)
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count in DEVICE_COUNTS else None


def _probe(world_size: int = 1) -> tuple[bool, str]:
    count = _device_count()
    if count is None:  # the driver's own message (driver/mockrt.cpp), said before any rank starts
        value = os.environ.get("ACCELKIT_MOCK_DEVICES")
        return False, (f"ACCELKIT_MOCK_DEVICES={value} is not a device count: use an integer "
                       f"from {DEVICE_COUNTS[0]} to {DEVICE_COUNTS[-1]}, e.g. "
                       "ACCELKIT_MOCK_DEVICES=8")
    if count == 0:  # what the runtime reports (driver/mockrt.cpp: no devices, as a driver without a card)
        return False, ("the mock runtime reports no devices (ACCELKIT_MOCK_DEVICES=0); set "
                       "ACCELKIT_MOCK_DEVICES to 1..64")
    if count < world_size:
        return False, f"{world_size} devices needed, {count} present (ACCELKIT_MOCK_DEVICES={count})"
    return True, f"{count} mock devices over host memory"


#: The mock's switches and their defaults (driver/mockrt.cpp, mockccl.cpp).
SETTINGS_DEFAULTS = {
    "ACCELKIT_MOCK_DEVICES": "8 (under torchrun: LOCAL_WORLD_SIZE)",
    "ACCELKIT_MOCK_MEMORY": "8GiB",
    "ACCELKIT_MOCK_HOST_ACCESSIBLE": "1",
    "ACCELKIT_MOCK_ASYNC": "0",
    "ACCELKIT_MOCK_LAUNCH_BLOCKING": "0",
    "ACCELKIT_MOCK_SCHEDULE": "off",
    "ACCELKIT_MOCK_FAULTS": "0",
    "ACCELKIT_MOCKCCL_CHUNK_BYTES": str(512 << 10),
    "ACCELKIT_MOCKCCL_P2P_BYTES": str(2 << 20),
    # Per peer across hosts: bytes of messages kept for receives not posted yet (mockccl_net.h).
    "ACCELKIT_MOCKCCL_KEPT_BYTES": str(1 << 30),
    # A group spanning hosts (mockccl_hosts.h): what tells hosts apart, and the interface
    # their TCP connections use ("": the one towards MASTER_ADDR, else the first that is up).
    "ACCELKIT_MOCKCCL_HOSTID": "hostname",
    "ACCELKIT_MOCKCCL_SOCKET_IFNAME": "",
}


def _scheduled() -> bool:
    """Whether the streams run under a seeded schedule (one worker, the highest-priority
    stream with work first: ``csrc/driver/scheduler.h``), launches not blocking."""
    on = [os.environ.get(name, "0") not in ("", "0")
          for name in ("ACCELKIT_MOCK_ASYNC", "ACCELKIT_MOCK_LAUNCH_BLOCKING")]
    return on == [True, False] and os.environ.get("ACCELKIT_MOCK_SCHEDULE", "") not in ("", "off")


def _settings() -> dict[str, str]:
    """Every ``ACCELKIT_MOCK*`` switch in effect (set ones as given, others at their
    default); unknown ones are listed too, so a typo shows in the report."""
    given = {k: v for k, v in os.environ.items() if k.startswith("ACCELKIT_MOCK")}
    return {**SETTINGS_DEFAULTS, **given}


SPEC = BackendSpec(
    name="mock",
    device_type="mock",
    collective_backend="mockccl",
    setup=_setup,
    probe=_probe,
    prepare=_prepare,
    settings=_settings,
    expectations=_CSRC.parent / "expectations.toml",
    capabilities=Capabilities(rng="offset-exact", max_world_size=_device_count() or 0, cpu_collectives=True,
                              inductor=True, serial_streams=_scheduled()),
)


def autoload() -> None:
    """``torch.backends`` entry point, called by ``import torch``: registers the mock only
    when ``ACCELKIT_AUTOLOAD=mock`` is set, so accelkit never claims PrivateUse1 uninvited."""
    if os.environ.get("ACCELKIT_AUTOLOAD", "") == "mock":
        import accelkit.backends.mock  # noqa: F401

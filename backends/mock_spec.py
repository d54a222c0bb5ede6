"""The ``mock`` backend's spec and its ``torch.backends`` autoload hook, kept outside
:mod:`accelkit.backends.mock` because importing that package registers the mock device under
PrivateUse1; listing backends and ``import torch`` must not, unless asked."""

import os

from accelkit.core.spec import BackendSpec, Capabilities


def _setup() -> None:
    import accelkit.backends.mock  # noqa: F401  (registers torch.mock and mccl)


def _device_count() -> int:
    return int(os.environ.get("ACCELKIT_MOCK_DEVICES", "8"))


def _probe(world_size: int = 1) -> tuple[bool, str]:
    count = _device_count()
    if count < world_size:
        return False, f"{world_size} devices needed, {count} present (ACCELKIT_MOCK_DEVICES={count})"
    return True, f"{count} mock devices over host memory"


SPEC = BackendSpec(
    name="mock",
    device_type="mock",
    collective_backend="mccl",
    setup=_setup,
    probe=_probe,
    capabilities=Capabilities(rng="offset-exact", max_world_size=_device_count(), cpu_collectives=True),
)


def autoload() -> None:
    """``torch.backends`` entry point, called by ``import torch``: registers the mock only
    when ``ACCELKIT_AUTOLOAD=mock`` is set, so accelkit never claims PrivateUse1 uninvited."""
    if os.environ.get("ACCELKIT_AUTOLOAD", "") == "mock":
        import accelkit.backends.mock  # noqa: F401

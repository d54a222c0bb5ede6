"""The ``cpu`` backend: CPU tensors through gloo. Every host can run it, at any world size.

torch's RNG tracker refuses cpu meshes, so ``rng='unsupported'``: RNG checks SKIP with
torch's reason rather than fail. ``expectations.toml`` lists what gloo itself gets wrong.
"""

from pathlib import Path

from accelkit.core.spec import BackendSpec, Capabilities


def _setup() -> None:
    """Nothing to register: torch ships the cpu device and gloo."""


def _probe(world_size: int = 1) -> tuple[bool, str]:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return False, "this torch build has no gloo (torch.distributed.is_gloo_available() is False)"
    return True, "gloo is available"


SPEC = BackendSpec(
    name="cpu",
    device_type="cpu",
    collective_backend="gloo",
    setup=_setup,
    probe=_probe,
    capabilities=Capabilities(rng="unsupported", max_world_size=None, cpu_collectives=True,
                              inductor=True),
    expectations=Path(__file__).with_name("expectations.toml"),
)

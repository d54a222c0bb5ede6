"""The ``cuda`` backend: CUDA tensors through NCCL, CPU tensors through gloo, one GPU per rank.

Without enough GPUs the backend is *unavailable* with the reason, never an error.
"""

from pathlib import Path

from accelkit.core.spec import BackendSpec, Capabilities


def _setup() -> None:
    """Nothing to register: torch ships the cuda device and NCCL."""


def _probe(world_size: int = 1) -> tuple[bool, str]:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    if not dist.is_nccl_available():
        return False, "this torch build has no NCCL (torch.distributed.is_nccl_available() is False)"
    count = torch.cuda.device_count()
    if count < world_size:
        return False, f"{world_size} devices needed, {count} present"
    return True, f"{count} CUDA device(s), NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"


SPEC = BackendSpec(
    name="cuda",
    device_type="cuda",
    collective_backend="nccl",
    setup=_setup,
    probe=_probe,
    # CUDA's Philox honours the tracker's offsets but draws 4 values per thread in its own
    # layout, so a Shard(0) result is not bitwise the single-device one. NCCL's send/recv take
    # no tag (ProcessGroupNCCL::send/recv leave it unused), so the tagged P2P checks skip.
    capabilities=Capabilities(rng="offset-consistent", max_world_size=None, cpu_collectives=True,
                              inductor=True, p2p_tags=False),
    expectations=Path(__file__).with_name("expectations.toml"),
)

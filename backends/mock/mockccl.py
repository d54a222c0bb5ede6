"""mockccl, the mock's collective library: a C++ ``c10d::Backend`` over shared memory within a
host and TCP between hosts.

The C++ lives in ``backends/mock/csrc/mockccl*.{h,cpp}`` (the transport, which a vendor replaces
with their library) and ``core/include/accelkit/c10d/*.h`` (the reusable glue
between c10d and a transport). It is built on first use as its own extension,
``accelkit_mock_mockccl``, separate from the mock device's extension.

``create_backend`` is the ``extended_api=True`` creator that
``accelkit.core.register_accelerator("mock", ..., collective_backend="mockccl", creator=...)``
registers for ``devices=["mock"]``. It returns a whole ``ProcessGroup``, mock tensors through
mockccl and CPU tensors through gloo, which c10d accepts from a creator. That makes both
``init_process_group("mock:mockccl,cpu:gloo")`` and ``init_process_group()`` (no backend, where
torch 2.13 would register mockccl for mock tensors only) give a group with CPU
collectives, and sets the group's default backend, which torch 2.13 leaves unset for a
``"<device>:<custom>,cpu:gloo"`` string (its upper-case plugin key is compared with lower-case
names; the only symptom is a warning "No backend of type 0 found" at shutdown). torch binds
``init_process_group(device_id=...)`` to the group it made before calling the creator and does
not pass ``device_id`` on, so the creator carries that binding over to its group
(:func:`_binding_of_group_being_created`); with it, DeviceMesh and ``split_group`` split the
group (mockccl supports splitting).
"""

from __future__ import annotations

import functools
import sys
from datetime import timedelta

DEVICE = "mock"
NAME = "mockccl"


@functools.cache
def extension():
    """The ``accelkit_mock_mockccl`` module, compiled on first use (about a minute), loaded once
    per process."""
    import torch.distributed  # noqa: F401  (registers c10d.Backend, the bound base class)
    from accelkit.backends.mock_spec import extensions
    from accelkit.core.cpp import load_extension

    return load_extension(**extensions()["mockccl"])


def connect(store, rank: int, size: int, timeout: timedelta, device: str = DEVICE):
    """The mockccl ``c10d.Backend`` of one process group, connected through ``store``: every rank
    of the group calls it: shared memory among the ranks of each host, TCP between hosts.
    Raises ``DistBackendError`` when a rank does not connect within ``timeout``."""
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    return extension().Backend(store, rank, size, timeout_ms, device)


def _binding_of_group_being_created():
    """The ``bound_device_id`` torch gave the ``ProcessGroup`` it is building around this
    creator (``_new_process_group_helper``'s ``pg``), or None. torch 2.13 sets it from
    ``init_process_group(device_id=...)`` before calling the creator and does not pass it."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_new_process_group_helper":
        frame = frame.f_back
    pg = frame.f_locals.get("pg") if frame is not None else None
    return getattr(pg, "bound_device_id", None)


def create_backend(dist_backend_opts, backend_options):
    """The ``extended_api=True`` creator ``torch.distributed.Backend.register_backend`` calls:
    a ``ProcessGroup`` with mockccl for mock tensors and gloo for CPU tensors, mockccl as default."""
    import torch
    from torch.distributed import PrefixStore, ProcessGroup, ProcessGroupGloo

    opts = dist_backend_opts
    group = ProcessGroup(opts.store, opts.group_rank, opts.group_size)
    mockccl = connect(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    group._register_backend(torch.device(DEVICE), ProcessGroup.BackendType.CUSTOM, mockccl)
    gloo = ProcessGroupGloo(PrefixStore("cpu/", opts.store), opts.group_rank, opts.group_size,
                            timeout=opts.timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = opts.group_id
    gloo._set_sequence_number_for_group()
    group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
    group._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    group.bound_device_id = _binding_of_group_being_created()
    return group

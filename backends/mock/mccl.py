"""mccl, the mock's collective library (a C++ ``c10d::Backend`` over shared memory)."""


def create_backend(dist_backend_opts, backend_options):
    """The ``extended_api=True`` creator ``torch.distributed.Backend.register_backend`` calls."""
    raise NotImplementedError("mccl is not built yet, see issue #5")

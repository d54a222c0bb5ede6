"""Reference backends: ``cpu`` (gloo), ``cuda`` (nccl) and ``mock`` (a cuda-like
PrivateUse1 device over host memory with its own collective library, mockccl).

Each sub-package exposes one :class:`accelkit.core.BackendSpec` called ``SPEC``;
importing a sub-package's ``SPEC`` never registers a device.
"""

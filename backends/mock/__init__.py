"""The ``mock`` accelerator: importing this package registers ``torch.mock`` under
PrivateUse1 and the ``mockccl`` collective library.

The device is the accelkit C++ layer (``core/include/accelkit``) over the mock's runtime
(``csrc/mock_runtime.h``, an adapter over its fake driver ``csrc/driver/mockrt.h``), built on first import by :func:`accelkit.core.load_extension`.
Configuration: ``ACCELKIT_MOCK_DEVICES`` (default 8; under torchrun the host's ranks), ``ACCELKIT_MOCK_MEMORY`` (capacity per
device, default ``8GiB``), ``ACCELKIT_MOCK_HOST_ACCESSIBLE=0`` (use the copying paths a
discrete device takes). ``torch.compile`` works on mock tensors with its default backend:
Inductor generates C++ kernels that run on the mock's memory, through host copies made by the
runtime when it is not host-accessible (:mod:`accelkit.core.host_codegen`). Importing claims PrivateUse1 for the process: a process that already
registered another PrivateUse1 device gets an error naming it.
"""

from __future__ import annotations

from accelkit.backends.mock_spec import extensions
from accelkit.core import load_extension, register_accelerator
from accelkit.core.compiler import HostKernels
from accelkit.core.device_module import build_device_module

#: The device type (``torch.device("mock:0")``) and the module name (``torch.mock``).
DEVICE_NAME = "mock"
#: The collective library registered for the device.
COLLECTIVE_BACKEND = "mockccl"

_C = load_extension(**extensions()["device"])
if _C.config_error():
    raise ValueError(_C.config_error())

#: The module registered as ``torch.mock``.
device_module = build_device_module(DEVICE_NAME, _C)

from accelkit.backends.mock import mockccl  # noqa: E402  (after the device: mockccl builds on it)

register_accelerator(DEVICE_NAME, device_module, collective_backend=COLLECTIVE_BACKEND,
                     creator=mockccl.create_backend, extended_api=True,
                     inductor=HostKernels(DEVICE_NAME))

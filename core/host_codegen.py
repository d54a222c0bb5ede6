"""Inductor codegen for a device whose kernels can run on the host: Inductor's own C++ kernels
(``CppScheduling``, the code it generates for CPU tensors) called on the device's tensors.

This is what accelkit plugs into the ``inductor=`` seam (:mod:`accelkit.core.compiler`) for
the mock and a freshly generated vendor package: ``inductor=HostKernels("<name>")`` (from
:mod:`accelkit.core.compiler`, which imports this module only when Inductor loads). PyTorch's reference PrivateUse1 backend (OpenReg)
takes the same route.

What a device needs beyond ``CppScheduling`` (torch 2.13; Inductor decides much of its C++
path by ``device.type == "cpu"``):

- :class:`HostScheduling`: Inductor names the codegen of a device type it does not know
  ``config.cuda_backend`` ("triton", ``torch._inductor.utils.get_current_backend``), and its
  CSE then skips the dtype propagation the C++ kernels need (masked loads, indirect indexing
  and atomic scatters fail with ``'str' object has no attribute 'dtype'`` or an
  ``AssertionError`` in ``indirect_assert``); the device's codegen runs with "cpp" instead;
- the scheduler's loop reordering, reindexing and index inversion across fusions
  (``config.loop_ordering_after_fusion``, ``loop_reindexing_after_fusion``,
  ``loop_index_inversion_in_fusion``) are skipped for cpu nodes only and assume Triton's
  groups elsewhere (``TypeError: can't multiply sequence by non-int of type 'tuple'``):
  :func:`host_codegen` turns them off for the process (they only ever apply to GPU nodes);
- a wrapper that calls the C++ kernels: ``PythonWrapperCodegen._generate_kernel_call_helper``
  emits non-Triton kernel calls only for cpu and mps (``RuntimeError: device <name> nyi``);
- allocations on the tensor's own device index: for a device other than cpu/cuda/xpu/mtia the
  wrapper allocates with ``device='<name>'``, i.e. on the *current* device, while the inputs
  may be on another (``device='<name>:<index>'`` here, as CUDA's wrapper does with a guard);
- ``DeviceOpOverrides`` (set_device, synchronize, device guard, raw stream) for the device.

**Device memory the host cannot address** (``torch.<name>.host_accessible()`` is False, the
mock's ``ACCELKIT_MOCK_HOST_ACCESSIBLE=0``), and **asynchronous devices**
(``torch.<name>.is_async()``, whose memory may still be in use by queued work when the host
would run a kernel): every kernel call goes through the runtime
instead (:func:`run_staged`): each device tensor argument's storage is copied to the host (once
per storage, so aliasing is kept), the kernel runs on the copies, and the storages of the
arguments the kernel writes (its non-``const`` pointers) are copied back. Results are those of
the zero-copy path, at the price of two copies per kernel; the choice is made when the
compiled module loads, so one cached module serves both modes.

Importing this module imports Inductor.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from textwrap import dedent
from typing import Any

import torch
from accelkit.core.compiler import InductorCodegen
from torch._inductor import config as inductor_config
from torch._inductor.codegen.common import DeviceOpOverrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.virtualized import V

#: Inductor flags :func:`host_codegen` sets (see the module docstring).
SCHEDULER_FLAGS: dict[str, bool] = {"loop_ordering_after_fusion": False,
                                    "loop_reindexing_after_fusion": False,
                                    "loop_index_inversion_in_fusion": False}


def host_codegen(name: str) -> InductorCodegen:
    """The codegen of device ``name`` (what :class:`accelkit.core.compiler.HostKernels`
    returns when Inductor loads); sets :data:`SCHEDULER_FLAGS` in ``torch._inductor.config``."""
    for flag, value in SCHEDULER_FLAGS.items():
        setattr(inductor_config, flag, value)
    wrapper, _ = wrapper_classes(name)
    return InductorCodegen(scheduling=HostScheduling, wrapper_codegen=wrapper,
                           device_op_overrides=HostDeviceOpOverrides(name),
                           custom_pass=CodegenVersion(name))


def run_staged(kernel: Any, args: tuple, writes: tuple[int, ...]) -> None:
    """Run the C++ ``kernel`` on host copies of its device tensor arguments: one host copy per
    storage (views of one storage stay views of one copy), then copy back the storages of
    the arguments at the positions in ``writes``. Every copy goes through the device's
    runtime (``Tensor.copy_`` between the device and the CPU)."""
    staged: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
    host_args = list(args)
    for i, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor) or arg.device.type == "cpu":
            continue
        storage = arg.untyped_storage()
        key = id(storage) if storage.nbytes() == 0 else storage.data_ptr()
        if key not in staged:
            staged[key] = (storage, storage.cpu())
        host = torch.empty((), dtype=arg.dtype)
        host_args[i] = host.set_(staged[key][1], arg.storage_offset(), arg.size(), arg.stride())
    kernel(*host_args)
    written = {args[i].untyped_storage().data_ptr() for i in writes
               if isinstance(args[i], torch.Tensor) and args[i].device.type != "cpu"
               and args[i].untyped_storage().nbytes() > 0}
    for key in written:
        device_storage, host_storage = staged[key]
        device_storage.copy_(host_storage)


class HostScheduling(CppScheduling):
    """Inductor's C++ kernel codegen, generating with the backend name "cpp" for a device type
    Inductor would otherwise treat as a Triton device (see the module docstring)."""

    def codegen_node(self, node: Any) -> None:
        with inductor_config.patch(cuda_backend="cpp"):
            super().codegen_node(node)

    def codegen_template(self, *args: Any, **kwargs: Any) -> Any:
        with inductor_config.patch(cuda_backend="cpp"):
            return super().codegen_template(*args, **kwargs)

    def flush(self) -> None:
        with inductor_config.patch(cuda_backend="cpp"):
            super().flush()


class HostDeviceOpOverrides(DeviceOpOverrides):
    """The snippets Inductor's Python wrapper writes for device ``name``: they call its device
    module ``torch.<name>``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(f"""
            def {name}(index):
                return torch.{self.name}.current_stream(index).stream_id
            """)

    def set_device(self, device_idx: int) -> str:
        return f"torch.{self.name}.set_device({device_idx})"

    def synchronize(self) -> str:
        return f"torch.{self.name}.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.{self.name}.device({device_idx})"


class CodegenVersion(CustomGraphModulePass):
    """A pass that changes nothing: Inductor keys its FX-graph cache on the ``uuid()`` of a
    device's custom pass, and this one is the hash of this file, so wrapper code cached by
    another version of accelkit is not reused."""

    _SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        return None

    def uuid(self) -> str:
        return f"accelkit-host-kernels-{self.name}-{self._SOURCE}"


def wrapper_classes(name: str) -> tuple[type, type]:
    """The wrapper codegen classes of device ``name`` (main graph, subgraph), made once."""
    if name not in _WRAPPERS:
        _WRAPPERS[name] = _make_wrappers(name)
    return _WRAPPERS[name]


_WRAPPERS: dict[str, tuple[type, type]] = {}


def _make_wrappers(name: str) -> tuple[type, type]:
    zero_copy = f"_{name}_zero_copy"

    class HostKernelCalls:
        """What both wrappers of the device change in PythonWrapperCodegen."""

        _accelkit = True

        def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *,
                                         device: torch.device | None = None,
                                         triton: bool = True, arg_types: Any = None,
                                         **kwargs: Any) -> None:
            device = device or V.graph.get_current_device_or_throw()
            if triton or device.type != name:
                super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                                     triton=triton, arg_types=arg_types,
                                                     **kwargs)
                return
            args = ", ".join(call_args)
            writes = tuple(i for i, t in enumerate(arg_types or ())
                           if isinstance(t, str) and t.endswith("*") and not t.startswith("const "))
            self.writeline(f"{kernel_name}({args}) if {zero_copy} else "
                           f"run_staged({kernel_name}, ({args}{',' if call_args else ''}), {writes!r})")

        def make_allocation(self, buffer_name: str, device: torch.device, dtype: Any,
                            shape: Any, stride: Any, allocation_shape: Any = None,
                            is_pinned: bool = False) -> str:
            line = super().make_allocation(buffer_name, device, dtype, shape, stride,
                                           allocation_shape, is_pinned)
            if device.type == name and device.index is not None:
                line = line.replace(f"device='{name}'", f"device='{name}:{device.index}'", 1)
            return line

    class HostKernelWrapper(HostKernelCalls, PythonWrapperCodegen):
        """Inductor's Python wrapper for device ``name``: C++ kernels on its tensors."""

        @staticmethod
        def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any,
                   partition_signatures: Any = None) -> PythonWrapperCodegen:
            if is_subgraph:
                return HostKernelSubgraphWrapper(subgraph_name, parent_wrapper,
                                                 partition_signatures)
            return HostKernelWrapper()

        def write_header(self) -> None:
            super().write_header()
            self.header.splice(f"""
                from accelkit.core.host_codegen import run_staged
                {zero_copy} = (getattr(torch.{name}, "host_accessible", lambda: False)()
                               and not getattr(torch.{name}, "is_async", lambda: False)())
                """)

    class HostKernelSubgraphWrapper(HostKernelCalls, SubgraphPythonWrapperCodegen):
        """The same, for subgraphs (their code lives in the main wrapper's module)."""

    for cls in (HostKernelWrapper, HostKernelSubgraphWrapper):
        cls.__qualname__ = f"{cls.__name__}[{name}]"
    return HostKernelWrapper, HostKernelSubgraphWrapper

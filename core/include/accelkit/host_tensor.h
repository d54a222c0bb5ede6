// Moving between device tensors and CPU tensors, for native kernels that compute on the host
// (and for accelkit's fallback). Devices whose memory is host memory
// (Runtime::host_accessible) do it without copying: a device tensor seen as a CPU tensor over
// the same bytes (host_view), a CPU kernel's output storage taken over by a device tensor
// (adopt_storage). Other devices copy storages both ways (download / upload_*).
#pragma once

#include <accelkit/context.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

namespace accelkit {

// accelkit's device allocator (c10::GetAllocator(PrivateUse1) once registered).
c10::Allocator* device_allocator();

// Memory on `device` from the allocator.
c10::DataPtr allocate_on(int device, size_t nbytes);

inline bool is_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == kDeviceType;
}

// A CPU tensor over the bytes of device tensor `t` (same sizes, strides, storage offset); its
// storage does not own the memory. Host-accessible runtimes only. With `resizable`, a CPU
// kernel may grow it (then it reallocates from the CPU allocator).
at::Tensor host_view(const at::Tensor& t, bool resizable = false);

// A device storage owning the bytes of CPU storage `cpu` (kept alive with it), counted in the
// allocator statistics of `device`. No copy; host-accessible runtimes only.
c10::Storage adopt_storage(const c10::Storage& cpu, int device);

// A device tensor with the metadata (sizes, strides, offset, conj/neg bits) of `like` over
// device storage `storage`.
at::Tensor device_tensor(c10::Storage storage, const at::Tensor& like);

// A CPU tensor with the metadata of `like` over host storage `host`.
at::Tensor host_tensor(c10::Storage host, const at::Tensor& like);

// A resizable host copy of a device storage's bytes (waits for the work queued before it on
// the current stream), and the way back: copy host bytes over the start of a device storage
// (large enough), or into a new storage on `device` (queued on the current stream).
c10::Storage download_storage(const c10::Storage& storage);
void upload_storage(const c10::Storage& host, c10::StorageImpl* storage);
c10::Storage upload_new_storage(const c10::Storage& host, int device);

// A CPU copy of device tensor `t` (same metadata, its whole storage downloaded).
at::Tensor download(const at::Tensor& t);

// Grow or shrink a device storage to `nbytes`, keeping min(old, new) bytes. Raises the
// allocator's OutOfMemoryError if over capacity.
void resize_bytes(c10::StorageImpl* storage, size_t nbytes);

// The CPU tensor a kernel computes on now, on the host: a view of the same memory when the
// runtime is host-accessible (after the current stream's queued work), else a copy. CPU
// tensors are returned as they are.
at::Tensor to_cpu(const at::Tensor& t);

// A fresh CPU result as a tensor on `device`: adopted (no copy) or copied to the device.
at::Tensor from_cpu(const at::Tensor& t, int device);

}  // namespace accelkit

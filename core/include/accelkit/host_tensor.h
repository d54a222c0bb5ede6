// Moving between device tensors and CPU tensors. Devices whose memory is host memory
// (Runtime::host_accessible) do it without copying: a device tensor seen as a CPU tensor over
// the same bytes (host_view), a CPU kernel's output storage taken over by a device tensor
// (adopt_storage). Other devices copy storages both ways (download / upload). Also storage
// resizing, shared by resize_, set_ and the hooks (issue #4).
#pragma once

#include <accelkit/allocator.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

namespace accelkit {

inline bool is_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == kDeviceType;
}

inline c10::intrusive_ptr<c10::TensorImpl> make_impl(c10::Storage storage,
                                                     c10::DispatchKey key,
                                                     const at::Tensor& like_meta,
                                                     c10::IntArrayRef sizes,
                                                     c10::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   like_meta.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  if (like_meta.is_conj()) impl->_set_conj(true);
  if (like_meta.is_neg()) impl->_set_neg(true);
  return impl;
}

// A CPU tensor over the bytes of device tensor `t` (same sizes, strides, storage offset).
// Its storage does not own the memory. With `resizable`, a CPU kernel may grow it (then it
// reallocates from the CPU allocator; the fallback moves the result back onto `t`).
inline at::Tensor host_view(const at::Tensor& t, bool resizable = false) {
  const c10::Storage& storage = t.storage();
  c10::DataPtr ptr(storage.mutable_data(), c10::Device(c10::DeviceType::CPU));
  auto cpu_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(ptr),
      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
  return at::Tensor(make_impl(c10::Storage(std::move(cpu_storage)), c10::DispatchKey::CPU, t,
                              t.sizes(), t.strides(), t.storage_offset()));
}

// A device storage owning the bytes of CPU storage `cpu` (kept alive through the DataPtr's
// context), counted in the allocator stats of `device`. No copy.
inline c10::Storage adopt_storage(const c10::Storage& cpu, int device) {
  auto owner = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cpu.unsafeGetStorageImpl());
  const size_t nbytes = owner->nbytes();
  auto data = DeviceAllocator::get().adopt(std::move(owner), device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &DeviceAllocator::get(),
      /*resizable=*/true));
}

// A device tensor with the metadata of `cpu_like` over device storage `storage`.
inline at::Tensor device_tensor(c10::Storage storage, const at::Tensor& cpu_like) {
  return at::Tensor(make_impl(std::move(storage), c10::DispatchKey::PrivateUse1, cpu_like,
                              cpu_like.sizes(), cpu_like.strides(), cpu_like.storage_offset()));
}

// Memory on `device` from the allocator (the thread's current device is set meanwhile).
inline c10::DataPtr allocate_on(int device, size_t nbytes) {
  const int saved = current_device();
  thread_current_device() = device;
  try {
    c10::DataPtr data = DeviceAllocator::get().allocate(nbytes);
    thread_current_device() = saved;
    return data;
  } catch (...) {
    thread_current_device() = saved;
    throw;
  }
}

// For runtimes whose memory the CPU cannot touch: a host copy of a device storage's bytes
// (resizable, from the CPU allocator), and the way back.
inline c10::Storage download_storage(const c10::Storage& storage) {
  const size_t nbytes = storage.nbytes();
  c10::Storage host(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(),
                    /*resizable=*/true);
  if (nbytes > 0) {
    runtime().copy(host.mutable_data(), kHost, storage.data(), storage.device().index(), nbytes);
  }
  return host;
}

// Copy host bytes over the start of a device storage (which must be large enough).
inline void upload_storage(const c10::Storage& host, c10::StorageImpl* storage) {
  TORCH_INTERNAL_ASSERT(host.nbytes() <= storage->nbytes());
  if (host.nbytes() > 0) {
    runtime().copy(storage->mutable_data(), storage->device().index(), host.data(), kHost,
                   host.nbytes());
  }
}

// A new device storage on `device` holding a copy of host bytes.
inline c10::Storage upload_new_storage(const c10::Storage& host, int device) {
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), host.nbytes(), allocate_on(device, host.nbytes()),
      &DeviceAllocator::get(), /*resizable=*/true));
  upload_storage(host, storage.unsafeGetStorageImpl());
  return storage;
}

// A CPU tensor with the metadata of `t` over host storage `host`.
inline at::Tensor host_tensor(c10::Storage host, const at::Tensor& t) {
  return at::Tensor(make_impl(std::move(host), c10::DispatchKey::CPU, t, t.sizes(), t.strides(),
                              t.storage_offset()));
}

inline at::Tensor download(const at::Tensor& t) {
  return host_tensor(download_storage(t.storage()), t);
}

// Grow or shrink a device storage to `nbytes`, keeping min(old, new) bytes (storage resize,
// resize_, set_). Raises the allocator's OutOfMemoryError if over capacity.
inline void resize_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const int device = storage->device().has_index() ? storage->device().index()
                                                   : current_device();
  c10::DataPtr fresh = allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr) {
    runtime().copy(fresh.get(), device, storage->data(), device, keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

// The CPU tensor a native kernel computes on: a view of the same memory when the runtime is
// host-accessible, else a host copy.
inline at::Tensor to_cpu(const at::Tensor& t) {
  if (!is_device(t)) return t;
  return runtime().host_accessible() ? host_view(t) : download(t);
}

// A fresh CPU result as a device tensor: adopted (no copy) or copied to the device.
inline at::Tensor from_cpu(const at::Tensor& t, int device) {
  if (!t.defined()) return t;
  c10::Storage storage = runtime().host_accessible() ? adopt_storage(t.storage(), device)
                                                     : upload_new_storage(t.storage(), device);
  return device_tensor(std::move(storage), t);
}

}  // namespace accelkit

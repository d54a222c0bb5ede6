// Device tensors as CPU tensors and back (<accelkit/host_tensor.h>), and storage resizing
// shared by resize_, set_ and the hooks.
#include <accelkit/host_tensor.h>

#include "runtime/allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

namespace accelkit {
namespace {

c10::intrusive_ptr<c10::TensorImpl> make_impl(c10::Storage storage, c10::DispatchKey key,
                                              const at::Tensor& like, c10::IntArrayRef sizes,
                                              c10::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   like.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return impl;
}

}  // namespace

c10::Allocator* device_allocator() { return &DeviceAllocator::get(); }

c10::DataPtr allocate_on(int device, size_t nbytes) {
  const int saved = current_device();
  set_current_device_unchecked(device);
  try {
    c10::DataPtr data = DeviceAllocator::get().allocate(nbytes);
    set_current_device_unchecked(saved);
    return data;
  } catch (...) {
    set_current_device_unchecked(saved);
    throw;
  }
}

at::Tensor host_view(const at::Tensor& t, bool resizable) {
  const c10::Storage& storage = t.storage();
  c10::DataPtr ptr(storage.mutable_data(), c10::Device(c10::DeviceType::CPU));
  auto cpu_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(ptr),
      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
  return at::Tensor(make_impl(c10::Storage(std::move(cpu_storage)), c10::DispatchKey::CPU, t,
                              t.sizes(), t.strides(), t.storage_offset()));
}

c10::Storage adopt_storage(const c10::Storage& cpu, int device) {
  auto owner = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cpu.unsafeGetStorageImpl());
  const size_t nbytes = owner->nbytes();
  auto data = DeviceAllocator::get().adopt(std::move(owner), device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &DeviceAllocator::get(),
      /*resizable=*/true));
}

at::Tensor device_tensor(c10::Storage storage, const at::Tensor& like) {
  return at::Tensor(make_impl(std::move(storage), c10::DispatchKey::PrivateUse1, like,
                              like.sizes(), like.strides(), like.storage_offset()));
}

at::Tensor host_tensor(c10::Storage host, const at::Tensor& like) {
  return at::Tensor(make_impl(std::move(host), c10::DispatchKey::CPU, like, like.sizes(),
                              like.strides(), like.storage_offset()));
}

// Downloads wait for the work queued before them on the current stream (the data must be
// there); uploads are queued on it (the runtime stages the host bytes, which may go at once).
c10::Storage download_storage(const c10::Storage& storage) {
  const size_t nbytes = storage.nbytes();
  c10::Storage host(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(),
                    /*resizable=*/true);
  if (nbytes > 0) {
    const int device = storage.device().index();
    const DriverStream stream = current_stream(device);
    runtime().copy_async(host.mutable_data(), kHost, storage.data(), device, nbytes, device,
                         stream);
    runtime().stream_synchronize(device, stream);
  }
  return host;
}

void upload_storage(const c10::Storage& host, c10::StorageImpl* storage) {
  TORCH_INTERNAL_ASSERT(host.nbytes() <= storage->nbytes());
  if (host.nbytes() > 0) {
    const int device = storage->device().index();
    runtime().copy_async(storage->mutable_data(), device, host.data(), kHost, host.nbytes(),
                         device, current_stream(device));
  }
}

c10::Storage upload_new_storage(const c10::Storage& host, int device) {
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), host.nbytes(), allocate_on(device, host.nbytes()),
      &DeviceAllocator::get(), /*resizable=*/true));
  upload_storage(host, storage.unsafeGetStorageImpl());
  return storage;
}

at::Tensor download(const at::Tensor& t) { return host_tensor(download_storage(t.storage()), t); }

void resize_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const int device =
      storage->device().has_index() ? storage->device().index() : current_device();
  c10::DataPtr fresh = allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr) {
    runtime().copy_async(fresh.get(), device, storage->data(), device, keep, device,
                         current_stream(device));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

at::Tensor to_cpu(const at::Tensor& t) {
  if (!is_device(t)) return t;
  if (!runtime().host_accessible()) return download(t);
  const int device = t.device().index();
  runtime().stream_synchronize(device, current_stream(device));  // queued writers first
  return host_view(t);
}

at::Tensor from_cpu(const at::Tensor& t, int device) {
  if (!t.defined()) return t;
  c10::Storage storage = runtime().host_accessible() ? adopt_storage(t.storage(), device)
                                                     : upload_new_storage(t.storage(), device);
  return device_tensor(std::move(storage), t);
}

}  // namespace accelkit

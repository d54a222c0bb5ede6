// Native kernels every PrivateUse1 device needs (the minimum set of the facts note): tensor
// creation, metadata-only views, resize_/set_, copies between host and device and between
// devices, and reading a scalar. Everything else goes through <accelkit/fallback.h> (issue #4).
#pragma once

#include <accelkit/allocator.h>
#include <accelkit/host_tensor.h>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

namespace accelkit::kernels {

inline at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                      std::optional<at::Layout> layout,
                                      std::optional<at::Device> device,
                                      std::optional<bool> /*pin_memory*/,
                                      std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, device_name(),
              " tensors support only the strided layout, got ", *layout);
  const int index = resolve_index(device.has_value() ? device->index() : -1);
  c10::DeviceGuard guard(c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(index)));
  return at::detail::empty_generic(size, &DeviceAllocator::get(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

inline at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                                std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout,
                                std::optional<at::Device> device,
                                std::optional<bool> /*pin_memory*/) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, device_name(),
              " tensors support only the strided layout, got ", *layout);
  const int index = resolve_index(device.has_value() ? device->index() : -1);
  c10::DeviceGuard guard(c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(index)));
  return at::detail::empty_strided_generic(size, stride, &DeviceAllocator::get(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

inline at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size,
                             c10::IntArrayRef stride, std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

inline at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

inline at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                                c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Make the storage hold at least what sizes/strides/offset of `self` address.
inline void ensure_storage(const at::Tensor& self) {
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.dtype().itemsize(),
      static_cast<size_t>(self.storage_offset()));
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resize_bytes(storage, needed);
}

inline const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                                 std::optional<at::MemoryFormat> memory_format) {
  for (int64_t s : size) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  }
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  // As resize_impl_cpu_: same sizes and no memory format keep the strides (views stay views).
  if (self.sizes() == size && !memory_format.has_value()) return self;
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format ",
                *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  ensure_storage(self);
  return self;
}

inline at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kDeviceType, "set_: expected a ", device_name(),
              " storage, got a storage on ", source.device());
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  impl->set_sizes_and_strides(size, stride, offset);
  ensure_storage(self);
  return self;
}

inline at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  const int64_t size[] = {numel};
  const int64_t stride[] = {1};
  return set_storage_offset(self, std::move(source), 0, size, stride);
}

inline at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

inline at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &DeviceAllocator::get(), true);
  const int64_t size[] = {0};
  const int64_t stride[] = {1};
  return set_storage_offset(self, std::move(empty), 0, size, stride);
}

// copy_ with a device tensor on one side (torch routes every such copy here).
inline at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst,
                            bool /*non_blocking*/) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  if (dst.numel() == 0) return dst;
  if (runtime().host_accessible()) {
    at::Tensor src = is_device(self) ? host_view(self) : self;
    at::Tensor out = is_device(dst) ? host_view(dst) : dst;
    out.copy_(src);
    return dst;
  }
  // Same dtype, same dense layout, no lazy conj/neg: one runtime copy of the bytes.
  if (self.dtype() == dst.dtype() && self.sizes() == dst.sizes() &&
      self.strides() == dst.strides() && self.is_non_overlapping_and_dense() &&
      self.is_conj() == dst.is_conj() && self.is_neg() == dst.is_neg()) {
    const size_t nbytes = static_cast<size_t>(self.numel()) * self.dtype().itemsize();
    runtime().copy(static_cast<char*>(dst.storage().mutable_data()) +
                       dst.storage_offset() * dst.dtype().itemsize(),
                   is_device(dst) ? dst.device().index() : kHost,
                   static_cast<const char*>(self.storage().data()) +
                       self.storage_offset() * self.dtype().itemsize(),
                   is_device(self) ? self.device().index() : kHost, nbytes);
    return dst;
  }
  const at::Tensor src = is_device(self) ? download(self) : self;
  if (!is_device(dst)) {
    const_cast<at::Tensor&>(dst).copy_(src);
    return dst;
  }
  at::Tensor host = download(dst);
  host.copy_(src);
  upload_storage(host.storage(), dst.storage().unsafeGetStorageImpl());
  return dst;
}

inline at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

inline at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (runtime().host_accessible()) return at::_local_scalar_dense(host_view(self));
  at::Tensor one = at::empty({}, self.options().device(c10::DeviceType::CPU));
  runtime().copy(one.data_ptr(), kHost,
                 static_cast<const char*>(self.storage().data()) +
                     self.storage_offset() * self.dtype().itemsize(),
                 self.device().index(), self.dtype().itemsize());
  return at::_local_scalar_dense(one);
}

// Convolutions: torch sends every non-CPU/CUDA backend to the *_overrideable ops, which have
// no CPU kernel to fall back to; run the CPU convolution on host tensors.
inline at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                              c10::IntArrayRef padding, c10::IntArrayRef dilation,
                              bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) host_bias = to_cpu(*bias);
  return from_cpu(at::convolution(to_cpu(input), to_cpu(weight), host_bias, stride, padding,
                                  dilation, transposed, output_padding, groups),
                  input.device().index());
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  const int64_t bias_size[] = {grad_output.size(1)};
  auto [gi, gw, gb] = at::convolution_backward(
      to_cpu(grad_output), to_cpu(input), to_cpu(weight), c10::IntArrayRef(bias_size), stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  const int device = input.device().index();
  return {from_cpu(gi, device), from_cpu(gw, device), from_cpu(gb, device)};
}

}  // namespace accelkit::kernels

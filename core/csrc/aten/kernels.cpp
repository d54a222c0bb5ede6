// Native kernels every PrivateUse1 device needs: tensor creation (zero tensors included),
// metadata-only views, resize_/set_, copies between host and device and between devices, reading a scalar,
// convolutions (torch sends non-CPU/CUDA backends to the *_overrideable ops), and the
// PrivateUse1 hooks torch implements as ops (_has_compatible_shallow_copy_type,
// _fused_sdp_choice). Everything else goes through the fallback (fallback.cpp).
#include <accelkit/fallback.h>
#include <accelkit/host_tensor.h>

#include "runtime/allocator.h"
#include "runtime/events.h"
#include "runtime/registry.h"
#include "testing/faults.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

namespace accelkit {
namespace {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                      std::optional<at::Layout> layout,
                                      std::optional<at::Device> device,
                                      std::optional<bool> /*pin_memory*/,
                                      std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, device_name(),
              " tensors support only the strided layout, got ", *layout);
  const int index = resolve_index(device.has_value() ? device->index() : -1);
  c10::DeviceGuard guard(c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(index)));
  return at::detail::empty_generic(size, device_allocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

// A zero tensor (forward-mode AD's tangent of a constant, torch._efficientzerotensor): no
// memory, the ZeroTensor key set, so ops see zeros through torch's ZeroTensor handling (as
// _efficientzerotensor_cuda, aten/src/ATen/native/TensorFactories.cpp). Through the fallback
// the CPU's zero tensor would be copied from its null data pointer.
at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> /*layout*/,
                                 std::optional<at::Device> device,
                                 std::optional<bool> /*pin_memory*/) {
  const int index = resolve_index(device.has_value() ? device->index() : -1);
  at::native::ZeroTensorAllocator allocator(
      c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(index)));
  return at::detail::empty_generic(
      size, &allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) |
          c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
      c10::dtype_or_default(dtype), std::nullopt);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                                std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout,
                                std::optional<at::Device> device,
                                std::optional<bool> /*pin_memory*/) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, device_name(),
              " tensors support only the strided layout, got ", *layout);
  const int index = resolve_index(device.has_value() ? device->index() : -1);
  c10::DeviceGuard guard(c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(index)));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size,
                             c10::IntArrayRef stride, std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                                c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Make the storage hold at least what sizes/strides/offset of `self` address.
void ensure_storage(const at::Tensor& self) {
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.dtype().itemsize(),
      static_cast<size_t>(self.storage_offset()));
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resize_bytes(storage, needed);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
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

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
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

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  const int64_t size[] = {numel};
  const int64_t stride[] = {1};
  return set_storage_offset(self, std::move(source), 0, size, stride);
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  const int64_t size[] = {0};
  const int64_t stride[] = {1};
  return set_storage_offset(self, std::move(empty), 0, size, stride);
}

#ifdef ACCELKIT_FAULTS
// The copy_strided_as_dense fault: a copy of one dtype and element count between tensors of
// different strides, done as one copy of numel elements from each tensor's first element
// (when both storages hold that many bytes). Returns false where the fault does not apply.
bool copy_as_dense(const at::Tensor& self, const at::Tensor& dst) {
  if (self.dtype() != dst.dtype() || self.numel() != dst.numel() ||
      self.strides() == dst.strides()) {
    return false;
  }
  const size_t item = self.dtype().itemsize();
  const size_t nbytes = static_cast<size_t>(self.numel()) * item;
  auto fits = [&](const at::Tensor& t) {
    return t.storage().nbytes() >= static_cast<size_t>(t.storage_offset()) * item + nbytes;
  };
  if (!fits(self) || !fits(dst)) return false;
  Runtime& rt = runtime();
  const bool from_device = is_device(self), to_device = is_device(dst);
  const int device = to_device ? dst.device().index() : self.device().index();
  const DriverStream stream = current_stream(device);
  rt.copy_async(static_cast<char*>(dst.storage().mutable_data()) + dst.storage_offset() * item,
                to_device ? device : kHost,
                static_cast<const char*>(self.storage().data()) + self.storage_offset() * item,
                from_device ? self.device().index() : kHost, nbytes, device, stream);
  if (!to_device) rt.stream_synchronize(device, stream);
  return true;
}
#endif

// (device, stream) waits, in stream order, for the work queued on (other, other_stream) so far.
void wait_for_stream(int device, DriverStream stream, int other, DriverStream other_stream) {
  if (runtime().async()) mark(other, other_stream)->block(device, stream);
}

// copy_ with a device tensor on one side (torch routes every such copy here). In stream order
// on the current stream of the destination's device (the source's, for a copy to the host):
// a copy to the host waits for it, unless non_blocking into pinned memory (as CUDA). A copy
// between two devices runs on the source device's current stream between a two-way barrier
// with the destination's (as CUDA's copy_device_to_device, aten/src/ATen/native/cuda/
// Copy.cu): it starts after the work queued on either, the destination's stream goes on after
// it, and the source's memory, freed meanwhile, goes back to the stream that still reads it.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  if (dst.numel() == 0) return dst;
  Runtime& rt = runtime();
#ifdef ACCELKIT_FAULTS
  if (faults::active("copy_strided_as_dense") && copy_as_dense(self, dst)) return dst;
#endif
  const bool from_device = is_device(self), to_device = is_device(dst);
  if (rt.host_accessible() && !rt.async()) {  // everything is done: plain host memory
    at::Tensor src = from_device ? host_view(self) : self;
    at::Tensor out = to_device ? host_view(dst) : dst;
    out.copy_(src);
    return dst;
  }
  const bool between = from_device && to_device && self.device() != dst.device();
  const int device = to_device && !between ? dst.device().index() : self.device().index();
  const DriverStream stream = current_stream(device);
  const int target = to_device ? dst.device().index() : device;
  const DriverStream target_stream = current_stream(target);
  if (between) wait_for_stream(device, stream, target, target_stream);
  const auto done = [&] {
    if (between) wait_for_stream(target, target_stream, device, stream);
    return dst;
  };
  // Same dtype, same dense layout, no lazy conj/neg: one runtime copy of the bytes.
  if (self.dtype() == dst.dtype() && self.sizes() == dst.sizes() &&
      self.strides() == dst.strides() && self.is_non_overlapping_and_dense() &&
      self.is_conj() == dst.is_conj() && self.is_neg() == dst.is_neg()) {
    const size_t nbytes = static_cast<size_t>(self.numel()) * self.dtype().itemsize();
    rt.copy_async(static_cast<char*>(dst.storage().mutable_data()) +
                      dst.storage_offset() * dst.dtype().itemsize(),
                  to_device ? dst.device().index() : kHost,
                  static_cast<const char*>(self.storage().data()) +
                      self.storage_offset() * self.dtype().itemsize(),
                  from_device ? self.device().index() : kHost, nbytes, device, stream);
    if (!to_device && !(non_blocking && dst.is_pinned())) rt.stream_synchronize(device, stream);
    return done();
  }
  if (rt.host_accessible()) {  // asynchronous: an elementwise copy on the host, in stream order
    if (!to_device) {
      rt.stream_synchronize(device, stream);
      const_cast<at::Tensor&>(dst).copy_(host_view(self));
      return dst;
    }
    // A CPU source is snapshotted now (the caller may change it). The launch holds views of
    // the device memory only, never the caller's tensors: a block freed meanwhile goes back to
    // its stream's cache, and that stream's later work runs after this copy.
    at::Tensor src = from_device ? host_view(self) : self.clone();
    at::Tensor out = host_view(dst);
    rt.launch(device, stream, "copy_", [src, out]() mutable { out.copy_(src); });
    return done();
  }
  if (rt.async() && to_device && !between) {
    // Discrete memory, asynchronous: a conversion (dtype, strides, conj/neg) is a launch. A CPU
    // source goes up first as it is (copy_async stages it: the caller may reuse it); then
    // copy_ between the two device tensors runs through the fallback, whose task converts host
    // images of both in stream order and writes the destination's back.
    const at::Tensor src = from_device ? self : self.contiguous().to(dst.device());
    at::Tensor out = dst;
    ACCELKIT_FALLBACK(copy_, out, src, non_blocking);
    return dst;
  }
  if (between) rt.stream_synchronize(device, stream);  // the host copies below
  const at::Tensor src = from_device ? download(self) : self;
  if (!to_device) {
    const_cast<at::Tensor&>(dst).copy_(src);
    return dst;
  }
  at::Tensor host = download(dst);
  host.copy_(src);
  upload_storage(host.storage(), dst.storage().unsafeGetStorageImpl());
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// .item(): a copy to the host, so it waits for the current stream.
at::Scalar local_scalar_dense(const at::Tensor& self) {
  Runtime& rt = runtime();
  if (rt.host_accessible() && !rt.async()) return at::_local_scalar_dense(host_view(self));
  at::Tensor one = at::empty({}, self.options().device(c10::DeviceType::CPU));
  const int device = self.device().index();
  const DriverStream stream = current_stream(device);
  rt.copy_async(one.data_ptr(), kHost,
                static_cast<const char*>(self.storage().data()) +
                    self.storage_offset() * self.dtype().itemsize(),
                device, self.dtype().itemsize(), device, stream);
  rt.stream_synchronize(device, stream);
  return at::_local_scalar_dense(one);
}

// Tensor.record_stream(s): the allocator keeps the memory from reuse until `s` has passed the
// point where the tensor is freed.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kDeviceType, "record_stream: expected a ", device_name(),
              " stream, got one of ", stream.device_type());
  if (self.has_storage()) DeviceAllocator::get().recordStream(self.storage().data_ptr(), stream);
}

// Convolutions: torch sends every non-CPU/CUDA backend to the *_overrideable ops, which have
// no CPU kernel to fall back to; they run as aten::convolution / convolution_backward through
// the fallback (whose CPU kernels pick the CPU's convolution), so on an asynchronous device a
// convolution is a launch like any other op, its outputs allocated ahead from the meta kernel.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  return ACCELKIT_FALLBACK(convolution, input, weight, bias, stride, padding, dilation,
                           transposed, output_padding, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  const int64_t bias_size[] = {grad_output.size(1)};
  return ACCELKIT_FALLBACK(convolution_backward, grad_output, input, weight,
                           at::OptionalIntArrayRef(c10::IntArrayRef(bias_size)), stride, padding,
                           dilation, transposed, output_padding, groups, output_mask);
}


// _has_compatible_shallow_copy_type: whether `from`'s data may be swapped into `self`
// (Tensor.data = ..., nn.Module._apply keeping Parameter identity, torch.utils.swap_tensors).
// c10::TensorImpl::has_compatible_shallow_copy_type counts only torch's built-in dense
// backends and names this op as the PrivateUse1 hook; the op's CompositeImplicitAutograd
// kernel never reaches the boxed fallback. As for CUDA: two dense strided tensors of any
// dense backend (CPU, CUDA, ..., PrivateUse1) are compatible; meta, sparse and others are not.
bool dense_strided(const at::Tensor& t) {
  constexpr auto backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
       c10::BackendComponent::MPSBit, c10::BackendComponent::HIPBit,
       c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
       c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  const c10::DispatchKeySet keys = t.key_set();
  return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(backends);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return dense_strided(self) && dense_strided(from);
}

// scaled_dot_product_attention picks its implementation through _fused_sdp_choice_stub, which
// has no PrivateUse1 entry, so it takes the math path; the op _fused_sdp_choice itself would
// reach the CPU kernel through the fallback and answer "flash". Answer what SDPA does.
int64_t fused_sdp_choice(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const std::optional<at::Tensor>&, double, bool, std::optional<double>,
                         bool) {
  return 0;  // sdp::SDPBackend::math
}

}  // namespace

void detail::register_kernels(KernelTable& m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(efficient_zero_tensor));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  m.impl("record_stream", TORCH_FN(record_stream));
  // Ops whose composite kernel is the CPU's implementation itself: it reads tensor memory on
  // the host instead of calling ops that dispatch, so on a PrivateUse1 tensor it would read
  // device memory directly (a crash on discrete memory; values from before the queued
  // producers ran on an asynchronous device). The boxed fallback runs them as the CPU ops they
  // are, in stream order. (grid_sampler takes _grid_sampler_2d_cpu_fallback for devices
  // without a kernel of their own, aten/src/ATen/native/GridSampler.cpp; fbgemm's fp16 linear
  // path calls _saturate_weight_to_fp16, aten/src/ATen/native/QuantizedLinear.cpp.)
  // Ops whose CompositeExplicitAutograd kernel, which a device without its own kernel gets
  // before the fallback, assumes what only CPU and CUDA provide: math_group_norm views its input
  // as contiguous (a channels_last input fails), kaiser_window calls a DispatchStub that has
  // no PrivateUse1 entry (an internal assert), math_native_layer_norm computes a float16 or
  // bfloat16 input's statistics in that dtype (the CPU and CUDA kernels accumulate in float:
  // a layer_norm result a few units in the last place away), the eval-mode batch norms
  // (_native_batch_norm_legit_no_training, _batch_norm_no_update) refuse float32 running
  // statistics beside a float16 input, which the CPU and CUDA kernels take; math_addr computes
  // a float16 outer product in float16 (the CPU and CUDA kernels in float). And the ops with
  // both a CPU kernel and a CompositeImplicitAutograd one, which a device without a kernel
  // gets: math_mish_backward and math_silu_backward compute float16 in float16 (the CPU
  // kernels in float: mish's float16 gradient 3e-3 off), math_channel_shuffle reshapes where
  // the CPU kernel keeps channels_last. The fallback runs them as the CPU ops they are.
  for (const char* name : {"_grid_sampler_2d_cpu_fallback", "_grid_sampler_2d_cpu_fallback.out",
                           "_grid_sampler_2d_cpu_fallback_backward", "_saturate_weight_to_fp16",
                           "native_group_norm", "native_group_norm_backward", "kaiser_window",
                           "kaiser_window.periodic", "kaiser_window.beta", "native_layer_norm",
                           "_native_batch_norm_legit_no_training", "_batch_norm_no_update", "addr",
                           "mish_backward", "silu_backward", "native_channel_shuffle"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

}  // namespace accelkit

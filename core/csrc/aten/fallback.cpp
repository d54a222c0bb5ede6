// The boxed fallback: every aten op without a native kernel for the device.
//
// 1. Device check, as CUDA: all device tensors on one device index; CPU tensors only as 0-dim
//    scalars (or as indices where CUDA accepts CPU indices). Message as CUDA's:
//    "Expected all tensors to be on the same device, but found at least two devices, ...".
// 2. Randomness: a `Generator?` argument (given or None) is replaced by a CPU generator seeded
//    from the device generator's (seed, offset), whose offset then advances by
//    ceil4(numel of the outputs): deterministic in (seed, offset), never touching torch's
//    CPU default generator (torch's own at::native::cpu_fallback draws from it).
// 3. Host-accessible runtimes (zero copy): device tensors are passed to the CPU kernel as CPU
//    tensors over the same memory (host_view); in-place and out= arguments are written in
//    place (an out= argument the kernel resizes is moved back onto the device tensor); fresh
//    outputs are adopted as device tensors without a copy, views of inputs become views of
//    the device inputs, and a returned argument is the argument itself.
//    Other runtimes: the same, over host copies of the arguments' storages (one per distinct
//    storage, so aliasing is kept); every copy the kernel changed is uploaded back, fresh
//    outputs are uploaded to new device storages. Correct for any memory, slower.
// 4. Asynchronous runtimes: the op is one task launched on the current stream, so the call
//    returns before the work, as a device kernel's launch does. The outputs are allocated
//    ahead, with the shapes, strides and dtypes of the op's meta kernel (torch's shape
//    inference); the task holds the arguments (so their memory lives until it ran), runs the
//    CPU kernel over host views of device memory (zero copy) or over host images it copies in
//    and out with the runtime's plain copy (discrete memory: the task runs in stream order, so
//    the bytes are there), and writes each fresh result into its preallocated output. A CPU
//    kernel's error is the stream's asynchronous error. In-place ops and out= arguments queue
//    the same way (an out= argument the op resizes is resized on the host first, to the meta
//    kernel's sizes and strides, as CUDA's structured kernels do); random ops draw from the
//    generator state taken at the call. Ops whose result the host needs at once (non-tensor
//    returns), whose output shapes depend on values (no meta kernel, or one that refuses),
//    that return views of their arguments or create tensors (a device argument) run as in
//    3., after the work queued on the current stream (zero copy: a stream synchronization;
//    copies: the downloads wait).
#include <accelkit/fallback.h>
#include <accelkit/generator.h>
#include <accelkit/host_tensor.h>
#include <accelkit/philox.h>

#include "runtime/registry.h"
#include "testing/faults.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <cstring>
#include <mutex>
#include <string_view>

namespace accelkit {
namespace {

// Ops CUDA runs with CPU index tensors beside device tensors.
bool accepts_cpu_indices(const c10::OperatorName& name) {
  const std::string_view n = name.name;
  return n == "aten::index" || n == "aten::index_put_" || n == "aten::_index_put_impl_" ||
         n == "aten::index_put";
}

template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

// Returns the device index the op runs on (-1 if no device tensor) after checking devices.
int check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         size_t first, size_t count) {
  int index = -1;
  bool cpu_tensor = false;
  const bool cpu_ok = accepts_cpu_indices(op.operator_name());
  for (size_t i = first; i < first + count; ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.device().type() == kDeviceType) {
        const int idx = t.device().index();
        if (index == -1) {
          index = idx;
        } else if (idx != index) {
          TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least "
                      "two devices, ", device_name(), ":", index, " and ", device_name(), ":",
                      idx, "! (in ", op.operator_name(), ")");
        }
      } else if (t.device().is_cpu() && t.dim() > 0) {
        cpu_tensor = true;
      }
    });
  }
  TORCH_CHECK(index == -1 || !cpu_tensor || cpu_ok,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              device_name(), ":", index, " and cpu! (in ", op.operator_name(),
              "; only 0-dim CPU tensors may be mixed with ", device_name(), " tensors)");
  return index;
}

// A device tensor argument and the CPU tensor the kernel gets for it.
struct Wrapped {
  at::Tensor device;     // the caller's device tensor
  at::Tensor host;       // the CPU tensor handed to the kernel
  c10::StorageImpl* host_storage;
  const void* host_data;
  bool mutable_arg;
};

// Copying runtimes: one host copy per distinct device storage (so arguments that alias on the
// device alias on the host), with the bytes as they were before the kernel.
struct Image {
  c10::StorageImpl* device;
  c10::Storage host;
  at::Tensor before;  // snapshot, to find writes the schema does not announce
};

struct Adopted {
  c10::StorageImpl* cpu;
  c10::Storage device;
};

// Small vectors: the fallback runs for every op, heap allocations show in tiny ops.
using Wrappeds = c10::SmallVector<Wrapped, 4>;
using Images = c10::SmallVector<Image, 4>;
using Adopteds = c10::SmallVector<Adopted, 2>;
using StorageList = c10::SmallVector<c10::StorageImpl*, 4>;

struct Context {
  bool zero_copy;  // Runtime::host_accessible(): views of device memory, no copies
  Wrappeds wrapped;
  Images images;
  Adopteds adopted;
  StorageList cpu_args;
};

at::Tensor wrap(const at::Tensor& t, bool is_mutable, Context& ctx) {
  if (!is_device(t)) {
    if (t.defined() && t.has_storage()) ctx.cpu_args.push_back(t.storage().unsafeGetStorageImpl());
    return t;
  }
  at::Tensor host;
  if (ctx.zero_copy) {
    host = host_view(t, is_mutable);
  } else {
    c10::StorageImpl* ds = t.storage().unsafeGetStorageImpl();
    const Image* image = nullptr;
    for (const Image& i : ctx.images) {
      if (i.device == ds) image = &i;
    }
    if (image == nullptr) {
      c10::Storage copy = download_storage(t.storage());
      at::Tensor before = at::empty({static_cast<int64_t>(copy.nbytes())}, at::kByte);
      if (copy.nbytes() > 0) std::memcpy(before.data_ptr(), copy.data(), copy.nbytes());
      ctx.images.push_back({ds, copy, before});
      image = &ctx.images.back();
    }
    host = host_tensor(image->host, t);
  }
  ctx.wrapped.push_back({t, host, host.storage().unsafeGetStorageImpl(), host.storage().data(),
                         is_mutable});
  return host;
}

// A device storage for the bytes of a CPU storage: adopted, or uploaded into a new one.
c10::Storage device_storage_for(const Context& ctx, const c10::Storage& cpu, int device) {
  return ctx.zero_copy ? adopt_storage(cpu, device) : upload_new_storage(cpu, device);
}

// After the kernel, for each argument: a CPU tensor the kernel re-pointed (set_) or whose
// memory it reallocated (resize) moves its storage onto the device tensor; changed metadata
// (an out= argument resized) is copied onto the device tensor.
void sync_argument(const Context& ctx, const Wrapped& w) {
  if (!w.mutable_arg) return;
  const at::Tensor& h = w.host;
  c10::TensorImpl* dev = w.device.unsafeGetTensorImpl();
  const int device = w.device.device().index();
  c10::StorageImpl* hs = h.storage().unsafeGetStorageImpl();
  if (hs != w.host_storage) {
    dev->set_storage_keep_dtype(device_storage_for(ctx, h.storage(), device));
  } else if (ctx.zero_copy && hs->data() != w.host_data) {
    c10::Storage adopted = adopt_storage(h.storage(), device);
    c10::StorageImpl* ds = w.device.storage().unsafeGetStorageImpl();
    ds->set_data_ptr_noswap(std::move(adopted.unsafeGetStorageImpl()->mutable_data_ptr()));
    ds->set_nbytes(adopted.nbytes());
  }
  if (h.sizes() != w.device.sizes() || h.strides() != w.device.strides() ||
      h.storage_offset() != w.device.storage_offset()) {
    dev->set_sizes_and_strides(h.sizes(), h.strides(), h.storage_offset());
  }
}

// Some CPU out= kernels hand their result back by flipping the out tensor's conjugate or
// negative bit (linalg_lu_solve_out with left=False ends in result._set_conj(...)). The
// caller's device tensor keeps its bits (an asynchronous launch cannot change them after the
// call returned), so the kernel's host tensor `h` gets the bits `conj`/`neg` back and its data
// is conjugated or negated in place instead: the same values.
void keep_math_bits(const at::Tensor& h, bool conj, bool neg) {
  if (!h.defined() || (h.is_conj() == conj && h.is_neg() == neg)) return;
  at::Tensor raw = host_tensor(h.storage(), h);
  raw.unsafeGetTensorImpl()->_set_conj(false);
  raw.unsafeGetTensorImpl()->_set_neg(false);
  if (h.is_conj() != conj) raw.conj_physical_();
  if (h.is_neg() != neg) raw.neg_();
  h.unsafeGetTensorImpl()->_set_conj(conj);
  h.unsafeGetTensorImpl()->_set_neg(neg);
}

// Copying runtimes: upload every host copy the kernel wrote (grown if the kernel resized it).
// Bytes are compared with the snapshot, not just the schema's (a!) marks: some CPU kernels
// write arguments their schema does not mark (native_batch_norm's running statistics).
void upload_images(const Context& ctx) {
  for (const Image& image : ctx.images) {
    const c10::StorageImpl* hs = image.host.unsafeGetStorageImpl();
    const size_t n = hs->nbytes();
    const bool changed = n != static_cast<size_t>(image.before.numel()) ||
                         (n > 0 && std::memcmp(hs->data(), image.before.data_ptr(), n) != 0);
    if (!changed) continue;
    if (n > image.device->nbytes()) resize_bytes(image.device, n);
    upload_storage(image.host, image.device);
  }
}

at::Tensor to_device(const at::Tensor& out, int device, Context& ctx) {
  if (!out.defined() || !out.device().is_cpu()) return out;
  if (out.layout() != at::kStrided || out.is_nested()) {  // to_sparse, to_sparse_csr, ...
    return detail::move_layout(out, c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(device)));
  }
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
  for (const Wrapped& w : ctx.wrapped) {
    if (w.host.unsafeGetTensorImpl() == impl) return w.device;  // a returned argument
  }
  for (const Wrapped& w : ctx.wrapped) {
    if (w.host.storage().unsafeGetStorageImpl() == storage) {  // a view of an argument
      return device_tensor(w.device.storage(), out);
    }
  }
  for (const Adopted& a : ctx.adopted) {
    if (a.cpu == storage) return device_tensor(a.device, out);  // shares a fresh output
  }
  for (c10::StorageImpl* cpu_arg : ctx.cpu_args) {
    if (cpu_arg == storage) {  // a CPU argument passed through: copy, never alias it
      return device_tensor(device_storage_for(ctx, out.clone().storage(), device), out);
    }
  }
  ctx.adopted.push_back({storage, device_storage_for(ctx, out.storage(), device)});
  return device_tensor(ctx.adopted.back().device, out);
}

// Replace `Generator?` arguments by a CPU generator derived from the device generator.
struct GeneratorSwap {
  PhiloxGenerator* device_gen = nullptr;
};

void swap_generators(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                            size_t first, int device, GeneratorSwap& swap) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& type = args[i].type();
    const bool is_gen = type->kind() == c10::TypeKind::GeneratorType ||
                        (type->kind() == c10::TypeKind::OptionalType &&
                         type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                             c10::TypeKind::GeneratorType);
    if (!is_gen) continue;
    c10::IValue& v = stack[first + i];
    std::optional<at::Generator> given;
    if (v.isGenerator()) given = v.toGenerator();
    PhiloxGenerator* gen = generator_for(given, device < 0 ? current_device() : device);
    uint64_t seed = 0;
    {
      std::lock_guard<std::mutex> lock(gen->mutex_);
      alignas(16) uint32_t words[4];
      philox::blocks(philox::stream_key(gen->current_seed(), 3), gen->get_offset(), 1, words);
      seed = (static_cast<uint64_t>(words[0]) << 32) | words[1];
    }
    v = c10::IValue(at::make_generator<at::CPUGeneratorImpl>(seed));
    swap.device_gen = gen;
  }
}

void advance(GeneratorSwap& swap, const torch::jit::Stack& stack, size_t first,
                    size_t count) {
  if (swap.device_gen == nullptr) return;
  uint64_t numel = 0;
  for (size_t i = first; i < first + count; ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (t.defined()) numel += static_cast<uint64_t>(t.numel());
    });
  }
  std::lock_guard<std::mutex> lock(swap.device_gen->mutex_);
  swap.device_gen->reserve(numel == 0 ? 1 : numel);
}

// ---- 4. the asynchronous path ------------------------------------------------------------

bool is_generator(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::GeneratorType ||
         (type->kind() == c10::TypeKind::OptionalType &&
          type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
              c10::TypeKind::GeneratorType);
}

// What the meta kernel needs of `t`: sizes, strides and dtype. A wrapped number (a Python
// scalar an op wrapped as a 0-dim CPU double) stays as it is: meta kernels take CPU scalars,
// and as a plain meta tensor it would promote a float32 result to float64.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// Ops whose meta kernel infers other outputs than the CPU kernel returns: native_layer_norm's
// statistics for a float16 or bfloat16 input and the batch norms' (float32 in the meta
// kernels, CUDA's contract; the input's dtype on the CPU; native_batch_norm's are empty in eval
// mode on the CPU); _embedding_bag's offset2bag (empty in the meta kernel, one per bag from the
// CPU kernel). And the ops with a CompositeImplicitAutograd kernel besides their CPU one, which
// reach the fallback only because the layer sends them (kernels.cpp): their meta result is the
// composite's (native_channel_shuffle: contiguous, where the CPU kernel keeps channels_last).
// Their outputs cannot be allocated ahead from the meta kernel, so they run when called.
bool meta_disagrees(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const std::string& name = op.operator_name().name;
  if (name == "aten::native_layer_norm") {
    const auto dtype = stack[first].toTensor().scalar_type();
    if (dtype != at::kFloat && dtype != at::kDouble) return true;
  }
  return name == "aten::native_batch_norm" || name == "aten::_batch_norm_with_update" ||
         name == "aten::_native_batch_norm_legit" || name == "aten::_embedding_bag" ||
         name == "aten::_embedding_bag_forward_only" ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

// True for a list of optional tensors (index's indices); false for lists of scalars.
bool is_optional_tensor_list(const c10::IValue& v) {
  return v.isList() && !v.toListRef().empty() &&
         (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone());
}

// `v` with every tensor replaced by `f(tensor)`.
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (is_optional_tensor_list(v)) {
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        out.push_back(f(e.toTensor()));
      } else {
        out.push_back(std::nullopt);
      }
    }
    return out;
  }
  return v;
}


// The device tensors of the returns, allocated ahead from the meta kernel's outputs; false when
// the op cannot be queued (see 4. above): then nothing was allocated and the stack is as given.
bool plan_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                  int device, torch::jit::Stack& outputs) {
  if (meta_disagrees(op, stack, first)) return false;
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  for (const c10::Argument& r : rets) {
    const auto kind = r.type()->kind();
    if (kind != c10::TypeKind::TensorType && !r.type()->isSubtypeOf(*c10::ListType::ofTensors())) {
      return false;  // the host reads the result at once
    }
    if (r.alias_info() != nullptr && (!r.alias_info()->isWrite() || detail::aliased_argument(schema, r) < 0)) {
      return false;  // a view of an argument
    }
  }
  torch::jit::Stack meta;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> written;  // (device, meta) mutable args
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isDevice()) return false;  // a factory
    if (is_generator(args[i].type())) {
      meta.emplace_back();
      continue;
    }
    meta.push_back(map_tensors(v, [](const at::Tensor& t) { return to_meta(t); }));
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite() && v.isTensor()) {
      written.emplace_back(v.toTensor(), meta.back().toTensor());
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return false;  // no meta kernel, or one that needs the values: the synchronous path says
  }
  if (meta.size() != rets.size()) return false;
  for (const auto& [dev, m] : written) {
    if (dev.defined() && (dev.dtype() != m.dtype() || !is_device(dev) ||
                          (m.layout() != at::kStrided || m.is_nested()))) {
      return false;  // not a device tensor the task can write as the meta kernel says
    }
  }
  // An out= argument the op resizes is resized here, on the host, ahead of the launch, to the
  // sizes and strides the meta kernel gave it (as CUDA's structured kernels resize outputs in
  // set_output before launching; the meta kernel's own resize_output already warned about a
  // non-empty one, as the CPU kernel's call would), the device's resize keeping the old bytes
  // in stream order.
  for (const auto& [dev, m] : written) {
    if (!dev.defined() || (dev.sizes() == m.sizes() && dev.strides() == m.strides())) continue;
    at::Tensor out = dev;
    if (out.sizes() != m.sizes()) out.resize_(m.sizes());
    if (out.strides() != m.strides()) {
      out.resize_(at::IntArrayRef{static_cast<int64_t>(m.storage().nbytes() / m.itemsize())});
      out.as_strided_(m.sizes(), m.strides(), 0);
    }
  }
  const c10::Device where(kDeviceType, static_cast<c10::DeviceIndex>(device));
  for (size_t r = 0; r < rets.size(); ++r) {
    const c10::IValue& v = meta[r];
    const int arg = detail::aliased_argument(schema, rets[r]);
    if (arg >= 0) {
      outputs.push_back(stack[first + arg]);  // the argument itself
    } else if (v.isTensor()) {
      const at::Tensor& m = v.toTensor();
      if (m.defined() && (m.layout() != at::kStrided || m.is_nested())) {
        return false;  // a sparse or nested result (layouts.cpp builds it)
      }
      outputs.push_back(m.defined() ? at::empty_strided(m.sizes(), m.strides(),
                                                        m.options().device(where))
                                    : m);
    } else {
      c10::List<at::Tensor> list;
      for (const at::Tensor& m : v.toTensorList()) {
        list.push_back(at::empty_strided(m.sizes(), m.strides(), m.options().device(where)));
      }
      outputs.push_back(std::move(list));
    }
  }
  return true;
}

// A device tensor as the launch sees it: a CPU tensor over the device memory it has at the
// call (sizes, strides, offset and data pointer taken now, as a kernel launch takes its
// pointers). A later resize_(0) or set_ of the tensor does not change what the task computes
// on; freed meanwhile, the memory goes back to its stream's cache (or, adopted, is released by
// a task on that stream), so it stays valid for the work queued on the stream before. On
// discrete memory it is a CPU tensor in name only: its data pointer is a device pointer, which
// only the runtime's copy reads and writes.
at::Tensor at_launch(const at::Tensor& t) { return is_device(t) ? host_view(t) : t; }

// A task's host image of one piece of discrete device memory, copied in with the runtime's
// plain copy in stream order (the task runs after the work queued before it), and its bytes
// before the kernel ran.
struct TaskImage {
  void* device_data;
  at::Tensor host_bytes;
  at::Tensor before;
};

// The CPU kernel's view of the launch-time tensors: those tensors themselves on
// host-accessible memory (zero copy), else host images of the memory they point to.
struct Task {
  bool zero_copy;
  int device;
  c10::SmallVector<TaskImage, 4> images;

  at::Tensor host(const at::Tensor& view, bool is_device_memory) {
    if (zero_copy || !is_device_memory || !view.defined()) return view;
    void* data = view.storage().mutable_data();
    // One image per device memory block, so arguments that alias on the device alias on the
    // host. Empty storages all have a null pointer and alias nothing: each gets its own (an
    // empty Q beside an empty input made linalg_qr take them for one tensor and assert).
    for (const TaskImage& image : images) {
      if (data != nullptr && image.device_data == data) {
        return host_tensor(image.host_bytes.storage(), view);
      }
    }
    const auto nbytes = static_cast<int64_t>(view.storage().nbytes());
    at::Tensor bytes = at::empty({nbytes}, at::kByte);
    if (nbytes > 0) runtime().copy(bytes.data_ptr(), kHost, data, device, nbytes);
    images.push_back({data, bytes, bytes.clone()});
    return host_tensor(bytes.storage(), view);
  }

  // Discrete: copy back every image the kernel changed (compared with its bytes before: some
  // CPU kernels write arguments their schema does not mark).
  void write_back() {
    for (const TaskImage& image : images) {
      const size_t n = static_cast<size_t>(image.host_bytes.numel());
      if (n == 0 || std::memcmp(image.host_bytes.data_ptr(), image.before.data_ptr(), n) == 0) {
        continue;
      }
      runtime().copy(image.device_data, device, image.host_bytes.data_ptr(), kHost, n);
    }
  }

  // A fresh CPU result into its preallocated device output (`out`: its launch-time view).
  void store(const at::Tensor& out, const at::Tensor& result, const c10::OperatorName& name) {
    if (!out.defined()) return;
    TORCH_CHECK(result.sizes() == out.sizes() && result.scalar_type() == out.scalar_type(), name,
                ": the CPU kernel returned ", result.scalar_type(), " of sizes ", result.sizes(),
                " where its meta kernel inferred ", out.scalar_type(), " of sizes ", out.sizes(),
                " (list the op in meta_disagrees, core/csrc/aten/fallback.cpp)");
    if (zero_copy) {
      out.copy_(result);
      return;
    }
    const auto nbytes = static_cast<int64_t>(out.storage().nbytes());
    at::Tensor bytes = at::empty({nbytes}, at::kByte);
    host_tensor(bytes.storage(), out).copy_(result);
    if (nbytes > 0) {
      runtime().copy(out.storage().mutable_data(), device, bytes.data_ptr(), kHost, nbytes);
    }
  }
};

// For each tensor of `v`: whether it is device memory (CPU arguments are passed as they are).
void device_flags(const c10::IValue& v, std::vector<bool>& flags) {
  for_each_tensor(v, [&](const at::Tensor& t) { flags.push_back(is_device(t)); });
}

// Launch the op as one task on the current stream (4. above); false if it must run now.
bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first,
                  int device) {
  torch::jit::Stack outputs;
  if (!plan_outputs(op, *stack, first, device, outputs)) return false;
  // What the task computes on: the arguments' launch-time views, never the caller's tensors
  // (a kernel holds pointers, not references: memory freed before the task ran goes back to
  // its stream's cache, whose later work runs after the task; another stream's reads need
  // Tensor.record_stream, as on real hardware).
  auto views = std::make_shared<torch::jit::Stack>();
  auto on_device = std::make_shared<std::vector<bool>>();
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    device_flags(v, *on_device);
    views->push_back(map_tensors(v, at_launch));
  }
  auto outs = std::make_shared<torch::jit::Stack>();
  for (const c10::IValue& v : outputs) outs->push_back(map_tensors(v, at_launch));
  const bool zero_copy = runtime().host_accessible();
  // The op's name lives as long as its registration (the process), as `what` must.
  runtime().launch(device, current_stream(device), op.operator_name().name.c_str(),
                   [op, views, on_device, outs, zero_copy, device] {
    Task task{zero_copy, device, {}};
    torch::jit::Stack host;
    host.reserve(views->size());
    size_t k = 0;
    for (const c10::IValue& v : *views) {
      host.push_back(map_tensors(v, [&](const at::Tensor& t) {
        return task.host(t, (*on_device)[k++]);
      }));
    }
    const auto& args = op.schema().arguments();
    c10::SmallVector<std::pair<bool, bool>, 4> bits;  // the out= arguments' bits at launch
    for (size_t i = 0; i < args.size(); ++i) {
      const bool out = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
      const at::Tensor t = out && host[i].isTensor() ? host[i].toTensor() : at::Tensor();
      bits.emplace_back(t.defined() && t.is_conj(), t.defined() && t.is_neg());
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host);
    for (size_t i = 0; i < args.size(); ++i) {
      const bool out = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
      if (out && host[i].isTensor()) keep_math_bits(host[i].toTensor(), bits[i].first, bits[i].second);
    }
    if (!zero_copy) task.write_back();
    const auto& rets = op.schema().returns();
    for (size_t r = 0; r < rets.size(); ++r) {
      if (detail::aliased_argument(op.schema(), rets[r]) >= 0) continue;  // written in place
      const c10::IValue& out = (*outs)[r];
      if (out.isTensor()) {
        task.store(out.toTensor(), host[r].toTensor(), op.operator_name());
      } else {
        const auto list = out.toTensorList();
        const auto results = host[r].toTensorList();
        TORCH_CHECK(list.size() == results.size(), op.operator_name(), ": the CPU kernel returned ",
                    results.size(), " tensors where its meta kernel inferred ", list.size());
        for (size_t i = 0; i < list.size(); ++i) task.store(list[i], results[i], op.operator_name());
      }
    }
  });
  stack->erase(stack->begin() + first, stack->end());
  for (c10::IValue& v : outputs) stack->push_back(std::move(v));
  return true;
}

}  // namespace

int detail::aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  if (ret.alias_info() == nullptr) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() != nullptr &&
        args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Whether any argument is a device tensor.
bool has_device_tensor(const torch::jit::Stack& stack, size_t first) {
  bool any = false;
  for (size_t i = first; i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) { any = any || is_device(t); });
  }
  return any;
}

// A view op: every return aliases an argument without writing it, and no argument is
// written. Its CPU kernel computes metadata only, never reading the memory.
bool is_view(const c10::FunctionSchema& schema) {
  for (const c10::Argument& a : schema.arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return false;
  }
  for (const c10::Argument& r : schema.returns()) {
    if (r.alias_info() == nullptr || r.alias_info()->isWrite() ||
        detail::aliased_argument(schema, r) < 0) {
      return false;
    }
  }
  return !schema.returns().empty();
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t nargs = args.size();
  const size_t first = stack->size() - nargs;
  int device = check_devices(op, *stack, first, nargs);

  // Device arguments (factories): run on the CPU, remember the index.
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isDevice() && v.toDevice().type() == kDeviceType) {
      if (device == -1) device = resolve_index(v.toDevice().index());
      v = c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
  }
  const bool factory = device == -1 || [&] {
    for (size_t i = 0; i < nargs; ++i) {
      if ((*stack)[first + i].isDevice()) return true;
    }
    return false;
  }();
  if (device == -1) device = current_device();
  GeneratorSwap swap;
  swap_generators(schema, *stack, first, device, swap);
  bool launch = runtime().async() && !factory;
#ifdef ACCELKIT_FAULTS
  if (faults::active("fallback_waits")) launch = false;
#endif
  if (launch && launch_async(op, stack, first, device)) {
    advance(swap, *stack, stack->size() - schema.returns().size(), schema.returns().size());
    return;
  }

  Context ctx;
  // A view computes metadata only: over the device memory itself on any runtime (on discrete
  // memory the CPU kernel gets the device pointer, which it never dereferences).
  const bool view = is_view(schema);
  ctx.zero_copy = runtime().host_accessible() || view;
  // The CPU kernel runs now, on the host: on an asynchronous device, after the work queued on
  // the current stream (the copying path's downloads wait for it themselves), unless it reads
  // no device memory: a factory without device tensors, or a view (its result is metadata
  // over the argument's memory, which the queued work may still be writing, as on CUDA).
  if (ctx.zero_copy && runtime().async() && !view && has_device_tensor(*stack, first)) {
    runtime().stream_synchronize(device, current_stream(device));
  }
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[first + i];
    const bool is_mutable = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    if (v.isTensor()) {
      v = c10::IValue(wrap(v.toTensor(), is_mutable, ctx));
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> hosts;
      hosts.reserve(list.size());
      for (const at::Tensor& t : list) hosts.push_back(wrap(t, is_mutable, ctx));
      v = c10::IValue(std::move(hosts));
    } else if (v.isList() && args[i].type()->isSubtypeOf(
                                 *c10::ListType::create(c10::OptionalType::ofTensor()))) {
      c10::List<std::optional<at::Tensor>> hosts;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          hosts.push_back(wrap(e.toTensor(), is_mutable, ctx));
        } else {
          hosts.push_back(std::nullopt);
        }
      }
      v = c10::IValue(std::move(hosts));
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (const Wrapped& w : ctx.wrapped) {
    if (w.mutable_arg) keep_math_bits(w.host, w.device.is_conj(), w.device.is_neg());
  }
  if (!ctx.zero_copy) upload_images(ctx);
  for (const Wrapped& w : ctx.wrapped) sync_argument(ctx, w);
  const size_t nret = schema.returns().size();
  const size_t rfirst = stack->size() - nret;
  for (size_t i = rfirst; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = c10::IValue(to_device(v.toTensor(), device, ctx));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> outs;
      for (const at::Tensor& t : v.toTensorList()) outs.push_back(to_device(t, device, ctx));
      v = c10::IValue(std::move(outs));
    }
  }
  advance(swap, *stack, rfirst, nret);
}

}  // namespace accelkit

// bind_device (<accelkit/python.h>): the functions accelkit.core.device_module builds the
// cuda-like torch.<name> module from.
#include <accelkit/generator.h>
#include <accelkit/python.h>

#include "runtime/allocator.h"
#include "testing/faults.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

namespace accelkit {
namespace {

// CUDA's memory_stats keys ("allocated_bytes.all.current", ...), flat.
pybind11::dict memory_stats_dict(int64_t device) {
  const auto stats = DeviceAllocator::get().getDeviceStats(static_cast<c10::DeviceIndex>(device));
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  pybind11::dict out;
  auto put = [&](const std::string& name, const c10::CachingAllocator::Stat& s) {
    out[pybind11::str(name + ".all.current")] = s.current;
    out[pybind11::str(name + ".all.peak")] = s.peak;
    out[pybind11::str(name + ".all.allocated")] = s.allocated;
    out[pybind11::str(name + ".all.freed")] = s.freed;
  };
  put("allocation", stats.allocation[agg]);
  put("segment", stats.segment[agg]);
  put("active", stats.active[agg]);
  put("allocated_bytes", stats.allocated_bytes[agg]);
  put("reserved_bytes", stats.reserved_bytes[agg]);
  put("active_bytes", stats.active_bytes[agg]);
  put("requested_bytes", stats.requested_bytes[agg]);
  out["num_ooms"] = stats.num_ooms;
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  return out;
}

}  // namespace

void bind_device(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("device_count", [] { return device_count(); });
  m.def("current_device", [] { return current_device(); });
  m.def("set_device", [](int64_t index) { set_current_device(static_cast<int>(index)); });
  m.def("check_device", [](int64_t index) { check_device_index(index); });
  m.def("is_initialized", [] { return initialized(); });
  m.def("init", [] { mark_initialized(); });
  m.def("synchronize", [](int64_t index) { runtime().synchronize(resolve_index(index)); });
  // The runtime's own copy (Runtime::copy), for `accelkit doctor` and the conformance checks
  // that probe it byte for byte: addresses as integers (Tensor.data_ptr()), a device of -1
  // (accelkit::kHost) for host memory. Where device memory is host memory the layer computes on
  // it directly and never calls the runtime's copy: only this reaches it there.
  m.def("runtime_copy", [](int64_t dst, int64_t dst_device, int64_t src, int64_t src_device,
                           int64_t nbytes) {
    TORCH_CHECK(nbytes >= 0, "runtime_copy: nbytes must be >= 0, got ", nbytes);
    for (const int64_t device : {dst_device, src_device}) {
      if (device != kHost) check_device_index(device);
    }
    py::gil_scoped_release release;
    runtime().copy(reinterpret_cast<void*>(dst), static_cast<int>(dst_device),
                   reinterpret_cast<const void*>(src), static_cast<int>(src_device),
                   static_cast<size_t>(nbytes));
  });
  m.def("host_accessible", [] { return runtime().host_accessible(); });
  m.def("is_async", [] { return runtime().async(); });
  m.def("empty_cache", [] { DeviceAllocator::get().emptyCache({0, 0}); });
  m.def("default_generator", [](int64_t index) { return default_generator(index); });
  m.def("memory_stats", &memory_stats_dict);
  m.def("reset_peak_memory_stats", [](int64_t index) {
    DeviceAllocator::get().resetPeakStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("reset_accumulated_memory_stats", [](int64_t index) {
    DeviceAllocator::get().resetAccumulatedStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("mem_get_info", [](int64_t index) {
    return DeviceAllocator::get().getMemoryInfo(static_cast<c10::DeviceIndex>(index));
  });
  m.def("current_stream", [](int64_t index) {
    const c10::Stream s = c10::impl::getDeviceGuardImpl(kDeviceType)
                              ->getStream(c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(
                                                                       resolve_index(index))));
    return py::make_tuple(s.id(), s.device_index(), static_cast<int64_t>(s.device_type()));
  });
  m.def("stream_priority_range", [](int64_t index) {
    const auto [least, greatest] = runtime().stream_priority_range(resolve_index(index));
    return py::make_tuple(least, greatest);
  });
  m.def("external_stream", [](uintptr_t stream, int64_t index) {
    const int device = resolve_index(index);
    return external_stream(device, reinterpret_cast<DriverStream>(stream));
  });
  m.def("set_stream", [](int64_t stream_id, int64_t index) {
    const c10::Stream s(c10::Stream::UNSAFE,
                        c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(
                                                     resolve_index(index))),
                        stream_id);
    c10::impl::getDeviceGuardImpl(kDeviceType)->exchangeStream(s);
  });
#ifdef ACCELKIT_FAULTS
  // A fault build (testing/faults.h): the faults it has, as (name, story) pairs, and the one in effect.
  m.def("_faults", [] {
    py::list out;
    for (const auto& fault : faults::all()) out.append(py::make_tuple(fault.name, fault.story));
    return out;
  });
  m.def("_fault", [] { return faults::current(); });
#endif
}

}  // namespace accelkit

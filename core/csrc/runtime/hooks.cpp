// at::PrivateUse1HooksInterface for the device: what torch.Generator(device=...),
// pin_memory(), storage resize, torch.accelerator and torch._C._get_accelerator() ask of a
// PrivateUse1 backend (each fails with "Please register PrivateUse1HooksInterface" without it).
#include <accelkit/generator.h>
#include <accelkit/host_tensor.h>

#include "runtime/allocator.h"
#include "runtime/registry.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace accelkit {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  void init() const override { mark_initialized(); }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override {
    return initialized();
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(current_device());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = getCurrentDevice();
    if (index >= 0) set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<PhiloxGenerator>(
        static_cast<c10::DeviceIndex>(resolve_index(index)));
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const int index = DeviceAllocator::get().device_of(data);
    TORCH_CHECK(index >= 0, "pointer ", data, " is not ", device_name(), " device memory");
    return {kDeviceType, static_cast<c10::DeviceIndex>(index)};
  }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator::get(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

}  // namespace

void detail::register_hooks() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }

}  // namespace accelkit

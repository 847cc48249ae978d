// The adapter's PrivateUse1 hooks (at::PrivateUse1HooksInterface) and its registrations with PyTorch:
// the device allocator, the hooks, and resizing an emu storage.
#include "adapter.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace emu {

// ------------------------------------------------------------------ storage resize
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "emu: trying to resize storage that is not resizable");
  c10::DeviceIndex device = current_device();
  if (impl->data_ptr().device().has_index() && impl->data_ptr().device().type() == kEmu) {
    device = impl->data_ptr().device().index();
  }
  c10::DeviceGuard guard(c10::Device(kEmu, device));
  // queued copies find their memory through the storage: let them finish before it changes
  // (FSDP frees and re-allocates parameter storage this way between queued copies)
  synchronize_device(device);
  c10::DataPtr fresh = allocator().allocate(new_bytes);
  const size_t old_bytes = impl->nbytes();
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0 && impl->data() != nullptr) {
    allocator().copy_data(fresh.get(), impl->data(), keep);
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

namespace {

// ------------------------------------------------------------------ hooks
struct EmuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = allocator().device_of(data);
    TORCH_CHECK(d >= 0, "emu: pointer ", data, " is not emu device memory");
    return at::Device(kEmu, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_memory_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    check_device(device_index);
    return is_initialized();
  }
  void init() const override { device_count(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    if (device >= 0) set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

struct Registrations {
  Registrations() {
    c10::SetAllocator(kEmu, &allocator());
    at::RegisterPrivateUse1HooksInterface(new EmuHooks());
  }
} registrations;

}  // namespace
}  // namespace emu

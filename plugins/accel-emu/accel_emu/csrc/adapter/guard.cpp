// The adapter's device guard (c10::impl::DeviceGuardImplInterface): current device, streams and events
// as PyTorch's device-generic code asks for them, answered by the driver.
#include "adapter.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <memory>

namespace emu {
namespace {

struct EventHandle {
  std::shared_ptr<Event> event;
};

Event* as_event(void* handle) { return static_cast<EventHandle*>(handle)->event.get(); }

struct EmuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kEmu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kEmu, "emu guard given a ", d.type(), " device");
    auto old = getDevice();
    if (d.has_index() && d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kEmu, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kEmu, "emu guard given a ", d.type(), " device");
    if (d.has_index()) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      if (d.has_index()) set_current_device(d.index());
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return current_stream(d.has_index() ? d.index() : current_device());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    auto idx = d.has_index() ? d.index() : current_device();
    check_device(idx);
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kEmu, idx));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override;
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return new_stream(d.has_index() ? d.index() : current_device());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventHandle*>(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "emu: event device index ", static_cast<int>(device_index),
                " does not match the recording stream's device ", static_cast<int>(stream.device_index()));
    if (*event == nullptr) *event = new EventHandle{std::make_shared<Event>()};
    auto shared = static_cast<EventHandle*>(*event)->event;
    // the stream task keeps the event alive even if Python drops it first
    record_event(shared.get(), stream, flag == c10::EventFlag::BACKEND_DEFAULT);
    stream_queue(stream.device_index(), stream.id()).enqueue([shared] {});
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    auto shared = static_cast<EventHandle*>(event)->event;
    block_on_event(shared.get(), stream);
    stream_queue(stream.device_index(), stream.id()).enqueue([shared] {});
  }
  bool queryEvent(void* event) const override { return event == nullptr || query_event(as_event(event)); }
  bool queryStream(const c10::Stream& s) const override { return stream_queue(s.device_index(), s.id()).query(); }
  void synchronizeStream(const c10::Stream& s) const override {
    stream_queue(s.device_index(), s.id()).synchronize();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) synchronize_event(as_event(event));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize_device(device_index < 0 ? current_device() : device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "emu: both events must be recorded before calculating elapsed time");
    return elapsed_ms(as_event(start), as_event(end));
  }
};

c10::Stream EmuGuardImpl::getStreamFromGlobalPool(c10::Device d, bool) const {
  return pool_stream(d.has_index() ? d.index() : current_device());
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuardImpl);

}  // namespace
}  // namespace emu

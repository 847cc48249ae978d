// torch.profiler's device timing for emu: the PrivateUse1 profiler stubs.
//
// With stubs registered, torch.profiler.profile(activities=[CPU, PrivateUse1]) times every operator on
// the device too (torch's "privateuse1 fallback" profiler state): an event is recorded on the current
// stream when an operator starts and ends, and the difference is its device time. Without them
// torch.profiler records no emu activity at all.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "emu_runtime.h"

namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

emu::Event* as_event(const ProfilerVoidEventStub* stub) {
  return static_cast<emu::Event*>(stub->get());
}

struct EmuProfilerStubs final : public ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = emu::current_device();
    if (device != nullptr) {
      *device = index;
    }
    // the stream's task still refers to the event: its owner waits for it before freeing it
    *event = ProfilerVoidEventStub(new emu::Event(), [](void* raw) {
      auto* ev = static_cast<emu::Event*>(raw);
      emu::synchronize_event(ev);
      delete ev;
    });
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    emu::record_event(as_event(event), emu::current_stream(index), /*timing=*/true);
  }

  // microseconds, as the profiler expects of every device's stubs
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    return static_cast<float>(emu::elapsed_ms(as_event(start), as_event(end)) * 1000.0);
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return true;
  }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = emu::current_device();
    for (c10::DeviceIndex index = 0; index < emu::device_count(); ++index) {
      emu::set_current_device(index);
      op(index);
    }
    emu::set_current_device(previous);
  }

  void synchronize() const override {
    for (c10::DeviceIndex index = 0; index < emu::device_count(); ++index) {
      emu::synchronize_device(index);
    }
  }
};

struct RegisterStubs {
  RegisterStubs() {
    static EmuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};

const RegisterStubs registered;

}  // namespace

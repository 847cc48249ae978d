// DDP's time statistics for emu parameters (forward, backward compute, communication per iteration).
//
// torch's DistributedDataParallel asks TimerRegistry for a timer of the parameters' device type; with
// none registered it warns on every run ("Time stats are currently only collected for CPU and CUDA
// devices") and reports no times. emu computes on the host, so a host timestamp taken once the
// device's current stream has drained is when the device reached the event.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "adapter.h"

namespace c10d {
namespace {

class EmuTimer : public Timer {
 public:
  explicit EmuTimer(c10::Device device) : device_(device.index()) {}

  void record(Event event) override {
    if (device_ >= 0) {
      emu::wait_current_stream(device_);
    }
    getTimeRef(event) = current_time_in_nanos();
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto started = getTimestamp(start);
    auto ended = getTimestamp(end);
    if (!started || !ended) {
      return std::nullopt;
    }
    return *ended - *started;
  }

 private:
  c10::DeviceIndex device_;
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, EmuTimer);

}  // namespace
}  // namespace c10d

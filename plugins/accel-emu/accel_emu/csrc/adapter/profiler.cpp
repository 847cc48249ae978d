// torch's profilers on emu, the two ways a device plugs into them:
//
// * The PrivateUse1 profiler stubs: torch.autograd.profiler.profile(use_device="emu", use_kineto=False)
//   (torch's "privateuse1 fallback" state) records an event on the current stream when an operator
//   starts and ends, and the difference is its device time.
// * A Kineto activity profiler (torch's PrivateUse1ProfilerRegistry): torch.profiler.profile with
//   ProfilerActivity.PrivateUse1 gets emu's device activity as a vendor's profiler library gives it,
//   one kernel per operator the device ran and one memcpy per copy, each on its device and stream
//   and linked to the operator that launched it, so the operator's device time, the trace's device
//   rows and export_chrome_trace show them.
#define USE_KINETO 1
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "adapter.h"

namespace emu {
namespace {

struct Activity {
  bool copy;
  std::string name;
  c10::DeviceIndex device;
  c10::StreamId stream;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
};

std::atomic<bool> g_tracing{false};
std::mutex g_mutex;
std::vector<Activity> g_recorded;  // activities of the running trace
thread_local std::vector<uint64_t> tls_correlation;

}  // namespace

bool activity_tracing() { return g_tracing.load(std::memory_order_relaxed); }

int64_t activity_clock() { return c10::getTime(); }

uint64_t activity_correlation() { return tls_correlation.empty() ? 0 : tls_correlation.back(); }

void record_activity(bool copy, std::string name, c10::DeviceIndex device, c10::StreamId stream, int64_t start_ns,
                     int64_t end_ns, uint64_t correlation) {
  if (!activity_tracing()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recorded.push_back(Activity{copy, std::move(name), device, stream, start_ns, end_ns, correlation});
}

namespace {

// One trace: recording between start() and stop(), handed to Kineto's logger in processTrace().
class EmuTraceSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_recorded.clear();
    }
    g_tracing.store(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    for (c10::DeviceIndex index = 0; index < device_count(); ++index) synchronize_device(index);  // queued copies land
    g_tracing.store(false);
    std::lock_guard<std::mutex> lock(g_mutex);
    activities_.swap(g_recorded);
    g_recorded.clear();
    status_ = libkineto::TraceStatus::READY;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    trace_.reserve(activities_.size());
    for (const auto& a : activities_) {
      auto type = a.copy ? libkineto::ActivityType::GPU_MEMCPY : libkineto::ActivityType::CONCURRENT_KERNEL;
      trace_.emplace_back(span(), type, a.name);
      auto& out = trace_.back();
      out.startTime = a.start_ns;
      out.endTime = a.end_ns;
      out.id = static_cast<int32_t>(a.correlation);
      out.device = a.device;
      out.resource = a.stream;
      out.threadId = static_cast<int32_t>(a.stream);
      out.linked = a.correlation == 0 ? nullptr : linked(static_cast<int32_t>(a.correlation));
    }
    for (const auto& activity : trace_) logger.handleGenericActivity(activity);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "emu", "emu (emulated accelerator)"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { tls_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!tls_correlation.empty()) tls_correlation.pop_back();
  }

 private:
  static const libkineto::TraceSpan& span() {
    static const libkineto::TraceSpan* s = new libkineto::TraceSpan(0, 0, "emu");
    return *s;
  }
  std::vector<Activity> activities_;
  std::vector<libkineto::GenericTraceActivity> trace_;  // what the logger was handed; lives with the session
};

class EmuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    for (auto type : types) {
      if (activities_.count(type)) return std::make_unique<EmuTraceSession>();
    }
    return nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"emu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::GPU_MEMCPY};
};

REGISTER_PRIVATEUSE1_PROFILER(EmuActivityProfiler);

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

Event* as_event(const ProfilerVoidEventStub* stub) {
  return static_cast<Event*>(stub->get());
}

struct EmuProfilerStubs final : public ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) {
      *device = index;
    }
    // the stream's task still refers to the event: its owner waits for it before freeing it
    *event = ProfilerVoidEventStub(new Event(), [](void* raw) {
      auto* ev = static_cast<Event*>(raw);
      synchronize_event(ev);
      delete ev;
    });
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    record_event(as_event(event), current_stream(index), /*timing=*/true);
  }

  // microseconds, as the profiler expects of every device's stubs
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    return static_cast<float>(elapsed_ms(as_event(start), as_event(end)) * 1000.0);
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return true;
  }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = current_device();
    for (c10::DeviceIndex index = 0; index < device_count(); ++index) {
      set_current_device(index);
      op(index);
    }
    set_current_device(previous);
  }

  void synchronize() const override {
    for (c10::DeviceIndex index = 0; index < device_count(); ++index) {
      synchronize_device(index);
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
}  // namespace emu

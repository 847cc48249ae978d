// The extension's Python module (accel_emu's `_C`): the driver's and the adapter's functions torch.emu
// and accel_emu call, and the emu_ccl backend's class (collectives.cpp).
#include "adapter.h"

#include <ATen/core/CachingHostAllocator.h>
#include <torch/extension.h>

#include <algorithm>
#include <string>
#include <vector>

namespace emu {
namespace {

// The flat statistics torch.cuda.memory_stats gives, from the allocator's DeviceStats: every
// counter for all/large_pool/small_pool, the oversize counters and the event counts.
py::dict stats_dict(c10::DeviceIndex device) {
  auto st = allocator().getDeviceStats(device);
  py::dict out;
  auto put_stat = [&](const std::string& base, const c10::CachingAllocator::Stat& s) {
    out[py::str(base + ".current")] = s.current;
    out[py::str(base + ".peak")] = s.peak;
    out[py::str(base + ".allocated")] = s.allocated;
    out[py::str(base + ".freed")] = s.freed;
  };
  using c10::CachingAllocator::StatType;
  const std::pair<const char*, StatType> pools[] = {
      {"all", StatType::AGGREGATE}, {"small_pool", StatType::SMALL_POOL}, {"large_pool", StatType::LARGE_POOL}};
  auto put_array = [&](const char* name, const c10::CachingDeviceAllocator::StatArray& arr) {
    for (const auto& pool : pools) {
      put_stat(std::string(name) + "." + pool.first, arr[static_cast<size_t>(pool.second)]);
    }
  };
  put_array("allocation", st.allocation);
  put_array("segment", st.segment);
  put_array("active", st.active);
  put_array("inactive_split", st.inactive_split);
  put_array("allocated_bytes", st.allocated_bytes);
  put_array("reserved_bytes", st.reserved_bytes);
  put_array("active_bytes", st.active_bytes);
  put_array("inactive_split_bytes", st.inactive_split_bytes);
  put_array("requested_bytes", st.requested_bytes);
  put_stat("oversize_allocations", st.oversize_allocations);
  put_stat("oversize_segments", st.oversize_segments);
  out["num_ooms"] = st.num_ooms;
  out["num_alloc_retries"] = st.num_alloc_retries;
  out["num_sync_all_streams"] = st.num_sync_all_streams;
  out["num_device_alloc"] = st.num_device_alloc;
  out["num_device_free"] = st.num_device_free;
  out["max_split_size"] = st.max_split_size;
  return out;
}

// The flat statistics torch.cuda.host_memory_stats gives, from emu's host (pinned) allocator.
py::dict host_stats_dict() {
  const auto st = at::getHostAllocator(kEmu)->get_stats();
  py::dict out;
  auto put_stat = [&](const std::string& base, const c10::CachingAllocator::Stat& s) {
    out[py::str(base + ".current")] = s.current;
    out[py::str(base + ".peak")] = s.peak;
    out[py::str(base + ".allocated")] = s.allocated;
    out[py::str(base + ".freed")] = s.freed;
  };
  auto put_duration = [&](const std::string& base, const c10::CachingAllocator::DurationStat& d) {
    out[py::str(base + ".total")] = d.total;
    out[py::str(base + ".max")] = d.max;
    out[py::str(base + ".min")] = d.min;
    out[py::str(base + ".count")] = d.count;
    out[py::str(base + ".avg")] = d.count == 0 ? 0 : d.total / d.count;
  };
  put_stat("allocations", st.allocations);
  put_stat("allocated_bytes", st.allocated_bytes);
  put_stat("active_requests", st.active_requests);
  put_stat("active_bytes", st.active_bytes);
  put_duration("host_alloc_time", st.host_alloc_time);
  put_duration("host_free_time", st.host_free_time);
  out["num_host_alloc"] = st.num_host_alloc;
  out["num_host_free"] = st.num_host_free;
  return out;
}

// A gate queued on a stream: work queued after it waits until release(). Lets a test (or a
// user debugging a missing synchronize) hold a stream's queue deterministically.
struct StreamHold {
  std::mutex mutex;
  std::condition_variable cv;
  bool released = false;
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    cv.notify_all();
  }
};

std::shared_ptr<StreamHold> hold_stream(int device, int64_t stream_id) {
  auto hold = std::make_shared<StreamHold>();
  stream_queue(static_cast<c10::DeviceIndex>(device), stream_id).enqueue([hold] {
    std::unique_lock<std::mutex> lock(hold->mutex);
    hold->cv.wait(lock, [&] { return hold->released; });
  });
  return hold;
}

}  // namespace
}  // namespace emu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "emu device runtime (accel_emu)";
  static const std::vector<std::string> host_routed = emu::route_composites_to_host();
  m.def("host_routed_ops", [] { return host_routed; });
  static const bool host_outputs_on_device = emu::install_host_output_allocator();
  m.def("host_outputs_on_device", [] { return host_outputs_on_device; });
  m.def("device_count", [] { return static_cast<int>(emu::device_count()); });
  m.def("physical_index", [](int i) { return emu::physical_index(static_cast<c10::DeviceIndex>(i)); });
  m.def("current_device", [] { return static_cast<int>(emu::current_device()); });
  m.def("set_device", [](int i) { emu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("synchronize", [](int i) {
    py::gil_scoped_release nogil;
    emu::synchronize_device(static_cast<c10::DeviceIndex>(i));
  });
  m.def("capacity", [] { return emu::capacity_bytes(); });
  m.def("protection_enabled", [] { return emu::protection_enabled(); });
  m.def("memory_stats", [](int i) { return emu::stats_dict(static_cast<c10::DeviceIndex>(i)); });
  m.def("reset_peak_memory_stats", [](int i) { emu::allocator().resetPeakStats(static_cast<c10::DeviceIndex>(i)); });
  m.def("reset_accumulated_memory_stats",
        [](int i) { emu::allocator().resetAccumulatedStats(static_cast<c10::DeviceIndex>(i)); });
  m.def("empty_cache", [] { emu::allocator().emptyCache(); });
  m.def("host_memory_stats", [] { return emu::host_stats_dict(); });
  m.def("reset_peak_host_memory_stats", [] { at::getHostAllocator(emu::kEmu)->reset_peak_stats(); });
  m.def("reset_accumulated_host_memory_stats", [] { at::getHostAllocator(emu::kEmu)->reset_accumulated_stats(); });
  // torch.multiprocessing (accel_emu.ipc): the block under an emu tensor's storage made shareable,
  // and a block another process shared mapped here as a byte tensor over the sent storage
  m.def("share_block", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == emu::kEmu && t.has_storage() && t.storage().data() != nullptr,
                "emu: share_block needs an emu tensor with memory");
    const auto [fd, mapped, offset] = emu::allocator().share(t.storage().data());
    return py::make_tuple(fd, mapped, offset);
  });
  m.def("import_shared_block", [](int fd, size_t mapped, size_t offset, size_t nbytes, int device) {
    TORCH_CHECK(offset + nbytes <= mapped, "emu: a shared storage of ", nbytes, " bytes at offset ", offset,
                " does not fit its block of ", mapped, " bytes");
    const auto index = static_cast<c10::DeviceIndex>(device);
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, emu::allocator().import_shared(fd, mapped, offset, index),
                         &emu::allocator(), /*resizable=*/false);
    at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(c10::Device(emu::kEmu, index)));
    bytes.set_(storage, 0, {static_cast<int64_t>(nbytes)}, {1});
    return bytes;
  });
  m.def("mem_get_info", [](int i) { return emu::allocator().getMemoryInfo(static_cast<c10::DeviceIndex>(i)); });
  m.def("default_generator", [](int i) { return emu::default_generator(static_cast<c10::DeviceIndex>(i)); });
  m.def("current_stream_id", [](int i) {
    return static_cast<int64_t>(emu::current_stream(static_cast<c10::DeviceIndex>(i)).id());
  });
  m.def("set_stream", [](int64_t id, int i) {
    emu::exchange_stream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1,
                                     static_cast<c10::DeviceIndex>(i)), id));
  });
  py::class_<emu::StreamHold, std::shared_ptr<emu::StreamHold>>(m, "StreamHold")
      .def("release", &emu::StreamHold::release);
  m.def("hold_stream", &emu::hold_stream, py::arg("device"), py::arg("stream_id"));
  m.def("fallback_calls", [] {
    py::list out;
    for (const auto& c : emu::fallback_calls()) {
      out.append(py::make_tuple(c.op, c.direct ? "direct" : "copying", c.calls));
    }
    return out;
  });
  m.def("reset_fallback_calls", [] { emu::reset_fallback_calls(); });
  m.def("fallback_results_copied", [] { return emu::fallback_results_copied(); });
  // Calls kernel(*args) as a host kernel over emu memory, the way the fallback runs one: after the
  // current stream of each emu tensor's device, with each emu tensor handed over as a host tensor over
  // its block's host window (Inductor's generated C++ kernels read and write tensors through their
  // data pointers, and device addresses are not host-accessible).
  m.def("launch", [](const py::function& kernel, const py::args& args) {
    std::vector<c10::DeviceIndex> waited;
    py::list hosted;
    for (const auto& arg : args) {
      if (!THPVariable_Check(arg.ptr()) || THPVariable_Unpack(arg.ptr()).device().type() != emu::kEmu) {
        hosted.append(arg);
        continue;
      }
      const at::Tensor& t = THPVariable_Unpack(arg.ptr());
      const auto device = t.device().index();
      if (std::find(waited.begin(), waited.end(), device) == waited.end()) {
        py::gil_scoped_release nogil;
        emu::wait_current_stream(device);
        waited.push_back(device);
      }
      hosted.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(emu::host_alias(t))));
    }
    return kernel(*py::tuple(hosted));
  });
  m.def("is_initialized", [] { return emu::is_initialized(); });
  m.def("in_bad_fork", [] { return emu::in_bad_fork(); });

  emu::define_collectives(m);
}

// The adapter's pinned host memory: torch's host allocator for emu, with CUDA's host statistics.
#include "adapter.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace emu {
namespace {

// Page-locked memory is only bookkeeping here: blocks are tracked so `is_pinned()` answers and
// copies from/to them may run asynchronously, as on a real device. It is torch's host allocator
// for the device type (at::getHostAllocator), with the statistics CUDA's pinned allocator keeps;
// it caches nothing, so every request maps a block and every free returns it.
class PinnedAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    void* p = nullptr;
    const auto started = std::chrono::steady_clock::now();
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 4096, nbytes) == 0,
                     "emu: cannot allocate ", nbytes, " bytes of pinned host memory");
    const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ranges_[reinterpret_cast<uintptr_t>(p)] = nbytes;
      const auto bytes = static_cast<int64_t>(nbytes);
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(bytes);
      stats_.active_requests.increase(1);
      stats_.active_bytes.increase(bytes);
      stats_.num_host_alloc += 1;
      stats_.host_alloc_time.increase(took.count());
    }
    return c10::DataPtr(p, p, &PinnedAllocator::deleter, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  // Nothing is cached, so no block waits for a stream before it is reused.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes}) {
      stat->reset_accumulated();
    }
    stats_.host_alloc_time.reset_accumulated();
    stats_.host_free_time.reset_accumulated();
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes}) {
      stat->reset_peak();
    }
    stats_.host_alloc_time.reset_peak();
    stats_.host_free_time.reset_peak();
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto key = reinterpret_cast<uintptr_t>(ptr);
    auto it = ranges_.upper_bound(key);
    if (it == ranges_.begin()) return false;
    --it;
    return key < it->first + it->second;
  }

  static void deleter(void* p);

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> ranges_;
  at::HostStats stats_;
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* a = new PinnedAllocator();
  return *a;
}

void PinnedAllocator::deleter(void* p) {
  auto& self = pinned_allocator();
  const auto started = std::chrono::steady_clock::now();
  size_t nbytes = 0;
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    auto it = self.ranges_.find(reinterpret_cast<uintptr_t>(p));
    if (it != self.ranges_.end()) {
      nbytes = it->second;
      self.ranges_.erase(it);
    }
  }
  std::free(p);
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started);
  std::lock_guard<std::mutex> lock(self.mutex_);
  const auto bytes = static_cast<int64_t>(nbytes);
  self.stats_.allocations.decrease(1);
  self.stats_.allocated_bytes.decrease(bytes);
  self.stats_.active_requests.decrease(1);
  self.stats_.active_bytes.decrease(bytes);
  self.stats_.num_host_free += 1;
  self.stats_.host_free_time.increase(took.count());
}

// torch's host allocator for emu: torch.accelerator.empty_host_cache() and the statistics reach it
struct RegisterHostAllocator {
  RegisterHostAllocator() { at::setHostAllocator(kEmu, &pinned_allocator()); }
};
const RegisterHostAllocator host_allocator_registered;

}  // namespace

c10::Allocator* pinned_memory_allocator() { return &pinned_allocator(); }

bool is_pinned_ptr(const void* ptr) { return pinned_allocator().contains(ptr); }

}  // namespace emu

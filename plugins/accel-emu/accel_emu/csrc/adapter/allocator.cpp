// The adapter's device allocator (PyTorch's c10::DeviceAllocator for emu): it caches freed blocks
// per device, keeps CUDA's statistics, raises torch.OutOfMemoryError past the device's capacity, and
// translates device addresses to the host windows kernels and copies use (host_address). The memory
// itself comes from the driver (../driver/memory.cpp).
#include "adapter.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace emu {

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
constexpr size_t kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
constexpr size_t kSmallPool = static_cast<size_t>(c10::CachingAllocator::StatType::SMALL_POOL);
constexpr size_t kLargePool = static_cast<size_t>(c10::CachingAllocator::StatType::LARGE_POOL);
// Blocks of up to 1 MiB are the small pool, larger ones the large pool (the caching allocator's split).
constexpr size_t kSmallBlock = 1 << 20;

size_t pool_of(size_t mapped) { return mapped <= kSmallBlock ? kSmallPool : kLargePool; }

// A statistic of the whole device and of the block's pool together.
void increase(c10::CachingDeviceAllocator::StatArray& arr, size_t pool, int64_t amount) {
  arr[kAggregate].increase(amount);
  arr[pool].increase(amount);
}

void decrease(c10::CachingDeviceAllocator::StatArray& arr, size_t pool, int64_t amount) {
  arr[kAggregate].decrease(amount);
  arr[pool].decrease(amount);
}

std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

size_t mapping_length(const Block& b) { return b.mapped + b.tail; }

}  // namespace

void EmuAllocator::ensure_init() {
  if (!initialized_) {
    auto n = static_cast<size_t>(device_count());
    cache_.resize(n);
    stats_.resize(n);
    initialized_ = true;
    mark_initialized();
  }
}

bool EmuAllocator::initialized() {
  std::lock_guard<std::mutex> lock(mutex_);
  return initialized_;
}

Block* EmuAllocator::find(const void* ptr) {
  auto key = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(key);
  if (it == blocks_.begin()) return nullptr;
  --it;
  Block& b = it->second;
  if (key < it->first + std::max<size_t>(b.mapped, 1)) return &b;
  return nullptr;
}

Mapping EmuAllocator::map_block(size_t mapped, c10::DeviceIndex device) {
  const Mapping m = map_memory(mapped + kernel_tail_bytes());
  if (m.device == nullptr) return m;
  auto& st = stats_[device];
  increase(st.reserved_bytes, pool_of(mapped), static_cast<int64_t>(mapped));
  increase(st.segment, pool_of(mapped), 1);
  st.num_device_alloc += 1;
  return m;
}

void EmuAllocator::free_cached(c10::DeviceIndex device) {
  auto& cache = cache_[device];
  for (auto& entry : cache) {
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(entry.second));
    unmap_memory({it->second.base, it->second.host}, mapping_length(it->second));
    blocks_.erase(it);
    decrease(stats_[device].reserved_bytes, pool_of(entry.first), static_cast<int64_t>(entry.first));
    decrease(stats_[device].segment, pool_of(entry.first), 1);
    stats_[device].num_device_free += 1;
  }
  cache.clear();
}

c10::DataPtr EmuAllocator::allocate(size_t nbytes) {
  c10::DeviceIndex device = current_device();
  check_device(device);
  c10::Device dev(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) return c10::DataPtr(nullptr, dev);
  const size_t page = page_size();
  const size_t mapped = (nbytes + page - 1) / page * page;
  std::unique_lock<std::mutex> lock(mutex_);
  ensure_init();
  auto& st = stats_[device];
  void* base = nullptr;
  void* host = nullptr;
  auto& cache = cache_[device];
  auto hit = cache.lower_bound(mapped);
  if (hit != cache.end() && hit->first < 2 * mapped && pool_of(hit->first) == pool_of(mapped)) {
    base = hit->second;
    cache.erase(hit);
  } else {
    const uint64_t capacity = capacity_bytes();
    if (static_cast<uint64_t>(st.reserved_bytes[kAggregate].current) + mapped > capacity) {
      free_cached(device);
    }
    if (static_cast<uint64_t>(st.reserved_bytes[kAggregate].current) + mapped <= capacity) {
      const Mapping m = map_block(mapped, device);
      base = m.device;
      host = m.host;
    }
    if (base == nullptr) {
      st.num_ooms += 1;
      lock.unlock();  // the error message reads the statistics copied below
      const auto allocated_now = st.allocated_bytes[kAggregate].current;
      const auto reserved_now = st.reserved_bytes[kAggregate].current;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "emu out of memory. Tried to allocate ",
                       mib(static_cast<double>(nbytes)), " (emu:", static_cast<int>(device), "; ",
                       gib(static_cast<double>(capacity)), " total capacity; ",
                       mib(static_cast<double>(allocated_now)),
                       " already allocated; ", mib(static_cast<double>(reserved_now)),
                       " reserved in total by PyTorch)");
    }
    Block b;
    b.base = base;
    b.host = host;
    b.mapped = mapped;
    b.tail = kernel_tail_bytes();
    b.device = device;
    blocks_[reinterpret_cast<uintptr_t>(base)] = b;
  }
  Block& b = blocks_[reinterpret_cast<uintptr_t>(base)];
  b.requested = nbytes;
  b.live = true;
  const size_t pool = pool_of(b.mapped);
  increase(st.allocation, pool, 1);
  increase(st.active, pool, 1);
  increase(st.allocated_bytes, pool, static_cast<int64_t>(nbytes));
  increase(st.active_bytes, pool, static_cast<int64_t>(nbytes));
  increase(st.requested_bytes, pool, static_cast<int64_t>(nbytes));
  const auto allocated_total = static_cast<size_t>(st.allocated_bytes[kAggregate].current);
  const auto reserved_total = static_cast<size_t>(st.reserved_bytes[kAggregate].current);
  lock.unlock();
  // torch.profiler(profile_memory=True) sees device allocations as it sees CUDA's
  c10::reportMemoryUsageToProfiler(base, static_cast<int64_t>(nbytes), allocated_total, reserved_total, dev);
  return c10::DataPtr(base, base, &EmuAllocator::free_ptr, dev);
}

void EmuAllocator::free_ptr(void* ptr) { allocator().release(ptr); }

void EmuAllocator::release(void* ptr) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end()) return;
  Block& b = it->second;
  if (!b.live) return;
  if (b.imported) {  // another process's memory: only these mappings go
    unmap_memory({b.base, b.host}, mapping_length(b));
    blocks_.erase(it);
    return;
  }
  auto& st = stats_[b.device];
  const size_t pool = pool_of(b.mapped);
  decrease(st.allocation, pool, 1);
  decrease(st.active, pool, 1);
  decrease(st.allocated_bytes, pool, static_cast<int64_t>(b.requested));
  decrease(st.active_bytes, pool, static_cast<int64_t>(b.requested));
  decrease(st.requested_bytes, pool, static_cast<int64_t>(b.requested));
  b.live = false;
  const c10::Device dev(c10::DeviceType::PrivateUse1, b.device);
  const auto freed = static_cast<int64_t>(b.requested);
  if (b.fd >= 0) {
    // shared with other processes, which may still use it: never handed to a new tensor here
    unmap_memory({b.base, b.host}, mapping_length(b));
    ::close(b.fd);
    decrease(st.reserved_bytes, pool, static_cast<int64_t>(b.mapped));
    decrease(st.segment, pool, 1);
    st.num_device_free += 1;
    blocks_.erase(it);
  } else {
    cache_[b.device].emplace(b.mapped, b.base);
  }
  const auto allocated_total = static_cast<size_t>(st.allocated_bytes[kAggregate].current);
  const auto reserved_total = static_cast<size_t>(st.reserved_bytes[kAggregate].current);
  lock.unlock();
  c10::reportMemoryUsageToProfiler(ptr, -freed, allocated_total, reserved_total, dev);
}

c10::DeleterFnPtr EmuAllocator::raw_deleter() const { return &EmuAllocator::free_ptr; }

void EmuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  auto& self = const_cast<EmuAllocator&>(*this);
  std::memcpy(self.host_address(dest), self.host_address(src), count);
}

void* EmuAllocator::host_address(const void* ptr) {
  if (ptr == nullptr || !protection_enabled()) return const_cast<void*>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find(ptr);
  TORCH_CHECK(b != nullptr, "emu: ", ptr, " is not in emu device memory");
  return static_cast<char*>(b->host) + (static_cast<const char*>(ptr) - static_cast<const char*>(b->base));
}

int EmuAllocator::device_of(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find(ptr);
  return b ? b->device : -1;
}

std::tuple<int, size_t, size_t> EmuAllocator::share(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find(ptr);
  TORCH_CHECK(b != nullptr && b->live, "emu: the tensor's memory is not a live emu allocation; it cannot be shared");
  const size_t offset = static_cast<const char*>(ptr) - static_cast<const char*>(b->base);
  if (b->fd >= 0 || b->imported) {
    TORCH_CHECK(!b->imported, "emu: a tensor received from another process cannot be passed on (send the original)");
    return {b->fd, mapping_length(*b), offset};
  }
  // the whole mapping, tail included: the receiver's kernels may read past a tensor's end as well
  const size_t length = mapping_length(*b);
  const int fd = share_memory({b->base, b->host}, length);
  b->fd = fd;
  return {fd, length, offset};
}

c10::DataPtr EmuAllocator::import_shared(int fd, size_t mapped, size_t offset, c10::DeviceIndex device) {
  check_device(device);
  if (offset >= mapped) ::close(fd);
  TORCH_CHECK(offset < mapped, "emu: a shared tensor's offset ", offset, " lies outside its block of ", mapped, " bytes");
  const Mapping m = import_memory(fd, mapped);
  void* base = m.device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_init();
    Block b;
    b.base = base;
    b.host = m.host;
    b.mapped = mapped;
    b.device = device;
    b.live = true;
    b.imported = true;
    blocks_[reinterpret_cast<uintptr_t>(base)] = b;
  }
  void* data = static_cast<char*>(base) + offset;
  return c10::DataPtr(data, base, &EmuAllocator::free_ptr, c10::Device(c10::DeviceType::PrivateUse1, device));
}

void EmuAllocator::emptyCache(c10::MempoolId_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!initialized_) return;
  for (size_t d = 0; d < cache_.size(); ++d) free_cached(static_cast<c10::DeviceIndex>(d));
}

void EmuAllocator::recordStream(const c10::DataPtr&, c10::Stream) {}

DeviceStats EmuAllocator::getDeviceStats(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_init();
  return stats_[device];
}

void EmuAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_init();
  auto& st = stats_[device];
  for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.allocated_bytes, &st.reserved_bytes,
                    &st.active_bytes, &st.requested_bytes}) {
    for (auto& s : *arr) s.reset_accumulated();
  }
  st.num_alloc_retries = 0;
  st.num_ooms = 0;
  st.num_device_alloc = 0;
  st.num_device_free = 0;
}

void EmuAllocator::resetPeakStats(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_init();
  auto& st = stats_[device];
  for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.allocated_bytes, &st.reserved_bytes,
                    &st.active_bytes, &st.requested_bytes}) {
    for (auto& s : *arr) s.reset_peak();
  }
}

std::pair<size_t, size_t> EmuAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_init();
  const uint64_t capacity = capacity_bytes();
  const auto reserved = static_cast<uint64_t>(stats_[device].reserved_bytes[kAggregate].current);
  return {static_cast<size_t>(capacity > reserved ? capacity - reserved : 0), static_cast<size_t>(capacity)};
}

c10::DataPtr EmuAllocator::allocate_host_window(size_t nbytes) {
  c10::DataPtr block = allocate(nbytes);
  void* base = block.get();
  void* host = host_address(base);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    host_windows_[host] = base;
  }
  block.release_context();  // owned by the host DataPtr's deleter from here
  return c10::DataPtr(host, host, &EmuAllocator::free_host_window, c10::Device(c10::DeviceType::CPU));
}

bool EmuAllocator::is_host_window(const c10::DataPtr& ptr) { return ptr.get_deleter() == &EmuAllocator::free_host_window; }

void* EmuAllocator::take_host_window(void* host) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = host_windows_.find(host);
  if (it == host_windows_.end()) return nullptr;
  void* base = it->second;
  host_windows_.erase(it);
  return base;
}

c10::DataPtr EmuAllocator::adopt_host_window(c10::DataPtr&& ptr, c10::DeviceIndex device) {
  TORCH_INTERNAL_ASSERT(is_host_window(ptr));
  void* host = ptr.release_context();
  void* base = take_host_window(host);
  TORCH_INTERNAL_ASSERT(base != nullptr, "emu: ", host, " is not a host window this allocator handed out");
  return c10::DataPtr(base, base, &EmuAllocator::free_ptr, c10::Device(kEmu, device));
}

bool EmuAllocator::release_host_window(void* host) {
  void* base = take_host_window(host);
  if (base == nullptr) return false;
  release(base);
  return true;
}

void EmuAllocator::free_host_window(void* host) { allocator().release_host_window(host); }

EmuAllocator& allocator() {
  static EmuAllocator* a = new EmuAllocator();  // leaked: storages may outlive static destruction
  return *a;
}

void* host_data(const at::Tensor& t) {
  // through the storage's start, which always lies in its block (an empty view may point at its end)
  const void* start = t.storage().data();
  if (start == nullptr) return nullptr;
  const auto offset = static_cast<const char*>(t.data_ptr()) - static_cast<const char*>(start);
  return static_cast<char*>(allocator().host_address(start)) + offset;
}

}  // namespace emu

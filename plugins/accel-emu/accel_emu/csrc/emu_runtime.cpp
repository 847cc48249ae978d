// The emu runtime: configuration, memory, streams, events, generators (see emu_runtime.h).
#include "emu_runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
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

// ------------------------------------------------------------------ configuration
struct Config {
  std::vector<int> visible;  // visible index -> physical index
  uint64_t capacity = 8ull << 30;
  bool protect = true;
  std::string error;  // non-empty: the environment is invalid, every use raises this
};

bool parse_int(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

bool parse_size(const std::string& raw, uint64_t& out) {
  std::string text = trim(raw);
  size_t i = 0;
  while (i < text.size() && (isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  double number = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string unit = trim(text.substr(i));
  for (auto& c : unit) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  double mult;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return false;
  double bytes = number * mult;
  if (!(bytes >= 1)) return false;
  out = static_cast<uint64_t>(bytes);
  return true;
}

Config load_config() {
  Config c;
  long long physical = 2;
  if (const char* v = std::getenv("ACCEL_EMU_DEVICES")) {
    if (!parse_int(trim(v), physical) || physical < 1 || physical > 64) {
      c.error = std::string("ACCEL_EMU_DEVICES must be an integer from 1 to 64, got '") + v + "'";
      return c;
    }
  }
  if (const char* v = std::getenv("EMU_VISIBLE_DEVICES")) {
    std::string list = trim(v);
    std::stringstream ss(list);
    std::string item;
    while (!list.empty() && std::getline(ss, item, ',')) {
      long long idx;
      if (!parse_int(trim(item), idx) || idx < 0 || idx >= physical) {
        c.error = "EMU_VISIBLE_DEVICES='" + list + "': '" + item + "' is not a device index from 0 to " +
                  std::to_string(physical - 1);
        return c;
      }
      for (int seen : c.visible) {
        if (seen == idx) {
          c.error = "EMU_VISIBLE_DEVICES='" + list + "' names device " + std::to_string(idx) + " twice";
          return c;
        }
      }
      c.visible.push_back(static_cast<int>(idx));
    }
  } else {
    for (int i = 0; i < physical; ++i) c.visible.push_back(i);
  }
  if (const char* v = std::getenv("ACCEL_EMU_MEMORY")) {
    if (!parse_size(v, c.capacity)) {
      c.error = std::string("ACCEL_EMU_MEMORY must be a size such as 4GiB or 512MiB, got '") + v + "'";
      return c;
    }
  }
  if (const char* v = std::getenv("ACCEL_EMU_PROTECT")) {
    std::string s = trim(v);
    for (auto& ch : s) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
    if (s == "1" || s == "true" || s == "yes" || s == "on") c.protect = true;
    else if (s == "0" || s == "false" || s == "no" || s == "off") c.protect = false;
    else {
      c.error = std::string("ACCEL_EMU_PROTECT must be 0 or 1, got '") + v + "'";
      return c;
    }
  }
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

const Config& checked_config() {
  const Config& c = config();
  TORCH_CHECK(c.error.empty(), "emu: ", c.error);
  return c;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// Each block is mapped with one more page than it reserves, opened and closed with it. Host kernels
// (Inductor's vectorised C++ kernels) may load a whole vector where a tensor ends a few elements into
// it and use only those elements; on the host's heap the extra bytes are readable, but a block ending
// exactly at a page boundary would be followed by another block's PROT_NONE pages or by none. Real
// allocators hand out memory at a coarser granularity than a tensor's bytes for the same reason.
size_t kernel_tail_bytes() { return page_size(); }

size_t mapping_length(const Block& b) { return b.mapped + b.tail; }

thread_local c10::DeviceIndex tls_device = 0;
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

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

}  // namespace

c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(checked_config().visible.size());
}

int physical_index(c10::DeviceIndex index) {
  check_device(index);
  return config().visible[index];
}

uint64_t capacity_bytes() { return checked_config().capacity; }

bool protection_enabled() { return checked_config().protect; }

void check_device(c10::DeviceIndex index) {
  auto n = device_count();
  TORCH_CHECK(index >= 0 && index < n, "emu: invalid device index ", static_cast<int>(index),
              " (this process sees ", static_cast<int>(n), " emu device(s))");
}

c10::DeviceIndex current_device() { return tls_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  tls_device = index;
}

bool in_bad_fork() { return g_bad_fork.load(); }
bool is_initialized() { return g_initialized.load(); }
void mark_initialized() { g_initialized.store(true); }

// ------------------------------------------------------------------ memory
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

void* EmuAllocator::map_block(size_t mapped, c10::DeviceIndex device, size_t requested) {
  int prot = protection_enabled() ? PROT_NONE : (PROT_READ | PROT_WRITE);
  // MAP_SHARED: each block is its own (shmem) object, so the kernel never merges neighbouring
  // blocks into one mapping. Private anonymous blocks next to each other would be merged while
  // closed and split again by every open, which made mprotect the largest cost of a kernel.
  void* p = mmap(nullptr, mapped + kernel_tail_bytes(), prot, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto& st = stats_[device];
  increase(st.reserved_bytes, pool_of(mapped), static_cast<int64_t>(mapped));
  increase(st.segment, pool_of(mapped), 1);
  st.num_device_alloc += 1;
  (void)requested;
  return p;
}

void EmuAllocator::free_cached(c10::DeviceIndex device) {
  auto& cache = cache_[device];
  for (auto& entry : cache) {
    munmap(entry.second, entry.first + kernel_tail_bytes());
    blocks_.erase(reinterpret_cast<uintptr_t>(entry.second));
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
      base = map_block(mapped, device, nbytes);
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
    b.mapped = mapped;
    b.tail = kernel_tail_bytes();
    b.device = device;
    blocks_[reinterpret_cast<uintptr_t>(base)] = b;
  }
  Block& b = blocks_[reinterpret_cast<uintptr_t>(base)];
  b.requested = nbytes;
  b.live = true;
  b.open_count = 0;
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
  if (b.imported) {  // another process's memory: only this mapping goes
    munmap(b.base, mapping_length(b));
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
  if (b.open_count > 0 && protection_enabled()) mprotect(b.base, mapping_length(b), PROT_NONE);
  b.open_count = 0;
  b.live = false;
  const c10::Device dev(c10::DeviceType::PrivateUse1, b.device);
  const auto freed = static_cast<int64_t>(b.requested);
  if (b.fd >= 0) {
    // shared with other processes, which may still use it: never handed to a new tensor here
    munmap(b.base, mapping_length(b));
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
  self.open(dest);
  self.open(src);
  std::memcpy(dest, src, count);
  self.close(src);
  self.close(dest);
}

void EmuAllocator::open(const void* ptr) {
  if (ptr == nullptr || !protection_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find(ptr);
  if (b == nullptr) return;
  if (b->open_count++ == 0) {
    TORCH_CHECK(mprotect(b->base, mapping_length(*b), PROT_READ | PROT_WRITE) == 0, "emu: mprotect failed: ",
                std::strerror(errno));
  }
}

void EmuAllocator::close(const void* ptr) {
  if (ptr == nullptr || !protection_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = find(ptr);
  if (b == nullptr || b->open_count == 0) return;
  if (--b->open_count == 0) mprotect(b->base, mapping_length(*b), PROT_NONE);
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
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "emu-shared-block", 1u /* MFD_CLOEXEC */));
  TORCH_CHECK(fd >= 0, "emu: cannot create a memory file to share a block: ", std::strerror(errno));
  const bool closed = protection_enabled() && b->open_count == 0;
  // the whole mapping, tail included: the receiver's kernels may read past a tensor's end as well
  const size_t length = mapping_length(*b);
  if (closed) mprotect(b->base, length, PROT_READ);
  size_t written = 0;
  bool ok = ftruncate(fd, static_cast<off_t>(length)) == 0;
  while (ok && written < length) {
    const ssize_t n = pwrite(fd, static_cast<const char*>(b->base) + written, length - written, static_cast<off_t>(written));
    ok = n > 0;
    if (ok) written += static_cast<size_t>(n);
  }
  // the file replaces the anonymous memory at the same address, with the same access rights
  const int prot = closed ? PROT_NONE : (PROT_READ | PROT_WRITE);
  if (ok) ok = mmap(b->base, length, prot, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) != MAP_FAILED;
  if (!ok) {
    const int error = errno;
    if (closed) mprotect(b->base, length, PROT_NONE);
    ::close(fd);
    TORCH_CHECK(false, "emu: cannot move a block onto a memory file to share it: ", std::strerror(error));
  }
  b->fd = fd;
  return {fd, length, offset};
}

c10::DataPtr EmuAllocator::import_shared(int fd, size_t mapped, size_t offset, c10::DeviceIndex device) {
  check_device(device);
  const int prot = protection_enabled() ? PROT_NONE : (PROT_READ | PROT_WRITE);
  void* base = mmap(nullptr, mapped, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping keeps the file
  TORCH_CHECK(base != MAP_FAILED, "emu: cannot map a block shared by another process: ", std::strerror(error));
  TORCH_CHECK(offset < mapped, "emu: a shared tensor's offset ", offset, " lies outside its block of ", mapped, " bytes");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_init();
    Block b;
    b.base = base;
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

EmuAllocator& allocator() {
  static EmuAllocator* a = new EmuAllocator();  // leaked: storages may outlive static destruction
  return *a;
}

MemoryGuard::MemoryGuard(const std::vector<const at::Tensor*>& tensors) {
  for (const auto* t : tensors) add(*t);
}

void MemoryGuard::add(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1) return;
  const void* p = t.storage().data();
  if (p == nullptr) return;
  allocator().open(p);
  opened_.push_back(p);
}

MemoryGuard::~MemoryGuard() {
  for (auto it = opened_.rbegin(); it != opened_.rend(); ++it) allocator().close(*it);
}

// ------------------------------------------------------------------ streams
namespace {

constexpr c10::StreamId kPoolSize = 4;

struct StreamTable {
  std::mutex mutex;
  std::vector<std::vector<StreamQueue*>> per_device;  // leaked on purpose: workers are detached
  std::vector<c10::StreamId> pool_next;
};

StreamTable* g_streams = new StreamTable();

thread_local std::vector<c10::StreamId> tls_current_stream;

c10::StreamId& tls_stream_slot(c10::DeviceIndex device) {
  if (tls_current_stream.size() <= static_cast<size_t>(device)) tls_current_stream.resize(device + 1, 0);
  return tls_current_stream[device];
}

void prepare_device_streams(c10::DeviceIndex device) {
  // g_streams->mutex held
  auto& pd = g_streams->per_device;
  if (pd.size() <= static_cast<size_t>(device)) {
    pd.resize(device + 1);
    g_streams->pool_next.resize(device + 1, 0);
  }
  auto& list = pd[device];
  while (list.size() < static_cast<size_t>(kPoolSize + 1)) {
    list.push_back(new StreamQueue(device, static_cast<c10::StreamId>(list.size())));
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StreamQueue::~StreamQueue() = default;

void StreamQueue::enqueue(std::function<void()> task) {
  std::vector<std::function<void()>> done;
  std::unique_lock<std::mutex> lock(mutex_);
  done.swap(retired_);
  if (!started_) {
    started_ = true;
    mark_initialized();
    std::thread t([this] { run(); });
    t.detach();
  }
  tasks_.push_back(std::move(task));
  cv_.notify_all();
}

void StreamQueue::run() {
  tls_device = device_;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (stop_) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    running_ = 1;
    lock.unlock();
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> relock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    retired_.push_back(std::move(task));
    running_ = 0;
    cv_.notify_all();
  }
}

void StreamQueue::synchronize() {
  std::vector<std::function<void()>> done;
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return tasks_.empty() && running_ == 0; });
  done.swap(retired_);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool StreamQueue::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.empty() && running_ == 0;
}

void StreamQueue::reset_after_fork() {
  // the worker thread does not exist in the child; the old mutex may be held by it
  new (&mutex_) std::mutex();
  new (&cv_) std::condition_variable();
  tasks_.clear();
  retired_.clear();
  running_ = 0;
  started_ = false;
  stop_ = false;
}

StreamQueue& stream_queue(c10::DeviceIndex device, c10::StreamId id) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams->mutex);
  prepare_device_streams(device);
  auto& list = g_streams->per_device[device];
  TORCH_CHECK(id >= 0 && static_cast<size_t>(id) < list.size(), "emu: unknown stream id ", id, " on emu:",
              static_cast<int>(device));
  return *list[id];
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_device(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
                     tls_stream_slot(device));
}

c10::Stream exchange_stream(c10::Stream s) {
  auto old = current_stream(s.device_index());
  stream_queue(s.device_index(), s.id());  // validates
  tls_stream_slot(s.device_index()) = s.id();
  return old;
}

c10::Stream new_stream(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams->mutex);
  prepare_device_streams(device);
  auto& list = g_streams->per_device[device];
  auto id = static_cast<c10::StreamId>(list.size());
  list.push_back(new StreamQueue(device, id));
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

c10::Stream pool_stream(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams->mutex);
  prepare_device_streams(device);
  auto& next = g_streams->pool_next[device];
  auto id = static_cast<c10::StreamId>(1 + (next++ % kPoolSize));
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

void synchronize_device(c10::DeviceIndex device) {
  check_device(device);
  std::vector<StreamQueue*> list;
  {
    std::lock_guard<std::mutex> lock(g_streams->mutex);
    prepare_device_streams(device);
    list = g_streams->per_device[device];
  }
  for (auto* q : list) q->synchronize();
}

void wait_current_stream(c10::DeviceIndex device) {
  stream_queue(device, tls_stream_slot(device)).synchronize();
}

// ------------------------------------------------------------------ events
void record_event(Event* ev, const c10::Stream& s, bool timing) {
  StreamQueue& queue = stream_queue(s.device_index(), s.id());
  // an idle stream reaches the event now: no round trip through its worker thread (the profiler
  // records two events per operator)
  const bool idle = queue.query();
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    TORCH_CHECK(ev->device < 0 || ev->device == s.device_index(), "emu: event recorded on emu:",
                static_cast<int>(ev->device), " cannot be recorded on a stream of emu:",
                static_cast<int>(s.device_index()));
    ev->recorded = true;
    ev->device = s.device_index();
    ev->timing = ev->timing || timing;
    gen = ++ev->generation;
    if (idle) {
      ev->time_ns = now_ns();
      ev->completed = true;
      ev->cv.notify_all();
      return;
    }
    ev->completed = false;
  }
  queue.enqueue([ev, gen] {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (ev->generation == gen) {
      ev->time_ns = now_ns();
      ev->completed = true;
    }
    ev->cv.notify_all();
  });
}

void block_on_event(Event* ev, const c10::Stream& s) {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (!ev->recorded) return;
    gen = ev->generation;
  }
  stream_queue(s.device_index(), s.id()).enqueue([ev, gen] {
    std::unique_lock<std::mutex> lock(ev->mutex);
    ev->cv.wait(lock, [&] { return ev->completed || ev->generation != gen; });
  });
}

bool query_event(Event* ev) {
  std::lock_guard<std::mutex> lock(ev->mutex);
  return !ev->recorded || ev->completed;
}

void synchronize_event(Event* ev) {
  std::unique_lock<std::mutex> lock(ev->mutex);
  if (!ev->recorded) return;
  ev->cv.wait(lock, [&] { return ev->completed; });
}

double elapsed_ms(Event* start, Event* end) {
  TORCH_CHECK(start->recorded && end->recorded,
              "emu: both events must be recorded before calculating elapsed time");
  TORCH_CHECK(start->timing && end->timing,
              "emu: both events must be created with enable_timing=True to measure elapsed time");
  synchronize_event(start);
  synchronize_event(end);
  std::lock_guard<std::mutex> l1(start->mutex);
  return static_cast<double>(end->time_ns - start->time_ns) / 1e6;
}

// ------------------------------------------------------------------ generators
namespace {

// A device generator: its numbers come from a host Mersenne Twister (the kernels run on the host),
// but it belongs to one emu device, so seeding emu never touches the CPU generator and vice versa.
class EmuGenerator final : public c10::GeneratorImpl {
 public:
  EmuGenerator(c10::DeviceIndex device, at::Generator host)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  const at::Generator& host() const { return host_; }

 private:
  EmuGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return new EmuGenerator(device_.index(), host_.clone());
  }
  mutable at::Generator host_;
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  static std::once_flag once;
  static std::vector<at::Generator>* gens = nullptr;
  std::call_once(once, [] {
    gens = new std::vector<at::Generator>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      gens->push_back(at::make_generator<EmuGenerator>(d, at::detail::createCPUGenerator()));
    }
  });
  return (*gens)[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  return at::make_generator<EmuGenerator>(device, at::detail::createCPUGenerator());
}

at::Generator host_generator_of(const at::Generator& emu_gen) {
  auto* impl = dynamic_cast<EmuGenerator*>(emu_gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'emu' device type for generator but found '",
              emu_gen.device().type() == c10::DeviceType::PrivateUse1 ? std::string("emu")
                                                                       : c10::DeviceTypeName(emu_gen.device().type(), true),
              "'");
  return impl->host();
}

// ------------------------------------------------------------------ fork
namespace {

void after_fork_child() {
  if (g_initialized.load()) g_bad_fork.store(true);
  for (auto& list : g_streams->per_device) {
    for (auto* q : list) q->reset_after_fork();
  }
  new (&g_streams->mutex) std::mutex();
}

struct ForkHandlerInstaller {
  ForkHandlerInstaller() { pthread_atfork(nullptr, nullptr, &after_fork_child); }
} fork_handler_installer;

}  // namespace

}  // namespace emu

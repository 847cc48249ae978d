// The emu "driver": device memory, devices, streams, events and generators.
//
// A vendor's runtime library would sit here; emu implements one on the host so that the
// PyTorch integration around it (allocator, guard, hooks, kernels) is exercised exactly as it
// would be for a real accelerator. Device memory is host memory mapped without access rights;
// it is opened (read/write) only while a kernel or a copy runs on it.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace emu {

// ------------------------------------------------------------------ configuration
// Number of devices this process sees (after EMU_VISIBLE_DEVICES).
c10::DeviceIndex device_count();
// Physical index of a visible device (EMU_VISIBLE_DEVICES remaps like CUDA_VISIBLE_DEVICES).
int physical_index(c10::DeviceIndex index);
// Capacity of one device in bytes (ACCEL_EMU_MEMORY).
uint64_t capacity_bytes();
// True when device memory is mapped PROT_NONE outside kernels and copies (ACCEL_EMU_PROTECT).
bool protection_enabled();
void check_device(c10::DeviceIndex index);

// ------------------------------------------------------------------ current device
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

// ------------------------------------------------------------------ memory
struct Block {
  void* base = nullptr;
  size_t requested = 0;  // bytes asked for
  size_t mapped = 0;     // bytes reserved for it (page-rounded), what the statistics count
  size_t tail = 0;       // bytes mapped after those (see kernel_tail_bytes); the mapping is mapped + tail
  c10::DeviceIndex device = 0;
  int open_count = 0;    // >0 while a kernel or copy has it open
  bool live = false;     // false while parked in the cache
  int fd = -1;           // the memory file behind a block shared with other processes (else -1)
  bool imported = false; // mapped from another process's shared block (not this allocator's memory)
};

class EmuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Opens (read/write) or closes (no access) the block holding `ptr`; reference counted, so
  // nested and concurrent users (autograd thread, stream workers) are safe.
  void open(const void* ptr);
  void close(const void* ptr);
  // Device of a pointer into emu memory, or -1.
  int device_of(const void* ptr);
  // Makes the block holding `ptr` shareable with other processes (moved, at the same address, onto a
  // memory file); returns that file's descriptor (owned by the allocator), the block's size and
  // where `ptr` lies in it. A shared block is unmapped when freed instead of cached.
  std::tuple<int, size_t, size_t> share(const void* ptr);
  // Maps a block another process shared (takes `fd`) as memory of `device`; freed by unmapping.
  c10::DataPtr import_shared(int fd, size_t mapped, size_t offset, c10::DeviceIndex device);

  static void free_ptr(void* ptr);

 private:
  void release(void* ptr);
  void* map_block(size_t mapped, c10::DeviceIndex device, size_t requested);
  void free_cached(c10::DeviceIndex device);  // unmaps cached blocks of `device`
  Block* find(const void* ptr);               // the block containing ptr (mutex held)

  std::mutex mutex_;
  std::map<uintptr_t, Block> blocks_;                               // by base address
  std::vector<std::multimap<size_t, void*>> cache_;                 // per device: mapped size -> base
  std::vector<c10::CachingDeviceAllocator::DeviceStats> stats_;     // per device
  bool initialized_ = false;
  void ensure_init();
};

EmuAllocator& allocator();

// Holds device memory of the given tensors open for the guard's lifetime.
class MemoryGuard {
 public:
  MemoryGuard() = default;
  explicit MemoryGuard(const std::vector<const at::Tensor*>& tensors);
  void add(const at::Tensor& t);
  ~MemoryGuard();
  MemoryGuard(const MemoryGuard&) = delete;
  MemoryGuard& operator=(const MemoryGuard&) = delete;

 private:
  std::vector<const void*> opened_;
};

// ------------------------------------------------------------------ streams and events
struct Event {
  std::mutex mutex;
  std::condition_variable cv;
  bool recorded = false;
  bool completed = true;
  uint64_t generation = 0;
  int64_t time_ns = 0;
  c10::DeviceIndex device = -1;
  bool timing = false;
};

class StreamQueue {
 public:
  StreamQueue(c10::DeviceIndex device, c10::StreamId id) : device_(device), id_(id) {}
  ~StreamQueue();
  void enqueue(std::function<void()> task);
  void synchronize();  // waits until every queued task ran; rethrows a task's error
  bool query();
  c10::StreamId id() const { return id_; }
  c10::DeviceIndex device() const { return device_; }
  void reset_after_fork();

 private:
  void run();
  c10::DeviceIndex device_;
  c10::StreamId id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  // Finished tasks, destroyed later by a caller of synchronize()/enqueue() rather than by the
  // worker: a task's captures may hold the last reference to a tensor with a Python object,
  // whose release needs the GIL, which a thread waiting for this stream may hold.
  std::vector<std::function<void()>> retired_;
  size_t running_ = 0;
  bool stop_ = false;
  std::thread worker_;
  bool started_ = false;
  std::exception_ptr error_;
};

StreamQueue& stream_queue(c10::DeviceIndex device, c10::StreamId id);
c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream exchange_stream(c10::Stream s);
c10::Stream new_stream(c10::DeviceIndex device);
// A stream from the per-device pool (round robin), as getStreamFromGlobalPool hands out.
c10::Stream pool_stream(c10::DeviceIndex device);
void synchronize_device(c10::DeviceIndex device);
// Waits for the current stream of `device` (work queued before a synchronous kernel).
void wait_current_stream(c10::DeviceIndex device);

void record_event(Event* ev, const c10::Stream& s, bool timing);
void block_on_event(Event* ev, const c10::Stream& s);
bool query_event(Event* ev);
void synchronize_event(Event* ev);
double elapsed_ms(Event* start, Event* end);

// ------------------------------------------------------------------ generators
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The host (CPU) generator that draws numbers for an emu generator.
at::Generator host_generator_of(const at::Generator& emu_gen);

// ------------------------------------------------------------------ host fallback statistics
// Operators that ran through the host fallback since the last reset: name, whether they took the
// direct path (host aliases of device memory) or the copying one, and how many calls.
struct FallbackCount {
  std::string op;
  bool direct;
  uint64_t calls;
};
std::vector<FallbackCount> fallback_calls();
void reset_fallback_calls();
// Registers the host fallback as emu's kernel for operators whose host kernel a composite would
// otherwise bypass on emu (once, when the module loads); returns their names.
std::vector<std::string> route_composites_to_host();

// ------------------------------------------------------------------ profiler activity (emu_profiler.cpp)
// While torch.profiler traces emu's activity, kernels and copies the device runs are recorded with
// their times (activity_clock), device, stream and the correlation id of the operator that launched
// them (activity_correlation, on the launching thread). activity_tracing() is one atomic load.
bool activity_tracing();
int64_t activity_clock();
uint64_t activity_correlation();
void record_activity(bool copy, std::string name, c10::DeviceIndex device, c10::StreamId stream, int64_t start_ns,
                     int64_t end_ns, uint64_t correlation);

// ------------------------------------------------------------------ process state
bool in_bad_fork();
bool is_initialized();
void mark_initialized();

}  // namespace emu

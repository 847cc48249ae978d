// The emu "driver": the runtime a vendor's device library provides, simulated on the host.
//
// Everything PyTorch-facing (the allocator PyTorch calls, the device guard, hooks, kernels) lives in
// ../adapter and reaches the device only through this header. A vendor keeps the adapter's shape and
// replaces these functions with calls into its own runtime (see the plug-in README's Layout).
//
// Device memory is host memory mapped twice: at its device address without access rights (what tensors
// hold, so host code that dereferences a device pointer faults as on a discrete device), and at a host
// window only the adapter's kernels and copies use (a device's own view of its memory).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <ATen/core/Generator.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace emu {

// ------------------------------------------------------------------ devices and configuration (devices.cpp)
// Number of devices this process sees (after EMU_VISIBLE_DEVICES).
c10::DeviceIndex device_count();
// Physical index of a visible device (EMU_VISIBLE_DEVICES remaps like CUDA_VISIBLE_DEVICES).
int physical_index(c10::DeviceIndex index);
// Capacity of one device in bytes (ACCEL_EMU_MEMORY).
uint64_t capacity_bytes();
// True when device addresses are mapped PROT_NONE and kernels reach memory through host windows
// (ACCEL_EMU_PROTECT); false: device addresses are readable and are their own windows.
bool protection_enabled();
void check_device(c10::DeviceIndex index);
// The calling thread's current device.
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// Process state: whether the device was used, and whether this is a child forked after that.
bool in_bad_fork();
bool is_initialized();
void mark_initialized();
// Called in a forked child: marks it a bad fork when the parent had used the device.
void note_forked_child();

// ------------------------------------------------------------------ device memory (memory.cpp)
// The granularity of device memory: reservations are multiples of it.
size_t page_size();
// Bytes mapped after every block, beyond what it reserves (see memory.cpp for why).
size_t kernel_tail_bytes();
// A block of device memory: its device address and the host window the device's kernels reach it
// through (the same address while protection is off).
struct Mapping {
  void* device = nullptr;
  void* host = nullptr;
};
// Maps `length` bytes of device memory (device address without access while protection is on, and
// its host window); {nullptr, nullptr} when the host refuses.
Mapping map_memory(size_t length);
void unmap_memory(const Mapping& m, size_t length);
// Moves both mappings of a block, at the same addresses, onto a memory file another process can
// map; returns the file's descriptor.
int share_memory(const Mapping& m, size_t length);
// Maps a memory file another process shared (takes ownership of `fd`).
Mapping import_memory(int fd, size_t length);

// ------------------------------------------------------------------ streams and events (streams.cpp)
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
  // Runs `task` on the calling thread when nothing is queued or running on this stream (the stream is
  // busy with it meanwhile: the worker and synchronize() wait for it); false, without running it,
  // when the stream has work of its own.
  bool run_now_if_idle(const std::function<void()>& task);
  // Waits until every task queued (or run by its caller) before the call has run, not for tasks other
  // threads queue meanwhile, as a device's stream synchronize does; rethrows a task's error.
  void synchronize();
  bool query();
  c10::StreamId id() const { return id_; }
  c10::DeviceIndex device() const { return device_; }
  void reset_after_fork();

 private:
  void run();
  // mutex_ held: nothing queued, running, unreleased or failed is left, so synchronize() may return at once
  void mark_clean_if_idle();
  c10::DeviceIndex device_;
  c10::StreamId id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  // Finished tasks, destroyed later by a caller of synchronize()/enqueue() rather than by the
  // worker: a task's captures may hold the last reference to a tensor with a Python object,
  // whose release needs the GIL, which a thread waiting for this stream may hold.
  std::vector<std::function<void()>> retired_;
  size_t running_ = 0;  // a task is running: the worker's, or one run_now_if_idle() runs
  uint64_t submitted_ = 0;  // tasks queued or run by their caller, ever
  uint64_t finished_ = 0;   // of those, the ones that ran
  // set when a task is queued or run by its caller, cleared (mutex_ held) once none is left, nor a
  // finished task to release or an error to raise: synchronize() reads it without the lock
  std::atomic<bool> dirty_{false};
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

// ------------------------------------------------------------------ generators (generators.cpp)
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The host (CPU) generator that draws numbers for an emu generator.
at::Generator host_generator_of(const at::Generator& emu_gen);

}  // namespace emu

// The adapter: emu's integration with PyTorch (its PrivateUse1 device), built on the driver
// (../driver/driver.h). Declarations shared by the adapter's files; each file says what it holds.
#pragma once

#include "../driver/driver.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>
#include <ATen/core/Tensor.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace pybind11 {
class module_;
}

namespace emu {

constexpr auto kEmu = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------ device allocator (allocator.cpp)
struct Block {
  void* base = nullptr;  // device address
  void* host = nullptr;  // host window of the same pages (kernels and copies use it)
  size_t requested = 0;  // bytes asked for
  size_t mapped = 0;     // bytes reserved for it (page-rounded), what the statistics count
  size_t tail = 0;       // bytes mapped after those (see kernel_tail_bytes); the mapping is mapped + tail
  c10::DeviceIndex device = 0;
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

  // Where a kernel or copy reaches the device address `ptr` (in a live or imported block): the same
  // byte in the block's host window. nullptr stays nullptr.
  void* host_address(const void* ptr);
  // Device of a pointer into emu memory, or -1.
  int device_of(const void* ptr);
  // Makes the block holding `ptr` shareable with other processes (moved, at the same address, onto a
  // memory file); returns that file's descriptor (owned by the allocator), the block's size and
  // where `ptr` lies in it. A shared block is unmapped when freed instead of cached.
  std::tuple<int, size_t, size_t> share(const void* ptr);
  // Maps a block another process shared (takes `fd`) as memory of `device`; freed by unmapping.
  c10::DataPtr import_shared(int fd, size_t mapped, size_t offset, c10::DeviceIndex device);

  // Device memory of the current device handed to host code as host memory: a CPU DataPtr at the
  // block's host window, freed back to this allocator (see host_outputs.cpp).
  c10::DataPtr allocate_host_window(size_t nbytes);
  // True when `ptr` is a DataPtr allocate_host_window made.
  static bool is_host_window(const c10::DataPtr& ptr);
  // Turns such a DataPtr into the block's device DataPtr (the same memory, now an emu allocation).
  c10::DataPtr adopt_host_window(c10::DataPtr&& ptr, c10::DeviceIndex device);
  // Frees the block whose host window starts at `host` if allocate_host_window made it; false if not.
  bool release_host_window(void* host);

  static void free_ptr(void* ptr);

 private:
  void release(void* ptr);
  static void free_host_window(void* host);
  void* take_host_window(void* host);  // forgets an allocate_host_window block: its base, or nullptr
  Mapping map_block(size_t mapped, c10::DeviceIndex device);
  void free_cached(c10::DeviceIndex device);  // unmaps cached blocks of `device`
  Block* find(const void* ptr);               // the block containing ptr (mutex held)

  std::mutex mutex_;
  std::map<uintptr_t, Block> blocks_;                               // by base address
  std::unordered_map<void*, void*> host_windows_;                   // allocate_host_window's: host -> base
  std::vector<std::multimap<size_t, void*>> cache_;                 // per device: mapped size -> base
  std::vector<c10::CachingDeviceAllocator::DeviceStats> stats_;     // per device
  bool initialized_ = false;
  void ensure_init();
};

EmuAllocator& allocator();

// The host window address of an emu tensor's first element (see EmuAllocator::host_address).
void* host_data(const at::Tensor& t);

// ------------------------------------------------------------------ host kernels' outputs (host_outputs.cpp)
// While one is alive on a thread, host tensors allocated on that thread take device memory of `device`
// (through its host window): a host kernel run for emu then writes its results in device memory.
class HostOutputsOnDevice {
 public:
  explicit HostOutputsOnDevice(c10::DeviceIndex device);
  ~HostOutputsOnDevice();
  HostOutputsOnDevice(const HostOutputsOnDevice&) = delete;
  HostOutputsOnDevice& operator=(const HostOutputsOnDevice&) = delete;

 private:
  c10::DeviceIndex previous_;
};
// The emu tensor over a host tensor's memory when that memory is device memory (allocated under
// HostOutputsOnDevice) and no other tensor holds it: its sizes, strides and offset, no copy. An
// undefined tensor otherwise (the caller copies).
at::Tensor adopt_host_output(const at::Tensor& host, c10::DeviceIndex device);
// Installs the host allocator HostOutputsOnDevice relies on (once, when the module loads); false when
// another allocator of higher priority keeps the host's place (outputs are then copied).
bool install_host_output_allocator();

// ------------------------------------------------------------------ pinned host memory (host_allocator.cpp)
// torch's host allocator for emu (pinned memory).
c10::Allocator* pinned_memory_allocator();
// True when `ptr` lies in a block of pinned host memory.
bool is_pinned_ptr(const void* ptr);

// ------------------------------------------------------------------ storage (hooks.cpp)
// Gives an emu storage `new_bytes` of fresh device memory, keeping its contents.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

// ------------------------------------------------------------------ native kernels (kernels.cpp)
// Raises NotImplementedError: emu keeps only strided (dense) tensors.
[[noreturn]] void refuse_layout(const std::string& op, c10::Layout layout);
// A host (cpu) tensor over the same bytes as an emu tensor (through its block's host window), with its
// conj/neg bits; valid while the emu tensor's storage lives.
at::Tensor host_alias(const at::Tensor& t);
// Gives an emu tensor these sizes, strides and storage offset, growing its storage when needed.
void take_geometry(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);
// emu's copy kernel (aten::_copy_from): queued on the current stream or run now.
at::Tensor emu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

// ------------------------------------------------------------------ host fallback (fallback.cpp)
// Operators that ran through the host fallback since the last reset: name, whether they took the
// direct path (host aliases of device memory) or the copying one, and how many calls.
struct FallbackCount {
  std::string op;
  bool direct;
  uint64_t calls;
};
std::vector<FallbackCount> fallback_calls();
// New results of the direct path that were copied into device memory rather than adopted (see
// adopt_host_output) since the last reset.
uint64_t fallback_results_copied();
void reset_fallback_calls();
// Registers the host fallback as emu's kernel for operators whose host kernel a composite would
// otherwise bypass on emu (once, when the module loads); returns their names.
std::vector<std::string> route_composites_to_host();

// ------------------------------------------------------------------ profiler activity (profiler.cpp)
// While torch.profiler traces emu's activity, kernels and copies the device runs are recorded with
// their times (activity_clock), device, stream and the correlation id of the operator that launched
// them (activity_correlation, on the launching thread). activity_tracing() is one atomic load.
bool activity_tracing();
int64_t activity_clock();
uint64_t activity_correlation();
void record_activity(bool copy, std::string name, c10::DeviceIndex device, c10::StreamId stream, int64_t start_ns,
                     int64_t end_ns, uint64_t correlation);


// ------------------------------------------------------------------ collectives (collectives.cpp)
// Adds the emu_ccl backend's class (EmuCCL) to the extension module.
void define_collectives(pybind11::module_& m);

}  // namespace emu

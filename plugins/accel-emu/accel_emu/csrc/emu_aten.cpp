// PyTorch integration of the emu device: allocator registration, device guard, PrivateUse1
// hooks, the few native kernels a device must provide itself (memory, views, copies), the boxed
// host fallback for every other operator, and autocast policies.
#include "emu_runtime.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/MathBitsFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace emu {
namespace {

constexpr auto kEmu = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------ pinned host memory
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

// ------------------------------------------------------------------ device guard
struct EventHandle {
  std::shared_ptr<Event> event;
};

Event* as_event(void* handle) { return static_cast<EventHandle*>(handle)->event.get(); }

struct EmuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kEmu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kEmu, "emu guard given a ", d.type(), " device");
    auto old = getDevice();
    if (d.has_index() && d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kEmu, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kEmu, "emu guard given a ", d.type(), " device");
    if (d.has_index()) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      if (d.has_index()) set_current_device(d.index());
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return current_stream(d.has_index() ? d.index() : current_device());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    auto idx = d.has_index() ? d.index() : current_device();
    check_device(idx);
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kEmu, idx));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override;
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return new_stream(d.has_index() ? d.index() : current_device());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventHandle*>(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "emu: event device index ", static_cast<int>(device_index),
                " does not match the recording stream's device ", static_cast<int>(stream.device_index()));
    if (*event == nullptr) *event = new EventHandle{std::make_shared<Event>()};
    auto shared = static_cast<EventHandle*>(*event)->event;
    // the stream task keeps the event alive even if Python drops it first
    record_event(shared.get(), stream, flag == c10::EventFlag::BACKEND_DEFAULT);
    stream_queue(stream.device_index(), stream.id()).enqueue([shared] {});
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    auto shared = static_cast<EventHandle*>(event)->event;
    block_on_event(shared.get(), stream);
    stream_queue(stream.device_index(), stream.id()).enqueue([shared] {});
  }
  bool queryEvent(void* event) const override { return event == nullptr || query_event(as_event(event)); }
  bool queryStream(const c10::Stream& s) const override { return stream_queue(s.device_index(), s.id()).query(); }
  void synchronizeStream(const c10::Stream& s) const override {
    stream_queue(s.device_index(), s.id()).synchronize();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) synchronize_event(as_event(event));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize_device(device_index < 0 ? current_device() : device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "emu: both events must be recorded before calculating elapsed time");
    return elapsed_ms(as_event(start), as_event(end));
  }
};

}  // namespace

c10::Stream pool_stream(c10::DeviceIndex device);

namespace {

c10::Stream EmuGuardImpl::getStreamFromGlobalPool(c10::Device d, bool) const {
  return pool_stream(d.has_index() ? d.index() : current_device());
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuardImpl);

// ------------------------------------------------------------------ storage resize
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "emu: trying to resize storage that is not resizable");
  c10::DeviceIndex device = current_device();
  if (impl->data_ptr().device().has_index() && impl->data_ptr().device().type() == kEmu) {
    device = impl->data_ptr().device().index();
  }
  c10::DeviceGuard guard(c10::Device(kEmu, device));
  // queued copies find their memory through the storage: let them finish before it changes
  // (FSDP frees and re-allocates parameter storage this way between queued copies)
  synchronize_device(device);
  c10::DataPtr fresh = allocator().allocate(new_bytes);
  const size_t old_bytes = impl->nbytes();
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0 && impl->data() != nullptr) {
    allocator().copy_data(fresh.get(), impl->data(), keep);
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

// ------------------------------------------------------------------ hooks
struct EmuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = allocator().device_of(data);
    TORCH_CHECK(d >= 0, "emu: pointer ", data, " is not emu device memory");
    return at::Device(kEmu, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return pinned_allocator().contains(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    check_device(device_index);
    return is_initialized();
  }
  void init() const override { device_count(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    if (device >= 0) set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

struct Registrations {
  Registrations() {
    c10::SetAllocator(kEmu, &allocator());
    at::RegisterPrivateUse1HooksInterface(new EmuHooks());
  }
} registrations;

// ------------------------------------------------------------------ native kernels
// emu keeps only strided (dense) tensors: its kernels are the host's dense kernels run on its memory,
// and it has no sparse storage formats. Everything that would make or use another layout on emu
// raises NotImplementedError with this text.
[[noreturn]] void refuse_layout(const std::string& op, c10::Layout layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "emu supports only strided (dense) tensors; ", op, " met a ", layout,
                              " tensor on emu. Keep sparse tensors on the host (cpu), or give emu dense ones "
                              "(to_dense() on the host).");
}

void check_factory(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  if (c10::layout_or_default(layout) != c10::Layout::Strided) refuse_layout("a factory function", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "emu: only host (cpu) tensors can be pinned");
}

at::Tensor emu_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  check_factory(layout, pin_memory);
  auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kEmu, "emu empty() called for device ", dev);
  c10::OptionalDeviceGuard guard(dev.has_index() ? std::optional<c10::Device>(dev) : std::nullopt);
  return at::detail::empty_generic(size, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor emu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool> pin_memory) {
  check_factory(layout, pin_memory);
  auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kEmu, "emu empty_strided() called for device ", dev);
  c10::OptionalDeviceGuard guard(dev.has_index() ? std::optional<c10::Device>(dev) : std::nullopt);
  return at::detail::empty_strided_generic(size, stride, &allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor emu_as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                          std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) offset = storage_offset->guard_int(__FILE__, __LINE__);
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor emu_view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor emu_reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor emu_unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor emu_view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor emu_view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }

const at::Tensor& emu_resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                              std::optional<c10::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  for (auto s : sizes) TORCH_CHECK(s >= 0, "emu resize_: negative dimension ", s);
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != sizes) impl->set_sizes_contiguous(sizes);
  auto fmt = memory_format.value_or(c10::MemoryFormat::Contiguous);
  TORCH_CHECK(fmt != c10::MemoryFormat::Preserve, "emu resize_: unsupported memory format Preserve");
  if (fmt != c10::MemoryFormat::Contiguous) impl->empty_tensor_restride(fmt);
  const int64_t numel = self.numel();
  if (numel > 0) {
    const size_t needed = static_cast<size_t>(self.storage_offset() + numel) * self.dtype().itemsize();
    if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage(), needed);
  }
  return self;
}

at::Tensor& emu_set_storage(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                            c10::IntArrayRef stride) {
  // grow the storage here: the host implementation would copy device bytes with memcpy
  if (!stride.empty()) {
    const size_t needed = at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), offset);
    if (needed > source.nbytes()) resize_storage_bytes(source, needed);
  } else {
    const size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), offset);
    if (needed > source.nbytes()) resize_storage_bytes(source, needed);
  }
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& emu_set_source_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }

at::Tensor& emu_set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

// A host (cpu) tensor over the same bytes as an emu tensor, with its conj/neg bits; valid while a
// MemoryGuard holds it open.
at::Tensor host_alias(const at::Tensor& t) {
  at::Tensor out = at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::DeviceType::CPU));
  if (t.is_conj()) out._set_conj(true);
  if (t.is_neg()) out._set_neg(true);
  return out;
}

bool is_pinned_host(const at::Tensor& t) {
  return t.device().is_cpu() && t.has_storage() && t.storage().data() != nullptr &&
         pinned_allocator().contains(t.storage().data());
}

void copy_now(const at::Tensor& self, const at::Tensor& dst) {
  MemoryGuard guard;
  guard.add(self);
  guard.add(dst);
  at::Tensor src_view = self.device().type() == kEmu ? host_alias(self) : self;
  at::Tensor dst_view = dst.device().type() == kEmu ? host_alias(dst) : dst;
  dst_view.copy_(src_view);
}

// A tensor over `t`'s storage with the sizes, strides, offset and math bits `t` has now. Work queued on
// a stream uses it instead of `t`, whose metadata an in-place operator (resize_, t_, set_, ...) may
// change before the stream gets to the work.
at::Tensor geometry_snapshot(const at::Tensor& t) {
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

at::Tensor emu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "emu copy: undefined tensor");
  if (self.numel() == 0) return dst;
  const bool src_emu = self.device().type() == kEmu;
  const bool dst_emu = dst.device().type() == kEmu;
  TORCH_CHECK(src_emu || self.device().is_cpu(), "emu: cannot copy from ", self.device(), " to ", dst.device());
  TORCH_CHECK(dst_emu || dst.device().is_cpu(), "emu: cannot copy from ", self.device(), " to ", dst.device());
  const c10::DeviceIndex device = dst_emu ? dst.device().index() : self.device().index();
  // Copies within one device, and host copies with non_blocking=True from/to pinned memory, are
  // queued on the current stream (asynchronous, as on a real device); the rest wait for it.
  const bool same_device = src_emu && dst_emu && self.device() == dst.device();
  const bool async = same_device || (!(src_emu && dst_emu) && non_blocking &&
                                     (src_emu ? is_pinned_host(dst) : is_pinned_host(self)));
  auto stream = current_stream(device);
  const char* kind = src_emu ? (dst_emu ? (same_device ? "Memcpy DtoD" : "Memcpy PtoP") : "Memcpy DtoH") : "Memcpy HtoD";
  if (async) {
    // the task holds both storages alive, and copies the geometry the tensors have now
    at::Tensor s = geometry_snapshot(self);
    at::Tensor d = geometry_snapshot(dst);
    const uint64_t correlation = activity_tracing() ? activity_correlation() : 0;
    const c10::StreamId id = stream.id();
    stream_queue(device, id).enqueue([s, d, kind, device, id, correlation] {
      const bool traced = activity_tracing();
      const int64_t started = traced ? activity_clock() : 0;
      copy_now(s, d);
      if (traced) record_activity(true, kind, device, id, started, activity_clock(), correlation);
    });
    return dst;
  }
  wait_current_stream(device);
  if (src_emu && dst_emu && self.device() != dst.device()) wait_current_stream(self.device().index());
  const bool traced = activity_tracing();
  const int64_t started = traced ? activity_clock() : 0;
  copy_now(self, dst);
  if (traced) record_activity(true, kind, device, stream.id(), started, activity_clock(), activity_correlation());
  return dst;
}

// Gives an emu tensor these sizes, strides and storage offset, growing its storage when needed.
void take_geometry(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  const size_t needed = at::detail::computeStorageNbytes(sizes, strides, t.dtype().itemsize(), offset);
  if (needed > t.storage().nbytes()) resize_storage_bytes(t.storage(), needed);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

at::Tensor emu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == kEmu) {
    emu_resize_(dst, self.sym_sizes(), std::nullopt);
  } else {
    at::native::resize_(dst, self.sizes(), std::nullopt);
  }
  return emu_copy_from(self, dst, false);
}

// emu's allocator never hands a block to other work while queued copies still use it (the queued
// task holds the tensors), so recording a stream on a tensor has nothing to do
void emu_record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kEmu, "emu: record_stream needs an emu stream, got one on ", stream.device());
  (void)self;
}

at::Scalar emu_local_scalar_dense(const at::Tensor& self) {
  wait_current_stream(self.device().index());
  MemoryGuard guard;
  guard.add(self);
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

// ------------------------------------------------------------------ host-computed kernels
// Operators whose CPU kernel the boxed fallback cannot reach (PyTorch routes unknown devices to
// an "overrideable" stub) or whose CPU kernel draws from the host generator without a generator
// argument. They run on the host over copies, like the fallback.
void check_same_device(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::Device> seen;
  for (const auto* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (!seen) seen = t->device();
    else TORCH_CHECK(*seen == t->device(), "Expected all tensors to be on the same device, but found at least two devices, ",
                     *seen, " and ", t->device(), "! (in ", op, " on emu)");
  }
}

at::Tensor host(const at::Tensor& t) { return t.defined() ? t.to(c10::Device(c10::DeviceType::CPU)) : t; }

at::Tensor emu_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  check_same_device("aten::convolution_overrideable", {&input, &weight, b});
  c10::DeviceGuard guard(input.device());
  std::optional<at::Tensor> host_bias;
  if (b) host_bias = host(*b);
  auto out = at::convolution(host(input), host(weight), host_bias, stride, padding, dilation, transposed,
                             output_padding, groups);
  return out.to(input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> emu_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  check_same_device("aten::convolution_backward_overrideable", {&grad_output, &input, &weight});
  c10::DeviceGuard guard(input.device());
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [gi, gw, gb] = at::convolution_backward(host(grad_output), host(input), host(weight), c10::IntArrayRef(bias_sizes),
                                               stride, padding, dilation, transposed, output_padding, groups, output_mask);
  auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
  return {back(gi), back(gw), back(gb)};
}

std::tuple<at::Tensor, at::Tensor> emu_native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) return {input.clone(), at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  // bernoulli_ goes through the fallback, which hands it this device's generator
  auto draw = at::empty_like(input, c10::MemoryFormat::Contiguous).bernoulli_(keep);
  auto output = input.mul(draw).mul_(scale);
  return {output, draw.to(at::kBool)};
}

// ------------------------------------------------------------------ the host fallback
bool is_index_op(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" || name.name == "aten::index_put" ||
         name.name == "aten::_index_put_impl_";
}

bool is_generator_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

struct DeviceScan {
  std::optional<c10::Device> emu_device;
  std::optional<c10::Device> other_device;
  void see(const at::Tensor& t, bool allow_host) {
    if (!t.defined()) return;
    auto d = t.device();
    if (d.type() == kEmu) {
      if (!emu_device) emu_device = d;
      else if (*emu_device != d && !other_device) other_device = d;
    } else if (!(d.is_cpu() && (t.dim() == 0 || allow_host))) {
      if (!other_device) other_device = d;
    }
  }
};

// Which fallback an operator takes. The direct one computes on host aliases of the device memory
// (opened for the kernel, like a device kernel reading its own memory): no copies of the inputs,
// in-place and `out=` results land in place, and only new outputs are copied into fresh device
// memory. The generic CPU fallback (copy every operand to the host and back) remains for what the
// direct path cannot express: views (their result would alias device memory from the host) and
// operators that resize their arguments by name.
enum class FallbackPath : uint8_t { kUnknown, kDirect, kCopying };

struct PathEntry {
  FallbackPath path = FallbackPath::kUnknown;
  std::string name;
  uint64_t calls = 0;
};

struct PathCache {
  std::mutex mutex;
  std::unordered_map<const void*, PathEntry> entries;  // by the operator's schema
};

PathCache& path_cache() {
  static PathCache* cache = new PathCache();
  return *cache;
}

FallbackPath choose_path(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    if (alias != nullptr && !alias->isWrite()) return FallbackPath::kCopying;  // a view
  }
  if (schema.name().find("resize") != std::string::npos) return FallbackPath::kCopying;
  return FallbackPath::kDirect;
}

// The path for `op`; also counts the call (fallback_calls() reports the counts).
FallbackPath path_for(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  auto& cache = path_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto& entry = cache.entries[&schema];
  if (entry.path == FallbackPath::kUnknown) {
    entry.path = choose_path(schema);
    entry.name = c10::toString(schema.operator_name());
  }
  ++entry.calls;
  return entry.path;
}

void keep_device_memory(void*) {}  // the device storage owns the bytes

// A host tensor over an emu tensor's storage (its memory must be open): same offset, sizes, strides
// and conj/neg bits. Its storage is resizable with the host allocator, so a kernel that resizes an
// `out=` argument gets new host memory instead of failing; direct_fallback copies that back.
at::Tensor host_view_of(const at::Tensor& t) {
  const c10::Storage& device_storage = t.storage();
  void* base = device_storage.mutable_data();
  c10::Storage storage(c10::Storage::use_byte_size_t(), device_storage.nbytes(),
                       c10::DataPtr(base, base, &keep_device_memory, c10::Device(c10::DeviceType::CPU)),
                       c10::GetCPUAllocator(), /*resizable=*/true);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                            c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) out._set_conj(true);
  if (t.is_neg()) out._set_neg(true);
  return out;
}

// True when a kernel changed the host alias of `original` beyond its values: resized or restrided
// it, moved it to new host memory, or flipped its conj/neg bit (linalg_lu_solve with left=False
// leaves conjugated values in its `out=` tensor and sets the bit rather than conjugating them).
bool alias_moved(const at::Tensor& alias, const at::Tensor& original) {
  return alias.sizes() != original.sizes() || alias.strides() != original.strides() ||
         alias.storage_offset() != original.storage_offset() ||
         alias.storage().data() != original.storage().data() || alias.is_conj() != original.is_conj() ||
         alias.is_neg() != original.is_neg();
}

// Copies a host result into new memory on `device` (same sizes, and strides when dense).
at::Tensor to_device_memory(const at::Tensor& result, c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(kEmu, device));
  const bool dense = result.is_non_overlapping_and_dense();
  at::Tensor dst = dense ? at::empty_strided(result.sizes(), result.strides(), result.options().device(kEmu))
                         : at::empty(result.sizes(), result.options().device(kEmu));
  if (result.numel() == 0) return dst;
  MemoryGuard open;
  open.add(dst);
  at::Tensor view = host_alias(dst);
  if (result.is_conj() || result.is_neg()) {
    view.copy_(result.resolve_conj().resolve_neg());
  } else {
    view.copy_(result);
  }
  return dst;
}

void direct_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto begin = stack->size() - num_args;

  MemoryGuard open;
  // host aliases handed to the kernel, and the device tensors they stand for
  std::vector<std::pair<at::Tensor, at::Tensor>> originals;
  std::vector<size_t> mutated;  // indices into `originals` of arguments the operator writes
  auto swap_in = [&](const at::Tensor& t, bool written) -> at::Tensor {
    if (!t.defined() || t.device().type() != kEmu) return t;
    open.add(t);
    at::Tensor alias = host_view_of(t);
    if (written) mutated.push_back(originals.size());
    originals.emplace_back(alias, t);
    return alias;
  };
  for (size_t i = 0; i < num_args; ++i) {
    auto& slot = (*stack)[begin + i];
    const auto* alias_info = schema.arguments()[i].alias_info();
    const bool written = alias_info != nullptr && alias_info->isWrite();
    if (slot.isTensor()) {
      slot = c10::IValue(swap_in(slot.toTensor(), written));
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList();
      c10::List<at::Tensor> hosted;
      hosted.reserve(list.size());
      for (const auto& t : list) hosted.push_back(swap_in(t, written));
      slot = c10::IValue(std::move(hosted));
    } else if (slot.isOptionalTensorList()) {
      auto list = slot.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> hosted;
      hosted.reserve(list.size());
      for (const auto& entry : list) {
        std::optional<at::Tensor> t = entry;
        hosted.push_back(t.has_value() ? std::optional<at::Tensor>(swap_in(*t, written)) : std::nullopt);
      }
      slot = c10::IValue(std::move(hosted));
    } else if (slot.isDevice() && slot.toDevice().type() == kEmu) {
      slot = c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // A written argument the kernel resized (an `out=` tensor of the wrong shape) now has host
  // memory or other metadata: give the device tensor the same sizes and strides (the host's
  // TensorIterator lays a resized output out like its inputs, and later kernels' numbers depend
  // on that layout) and copy the result into it.
  for (size_t index : mutated) {
    const auto& [alias, original] = originals[index];
    if (!alias_moved(alias, original)) continue;
    at::Tensor result = alias.clone();  // it may overlap the device memory about to be resized
    take_geometry(original, result.sizes(), result.strides(), alias.storage_offset());
    emu_copy_from(result, original, false);
  }

  auto original_of = [&](const at::Tensor& t) -> const at::Tensor* {
    for (const auto& entry : originals) {
      if (entry.first.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return &entry.second;
    }
    return nullptr;
  };
  const auto& returns_schema = schema.returns();
  const auto num_returns = returns_schema.size();
  const auto rbegin = stack->size() - num_returns;
  for (size_t r = 0; r < num_returns; ++r) {
    auto& slot = (*stack)[rbegin + r];
    const auto* alias = returns_schema[r].alias_info();
    const bool in_place = alias != nullptr && alias->isWrite();
    if (slot.isTensor()) {
      const at::Tensor out = slot.toTensor();
      if (!out.defined()) continue;
      if (in_place) {
        const at::Tensor* original = original_of(out);
        TORCH_CHECK(original != nullptr, "emu: ", schema.operator_name(),
                    " returned a tensor that is not the input it mutated");
        slot = c10::IValue(*original);
      } else if (out.device().is_cpu()) {
        if (out.layout() != c10::Layout::Strided) refuse_layout(c10::toString(schema.operator_name()), out.layout());
        slot = c10::IValue(to_device_memory(out, device));
      }
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList();
      std::vector<at::Tensor> back;
      back.reserve(list.size());
      for (const at::Tensor& out : list) {
        const at::Tensor* original = in_place && out.defined() ? original_of(out) : nullptr;
        if (original != nullptr) {
          back.push_back(*original);
        } else if (out.defined() && out.device().is_cpu()) {
          if (out.layout() != c10::Layout::Strided) refuse_layout(c10::toString(schema.operator_name()), out.layout());
          back.push_back(to_device_memory(out, device));
        }
        else {
          back.push_back(out);
        }
      }
      slot = c10::IValue(c10::List<at::Tensor>(std::move(back)));
    }
  }
}

void emu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  auto args = torch::jit::last(*stack, num_args);
  const bool index_op = is_index_op(schema.operator_name());

  DeviceScan scan;
  std::optional<c10::DeviceIndex> requested;  // a factory's device=emu:N
  for (const auto& v : args) {
    if (v.isTensor()) {
      scan.see(v.toTensor(), false);
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorList()) scan.see(t, index_op);
    } else if (v.isOptionalTensorList()) {
      for (const auto& t : v.toOptionalTensorList()) {
        std::optional<at::Tensor> ot = t;
        if (ot.has_value()) scan.see(*ot, index_op);
      }
    } else if (v.isDevice() && v.toDevice().type() == kEmu && v.toDevice().has_index()) {
      requested = v.toDevice().index();
    }
  }
  if (scan.emu_device && scan.other_device) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                *scan.emu_device, " and ", *scan.other_device, "! (in ", schema.operator_name(), " on emu)");
  }
  const c10::DeviceIndex device =
      scan.emu_device ? scan.emu_device->index() : requested.value_or(current_device());
  c10::DeviceGuard guard(c10::Device(kEmu, device));

  // random operators draw from the device's generator, not the host's
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_generator_type(schema.arguments()[i].type())) continue;
    auto& slot = (*stack)[stack->size() - num_args + i];
    if (slot.isNone()) {
      slot = c10::IValue(host_generator_of(default_generator(device)));
    } else if (slot.isGenerator()) {
      slot = c10::IValue(host_generator_of(slot.toGenerator()));
    }
  }
  wait_current_stream(device);
  const bool traced = activity_tracing();
  const int64_t started = traced ? activity_clock() : 0;
  if (path_for(op) == FallbackPath::kDirect) {
    direct_fallback(op, stack, device);
  } else {
    at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  }
  if (traced) {
    record_activity(false, "emu::" + schema.name(), device, current_stream(device).id(), started, activity_clock(),
                    activity_correlation());
  }
}

// Operators on sparse emu tensors (and the constructor of compressed sparse tensors, which PyTorch
// would otherwise build on emu from dense parts) are refused with a clear error.
void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  auto args = torch::jit::last(*stack, arguments.size());
  c10::Layout layout = c10::Layout::Sparse;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "layout" && args[i].isInt()) layout = args[i].toLayout();
    if (args[i].isTensor() && args[i].toTensor().defined() && args[i].toTensor().layout() != c10::Layout::Strided) {
      layout = args[i].toTensor().layout();
      break;
    }
  }
  refuse_layout(c10::toString(op.schema().operator_name()), layout);
}

// Module.to(), FSDP's flat parameters and `param.data = tensor` swap a tensor's storage for one of
// another type only when PyTorch calls the two types compatible. Its built-in rule names only its
// own devices; a PrivateUse1 device answers for itself: dense emu and dense host tensors may take
// each other's place, as CUDA and host tensors do.
bool emu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto dense = [](const at::Tensor& t) {
    const auto type = t.device().type();
    return t.layout() == c10::Layout::Strided && !t.is_quantized() && !t.is_nested() &&
           (type == kEmu || type == c10::DeviceType::CPU);
  };
  return dense(self) && dense(from);
}

// PyTorch resolves a conjugate or negative view before an operator that does not understand the
// bit by cloning the operand. On emu a clone is a copy, and every copy that involves emu reaches
// `_copy_from`, which the same rule would resolve by cloning again, without end (a stack overflow).
// emu's copies understand both bits (their host aliases carry them), so `_copy_from` and
// `_copy_from_and_resize` with an emu operand skip both rules; other devices keep PyTorch's rule.
class MathBitRule final : public at::native::MathOpFallback {
 public:
  explicit MathBitRule(c10::DispatchKey key)
      : MathOpFallback(key, key == c10::DispatchKey::Conjugate ? "conjugate" : "negation"), key_(key) {}
  bool is_bit_set(const at::Tensor& t) override {
    return key_ == c10::DispatchKey::Conjugate ? t.is_conj() : t.is_neg();
  }

 private:
  c10::DispatchKey key_;
};

template <c10::DispatchKey Key>
void copy_with_math_bits(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  bool emu_operand = false;
  for (const auto& v : torch::jit::last(*stack, op.schema().arguments().size())) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kEmu) emu_operand = true;
  }
  if (emu_operand) {
    // Negative is dispatched before Conjugate: skipping past Conjugate skips both
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Conjugate),
                       stack);
    return;
  }
  MathBitRule(Key).fallback_impl(op, keys, stack);
}

}  // namespace

std::vector<FallbackCount> fallback_calls() {
  auto& cache = path_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::vector<FallbackCount> out;
  out.reserve(cache.entries.size());
  for (const auto& item : cache.entries) {
    out.push_back({item.second.name, item.second.path == FallbackPath::kDirect, item.second.calls});
  }
  return out;
}

// An operator with a host (CPU) kernel of its own can still miss emu's fallback: a composite kernel
// takes precedence over a backend fallback, so on emu it would run as a decomposition with other
// numerics than the host's kernel. CompositeExplicitAutograd does so at the backend (native_layer_norm
// through batch norm, addr, group norm); CompositeImplicitAutograd does so at the autograd key
// whenever emu has no kernel of its own (mish_backward, silu_backward). Such operators get the
// fallback as emu's own kernel. Left alone: views, composites that are an operator's only source of
// gradients, and operators that reach the host's `out=` kernel through
// CompositeExplicitAutogradNonFunctional alone (the host's numerics already).
//
// Device-generic composites with no host kernel run on emu as they are, except those that call a
// DispatchStub on the device's tensors: the stub has no entry for emu, and PyTorch fails with
// "DispatchStub: missing kernel for emu" (conj_physical_, and through it linalg.svd's out= form on
// complex inputs) or refuses the device type by name (mode's out= form). The host runs them whole.
constexpr const char* kStubComposites[] = {"aten::conj_physical_", "aten::mode.values"};

std::vector<std::string> route_composites_to_host() {
  using c10::DispatchKey;
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::PrivateUse1, __FILE__, __LINE__);
  std::vector<std::string> routed;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* qualified : kStubComposites) {
    const std::string text(qualified);
    const auto dot = text.find('.');
    const c10::OperatorName name(text.substr(0, dot), dot == std::string::npos ? "" : text.substr(dot + 1));
    auto handle = dispatcher.findOp(name);
    if (!handle.has_value() || handle->hasKernelForDispatchKey(DispatchKey::PrivateUse1)) continue;
    library->impl(qualified, torch::CppFunction::makeFromBoxedFunction<&emu_fallback>());
    routed.push_back(text);
  }
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto handle = dispatcher.findOp(name);
    if (!handle.has_value() || !handle->hasKernelForDispatchKey(DispatchKey::CPU)) continue;
    if (handle->hasKernelForDispatchKey(DispatchKey::PrivateUse1)) continue;
    const bool explicit_composite = handle->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd);
    const bool implicit_composite = handle->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd);
    if (!explicit_composite && !(implicit_composite && handle->hasKernelForDispatchKey(DispatchKey::Autograd))) {
      continue;
    }
    if (choose_path(handle->schema()) != FallbackPath::kDirect) continue;
    const std::string qualified = c10::toString(name);
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&emu_fallback>());
    routed.push_back(qualified);
  }
  return routed;
}

void reset_fallback_calls() {
  auto& cache = path_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  for (auto& item : cache.entries) item.second.calls = 0;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", emu_empty);
  m.impl("empty_strided", emu_empty_strided);
  m.impl("as_strided", emu_as_strided);
  m.impl("view", emu_view);
  m.impl("_reshape_alias", emu_reshape_alias);
  m.impl("unfold", emu_unfold);
  m.impl("view_as_real", emu_view_as_real);
  m.impl("view_as_complex", emu_view_as_complex);
  m.impl("resize_", emu_resize_);
  m.impl("set_.source_Storage_storage_offset", emu_set_storage);
  m.impl("set_.source_Storage", emu_set_source_storage);
  m.impl("set_.source_Tensor", emu_set_source_tensor);
  m.impl("_copy_from", emu_copy_from);
  m.impl("_copy_from_and_resize", emu_copy_from_and_resize);
  m.impl("_local_scalar_dense", emu_local_scalar_dense);
  m.impl("record_stream", emu_record_stream);
  m.impl("convolution_overrideable", emu_convolution);
  m.impl("convolution_backward_overrideable", emu_convolution_backward);
  m.impl("native_dropout", emu_native_dropout);
  m.impl("_has_compatible_shallow_copy_type", emu_has_compatible_shallow_copy_type);
  // Without a kernel of its own, a structured operator's functional form reaches a PrivateUse1
  // device through PyTorch's composite wrapper, which calls the `.out` form with the final (reduced)
  // shape; the host's `mse_loss.out` first resizes that output to the elementwise shape and warns.
  // The host's functional kernel does not: send the functional form to the fallback as it is.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&emu_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}

// the constructor is a composite of its own: without this, it would build a compressed tensor on emu
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("_sparse_compressed_tensor_unsafe", torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}

TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  constexpr auto key = c10::DispatchKey::Conjugate;
  m.impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<&copy_with_math_bits<key>>());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFromBoxedFunction<&copy_with_math_bits<key>>());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  constexpr auto key = c10::DispatchKey::Negative;
  m.impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<&copy_with_math_bits<key>>());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFromBoxedFunction<&copy_with_math_bits<key>>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&emu_fallback>());
}

// ------------------------------------------------------------------ autocast
// The same policies CUDA uses: matmul-like ops in the lower precision, precision-sensitive ops
// in fp32, mixed-input ops promoted.
// operators without an autocast policy pass straight through
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define EMU_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define EMU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define EMU_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define EMU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(EMU_LOWER)
  AT_FORALL_FP32(EMU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(EMU_FP32_OPT)
  AT_FORALL_PROMOTE(EMU_PROMOTE)
#undef EMU_LOWER
#undef EMU_FP32
#undef EMU_FP32_OPT
#undef EMU_PROMOTE
}

}  // namespace emu

// Host kernels' outputs in device memory. The host fallback runs a host kernel over host windows of
// emu memory; the kernel allocates its results as host tensors. Copying each result into new device
// memory afterwards would cost an allocation and a copy per output, on every operator. Instead, while
// the kernel runs, the host (CPU) allocator hands out device memory on that thread (through host
// windows), and each result is then adopted as an emu tensor over the same memory.
//
// The host allocator is replaced process-wide by one that defers to the previous allocator except on
// a thread inside HostOutputsOnDevice; temporaries a kernel allocates there take device memory too,
// as a device kernel's would.
#include "adapter.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

namespace emu {
namespace {

thread_local c10::DeviceIndex outputs_device = -1;  // >= 0: this thread's host tensors take emu memory

class HostKernelAllocator final : public c10::Allocator {
 public:
  explicit HostKernelAllocator(c10::Allocator* host) : host_(host) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (outputs_device < 0 || nbytes == 0) return host_->allocate(nbytes);
    return allocator().allocate_host_window(nbytes);
  }

  // raw_allocate's pointers are freed here: a host window goes back to emu, anything else to the host
  c10::DeleterFnPtr raw_deleter() const override { return host_->raw_deleter() ? &free_raw : nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void free_raw(void* ptr);

 private:
  c10::Allocator* host_;
};

HostKernelAllocator* installed = nullptr;

void HostKernelAllocator::free_raw(void* ptr) {
  if (!allocator().release_host_window(ptr)) installed->host_->raw_deleter()(ptr);
}

}  // namespace

HostOutputsOnDevice::HostOutputsOnDevice(c10::DeviceIndex device) : previous_(outputs_device) {
  if (installed != nullptr) outputs_device = device;
}

HostOutputsOnDevice::~HostOutputsOnDevice() { outputs_device = previous_; }

at::Tensor adopt_host_output(const at::Tensor& host, c10::DeviceIndex device) {
  if (!host.has_storage() || host.is_conj() || host.is_neg()) return {};
  const c10::Storage& storage = host.storage();
  // another tensor holding this storage would be left over memory that is no longer host memory
  if (!EmuAllocator::is_host_window(storage.data_ptr()) || storage.use_count() != 1) return {};
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  c10::DataPtr device_ptr = allocator().adopt_host_window(impl->set_data_ptr(c10::DataPtr()), device);
  c10::Storage adopted(c10::Storage::use_byte_size_t(), impl->nbytes(), std::move(device_ptr), &allocator(),
                       /*resizable=*/true);
  impl->set_nbytes(0);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(std::move(adopted),
                                                            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), host.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
  return out;
}

bool install_host_output_allocator() {
  c10::Allocator* host = c10::GetCPUAllocator();
  static auto* ours = new HostKernelAllocator(host);  // leaked: host storages may outlive static destruction
  c10::SetCPUAllocator(ours, /*priority=*/0);
  if (c10::GetCPUAllocator() != ours) return false;
  installed = ours;
  return true;
}

}  // namespace emu

// The driver's device memory: mappings of host memory, without access rights at their device
// addresses while protection is on (ACCEL_EMU_PROTECT) and reached by kernels and copies through a
// second, host mapping of the same pages; moved onto memory files to be shared with other processes.
// The adapter's allocator (../adapter/allocator.cpp) caches and counts what it maps.
#include "driver.h"

#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace emu {

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// Each block is mapped with one more page than it reserves, in both of its mappings. Host kernels
// (Inductor's vectorised C++ kernels) may load a whole vector where a tensor ends a few elements into
// it and use only those elements; on the host's heap the extra bytes are readable, but a block ending
// exactly at a page boundary would be followed by another block's PROT_NONE pages or by none. Real
// allocators hand out memory at a coarser granularity than a tensor's bytes for the same reason.
size_t kernel_tail_bytes() { return page_size(); }

namespace {

int device_protection() { return protection_enabled() ? PROT_NONE : (PROT_READ | PROT_WRITE); }

// A second mapping of a block's pages, read/write, at an address of the kernel's choosing: the host
// window. mremap with an old size of 0 maps the same pages of a shared mapping again; the copy has the
// original's protection, which the window then drops.
void* map_window(void* device, size_t length) {
  void* host = mremap(device, 0, length, MREMAP_MAYMOVE);
  if (host == MAP_FAILED) return nullptr;
  if (mprotect(host, length, PROT_READ | PROT_WRITE) != 0) {
    munmap(host, length);
    return nullptr;
  }
  return host;
}

}  // namespace

// MAP_SHARED: each block is its own (shmem) object, so the kernel never merges neighbouring blocks
// into one mapping, and its pages can be mapped a second time as the block's host window. Kernels
// and copies use the window, so no access rights change while the device runs: device addresses stay
// PROT_NONE for the block's whole life.
Mapping map_memory(size_t length) {
  void* device = mmap(nullptr, length, device_protection(), MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (device == MAP_FAILED) return {};
  if (!protection_enabled()) return {device, device};
  void* host = map_window(device, length);
  if (host == nullptr) {
    munmap(device, length);
    return {};
  }
  return {device, host};
}

void unmap_memory(const Mapping& m, size_t length) {
  if (m.host != nullptr && m.host != m.device) munmap(m.host, length);
  munmap(m.device, length);
}

int share_memory(const Mapping& m, size_t length) {
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "emu-shared-block", 1u /* MFD_CLOEXEC */));
  TORCH_CHECK(fd >= 0, "emu: cannot create a memory file to share a block: ", std::strerror(errno));
  size_t written = 0;
  bool ok = ftruncate(fd, static_cast<off_t>(length)) == 0;
  while (ok && written < length) {
    const ssize_t n = pwrite(fd, static_cast<const char*>(m.host) + written, length - written, static_cast<off_t>(written));
    ok = n > 0;
    if (ok) written += static_cast<size_t>(n);
  }
  // the file replaces the anonymous memory at the same addresses, with the same access rights; the
  // window goes first, so a failure leaves the device address on the old pages it still reads through
  if (ok && m.host != m.device) {
    ok = mmap(m.host, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) != MAP_FAILED;
  }
  if (ok) ok = mmap(m.device, length, device_protection(), MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) != MAP_FAILED;
  if (!ok) {
    const int error = errno;
    ::close(fd);
    TORCH_CHECK(false, "emu: cannot move a block onto a memory file to share it: ", std::strerror(error));
  }
  return fd;
}

Mapping import_memory(int fd, size_t length) {
  void* device = mmap(nullptr, length, device_protection(), MAP_SHARED | MAP_NORESERVE, fd, 0);
  int error = errno;
  void* host = device;
  if (device != MAP_FAILED && protection_enabled()) {
    host = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    error = errno;
    if (host == MAP_FAILED) munmap(device, length);
  }
  ::close(fd);  // the mappings keep the file
  TORCH_CHECK(device != MAP_FAILED && host != MAP_FAILED, "emu: cannot map a block shared by another process: ",
              std::strerror(error));
  return {device, host};
}

}  // namespace emu

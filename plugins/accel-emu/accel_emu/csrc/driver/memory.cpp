// The driver's device memory: mappings of host memory, without access rights outside kernels and
// copies while protection is on (ACCEL_EMU_PROTECT), and moved onto memory files to be shared with
// other processes. The adapter's allocator (../adapter/allocator.cpp) caches and counts what it maps.
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

// Each block is mapped with one more page than it reserves, opened and closed with it. Host kernels
// (Inductor's vectorised C++ kernels) may load a whole vector where a tensor ends a few elements into
// it and use only those elements; on the host's heap the extra bytes are readable, but a block ending
// exactly at a page boundary would be followed by another block's PROT_NONE pages or by none. Real
// allocators hand out memory at a coarser granularity than a tensor's bytes for the same reason.
size_t kernel_tail_bytes() { return page_size(); }

void* map_memory(size_t length) {
  const int prot = protection_enabled() ? PROT_NONE : (PROT_READ | PROT_WRITE);
  // MAP_SHARED: each block is its own (shmem) object, so the kernel never merges neighbouring
  // blocks into one mapping. Private anonymous blocks next to each other would be merged while
  // closed and split again by every open, which made mprotect the largest cost of a kernel.
  void* p = mmap(nullptr, length, prot, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_memory(void* base, size_t length) { munmap(base, length); }

void open_memory(void* base, size_t length) {
  TORCH_CHECK(mprotect(base, length, PROT_READ | PROT_WRITE) == 0, "emu: mprotect failed: ", std::strerror(errno));
}

void close_memory(void* base, size_t length) { mprotect(base, length, PROT_NONE); }

int share_memory(void* base, size_t length, bool accessible) {
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "emu-shared-block", 1u /* MFD_CLOEXEC */));
  TORCH_CHECK(fd >= 0, "emu: cannot create a memory file to share a block: ", std::strerror(errno));
  if (!accessible) mprotect(base, length, PROT_READ);
  size_t written = 0;
  bool ok = ftruncate(fd, static_cast<off_t>(length)) == 0;
  while (ok && written < length) {
    const ssize_t n = pwrite(fd, static_cast<const char*>(base) + written, length - written, static_cast<off_t>(written));
    ok = n > 0;
    if (ok) written += static_cast<size_t>(n);
  }
  // the file replaces the anonymous memory at the same address, with the same access rights
  const int prot = accessible ? (PROT_READ | PROT_WRITE) : PROT_NONE;
  if (ok) ok = mmap(base, length, prot, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) != MAP_FAILED;
  if (!ok) {
    const int error = errno;
    if (!accessible) mprotect(base, length, PROT_NONE);
    ::close(fd);
    TORCH_CHECK(false, "emu: cannot move a block onto a memory file to share it: ", std::strerror(error));
  }
  return fd;
}

void* import_memory(int fd, size_t length) {
  const int prot = protection_enabled() ? PROT_NONE : (PROT_READ | PROT_WRITE);
  void* base = mmap(nullptr, length, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping keeps the file
  TORCH_CHECK(base != MAP_FAILED, "emu: cannot map a block shared by another process: ", std::strerror(error));
  return base;
}

}  // namespace emu

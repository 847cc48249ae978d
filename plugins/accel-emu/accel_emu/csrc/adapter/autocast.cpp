// The adapter's autocast policies for emu.
#include "adapter.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace emu {

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

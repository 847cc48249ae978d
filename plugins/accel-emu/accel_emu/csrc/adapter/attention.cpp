// The adapter's choice of implementation for scaled_dot_product_attention on emu (torch's
// _fused_sdp_choice_stub, which torch asks per device type and, without an entry for the device, answers
// with the composite "math" implementation): the host's choice for the same tensors. emu then runs the
// host's fused attention kernel (through the host fallback) where the host would, and its numbers and
// cost are the host's. With dropout the composite stays: its dropout draws from emu's generator, the
// host's fused kernel would draw from the host's.
#include "adapter.h"

#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

namespace emu {
namespace {

// A host tensor over `t`'s memory that asks for gradients as `t` does (the host's choice depends on it).
// Under tracing `t` is a fake tensor without memory: the host tensor then has none either (the choice
// reads sizes, strides, dtypes and flags only).
at::Tensor host_like(const at::Tensor& t) {
  if (t.device().type() != kEmu) return t;
  at::Tensor out = host_alias(t);
  if (t.requires_grad()) out.requires_grad_(true);
  return out;
}

int64_t emu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  if (dropout_p > 0.0) return static_cast<int64_t>(sdp::SDPBackend::math);
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = host_like(*attn_mask);
  // host tensors, and no Python dispatch (a tracer's fake tensor mode would refuse real tensors): the
  // operator dispatches to the host's choice
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(host_like(query), host_like(key), host_like(value), mask, dropout_p, is_causal, scale,
                               enable_gqa);
}

}  // namespace
}  // namespace emu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &emu::emu_fused_sdp_choice)
}  // namespace at::native

// The adapter's native kernels: what a device must implement itself (empty tensors, views, resize, set,
// copies, item), the operators whose host kernel the fallback cannot reach (convolutions, dropout), and
// their registration for PrivateUse1. Every other operator takes the host fallback (fallback.cpp).
#include "adapter.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
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
#include <torch/library.h>

#include <string>
#include <utility>

namespace emu {

// ------------------------------------------------------------------ native kernels
// emu keeps only strided (dense) tensors: its kernels are the host's dense kernels run on its memory,
// and it has no sparse storage formats. Everything that would make or use another layout on emu
// raises NotImplementedError with this text.
[[noreturn]] void refuse_layout(const std::string& op, c10::Layout layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "emu supports only strided (dense) tensors; ", op, " met a ", layout,
                              " tensor on emu. Keep sparse tensors on the host (cpu), or give emu dense ones "
                              "(to_dense() on the host).");
}

namespace {

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

}  // namespace

// A host (cpu) tensor over the same bytes as an emu tensor, through its block's host window, with its
// conj/neg bits.
at::Tensor host_alias(const at::Tensor& t) {
  at::Tensor out = at::from_blob(host_data(t), t.sizes(), t.strides(), t.options().device(c10::DeviceType::CPU));
  if (t.is_conj()) out._set_conj(true);
  if (t.is_neg()) out._set_neg(true);
  return out;
}

namespace {

bool is_pinned_host(const at::Tensor& t) {
  return t.device().is_cpu() && t.has_storage() && t.storage().data() != nullptr &&
         is_pinned_ptr(t.storage().data());
}

void copy_now(const at::Tensor& self, const at::Tensor& dst) {
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

}  // namespace

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
  if (async && same_device && stream.id() == 0) {
    // A copy that would be the only work of the default stream runs now, on this thread: an early
    // completion, which a device may give, and no handing over to the stream's worker and back to the
    // next kernel, which would wait for the stream anyway (emu's kernels run on their caller's thread).
    // Side streams always queue, so a consumer on another stream that does not wait for one still races.
    const bool traced = activity_tracing();
    const int64_t started = traced ? activity_clock() : 0;
    if (stream_queue(device, 0).run_now_if_idle([&] { copy_now(self, dst); })) {
      if (traced) record_activity(true, kind, device, 0, started, activity_clock(), activity_correlation());
      return dst;
    }
  }
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

namespace {

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
  // contiguous, whatever the host's kernel chose: torch lays a convolution out contiguous on a device that
  // overrides the operator (its shape functions say so, and compiled code checks the strides against them)
  return out.to(input.device(), out.scalar_type(), /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
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

// The host's histc counts floating-point tensors only; a device's (CUDA's) counts integer tensors too,
// in their own dtype, and transformers' mixture-of-experts routers count expert indices that way off the
// host. Integers are counted on the host in double (exact up to 2**53) and the counts cast back.
at::Tensor emu_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  check_same_device("aten::histc", {&self});
  c10::DeviceGuard guard(self.device());
  const auto dtype = self.scalar_type();
  auto counts = at::isFloatingType(dtype) ? at::histc(host(self), bins, min, max)
                                          : at::histc(host(self).to(at::kDouble), bins, min, max).to(dtype);
  return counts.to(self.device());
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

}  // namespace

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
  m.impl("histc", emu_histc);
  m.impl("_has_compatible_shallow_copy_type", emu_has_compatible_shallow_copy_type);
}

}  // namespace emu

// The adapter's boxed host fallback: every operator without a native kernel runs on the host over the
// device memory of its operands (through their host windows), with emu's device checks, generators and streams;
// sparse layouts are refused; conjugate and negative views are copied with their bits.
#include "adapter.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/MathBitsFallback.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace emu {
namespace {

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

// What the fallback needs to know about an operator, worked out from its schema on first use.
struct PathEntry {
  FallbackPath path = FallbackPath::kUnknown;
  std::string name;
  bool index_op = false;               // its index tensors may stay on the host
  std::vector<size_t> generator_args;  // the arguments that take a generator
  std::atomic<uint64_t> calls{0};
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

// The entry of `op`, made on its first call; also counts the call (fallback_calls() reports the
// counts). Entries never move or go, so each thread remembers the ones it used and looks them up
// without the lock afterwards: the fallback runs for nearly every operator on emu.
PathEntry& entry_for(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  thread_local std::unordered_map<const void*, PathEntry*> known;
  auto hit = known.find(&schema);
  PathEntry* entry = hit != known.end() ? hit->second : nullptr;
  if (entry == nullptr) {
    auto& cache = path_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    entry = &cache.entries[&schema];
    if (entry->path == FallbackPath::kUnknown) {
      entry->name = c10::toString(schema.operator_name());
      entry->index_op = is_index_op(schema.operator_name());
      for (size_t i = 0; i < schema.arguments().size(); ++i) {
        if (is_generator_type(schema.arguments()[i].type())) entry->generator_args.push_back(i);
      }
      entry->path = choose_path(schema);
    }
    known.emplace(&schema, entry);
  }
  entry->calls.fetch_add(1, std::memory_order_relaxed);
  return *entry;
}

void keep_device_memory(void*) {}  // the device storage owns the bytes

// A host tensor over an emu tensor's storage (its block's host window): same offset, sizes, strides
// and conj/neg bits. Its storage is resizable with the host allocator, so a kernel that resizes an
// `out=` argument gets new host memory instead of failing; direct_fallback copies that back.
at::Tensor host_view_of(const at::Tensor& t) {
  const c10::Storage& device_storage = t.storage();
  void* base = allocator().host_address(device_storage.data());
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
         alias.storage().data() != allocator().host_address(original.storage().data()) || alias.is_conj() != original.is_conj() ||
         alias.is_neg() != original.is_neg();
}

// Copies a host result into new memory on `device` (same sizes, and strides when dense).
at::Tensor to_device_memory(const at::Tensor& result, c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(kEmu, device));
  const bool dense = result.is_non_overlapping_and_dense();
  at::Tensor dst = dense ? at::empty_strided(result.sizes(), result.strides(), result.options().device(kEmu))
                         : at::empty(result.sizes(), result.options().device(kEmu));
  if (result.numel() == 0) return dst;
  at::Tensor view = host_alias(dst);
  if (result.is_conj() || result.is_neg()) {
    view.copy_(result.resolve_conj().resolve_neg());
  } else {
    view.copy_(result);
  }
  return dst;
}

// A host kernel's new result as an emu tensor: the same memory when the kernel allocated it in device
// memory and nothing else holds it, else a copy.
std::atomic<uint64_t> results_copied{0};  // results to_device_memory copied (fallback_results_copied)

at::Tensor result_on_device(const at::Tensor& out, c10::DeviceIndex device, const c10::FunctionSchema& schema) {
  if (out.layout() != c10::Layout::Strided) refuse_layout(c10::toString(schema.operator_name()), out.layout());
  at::Tensor adopted = adopt_host_output(out, device);
  if (adopted.defined()) return adopted;
  results_copied.fetch_add(1, std::memory_order_relaxed);
  return to_device_memory(out, device);
}

void direct_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto begin = stack->size() - num_args;

  // host aliases handed to the kernel, and the device tensors they stand for
  std::vector<std::pair<at::Tensor, at::Tensor>> originals;
  originals.reserve(num_args);  // one per tensor argument, unless lists hold more
  std::vector<size_t> mutated;  // indices into `originals` of arguments the operator writes
  auto swap_in = [&](const at::Tensor& t, bool written) -> at::Tensor {
    if (!t.defined() || t.device().type() != kEmu) return t;
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

  {
    HostOutputsOnDevice outputs_on_device(device);  // new results land in device memory (host_outputs.cpp)
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

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
        slot = c10::IValue(result_on_device(out, device, schema));
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
          back.push_back(result_on_device(out, device, schema));
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
  const PathEntry& entry = entry_for(op);
  const bool index_op = entry.index_op;

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
  for (size_t i : entry.generator_args) {
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
  if (entry.path == FallbackPath::kDirect) {
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
    out.push_back({item.second.name, item.second.path == FallbackPath::kDirect,
                   item.second.calls.load(std::memory_order_relaxed)});
  }
  return out;
}

// An operator with a host (CPU) kernel of its own can still miss emu's fallback: a composite kernel
// takes precedence over a backend fallback, so on emu it would run as a decomposition with other
// numerics than the host's kernel. CompositeExplicitAutograd does so at the backend (native_layer_norm
// through batch norm, addr, group norm); CompositeImplicitAutograd does so at the autograd key
// whenever emu has no kernel of its own (mish_backward, silu_backward). Such operators get the
// fallback as emu's own kernel. So do structured operators' functional and in-place forms
// (CompositeExplicitAutogradNonFunctional): their numerics are the host's either way, but the composite
// works the result's shape out on emu before the host kernel does it again. Left alone: views and
// composites that are an operator's only source of gradients.
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
    // CompositeExplicitAutogradNonFunctional: a structured operator's functional and in-place forms, which
    // would work out the result's shape on emu and call the `out=` form; the host's kernel does both at once
    const bool explicit_composite = handle->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
                                    handle->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional);
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

uint64_t fallback_results_copied() { return results_copied.load(std::memory_order_relaxed); }

void reset_fallback_calls() {
  results_copied.store(0, std::memory_order_relaxed);
  auto& cache = path_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  for (auto& item : cache.entries) item.second.calls.store(0, std::memory_order_relaxed);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
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

}  // namespace emu

// The adapter's collective backend for torch.distributed: emu_ccl, registered for the emu device type,
// stages emu tensors through a host (gloo) process group built from the same store.
#include "adapter.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

#include <algorithm>
#include <string>
#include <vector>

namespace emu {
namespace {

// A finished collective: emu_ccl runs each collective to completion on the host before
// returning, so the work is complete and its future already holds the result.
class DoneWork final : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> result, c10d::OpType type)
      : c10d::Work(-1, type), result_(std::move(result)) {
    std::vector<c10::Device> devices;
    for (const auto& t : result_) {
      if (t.defined() && t.device().type() == kEmu &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

at::Tensor to_host(const at::Tensor& t) { return t.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/false, /*copy=*/true); }

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(to_host(t));
  return out;
}

void copy_back(std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

void finish(const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait();
}

class EmuCCL final : public c10d::Backend {
 public:
  EmuCCL(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
      : c10d::Backend(rank, size), host_(std::move(host)) {}

  const std::string getBackendName() const override { return "emu_ccl"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    auto host = to_host(tensors);
    finish(host_->broadcast(host, opts));
    copy_back(tensors, host);
    return done(tensors, c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    auto host = to_host(tensors);
    finish(host_->allreduce(host, opts));
    copy_back(tensors, host);
    return done(tensors, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    auto host = to_host(tensors);
    finish(host_->allreduce_coalesced(host, opts));
    copy_back(tensors, host);
    return done(tensors, c10d::OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    auto host = to_host(tensors);
    finish(host_->reduce(host, opts));
    copy_back(tensors, host);
    return done(tensors, c10d::OpType::REDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    auto host_in = to_host(inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    for (auto& list : outputs) host_out.push_back(to_host(list));
    finish(host_->allgather(host_out, host_in, opts));
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < outputs.size(); ++i) {
      copy_back(outputs[i], host_out[i]);
      flat.insert(flat.end(), outputs[i].begin(), outputs[i].end());
    }
    return done(flat, c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    auto host_in = to_host(input);
    auto host_out = to_host(output);
    finish(host_->_allgather_base(host_out, host_in, opts));
    output.copy_(host_out);
    return done({output}, c10d::OpType::_ALLGATHER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    for (size_t i = 0; i < outputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
    return done(outputs, c10d::OpType::COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    auto host_in = to_host(inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    for (auto& list : outputs) host_out.push_back(to_host(list));
    finish(host_->gather(host_out, host_in, opts));
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < outputs.size(); ++i) {
      copy_back(outputs[i], host_out[i]);
      flat.insert(flat.end(), outputs[i].begin(), outputs[i].end());
    }
    return done(flat, c10d::OpType::GATHER);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    auto host_out = to_host(outputs);
    std::vector<std::vector<at::Tensor>> host_in;
    for (auto& list : inputs) host_in.push_back(to_host(list));
    finish(host_->scatter(host_out, host_in, opts));
    copy_back(outputs, host_out);
    return done(outputs, c10d::OpType::SCATTER);
  }

  // reduce-scatter is staged as a host all-reduce of the whole input followed by taking this
  // rank's share: simple and correct for every reduce op, at world_size times the traffic.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "emu_ccl reduce_scatter takes one output tensor");
    std::vector<at::Tensor> flat;
    for (const auto& t : inputs[0]) flat.push_back(to_host(t).reshape({-1}));
    std::vector<at::Tensor> joined{at::cat(flat)};
    c10d::AllreduceOptions ar;
    ar.reduceOp = opts.reduceOp;
    ar.timeout = opts.timeout;
    finish(host_->allreduce(joined, ar));
    const int64_t n = outputs[0].numel();
    outputs[0].copy_(joined[0].narrow(0, n * getRank(), n).view(outputs[0].sizes()));
    return done(outputs, c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> joined{to_host(input).reshape({-1})};
    c10d::AllreduceOptions ar;
    ar.reduceOp = opts.reduceOp;
    ar.timeout = opts.timeout;
    finish(host_->allreduce(joined, ar));
    const int64_t n = output.numel();
    output.copy_(joined[0].narrow(0, n * getRank(), n).view(output.sizes()));
    return done({output}, c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    for (size_t i = 0; i < outputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
    return done(outputs, c10d::OpType::COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split, std::vector<int64_t>& input_split,
                                               const c10d::AllToAllOptions& opts) override {
    auto host_in = to_host(input);
    auto host_out = to_host(output);
    finish(host_->alltoall_base(host_out, host_in, output_split, input_split, opts));
    output.copy_(host_out);
    return done({output}, c10d::OpType::ALLTOALL_BASE);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    auto host = to_host(tensors);
    finish(host_->send(host, dst, tag));
    return done(tensors, c10d::OpType::SEND);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    auto host = to_host(tensors);
    finish(host_->recv(host, src, tag));
    copy_back(tensors, host);
    return done(tensors, c10d::OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    c10d::BarrierOptions host_opts = opts;
    host_opts.device_ids.clear();
    host_opts.device = std::nullopt;
    finish(host_->barrier(host_opts));
    return done({}, c10d::OpType::BARRIER);
  }

 private:
  static c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> result, c10d::OpType type) {
    // the results were written by copies queued on the current stream: wait for them, as a
    // device collective library would before reporting completion
    for (const auto& t : result) {
      if (t.defined() && t.device().type() == kEmu) wait_current_stream(t.device().index());
    }
    return c10::make_intrusive<DoneWork>(std::move(result), type);
  }
  c10::intrusive_ptr<c10d::Backend> host_;
};

}  // namespace

void define_collectives(py::module_& m) {
  py::object base = py::module::import("torch._C._distributed_c10d").attr("Backend");
  py::class_<EmuCCL, c10::intrusive_ptr<EmuCCL>>(m, "EmuCCL", base)
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, int, int>(), py::arg("host"), py::arg("rank"),
           py::arg("size"));
}

}  // namespace emu

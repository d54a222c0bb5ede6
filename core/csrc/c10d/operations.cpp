// The c10d glue's operations (<accelkit/c10d/backend.h>): each collective and point-to-point
// call of c10d::Backend checked, described (CallInfo) and queued as transport calls.
#include "c10d/transport_backend.h"  // and <accelkit/c10d/backend.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <optional>

namespace accelkit::c10d {

// -- TransportBackend: operations ---------------------------------------------------------------

c10::intrusive_ptr<::c10d::Work> TransportBackend::broadcast(std::vector<at::Tensor>& tensors,
                                           const ::c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  CallInfo call = collective(Kind::kBroadcast, "broadcast", opts.timeout, t);
  call.root = static_cast<int>(opts.rootRank);
  Staged buf(t, /*copy_in=*/true);
  return enqueue(::c10d::OpType::BROADCAST, call, tensors, [this, buf](const CallInfo& call, QueuedWork&) {
    transport_->broadcast(call, buf.dense.data_ptr());
    buf.copy_out();
  });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allreduce(std::vector<at::Tensor>& tensors,
                                           const ::c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  TORCH_CHECK(!opts.sparseIndices.has_value() && t.layout() == at::kStrided,
              name_, ": allreduce supports dense (strided) tensors only, got ", t.layout());
  auto job = reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce", opts.timeout, -1);
  return enqueue(::c10d::OpType::ALLREDUCE, job.call, tensors, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), name_, ": allreduce_coalesced needs at least one tensor");
  std::vector<Job> jobs;
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    jobs.push_back(reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce_coalesced",
                             opts.timeout, -1));
  }
  return enqueue_all(::c10d::OpType::ALLREDUCE_COALESCED, std::move(jobs), tensors);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce(std::vector<at::Tensor>& tensors,
                                        const ::c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  auto job = reduction(t, t, opts.reduceOp, Kind::kReduce, "reduce", opts.timeout,
                       static_cast<int>(opts.rootRank));
  return enqueue(::c10d::OpType::REDUCE, job.call, tensors, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const ::c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, name_, ": allgather takes one output list per process, got ",
              outputs.size());
  check_list(outputs[0], in, size_, "allgather", "output");
  auto job = gather_job(outputs[0], in, Kind::kAllgather, "allgather", opts.timeout, -1);
  return enqueue(::c10d::OpType::ALLGATHER, job.call, outputs[0], std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives rank r's inputs[i] (torch.distributed.all_gather_coalesced's layout,
  // ProcessGroupGloo::allgather_coalesced's): one list per rank, one tensor per input.
  TORCH_CHECK(!inputs.empty(), name_, ": allgather_coalesced needs at least one input");
  TORCH_CHECK(outputs.size() == static_cast<size_t>(size_), name_, ": allgather_coalesced takes "
              "one output list per rank (", size_, "), each with one tensor per input, got ",
              outputs.size(), " lists");
  for (size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), name_, ": allgather_coalesced: the output "
                "list for rank ", r, " has ", outputs[r].size(), " tensors for ", inputs.size(),
                " inputs");
  }
  std::vector<Job> jobs;
  std::vector<at::Tensor> all_outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_coalesced");
    std::vector<at::Tensor> gathered;  // inputs[i] of every rank
    gathered.reserve(outputs.size());
    for (const auto& per_rank : outputs) gathered.push_back(per_rank[i]);
    check_list(gathered, inputs[i], size_, "allgather_coalesced", "output");
    jobs.push_back(
        gather_job(gathered, inputs[i], Kind::kAllgather, "allgather_coalesced", opts.timeout,
                   -1));
    all_outputs.insert(all_outputs.end(), gathered.begin(), gathered.end());
  }
  return enqueue_all(::c10d::OpType::ALLGATHER_COALESCED, std::move(jobs), all_outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const ::c10d::AllgatherOptions& opts) {
  check_tensor(input, "_allgather_base");
  auto job = gather_base_job(output, input, "_allgather_base", opts.timeout);
  return enqueue(::c10d::OpType::_ALLGATHER_BASE, job.call, {output}, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), name_, ": allgather_into_tensor_coalesced got ",
              inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<Job> jobs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_into_tensor_coalesced");
    jobs.push_back(
        gather_base_job(outputs[i], inputs[i], "allgather_into_tensor_coalesced", opts.timeout));
  }
  return enqueue_all(::c10d::OpType::COALESCED, std::move(jobs), outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const ::c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  check_root(opts.rootRank, "gather");
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs;
  if (root) {
    TORCH_CHECK(outputs.size() == 1, name_, ": gather takes one output list on the root, got ",
                outputs.size());
    check_list(outputs[0], in, size_, "gather", "output");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), name_,
                ": gather takes no output list on non-root ranks");
  }
  auto job = gather_job(outs, in, Kind::kGather, "gather", opts.timeout,
                        static_cast<int>(opts.rootRank));
  return enqueue(::c10d::OpType::GATHER, job.call, outs, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const ::c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  const bool root = opts.rootRank == rank_;
  at::Tensor packed;
  if (root) {
    TORCH_CHECK(inputs.size() == 1, name_, ": scatter takes one input list on the root, got ",
                inputs.size());
    check_list(inputs[0], out, size_, "scatter", "input");
    packed = pack(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), name_,
                ": scatter takes no input list on non-root ranks");
  }
  CallInfo call = collective(Kind::kScatter, "scatter", opts.timeout, out);
  call.root = static_cast<int>(opts.rootRank);
  Staged dst(out, /*copy_in=*/false);
  return enqueue(::c10d::OpType::SCATTER, call, outputs, [this, packed, dst](const CallInfo& call, QueuedWork&) {
    transport_->scatter(call, packed.defined() ? packed.data_ptr() : nullptr,
                        dst.dense.data_ptr());
    dst.copy_out();
  });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const ::c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, name_, ": reduce_scatter takes one input list per process, "
              "got ", inputs.size());
  check_list(inputs[0], out, size_, "reduce_scatter", "input");
  auto job = reduction(pack(inputs[0]), out, opts.reduceOp, Kind::kReduceScatter,
                       "reduce_scatter", opts.timeout, -1);
  return enqueue(::c10d::OpType::REDUCE_SCATTER, job.call, outputs, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  auto job = reduce_scatter_base_job(output, input, opts, "_reduce_scatter_base");
  return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, job.call, {output}, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), name_, ": reduce_scatter_tensor_coalesced got ",
              inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<Job> jobs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    jobs.push_back(
        reduce_scatter_base_job(outputs[i], inputs[i], opts, "reduce_scatter_tensor_coalesced"));
  }
  return enqueue_all(::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(jobs), outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const ::c10d::AllToAllOptions& opts) {
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  check_same_dtype(output, input, "alltoall_base");
  auto send = split_counts(input, input_splits, "input");
  auto recv = split_counts(output, output_splits, "output");
  CallInfo call = collective(Kind::kAlltoall, "alltoall_base", opts.timeout, input);
  call.count = 0;  // per-peer counts instead, checked by the transport
  Staged src(input, true);
  Staged dst(output, false);
  return enqueue(::c10d::OpType::ALLTOALL_BASE, call, {output},
                 [this, src, dst, send, recv](const CallInfo& call, QueuedWork&) {
                   transport_->alltoall(call, src.dense.data_ptr(), send.first, send.second,
                                        dst.dense.data_ptr(), recv.first, recv.second);
                   dst.copy_out();
                 });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == inputs.size(),
              name_, ": alltoall takes ", size_, " inputs and ", size_, " outputs, got ",
              inputs.size(), " and ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "alltoall");
    check_tensor(outputs[i], "alltoall");
    check_same_dtype(outputs[i], inputs[0], "alltoall");
    check_same_dtype(inputs[i], inputs[0], "alltoall");
  }
  std::pair<std::vector<int64_t>, std::vector<int64_t>> send, recv;
  for (size_t i = 0; i < inputs.size(); ++i) {
    send.first.push_back(inputs[i].numel());
    send.second.push_back(i == 0 ? 0 : send.second[i - 1] + send.first[i - 1]);
    recv.first.push_back(outputs[i].numel());
    recv.second.push_back(i == 0 ? 0 : recv.second[i - 1] + recv.first[i - 1]);
  }
  at::Tensor packed = pack(inputs);
  at::Tensor received = at::empty({recv.second.back() + recv.first.back()}, packed.options());
  CallInfo call = collective(Kind::kAlltoall, "alltoall", opts.timeout, inputs[0]);
  call.count = 0;  // per-peer counts instead, checked by the transport
  return enqueue(::c10d::OpType::ALLTOALL, call, outputs,
                 [this, packed, received, send, recv, outputs](const CallInfo& call, QueuedWork&) {
                   transport_->alltoall(call, packed.data_ptr(), send.first, send.second,
                                        received.data_ptr(), recv.first, recv.second);
                   unpack(received, outputs);
                 });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) {
  const at::Tensor& t = single(tensors, "send");
  check_peer(dst, "send");
  CallInfo call = point_to_point(Kind::kSend, "send", t);
  Staged buf(t, true);
  return enqueue_on(p2p_worker(dst, true), ::c10d::OpType::SEND, call, tensors,
                    [this, buf, dst, tag](const CallInfo& call, QueuedWork&) {
                      transport_->send(call, buf.dense.data_ptr(), dst, tag);
                    });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) {
  const at::Tensor& t = single(tensors, "recv");
  check_peer(src, "recv");
  CallInfo call = point_to_point(Kind::kRecv, "recv", t);
  Staged buf(t, false);
  return enqueue_on(p2p_worker(src, false), ::c10d::OpType::RECV, call, tensors,
                    [this, buf, src, tag](const CallInfo& call, QueuedWork& work) {
                      transport_->recv(call, buf.dense.data_ptr(), src, tag);
                      buf.copy_out();
                      work.set_source_rank(src);
                    });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) {
  const at::Tensor& t = single(tensors, "recv");
  CallInfo call = point_to_point(Kind::kRecv, "recv (any source)", t);
  Staged buf(t, false);
  return enqueue_on(p2p_worker(-1, false), ::c10d::OpType::RECVANYSOURCE, call, tensors,
                    [this, buf, tag](const CallInfo& call, QueuedWork& work) {
                      int src = transport_->recv_any(call, buf.dense.data_ptr(), tag);
                      buf.copy_out();
                      work.set_source_rank(src);
                    });
}

CallInfo TransportBackend::collective(Kind kind, const char* name,
                                      std::chrono::milliseconds timeout) {
  check_open(name);
  CallInfo call;
  call.kind = kind;
  call.name = name;
  call.timeout = timeout == ::c10d::kUnsetTimeout ? timeout_ : timeout;
  return call;
}

CallInfo TransportBackend::collective(Kind kind, const char* name, std::chrono::milliseconds timeout,
                    const at::Tensor& t) {
  CallInfo call = collective(kind, name, timeout);
  call.dtype = t.scalar_type();
  call.count = t.numel();
  if (t.device().type() == device_type_) call.device = t.device().index();
  return call;
}

CallInfo TransportBackend::point_to_point(Kind kind, const char* name, const at::Tensor& t) {
  check_open(name);
  CallInfo call;
  call.kind = kind;
  call.name = name;
  call.dtype = t.scalar_type();
  call.count = t.numel();
  if (t.device().type() == device_type_) call.device = t.device().index();
  call.timeout = timeout_;
  return call;
}

void TransportBackend::check_tensor(const at::Tensor& t, const char* op) const {
  TORCH_CHECK(t.defined(), name_, ": ", op, " got an undefined tensor");
  TORCH_CHECK(t.device().type() == device_type_, name_, ": ", op, " got a tensor on ",
              t.device(), "; ", name_, " handles ", c10::DeviceTypeName(device_type_, true),
              " tensors (use '", c10::DeviceTypeName(device_type_, true), ":", name_,
              ",cpu:gloo' as the backend for CPU tensors)");
  TORCH_CHECK(t.layout() == at::kStrided, name_, ": ", op,
              " supports dense (strided) tensors only, got ", t.layout());
}

const at::Tensor& TransportBackend::single(const std::vector<at::Tensor>& tensors, const char* op) const {
  TORCH_CHECK(tensors.size() == 1, name_, ": ", op,
              " takes exactly one tensor per process (one device per rank), got ",
              tensors.size());
  check_tensor(tensors[0], op);
  return tensors[0];
}

void TransportBackend::check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) const {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), name_, ": ", op,
              " needs one dtype for inputs and outputs, got ", a.scalar_type(), " and ",
              b.scalar_type());
}

void TransportBackend::check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref, int expected,
                const char* op, const char* what) const {
  TORCH_CHECK(static_cast<int>(list.size()) == expected, name_, ": ", op, " needs ", expected,
              " ", what, " tensors (the group size), got ", list.size());
  for (const auto& t : list) {
    check_tensor(t, op);
    check_same_dtype(t, ref, op);
    TORCH_CHECK(t.numel() == ref.numel(), name_, ": ", op, " needs every ", what,
                " tensor to have ", ref.numel(), " elements, got ", t.numel());
  }
}

void TransportBackend::check_root(int64_t root, const char* op) const {
  TORCH_CHECK(root >= 0 && root < size_, name_, ": ", op, " root rank ", root,
              " is out of range for a group of ", size_, " ranks");
}

void TransportBackend::check_peer(int peer, const char* op) const {
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": ", op, " peer rank ", peer,
              " is invalid for rank ", rank_, " in a group of ", size_, " ranks");
}

at::Tensor TransportBackend::pack(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void TransportBackend::unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (const auto& out : outputs) {
    out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
    offset += out.numel();
  }
}

TransportBackend::Job TransportBackend::reduction(const at::Tensor& in, const at::Tensor& out, const ::c10d::ReduceOp& op, Kind kind,
              const char* name, std::chrono::milliseconds timeout, int root) {
  check_same_dtype(in, out, name);
  const auto dtype = out.scalar_type();
  CallInfo call = collective(kind, name, timeout, out);
  call.root = root;
  at::Tensor src = in;
  bool average = false;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: call.op = RedOp::kSum; break;
    case ::c10d::ReduceOp::PRODUCT: call.op = RedOp::kProduct; break;
    case ::c10d::ReduceOp::MIN: call.op = RedOp::kMin; break;
    case ::c10d::ReduceOp::MAX: call.op = RedOp::kMax; break;
    case ::c10d::ReduceOp::BAND: call.op = RedOp::kBand; break;
    case ::c10d::ReduceOp::BOR: call.op = RedOp::kBor; break;
    case ::c10d::ReduceOp::BXOR: call.op = RedOp::kBxor; break;
    case ::c10d::ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), name_, ": ", name,
                  " with ReduceOp.AVG needs a floating-point or complex tensor, got ", dtype,
                  " (use SUM and divide)");
      call.op = RedOp::kSum;
      average = true;
      break;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      auto* factor = dynamic_cast<::c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(factor != nullptr, name_, ": ", name, " with PREMUL_SUM has no factor");
      src = factor->tensor_factor.defined() ? in.mul(factor->tensor_factor.to(in.device()))
                                            : in.mul(factor->double_factor);
      call.op = RedOp::kSum;
      break;
    }
    default:
      TORCH_CHECK(false, name_, ": ", name, " does not support reduce op ",
                  static_cast<int>(op.op_));
  }
  const bool bitwise = call.op == RedOp::kBand || call.op == RedOp::kBor ||
                       call.op == RedOp::kBxor;
  TORCH_CHECK(!bitwise || at::isIntegralType(dtype, /*includeBool=*/true), name_, ": ", name,
              " with a bitwise reduce op needs an integer or bool tensor, got ", dtype);
  TORCH_CHECK(!at::isComplexType(dtype) || call.op == RedOp::kSum ||
                  call.op == RedOp::kProduct,
              name_, ": ", name, " on complex tensors supports SUM, AVG, PRODUCT and "
              "PREMUL_SUM only, got ", redop_name(call.op));
  Staged source(src, true);
  Staged dest(out, false);
  const int size = size_;
  const bool writes = kind != Kind::kReduce || root == rank_;
  Run run = [this, source, dest, average, size, writes](const CallInfo& call, QueuedWork&) {
    switch (call.kind) {
      case Kind::kAllreduce:
        transport_->allreduce(call, source.dense.data_ptr(), dest.dense.data_ptr());
        break;
      case Kind::kReduce:
        transport_->reduce(call, source.dense.data_ptr(), dest.dense.data_ptr());
        break;
      default:
        transport_->reduce_scatter(call, source.dense.data_ptr(), dest.dense.data_ptr());
    }
    if (!writes) return;
    if (average) dest.dense.div_(size);
    dest.copy_out();
  };
  return {call, std::move(run)};
}

TransportBackend::Job TransportBackend::reduce_scatter_base_job(const at::Tensor& output, const at::Tensor& input,
                            const ::c10d::ReduceScatterOptions& opts, const char* name) {
  check_tensor(input, name);
  check_tensor(output, name);
  TORCH_CHECK(input.numel() == output.numel() * size_, name_, ": ", name,
              " needs an input of group size x output elements (", size_, " x ",
              output.numel(), " = ", output.numel() * size_, "), got ", input.numel());
  return reduction(input, output, opts.reduceOp, Kind::kReduceScatter, name, opts.timeout, -1);
}

TransportBackend::Job TransportBackend::gather_job(const std::vector<at::Tensor>& outs, const at::Tensor& in, Kind kind,
               const char* name, std::chrono::milliseconds timeout, int root) {
  CallInfo call = collective(kind, name, timeout, in);
  call.root = root;
  Staged src(in, true);
  at::Tensor packed;
  if (!outs.empty()) packed = at::empty({in.numel() * size_}, in.options());
  Run run = [this, src, packed, outs](const CallInfo& call, QueuedWork&) {
    void* out = packed.defined() ? packed.data_ptr() : nullptr;
    if (call.kind == Kind::kAllgather) {
      transport_->allgather(call, src.dense.data_ptr(), out);
    } else {
      transport_->gather(call, src.dense.data_ptr(), out);
    }
    if (packed.defined()) unpack(packed, outs);
  };
  return {call, std::move(run)};
}

TransportBackend::Job TransportBackend::gather_base_job(const at::Tensor& output, const at::Tensor& input, const char* name,
                    std::chrono::milliseconds timeout) {
  check_tensor(output, name);
  check_same_dtype(output, input, name);
  TORCH_CHECK(output.numel() == input.numel() * size_, name_, ": ", name,
              " needs an output of group size x input elements (", size_, " x ",
              input.numel(), " = ", input.numel() * size_, "), got ", output.numel());
  CallInfo call = collective(Kind::kAllgather, name, timeout, input);
  Staged src(input, true);
  Staged dst(output, false);
  Run run = [this, src, dst](const CallInfo& call, QueuedWork&) {
    transport_->allgather(call, src.dense.data_ptr(), dst.dense.data_ptr());
    dst.copy_out();
  };
  return {call, std::move(run)};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> TransportBackend::split_counts(
    const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) const {
  std::vector<int64_t> counts(size_), offsets(size_);
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  if (splits.empty()) {
    TORCH_CHECK(rows % size_ == 0, name_, ": alltoall_base ", what, " has ", rows,
                " rows, not divisible by the group size ", size_,
                "; pass split sizes for uneven splits");
    for (int i = 0; i < size_; ++i) counts[i] = rows / size_ * row;
  } else {
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, name_, ": alltoall_base needs ",
                size_, " ", what, " split sizes (the group size), got ", splits.size());
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      TORCH_CHECK(splits[i] >= 0, name_, ": alltoall_base ", what, " split size ", splits[i],
                  " is negative");
      counts[i] = splits[i] * row;
      total += splits[i];
    }
    TORCH_CHECK(total == rows, name_, ": alltoall_base ", what, " split sizes sum to ", total,
                " but the tensor has ", rows, " rows");
  }
  for (int i = 1; i < size_; ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return {counts, offsets};
}

}  // namespace accelkit::c10d

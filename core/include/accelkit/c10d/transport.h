// accelkit collectives transport interface: the part of a c10d backend a vendor replaces with
// calls into their collective library (NCCL, HCCL, XCCL, ...). <accelkit/c10d/backend.h> turns
// c10d's tensor-list API (views, non-contiguous tensors, AVG, PREMUL_SUM, coalescing, Work and
// futures, per-op timeouts) into these calls on dense buffers, so a transport only moves and
// reduces bytes. The mock's shared-memory transport is backends/mock/csrc/mockccl_shm.h (with the
// mockccl_*.cpp files it lists).
//
// Contract for every collective call:
//  * All ranks of the group call the same collective with the same CallInfo (seq, kind, dtype,
//    count, reduce op, root) in the same order. A transport must DETECT a mismatch (different
//    kind, dtype, count, op or root) and throw on every rank, never corrupt data or hang.
//  * Buffers are dense and live on device `call.device`; `in` may equal `out`. A transport reads
//    and writes them the way its device allows: a host-accessible device's memory directly, a
//    discrete device's through its driver (the mock's transport stages through the runtime's
//    copies, device_runtime() in <accelkit/c10d/backend.h>). On an asynchronous device the glue
//    calls the transport once the work that produced the inputs is done.
//  * The call returns when `out` holds the result, or throws c10::DistBackendError naming the
//    collective, the sequence number and, for timeouts, the ranks that never arrived.
//  * Calls come from one thread per group, in order. send/recv may come from other threads
//    (one per peer and direction, and one for receives from any source), concurrently with
//    collectives; a message is taken by exactly one receive.
//  * abort() may come from any thread while calls run.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace accelkit::c10d {

// What is being done; part of the per-call header every rank checks.
enum class Kind : uint8_t {
  kBarrier = 0,
  kBroadcast,
  kAllreduce,
  kReduce,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kSend,
  kRecv,
};

// The reductions a transport implements. AVG and PREMUL_SUM are built on kSum by the glue.
// Bitwise ops are valid on integer and bool dtypes only (the glue rejects others).
enum class RedOp : int8_t { kNone = -1, kSum = 0, kProduct, kMin, kMax, kBand, kBor, kBxor };

inline const char* kind_name(Kind k) {
  static const char* names[] = {"barrier", "broadcast", "allreduce", "reduce", "allgather",
                                "reduce_scatter", "gather", "scatter", "alltoall", "send", "recv"};
  return names[static_cast<int>(k)];
}

inline const char* redop_name(RedOp op) {
  static const char* names[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"};
  return op == RedOp::kNone ? "-" : names[static_cast<int>(op)];
}

// The per-call header. `count` is in elements of `dtype`:
//   allreduce/reduce/broadcast: the buffer; allgather/gather: each rank's contribution;
//   reduce_scatter/scatter: each rank's result; alltoall: unused (per-peer counts instead).
struct CallInfo {
  Kind kind = Kind::kBarrier;
  std::string name;  // the c10d entry point, for messages ("_allgather_base", ...)
  uint64_t seq = 0;  // 1-based collective sequence number of the group
  c10::ScalarType dtype = c10::ScalarType::Byte;
  int64_t count = 0;
  RedOp op = RedOp::kNone;
  int root = -1;
  std::chrono::milliseconds timeout{0};
  int device = -1;  // index of the device the buffers live on (-1: none, e.g. barrier)
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank waits until all ranks arrived. NCCL: an allreduce of one element.
  virtual void barrier(const CallInfo& call) = 0;
  // `buf` of `count` elements on every rank gets root's data. NCCL: ncclBroadcast.
  virtual void broadcast(const CallInfo& call, void* buf) = 0;
  // out = op over ranks of in, on every rank. NCCL: ncclAllReduce.
  virtual void allreduce(const CallInfo& call, const void* in, void* out) = 0;
  // As allreduce, but only root's `out` is written (may be null elsewhere). NCCL: ncclReduce.
  virtual void reduce(const CallInfo& call, const void* in, void* out) = 0;
  // out[size * count] = concatenation of every rank's in[count]. NCCL: ncclAllGather.
  virtual void allgather(const CallInfo& call, const void* in, void* out) = 0;
  // out[count] = op over ranks of their in[rank * count : (rank + 1) * count].
  // NCCL: ncclReduceScatter.
  virtual void reduce_scatter(const CallInfo& call, const void* in, void* out) = 0;
  // As allgather, only root's `out` is written. NCCL: grouped send/recv.
  virtual void gather(const CallInfo& call, const void* in, void* out) = 0;
  // out[count] = root's in[rank * count : (rank + 1) * count]. NCCL: grouped send/recv.
  virtual void scatter(const CallInfo& call, const void* in, void* out) = 0;
  // Rank r sends send_counts[p] elements at in + send_offsets[p] to every peer p and receives
  // recv_counts[p] elements at out + recv_offsets[p] from it (offsets in elements). Every rank
  // checks that what p sends it equals what it expects. NCCL: grouped ncclSend/ncclRecv.
  virtual void alltoall(const CallInfo& call, const void* in, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& send_offsets, void* out,
                        const std::vector<int64_t>& recv_counts,
                        const std::vector<int64_t>& recv_offsets) = 0;
  // Point to point, `call.count` elements; the receiver checks tag and size.
  // NCCL: ncclSend / ncclRecv.
  virtual void send(const CallInfo& call, const void* buf, int peer, int tag) = 0;
  virtual void recv(const CallInfo& call, void* buf, int peer, int tag) = 0;
  // Receive from whichever peer sends first with `tag`; returns that peer's rank.
  virtual int recv_any(const CallInfo& call, void* buf, int tag) = 0;

  // Make every call in flight, and every later call, raise c10::DistBackendError promptly
  // (within moments, not at its timeout), naming `reason`; peers' calls that need this rank
  // should fail promptly too where the library can tell them. May be called from any thread
  // while calls run (teardown with operations in flight). NCCL: ncclCommAbort.
  virtual void abort(const std::string& reason) = 0;

  // Release shared resources. Called once, after the last call returned; idempotent.
  virtual void shutdown() = 0;
};

}  // namespace accelkit::c10d

// mockccl's point-to-point messages (mockccl_shm.h). Each ordered pair of ranks has a mailbox
// of one chunk: the sender posts a message chunk by chunk (waiting until the receiver took the
// previous one), with the message's size and tag in the mailbox. A receive from a peer takes
// that peer's messages in the order they were sent: the first one with the receive's tag is
// delivered; one with another tag is kept in this process, in order, for the receive that asks
// for its tag (it may be running on another thread: the receives of torch.distributed's irecv
// and batch_isend_irecv are queued per peer, a receive from any source runs on a thread of
// its own). So messages match by (peer, tag) and keep their order within a tag, as gloo's do
// (torch.distributed.send/recv document the tag as what matches a send with its recv).
#include "mockccl_shm.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "mockccl_staging.h"

namespace mockccl {

void ShmTransport::send(const CallInfo& call, const void* buf, int peer, int tag) {
  Staging stage(runtime_, call.device);
  send_host(call, stage.in(buf, call.count * c10::elementSize(call.dtype)), peer, tag);
}

void ShmTransport::recv(const CallInfo& call, void* buf, int peer, int tag) {
  Staging stage(runtime_, call.device);
  recv_host(call, stage.out(buf, call.count * c10::elementSize(call.dtype)), peer, tag);
  stage.finish();
}

int ShmTransport::recv_any(const CallInfo& call, void* buf, int tag) {
  Staging stage(runtime_, call.device);
  const int from = recv_any_host(call, stage.out(buf, call.count * c10::elementSize(call.dtype)),
                                 tag);
  stage.finish();
  return from;
}

void ShmTransport::send_host(const CallInfo& call, const void* buf, int peer, int tag) {
  check_usable(call);
  Deadline deadline(call.timeout);
  Mailbox& box = mailbox(rank_, peer);
  char* data = mailbox_data(rank_, peer);
  const int64_t total = call.count * static_cast<int64_t>(c10::elementSize(call.dtype));
  const char* src = static_cast<const char*>(buf);
  int64_t off = 0;
  do {
    const int64_t n = std::min<int64_t>(p2p_chunk_, total - off);
    wait_for(call, deadline, [&] { return box.taken.load(std::memory_order_acquire) ==
                                           box.posted.load(std::memory_order_relaxed); },
             [&] { return std::vector<int>{peer}; }, "receive (recv) what it sends");
    std::memcpy(data, src + off, n);
    box.total_bytes = total;
    box.bytes = n;
    box.tag = tag;
    box.first = off == 0;
    box.posted.fetch_add(1, std::memory_order_release);
    ring();
    off += n;
  } while (off < total);
}

// Waits (without holding any claim) until `peer` has a kept message with `tag` or a new
// message in its mailbox, then handles it under the peer's claim; repeats until a message
// with `tag` was delivered.
void ShmTransport::recv_host(const CallInfo& call, void* buf, int peer, int tag) {
  check_usable(call);
  Deadline deadline(call.timeout);
  for (;;) {
    std::unique_lock<std::mutex> claim;
    wait_for(call, deadline, [&] {
      std::unique_lock<std::mutex> lock(recv_claims_[peer], std::try_to_lock);
      if (!lock.owns_lock()) return false;  // another receive is taking peer's messages
      const bool kept = std::any_of(kept_[peer].begin(), kept_[peer].end(),
                                    [&](const Kept& k) { return k.tag == tag; });
      if (!kept && !message_waiting(peer)) return false;
      claim = std::move(lock);
      return true;
    }, [&] { return std::vector<int>{peer}; }, "send");
    if (take_kept(call, peer, tag, buf) || take_message(call, deadline, peer, tag, buf)) return;
  }
}

int ShmTransport::recv_any_host(const CallInfo& call, void* buf, int tag) {
  check_usable(call);
  Deadline deadline(call.timeout);
  for (;;) {
    int from = -1;
    std::unique_lock<std::mutex> claim;
    wait_for(call, deadline, [&] {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        std::unique_lock<std::mutex> lock(recv_claims_[p], std::try_to_lock);
        if (!lock.owns_lock()) continue;  // a recv(p) is taking p's messages
        const bool kept = std::any_of(kept_[p].begin(), kept_[p].end(),
                                      [&](const Kept& k) { return k.tag == tag; });
        if (kept || message_waiting(p)) {
          from = p;
          claim = std::move(lock);
          return true;
        }
      }
      return false;
    }, [&] { return peers(); }, "send");
    if (take_kept(call, from, tag, buf) || take_message(call, deadline, from, tag, buf)) {
      return from;
    }
  }
}

// The first chunk of a message from `peer` is in the mailbox (caller holds peer's claim).
bool ShmTransport::message_waiting(int peer) const {
  const Mailbox& box = mailbox(peer, rank_);
  return box.posted.load(std::memory_order_acquire) > box.taken.load(std::memory_order_relaxed);
}

// Delivers the oldest kept message of `peer` with `tag` into `buf`; false if there is none.
bool ShmTransport::take_kept(const CallInfo& call, int peer, int tag, void* buf) {
  auto& kept = kept_[peer];
  auto it = std::find_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.tag == tag; });
  if (it == kept.end()) return false;
  check_size(call, peer, tag, static_cast<int64_t>(it->bytes.size()));
  std::memcpy(buf, it->bytes.data(), it->bytes.size());
  kept.erase(it);
  return true;
}

// Takes the message in `peer`'s mailbox, chunk by chunk: into `buf` if it has `tag` (true),
// else into a kept message for a later receive (false).
bool ShmTransport::take_message(const CallInfo& call, const Deadline& deadline, int peer, int tag,
                                void* buf) {
  Mailbox& box = mailbox(peer, rank_);
  const char* data = mailbox_data(peer, rank_);
  TORCH_INTERNAL_ASSERT(box.first, "mockccl: a message from rank ", peer,
                        " was taken in part by another receive");
  const int64_t total = box.total_bytes;
  const bool match = box.tag == tag;
  char* dst = nullptr;
  if (match) {
    check_size(call, peer, tag, total);
    dst = static_cast<char*>(buf);
  } else {
    kept_[peer].push_back({box.tag, std::vector<char>(static_cast<size_t>(total))});
    dst = kept_[peer].back().bytes.data();
  }
  int64_t off = 0;
  do {
    wait_for(call, deadline, [&] { return message_waiting(peer); },
             [&] { return std::vector<int>{peer}; }, "send");
    std::memcpy(dst + off, data, box.bytes);
    off += box.bytes;
    box.taken.fetch_add(1, std::memory_order_release);
    ring();
  } while (off < total);
  return match;
}

void ShmTransport::check_size(const CallInfo& call, int peer, int tag, int64_t sent) const {
  const int64_t expected = call.count * static_cast<int64_t>(c10::elementSize(call.dtype));
  if (sent == expected) return;
  std::ostringstream msg;
  msg << "mockccl: recv on rank " << name(rank_) << " expected " << expected << " bytes with tag "
      << tag << " from rank " << name(peer) << ", but rank " << name(peer) << " sent " << sent
      << " bytes with that tag (a send and the recv that takes it must match in size)";
  C10_THROW_ERROR(DistBackendError, msg.str());
}

}  // namespace mockccl

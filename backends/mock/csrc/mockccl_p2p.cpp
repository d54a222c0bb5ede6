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
// message in its mailbox, or has left, then handles it under the peer's claim; repeats until a
// message with `tag` was delivered. A peer that left is asked for nothing more once its last
// messages were taken (it posted them before it left).
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
      if (!kept && !message_waiting(peer) && !has_left(peer)) return false;
      claim = std::move(lock);
      return true;
    }, [&] { return has_left(peer) ? std::vector<int>{} : std::vector<int>{peer}; }, "send");
    if (take_kept(call, peer, tag, buf)) return;
    if (message_waiting(peer)) {
      if (take_message(call, deadline, peer, tag, buf)) return;
      continue;
    }
    left(call, {peer}, tag);
  }
}

int ShmTransport::recv_any_host(const CallInfo& call, void* buf, int tag) {
  check_usable(call);
  Deadline deadline(call.timeout);
  const auto staying = [&] {
    std::vector<int> ranks;
    for (int p : peers())
      if (!has_left(p)) ranks.push_back(p);
    return ranks;
  };
  for (;;) {
    int from = -1;
    std::unique_lock<std::mutex> claim;
    wait_for(call, deadline, [&] {
      bool anyone = false;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        std::unique_lock<std::mutex> lock(recv_claims_[p], std::try_to_lock);
        anyone = anyone || !has_left(p) || !lock.owns_lock();
        if (!lock.owns_lock()) continue;  // a recv(p) is taking p's messages
        const bool kept = std::any_of(kept_[p].begin(), kept_[p].end(),
                                      [&](const Kept& k) { return k.tag == tag; });
        if (kept || message_waiting(p)) {
          from = p;
          claim = std::move(lock);
          return true;
        }
      }
      return !anyone;  // every peer left, with nothing for this receive
    }, staying, "send");
    if (from < 0) left(call, peers(), tag);
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
  kept_bytes_[peer] -= it->bytes.size();
  kept.erase(it);
  return true;
}

// Takes the message in `peer`'s mailbox, chunk by chunk: into `buf` if it has `tag` (true),
// else into a kept message for a later receive (false). The sizes the peer wrote are checked
// first: the message within Limits, each chunk within the mailbox and the message.
bool ShmTransport::take_message(const CallInfo& call, const Deadline& deadline, int peer, int tag,
                                void* buf) {
  Mailbox& box = mailbox(peer, rank_);
  const char* data = mailbox_data(peer, rank_);
  TORCH_INTERNAL_ASSERT(box.first, "mockccl: a message from rank ", peer,
                        " was taken in part by another receive");
  const int64_t total = box.total_bytes;
  const auto refuse = [&](const std::string& why) {
    fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(name(rank_)) +
         ": rank " + std::to_string(name(peer)) + "'s mailbox holds " + why +
         "; the group is unusable");
  };
  if (total < 0 || static_cast<uint64_t>(total) > limits_.max_message) {
    refuse("a message of " + std::to_string(total) + " bytes, more than the largest receive "
           "this rank can post (" + std::to_string(limits_.max_message) + " bytes: its device's "
           "memory)");
  }
  const bool match = box.tag == tag;
  char* dst = nullptr;
  std::vector<char>* kept = nullptr;
  if (match) {
    check_size(call, peer, tag, total);
    dst = static_cast<char*>(buf);
  } else {
    const uint64_t room = limits_.kept_bytes - std::min(limits_.kept_bytes, kept_bytes_[peer]);
    if (static_cast<uint64_t>(total) > room) {
      refuse(std::to_string(total) + " bytes with tag " + std::to_string(box.tag) +
             " that no receive has asked for, beyond the " + std::to_string(limits_.kept_bytes) +
             " bytes of such messages a peer may have waiting (" +
             std::to_string(kept_bytes_[peer]) + " are; ACCELKIT_MOCKCCL_KEPT_BYTES)");
    }
    kept_[peer].push_back({box.tag, {}});
    kept_bytes_[peer] += static_cast<uint64_t>(total);
    kept = &kept_[peer].back().bytes;
  }
  int64_t off = 0;
  do {
    wait_for(call, deadline, [&] { return message_waiting(peer); },
             [&] { return std::vector<int>{peer}; }, "send");
    const int64_t n = box.bytes;
    if (n < 0 || static_cast<size_t>(n) > p2p_chunk_ || n > total - off) {
      refuse("a chunk of " + std::to_string(n) + " bytes at byte " + std::to_string(off) +
             " of a " + std::to_string(total) + "-byte message (chunks are at most " +
             std::to_string(p2p_chunk_) + ")");
    }
    if (kept != nullptr) {
      kept->resize(static_cast<size_t>(off + n));  // memory as the bytes arrive
      dst = kept->data();
    }
    if (n > 0) std::memcpy(dst + off, data, static_cast<size_t>(n));
    off += n;
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

void ShmTransport::left(const CallInfo& call, const std::vector<int>& peers, int tag) const {
  std::ostringstream msg;
  msg << "mockccl: " << describe(call) << " on rank " << name(rank_) << ": rank"
      << (peers.size() == 1 ? " " : "s ") << join(names(peers))
      << (peers.size() == 1 ? " has" : " have") << " left the group (shut it down) with no "
      << "message with tag " << tag << " for this receive";
  C10_THROW_ERROR(DistBackendError, msg.str());
}

}  // namespace mockccl

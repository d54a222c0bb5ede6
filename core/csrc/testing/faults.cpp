// Fault injection for accelkit's mutation tests (faults.h); empty unless -DACCELKIT_FAULTS.
#include "testing/faults.h"

#ifdef ACCELKIT_FAULTS

#include <cstdlib>

namespace accelkit::faults {
namespace {
thread_local const std::string* t_scoped = nullptr;
}  // namespace

const std::vector<Fault>& all() {
  static const std::vector<Fault> faults = {
      {"unreduced_above_4kib",
       "all_reduce, reduce and reduce_scatter of inputs above 4 KiB return the input unreduced "
       "(a large-message protocol that never combines the ranks' data)"},
      {"bfloat16_reduced_as_float16",
       "reductions of bfloat16 run the float16 kernel (one case for both 16-bit floats)"},
      {"chunk_boundary_off_by_one",
       "the first element of every 512 KiB round after the first is not written (each later "
       "round starts one element late)"},
      {"reduction_drops_last_rank",
       "SUM reductions leave out the last rank's contribution (a ring one hop short)"},
      {"broadcast_from_rank0", "broadcast sends rank 0's data whatever the root"},
      {"allgather_stale_result",
       "all_gather returns the previous result of the same size (a cached staging buffer "
       "reused without being refilled)"},
      {"rng_offset_not_advanced",
       "random kernels do not advance the generator's offset (every op repeats the numbers)"},
      {"rng_offset_unrounded",
       "random kernels advance the offset by numel, not ceil4(numel) (Philox draws four "
       "values per counter)"},
      {"rng_state_24_bytes",
       "get_rng_state is 24 bytes (seed, offset, a spare counter), not the 16 torch's tracker "
       "reads"},
      {"is_initialized_always",
       "is_initialized() is True before the device is used (DeviceMesh then never selects "
       "each rank's device)"},
      {"set_device_ignored",
       "set_device(i) validates i but leaves the current device unchanged"},
      {"copy_strided_as_dense",
       "the copy kernel copies strided tensors as if dense whenever dtype and element count "
       "match (one memcpy, strides ignored)"},
      {"work_wait_unordered",
       "Work.wait() returns without making the current stream wait for the collective"},
      {"record_stream_ignored",
       "Tensor.record_stream does nothing: memory freed while another stream still reads it "
       "is handed out again at once"},
      {"collective_skips_producers",
       "a collective starts without waiting for the queued work that produces its inputs"},
      {"transport_reads_device_memory",
       "the transport checksums its input by reading device memory directly (works only "
       "where device memory is host memory)"},
      {"seed_truncated_to_32_bits",
       "the generator keeps only the low 32 bits of the seed (manual_seed(2**32 + 5) draws "
       "what manual_seed(5) draws)"},
      {"elapsed_time_zero", "Event.elapsed_time is always 0.0 (events carry no timestamps)"},
      {"p2p_ignores_tags",
       "send/recv ignore the tag: a recv takes the peer's next message, whatever its tag"},
      {"copy_drops_half_above_1mib",
       "the runtime's device-to-host copy moves only the first half of transfers above 1 MiB "
       "(never used by the layer where device memory is host memory)"},
      {"synchronize_noop",
       "the runtime's synchronize() returns without waiting for the device's queued work"},
      {"guard_keeps_new_device",
       "the device guard's exchangeDevice returns the device it switched to, not the one it "
       "replaced (every guard leaves the caller on the other device)"},
      {"device_barrier_noop",
       "the collective library's barrier returns at once (dist.barrier() still waits: torch "
       "runs it through the CPU's library)"},
      {"peer_copy_dropped",
       "the runtime's copies between two devices do nothing (a peer-to-peer path never "
       "enabled)"},
      {"stream_query_always_done",
       "Stream.query() is always True (a driver call that reports the stream idle whatever "
       "is queued)"},
      {"event_records_on_current_stream",
       "Event.record(stream) records on the current stream, not the one given"},
      {"elapsed_time_host_clock",
       "Event.elapsed_time measures between the host's calls to record(), not between the "
       "points the stream reached (a driver that stamps an event when it is issued)"},
      {"stream_priority_ignored",
       "streams are created at the lowest priority whatever priority is asked for"},
      {"fallback_waits",
       "every op without a native kernel runs at the call, after the stream's queued work "
       "(the host waits for the device at each op; values stay right)"},
      {"wait_event_unordered",
       "Stream.wait_event (and wait_stream) returns without making the stream wait"},
      {"split_shares_parent",
       "split() hands every sub-group the parent's communicator (a library that advertises "
       "splitting and ignores the colour), so a sub-group reduces over the whole group"},
  };
  return faults;
}

std::string current() {
  if (t_scoped != nullptr) return *t_scoped;
  const char* value = std::getenv("ACCELKIT_FAULT");
  return value == nullptr ? std::string() : std::string(value);
}

bool active(const char* name) { return current() == name; }

Scope::Scope(std::string fault) : fault_(std::move(fault)), previous_(t_scoped) {
  t_scoped = &fault_;
}

Scope::~Scope() { t_scoped = previous_; }

}  // namespace accelkit::faults

#endif  // ACCELKIT_FAULTS

#pragma once
// Heartbeat: how a rank tells its launcher (redco-run) that it is alive and
// making progress, so that a rank that hangs is found, named and stopped.
//
// redco-run gives each rank a slot in a shared memory block (the fd in
// REDCO_HEARTBEAT_FD, the slot in REDCO_HEARTBEAT_SLOT) and a timeout
// (REDCO_HANG_TIMEOUT, seconds). start() maps the slot and starts one thread
// that, every timeout / 10 (at most 1 s), writes into it:
//   alive     the time of this tick: a rank whose ticks stop is not running
//             at all (stopped by SIGSTOP or a debugger, swapped out, frozen);
//   progress  the time of the last tick at which the progress counter had
//             moved. The counter moves whenever redco does work: a tensor is
//             allocated (every op's output), a message of a collective
//             completes, a chunk of a checkpoint is written or read, and
//             while a file is synced (Busy). A long step keeps it moving; an
//             endless loop or a blocking call in user code does not;
//   waiting   since when the rank has had a message of a collective in
//             flight (0: none): a rank blocked on a peer is a victim of a
//             hang, not its cause;
//   watched   > 0 inside the training loop (Trainer::fit), the only place
//             where a stall is called a hang: a program may legitimately sit
//             in its own code for minutes elsewhere (reading a data set);
//   step      the training step being worked on, for the launcher's message.
// Without REDCO_HEARTBEAT_FD none of this runs: progress() and the waits
// stay a relaxed atomic increment each.
#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace redco::heartbeat {

// One rank's slot, shared between the rank and its launcher (lock-free
// atomics are address-free, so they work across processes). Times are
// CLOCK_MONOTONIC nanoseconds, comparable between processes of one host.
struct alignas(64) Slot {
  std::atomic<int64_t> pid;
  std::atomic<int64_t> alive_ns;
  std::atomic<int64_t> progress_ns;
  std::atomic<int64_t> waiting_since_ns;
  std::atomic<int64_t> watched;
  std::atomic<int64_t> step;
};
static_assert(std::atomic<int64_t>::is_always_lock_free);

namespace detail {
inline std::atomic<uint64_t> g_progress{0};  // moves whenever redco does work
inline std::atomic<int64_t> g_waits{0};      // messages of collectives in flight
inline std::atomic<int64_t> g_busy{0};       // open Busy scopes
}  // namespace detail

// Something happened: called where redco does work (tensor allocation,
// message completion, checkpoint I/O). Cheap enough for every op.
inline void progress() noexcept { detail::g_progress.fetch_add(1, std::memory_order_relaxed); }

// A message of a collective is in flight from wait_begin() to wait_end().
inline void wait_begin() noexcept { detail::g_waits.fetch_add(1, std::memory_order_relaxed); }
inline void wait_end() noexcept {
  detail::g_waits.fetch_sub(1, std::memory_order_relaxed);
  progress();
}

// While one is open (on any thread), the rank counts as making progress: for
// a system call that is long but bounded and shows nothing while it runs
// (fsync of a large checkpoint file). A call that never returns is then not
// called a hang; the peers' communication timeout still ends the job.
class Busy {
 public:
  Busy() noexcept { detail::g_busy.fetch_add(1, std::memory_order_relaxed); }
  ~Busy() {
    detail::g_busy.fetch_sub(1, std::memory_order_relaxed);
    progress();
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
};

// Maps this process's slot and starts the ticking thread, once; does nothing
// without REDCO_HEARTBEAT_FD. Throws redco::Error when the variables are
// malformed (they come from redco-run, so that is a launcher bug).
void start();
// Whether start() found a launcher to report to.
bool active();

// Inside the training loop (nested calls count): stalls there are hangs.
void watch_begin() noexcept;
void watch_end() noexcept;
// The training step being worked on, shown when the rank is reported.
void set_step(int64_t step) noexcept;

// CLOCK_MONOTONIC in nanoseconds (what the slot's times are in).
int64_t now_ns() noexcept;

}  // namespace redco::heartbeat

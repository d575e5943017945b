#pragma once
// The launcher's side of the heartbeat (redco/core/heartbeat.hpp): a shared
// memory block with one slot per local rank, and the rule that calls a rank
// hung. A rank is hung when, for longer than the timeout,
//   - its heartbeat thread has not ticked (the process is not running:
//     SIGSTOP, a debugger, frozen), or
//   - inside the training loop it made no progress (no tensor allocated, no
//     message of a collective completed, no checkpoint chunk written) while
//     it had no message in flight, i.e. it was not waiting for a peer (an
//     endless loop or a blocking call in user code).
// Ranks blocked in a collective are never blamed: they wait for the hung one.
// A rank that has not started its heartbeat (not yet at its Deployer or
// rendezvous, or a program that is not redco's) is not watched.
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "redco/comm/launch_env.hpp"
#include "redco/core/heartbeat.hpp"

namespace redco::run {

class HangWatch {
 public:
  // timeout_s == 0: no watching (nothing is created, no variables exported).
  HangWatch(int n_slots, double timeout_s);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  bool on() const { return slots_ != nullptr; }
  // Clears every slot: before each attempt at the job.
  void reset();
  // REDCO_HEARTBEAT_FD, REDCO_HEARTBEAT_SLOT and REDCO_HANG_TIMEOUT for a rank.
  void export_to(comm::Environ& env, int slot) const;
  // How often the supervisor should call check(), in milliseconds.
  int period_ms() const;
  // Call once per supervision round, before check(): false when this launcher
  // itself did not run for a while (then the ranks' silence proves nothing).
  bool begin_round();
  // Why the rank in `slot` (started as process `pid`, the leader of its
  // process group; global rank `rank`) is hung, or "".
  std::string check(int slot, pid_t pid, int rank) const;

 private:
  heartbeat::Slot* slots_ = nullptr;
  int n_ = 0;
  int fd_ = -1;
  double timeout_s_ = 0;
  int64_t last_round_ns_ = 0;
  int64_t quiet_until_ns_ = 0;
};

}  // namespace redco::run

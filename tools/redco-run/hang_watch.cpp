// The launcher's hang detection: see hang_watch.hpp.
#include "hang_watch.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "redco/core/error.hpp"

namespace redco::run {

namespace {

// The state letter of /proc/<pid>/stat ('T': stopped), or 0 when unreadable.
char process_state(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return 0;
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? 0 : line[close + 2];
}

}  // namespace

HangWatch::HangWatch(int n_slots, double timeout_s) : n_(n_slots), timeout_s_(timeout_s) {
  if (timeout_s <= 0) return;
  // Inherited by the ranks (no close-on-exec): they map their slot from it.
  fd_ = memfd_create("redco-heartbeat", 0);
  REDCO_CHECK(fd_ >= 0,
              "cannot create the heartbeat block: {} (pass --hang-timeout 0 to run "
              "without hang detection)",
              std::strerror(errno));
  const size_t bytes = size_t(n_) * sizeof(heartbeat::Slot);
  REDCO_CHECK(ftruncate(fd_, off_t(bytes)) == 0, "cannot size the heartbeat block: {}",
              std::strerror(errno));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  REDCO_CHECK(p != MAP_FAILED, "cannot map the heartbeat block: {}", std::strerror(errno));
  slots_ = static_cast<heartbeat::Slot*>(p);
}

HangWatch::~HangWatch() {
  if (slots_) munmap(slots_, size_t(n_) * sizeof(heartbeat::Slot));
  if (fd_ >= 0) close(fd_);
}

void HangWatch::reset() {
  if (!slots_) return;
  for (int i = 0; i < n_; ++i) {
    heartbeat::Slot& s = slots_[i];
    for (auto* f : {&s.pid, &s.alive_ns, &s.progress_ns, &s.waiting_since_ns, &s.watched, &s.step})
      f->store(0, std::memory_order_relaxed);
  }
  last_round_ns_ = 0;
}

void HangWatch::export_to(comm::Environ& env, int slot) const {
  if (!slots_) return;
  env["REDCO_HEARTBEAT_FD"] = std::to_string(fd_);
  env["REDCO_HEARTBEAT_SLOT"] = std::to_string(slot);
  env["REDCO_HANG_TIMEOUT"] = fmt::format("{}", timeout_s_);
}

int HangWatch::period_ms() const {
  return std::clamp(int(timeout_s_ * 100), 10, 1000);  // a tenth of the timeout
}

bool HangWatch::begin_round() {
  const int64_t now = heartbeat::now_ns();
  const auto timeout_ns = int64_t(timeout_s_ * 1e9);
  // The launcher was not scheduled for half a timeout (the machine was
  // suspended or overloaded): give the ranks' heartbeats time to catch up.
  if (last_round_ns_ > 0 && now - last_round_ns_ > timeout_ns / 2)
    quiet_until_ns_ = now + timeout_ns / 4;
  last_round_ns_ = now;
  return now >= quiet_until_ns_;
}

std::string HangWatch::check(int slot, pid_t pid, int rank) const {
  if (!slots_) return {};
  const heartbeat::Slot& s = slots_[slot];
  // The rank itself, or a process it started in its group (a wrapper script
  // that did not exec); 0 or another process: not reporting (yet).
  const auto reporter = pid_t(s.pid.load(std::memory_order_acquire));
  if (reporter <= 0 || (reporter != pid && getpgid(reporter) != pid)) return {};
  const int64_t now = heartbeat::now_ns();
  const double silent = double(now - s.alive_ns.load(std::memory_order_acquire)) * 1e-9;
  if (silent > timeout_s_) {
    const bool stopped = process_state(reporter) == 'T';
    return fmt::format(
        "rank {} hangs: it has not run for {:.1f} s (--hang-timeout {:g}){}", rank, silent,
        timeout_s_,
        stopped ? ": its process is stopped (SIGSTOP, or a debugger: --hang-timeout 0 lets one "
                  "stop it)"
                : ": its heartbeat thread is not scheduled (frozen, or the machine is overloaded)");
  }
  if (s.watched.load(std::memory_order_acquire) <= 0) return {};
  if (s.waiting_since_ns.load(std::memory_order_relaxed) != 0) return {};
  const double stalled = double(now - s.progress_ns.load(std::memory_order_relaxed)) * 1e-9;
  if (stalled <= timeout_s_) return {};
  return fmt::format(
      "rank {} hangs in training step {}: no progress for {:.1f} s (--hang-timeout {:g}) while "
      "not waiting for any peer (no tensor made, no message completed): an endless loop or a "
      "blocking call in user code (collate, loss, a callback)?",
      rank, s.step.load(std::memory_order_relaxed), stalled, timeout_s_);
}

}  // namespace redco::run

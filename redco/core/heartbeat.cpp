// The rank's side of the heartbeat (see heartbeat.hpp): one slot of the
// launcher's shared memory, written by one thread.
#include "redco/core/heartbeat.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>

#include "redco/core/error.hpp"

namespace redco::heartbeat {

namespace {

Slot* g_slot = nullptr;  // set once by start(), then never changed

// A whole non-negative number from the environment, or -1 when unset.
int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  REDCO_CHECK(*end == '\0' && x >= 0, "{}='{}' is not a whole number >= 0 (set by redco-run)", name,
              v);
  return x;
}

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  REDCO_CHECK(*end == '\0' && x > 0, "{}='{}' is not a positive number of seconds", name, v);
  return x;
}

// Every `period`: the time, whether the progress counter moved, whether a
// message is in flight. Only this thread writes the slot after start().
[[noreturn]] void tick(Slot* slot, std::chrono::nanoseconds period) {
  uint64_t seen = detail::g_progress.load(std::memory_order_relaxed);
  for (;;) {
    std::this_thread::sleep_for(period);
    const int64_t now = now_ns();
    const uint64_t count = detail::g_progress.load(std::memory_order_relaxed);
    if (count != seen || detail::g_busy.load(std::memory_order_relaxed) > 0)
      slot->progress_ns.store(now, std::memory_order_relaxed);
    seen = count;
    const bool waiting = detail::g_waits.load(std::memory_order_relaxed) > 0;
    if (!waiting) {
      slot->waiting_since_ns.store(0, std::memory_order_relaxed);
    } else if (slot->waiting_since_ns.load(std::memory_order_relaxed) == 0) {
      slot->waiting_since_ns.store(now, std::memory_order_relaxed);
    }
    slot->alive_ns.store(now, std::memory_order_release);
  }
}

void start_once() {
  const int64_t fd = env_int("REDCO_HEARTBEAT_FD");
  if (fd < 0) return;
  const int64_t index = env_int("REDCO_HEARTBEAT_SLOT");
  REDCO_CHECK(index >= 0, "REDCO_HEARTBEAT_FD is set but REDCO_HEARTBEAT_SLOT is not");
  const double timeout = env_seconds("REDCO_HANG_TIMEOUT", 60);
  const size_t bytes = size_t(index + 1) * sizeof(Slot);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, int(fd), 0);
  REDCO_CHECK(p != MAP_FAILED, "cannot map the heartbeat block (REDCO_HEARTBEAT_FD={}): {}", fd,
              std::strerror(errno));
  Slot* slot = static_cast<Slot*>(p) + index;
  const int64_t now = now_ns();
  slot->progress_ns.store(now, std::memory_order_relaxed);
  slot->waiting_since_ns.store(0, std::memory_order_relaxed);
  slot->alive_ns.store(now, std::memory_order_relaxed);
  slot->pid.store(getpid(), std::memory_order_release);
  g_slot = slot;
  // Ten ticks per timeout: a stall is seen within about 1.1 timeouts.
  const auto period = std::chrono::nanoseconds(
      std::clamp<int64_t>(int64_t(timeout * 1e8), 10'000'000, 1'000'000'000));
  std::thread(tick, slot, period).detach();
}

}  // namespace

int64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void start() {
  static std::once_flag once;
  std::call_once(once, start_once);
}

bool active() { return g_slot != nullptr; }

void watch_begin() noexcept {
  if (!g_slot) return;
  // Time spent before the loop is not the loop's stall.
  g_slot->progress_ns.store(now_ns(), std::memory_order_relaxed);
  g_slot->watched.fetch_add(1, std::memory_order_release);
}

void watch_end() noexcept {
  if (g_slot) g_slot->watched.fetch_sub(1, std::memory_order_relaxed);
}

void set_step(int64_t step) noexcept {
  if (g_slot) g_slot->step.store(step, std::memory_order_relaxed);
}

}  // namespace redco::heartbeat

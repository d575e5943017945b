// The rank's side of the heartbeat (redco/core/heartbeat.hpp) against a slot
// this test maps itself, as redco-run would: the thread ticks, tensor
// allocations and Busy scopes count as progress and nothing else does, a
// message in flight marks the rank as waiting, and the training loop's flag
// and step arrive.
// (The launcher's rule on top of it is tested end to end by test_restart.sh.)
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "redco/core/heartbeat.hpp"
#include "redco/core/tensor.hpp"

using namespace redco;
using namespace std::chrono_literals;

namespace {

// Sleeps until `done()` or 2 s; true when it came true.
template <typename F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("heartbeat: a rank reports liveness, progress, waiting and its step", "[heartbeat]") {
  // Slot 1 of two, as the second local rank; 0.2 s timeout: a tick every 20 ms.
  const int fd = memfd_create("test-heartbeat", 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 2 * sizeof(heartbeat::Slot)) == 0);
  auto* slots = static_cast<heartbeat::Slot*>(
      mmap(nullptr, 2 * sizeof(heartbeat::Slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(slots != MAP_FAILED);
  heartbeat::Slot& s = slots[1];
  setenv("REDCO_HEARTBEAT_FD", std::to_string(fd).c_str(), 1);
  setenv("REDCO_HEARTBEAT_SLOT", "1", 1);
  setenv("REDCO_HANG_TIMEOUT", "0.2", 1);
  heartbeat::start();
  REQUIRE(heartbeat::active());
  CHECK(s.pid.load() == getpid());
  CHECK(slots[0].pid.load() == 0);  // another rank's slot is left alone

  // Alive: the thread keeps ticking.
  const int64_t first = s.alive_ns.load();
  CHECK(eventually([&] { return s.alive_ns.load() > first + 50'000'000; }));

  // No work: progress stays where it was for several ticks.
  const int64_t before = s.progress_ns.load();
  std::this_thread::sleep_for(100ms);
  CHECK(s.progress_ns.load() == before);
  // A tensor made: progress moves at the next tick.
  (void)Tensor::empty(Shape{4});
  CHECK(eventually([&] { return s.progress_ns.load() > before; }));

  // A long system call in a Busy scope (an fsync) counts as progress throughout.
  {
    heartbeat::Busy busy;
    const int64_t at = s.progress_ns.load();
    CHECK(eventually([&] { return s.progress_ns.load() > at; }));
    const int64_t later = s.progress_ns.load();
    CHECK(eventually([&] { return s.progress_ns.load() > later; }));
  }

  // A message in flight: waiting from a tick on, cleared after it completes.
  CHECK(s.waiting_since_ns.load() == 0);
  heartbeat::wait_begin();
  CHECK(eventually([&] { return s.waiting_since_ns.load() != 0; }));
  heartbeat::wait_end();
  CHECK(eventually([&] { return s.waiting_since_ns.load() == 0; }));

  // The training loop: watched while inside, and its step.
  CHECK(s.watched.load() == 0);
  heartbeat::watch_begin();
  heartbeat::set_step(7);
  CHECK(s.watched.load() == 1);
  CHECK(s.step.load() == 7);
  heartbeat::watch_end();
  CHECK(s.watched.load() == 0);
}

// The coroutine scheduler: Task, sync_wait, when_all, events, the oneTBB
// compute executor and the progress engine.
#include <tbb/task_arena.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redco/sched/event.hpp"
#include "redco/sched/executor.hpp"
#include "redco/sched/progress.hpp"
#include "redco/sched/task.hpp"
#include "redco/sched/when_all.hpp"

using namespace redco;
using namespace redco::sched;
using namespace std::chrono_literals;

namespace {

Task<int> value(int v) { co_return v; }
Task<int> add(int a, int b) { co_return co_await value(a) + co_await value(b); }
Task<void> throws(std::string msg) {  // by value: the task runs after the call
  throw std::runtime_error(msg);
  co_return;
}
Task<void> nothing() { co_return; }
Task<int> depth(int n) {
  if (n == 0) co_return 0;
  co_return 1 + co_await depth(n - 1);
}

// Completes on another thread after `delay`; records the order of completion.
Task<int> later(int v, std::chrono::milliseconds delay) {
  Completion<int> c;
  std::thread t([&] {
    std::this_thread::sleep_for(delay);
    c.set_value(v);
  });
  const int got = co_await c;
  t.join();
  co_return got;
}

}  // namespace

TEST_CASE("Task returns values, nests, and is lazy", "[sched]") {
  CHECK(sync_wait(value(7)) == 7);
  CHECK(sync_wait(add(2, 40)) == 42);

  bool started = false;
  auto lazy = [&]() -> Task<void> {
    started = true;
    co_return;
  };
  Task<void> t = lazy();
  CHECK_FALSE(started);
  sync_wait(std::move(t));
  CHECK(started);

  auto move_only = []() -> Task<std::unique_ptr<int>> { co_return std::make_unique<int>(5); };
  CHECK(*sync_wait(move_only()) == 5);
}

TEST_CASE("Task exceptions reach the awaiter", "[sched]") {
  auto outer = []() -> Task<int> {
    co_await throws("inner failed");
    co_return 1;
  };
  CHECK_THROWS_WITH(sync_wait(outer()), "inner failed");
  auto catches = []() -> Task<std::string> {
    try {
      co_await throws("caught");
    } catch (const std::exception& e) {
      co_return std::string(e.what());
    }
    co_return "";
  };
  CHECK(sync_wait(catches()) == "caught");
}

TEST_CASE("100k sequential co_awaits use constant stack; deep nesting works", "[sched]") {
  // Each child completes synchronously: if finishing resumed the awaiter
  // with a plain (non-tail) call, every iteration would nest another frame.
  auto loop = []() -> Task<long> {
    long sum = 0;
    for (int i = 0; i < 100000; ++i) sum += co_await value(i);
    co_return sum;
  };
  CHECK(sync_wait(loop()) == 100000L * 99999L / 2);
  CHECK(sync_wait(depth(10000)) == 10000);
}

TEST_CASE("when_all: results in order, all finish, lowest failure rethrown", "[sched]") {
  auto [a, b, u] = sync_wait(when_all(later(1, 30ms), value(2), nothing()));
  CHECK(a == 1);
  CHECK(b == 2);
  (void)u;

  std::vector<Task<int>> tasks;
  for (int i = 0; i < 8; ++i) tasks.push_back(later(i * i, std::chrono::milliseconds(8 - i)));
  CHECK(sync_wait(when_all(std::move(tasks))) == std::vector<int>{0, 1, 4, 9, 16, 25, 36, 49});

  std::atomic<int> finished{0};
  auto slow_ok = [&]() -> Task<void> {
    co_await later(0, 40ms);
    ++finished;
  };
  auto slow_fail = [&](std::string msg) -> Task<void> {
    co_await later(0, 20ms);
    ++finished;
    throw std::runtime_error(msg);
  };
  std::vector<Task<void>> mixed;
  mixed.push_back(slow_ok());
  mixed.push_back(slow_fail("second"));
  mixed.push_back(throws("third"));  // fails first in time, but has a higher index
  mixed.push_back(slow_ok());
  CHECK_THROWS_WITH(sync_wait(when_all(std::move(mixed))), "second");
  CHECK(finished.load() == 3);  // the healthy tasks still ran to the end

  CHECK(sync_wait(when_all(std::vector<Task<int>>{})).empty());
}

TEST_CASE("yield interleaves coroutines on one thread", "[sched]") {
  std::string trace;
  auto step = [&](char name) -> Task<void> {
    trace += name;
    co_await yield();
    trace += name;
  };
  sync_wait(when_all(step('a'), step('b'), step('c')));
  CHECK(trace == "abcabc");
}

TEST_CASE("AsyncEvent and Completion resume waiters on their own thread", "[sched]") {
  AsyncEvent ev;
  std::thread::id resumed_on;
  int woken = 0;
  auto waiter = [&]() -> Task<void> {
    co_await ev;
    resumed_on = std::this_thread::get_id();
    ++woken;
  };
  auto setter = [&]() -> Task<void> {
    std::thread t([&] {
      std::this_thread::sleep_for(10ms);
      ev.set();
    });
    co_await ev;
    t.join();
  };
  sync_wait(when_all(waiter(), waiter(), setter()));
  CHECK(woken == 2);
  CHECK(resumed_on == std::this_thread::get_id());
  CHECK(ev.is_set());
  sync_wait(waiter());  // already set: no suspension
  CHECK(woken == 3);

  Completion<int> failed;
  std::thread t([&] { failed.set_exception(std::make_exception_ptr(std::runtime_error("io"))); });
  t.join();
  auto await_failed = [&]() -> Task<int> { co_return co_await failed; };
  CHECK_THROWS_WITH(sync_wait(await_failed()), "io");
  CHECK_THROWS_AS(failed.set_value(1), Error);
}

TEST_CASE("ComputeExecutor runs jobs on oneTBB and resumes on the caller", "[sched]") {
  ComputeExecutor exec;
  const std::thread::id main_id = std::this_thread::get_id();
  std::atomic<int> on_tbb{0};
  auto job = [&](int i) -> Task<int> {
    const int v = co_await exec.run([&, i] {
      if (tbb::this_task_arena::current_thread_index() != tbb::task_arena::not_initialized &&
          std::this_thread::get_id() != main_id)
        ++on_tbb;
      std::this_thread::sleep_for(2ms);
      return i * 10;
    });
    CHECK(std::this_thread::get_id() == main_id);
    co_return v;
  };
  std::vector<Task<int>> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(job(i));
  CHECK(sync_wait(when_all(std::move(jobs))) == std::vector<int>{0, 10, 20, 30, 40, 50});
  CHECK(on_tbb.load() == 6);

  auto bad = [&]() -> Task<void> { co_await exec.run([] { throw std::runtime_error("kernel"); }); };
  CHECK_THROWS_WITH(sync_wait(bad()), "kernel");
  exec.wait_idle();
}

TEST_CASE("ProgressEngine sleeps in a transport's idle_wait, which wake() ends", "[sched]") {
  // A transport's descriptor stood in for by a condition variable: idle_wait
  // blocks until on_wake (or its time) ends it.
  std::mutex m;
  std::condition_variable cv;
  bool signalled = false;
  std::atomic<int> waits{0}, polls{0};
  std::atomic<int> work{0};
  ProgressEngine engine({.idle_spins = 4,
                         .max_sleep = std::chrono::microseconds(200000),
                         .idle_wait =
                             [&](std::chrono::microseconds most) {
                               ++waits;
                               std::unique_lock lock(m);
                               cv.wait_for(lock, most, [&] { return signalled; });
                               signalled = false;
                             },
                         .on_wake =
                             [&] {
                               std::lock_guard lock(m);
                               signalled = true;
                               cv.notify_one();
                             }});
  Completion<int> done;
  engine.add([&] {
    ++polls;
    if (work.load() == 1) done.set_value(1), work = 2;
    return false;
  });
  std::this_thread::sleep_for(50ms);
  const int idle_polls = polls.load();
  CHECK(waits.load() >= 1);
  CHECK(idle_polls < 20);  // asleep in idle_wait (200 ms at most), not spinning
  work = 1;
  const auto posted = std::chrono::steady_clock::now();
  engine.wake();  // ends the wait at once: the work is seen long before 200 ms
  auto wait = [&]() -> Task<int> { co_return co_await done; };
  CHECK(sync_wait(wait()) == 1);
  CHECK(std::chrono::steady_clock::now() - posted < 100ms);
  engine.stop();
}

TEST_CASE("ProgressEngine polls, completes work, backs off and stops", "[sched]") {
  ProgressEngine engine;
  Completion<int> done;
  std::atomic<int> polls{0};
  std::atomic<bool> right_thread{true};
  const std::thread::id main_id = std::this_thread::get_id();
  const auto id = engine.add([&] {
    if (std::this_thread::get_id() == main_id) right_thread = false;
    if (++polls == 100) done.set_value(polls.load());
    return polls < 100;  // busy until the work is done
  });
  auto wait = [&]() -> Task<int> { co_return co_await done; };
  CHECK(sync_wait(wait()) == 100);
  CHECK(right_thread.load());
  engine.remove(id);
  const int after_remove = polls;
  std::this_thread::sleep_for(20ms);
  CHECK(polls.load() == after_remove);  // a removed poller never runs again

  // Idle: the engine sleeps (up to 1 ms) instead of spinning.
  std::atomic<int> idle_polls{0};
  engine.add([&] {
    ++idle_polls;
    return false;
  });
  std::this_thread::sleep_for(200ms);
  CHECK(idle_polls.load() > 0);
  CHECK(idle_polls.load() < 5000);

  engine.add([]() -> bool { throw std::runtime_error("transport broke"); });
  for (int i = 0; i < 200 && !engine.error(); ++i) std::this_thread::sleep_for(1ms);
  CHECK_THROWS_WITH(std::rethrow_exception(engine.error()), "transport broke");

  engine.stop();
  const int stopped = idle_polls;
  std::this_thread::sleep_for(10ms);
  CHECK(idle_polls.load() == stopped);
  engine.stop();  // idempotent
}

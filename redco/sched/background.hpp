#pragma once
// Background: tasks set going now and waited for later on the same thread,
// so that the thread computes while they (collectives) are in flight.
//
// start() runs a task until its first suspension. Whoever completes what it
// waits on (a comm progress thread, a peer rank's thread) posts it back to
// the group's one RunQueue, and wait() / wait_all() run that queue on the
// calling thread until the task(s) have ended: the tasks' code runs on the
// thread that started them, as under sync_wait (run_queue.hpp). One queue
// for the whole group matters: waiting for one task also runs the others'
// continuations, so a collective this rank takes part in (the root of a
// broadcast that its peers are waiting for) moves on while it waits for
// another. The destructor waits for every task (the queue must outlive every
// post to it) and drops their exceptions.
//
//   Background bg;
//   const size_t b = bg.start(comm.broadcast(t, 0));   // on its way
//   ... compute ...
//   bg.wait(b);                                       // t holds the root's values now
#include <coroutine>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <utility>

#include "redco/sched/run_queue.hpp"
#include "redco/sched/task.hpp"

namespace redco::sched {

// The return type of a started coroutine that nobody awaits: it runs until
// its first suspension and frees itself when it ends (its body must catch
// what it throws).
struct Detached {
  struct promise_type {
    Detached get_return_object() const noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
  };
};

class Background {
 public:
  Background() = default;
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  ~Background() {
    queue_.run_until([&] { return ended_ == tasks_.size(); });
  }

  // Starts `task`; returns its index for wait().
  size_t start(Task<void> task) {
    tasks_.emplace_back();
    RunQueue*& current = RunQueue::current();
    RunQueue* const outer = std::exchange(current, &queue_);
    run(std::move(task), this, tasks_.size() - 1);
    current = outer;
    return tasks_.size() - 1;
  }

  // Until task i has ended; rethrows its exception (once).
  void wait(size_t i) {
    queue_.run_until([&] { return tasks_[i].ended; });
    if (tasks_[i].error) std::rethrow_exception(std::exchange(tasks_[i].error, nullptr));
  }
  bool ended(size_t i) const { return tasks_[i].ended; }

 private:
  struct State {
    bool ended = false;
    std::exception_ptr error;
  };
  static Detached run(Task<void> task, Background* group, size_t i) {
    try {
      co_await std::move(task);
    } catch (...) {
      group->tasks_[i].error = std::current_exception();
    }
    group->tasks_[i].ended = true;
    ++group->ended_;
  }

  RunQueue queue_;
  std::deque<State> tasks_;  // a deque: start() keeps earlier entries where they are
  size_t ended_ = 0;
};

}  // namespace redco::sched

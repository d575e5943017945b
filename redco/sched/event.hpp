#pragma once
// AsyncEvent and Completion<T>: the bridge from "some other thread finished
// something" to "the coroutines waiting for it continue".
//
// A comm progress thread, a oneTBB task or a UCX callback calls set() /
// set_value(); every coroutine awaiting the event is posted back to the run
// queue of the thread it suspended on (see run_queue.hpp), so the setter
// never runs a waiter's code itself and can be a latency-critical thread.
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/sched/run_queue.hpp"

namespace redco::sched {

// A one-shot flag that coroutines can await. Any number of waiters; awaiting
// an already-set event does not suspend.
class AsyncEvent {
 public:
  AsyncEvent() = default;
  AsyncEvent(const AsyncEvent&) = delete;
  AsyncEvent& operator=(const AsyncEvent&) = delete;

  bool is_set() const {
    std::lock_guard lock(mutex_);
    return set_;
  }

  // Any thread. Waiters are released outside the lock: one of them may
  // destroy this event as soon as it runs.
  void set() {
    std::vector<Waiter> waiters;
    {
      std::lock_guard lock(mutex_);
      if (set_) return;
      set_ = true;
      waiters.swap(waiters_);
    }
    for (const Waiter& w : waiters) w.resume();
  }

  // Re-arms a set event; only valid when nobody is waiting.
  void reset() {
    std::lock_guard lock(mutex_);
    REDCO_CHECK(waiters_.empty(), "AsyncEvent::reset() while {} coroutine(s) wait on it",
                waiters_.size());
    set_ = false;
  }

  struct Awaiter {
    AsyncEvent& ev;
    bool await_ready() const { return ev.is_set(); }
    bool await_suspend(std::coroutine_handle<> h) const {
      std::lock_guard lock(ev.mutex_);
      if (ev.set_) return false;
      ev.waiters_.push_back({h, RunQueue::current()});
      return true;
    }
    void await_resume() const noexcept {}
  };
  Awaiter operator co_await() noexcept { return Awaiter{*this}; }

 private:
  mutable std::mutex mutex_;
  bool set_ = false;
  std::vector<Waiter> waiters_;
};

// A value (or an exception) delivered once by another thread. Awaiting it
// yields a reference to the stored value, valid while the Completion lives;
// a stored exception is rethrown in every awaiter.
template <typename T = void>
class Completion {
 public:
  template <typename U>
  void set_value(U&& v) {
    {
      std::lock_guard lock(mutex_);
      REDCO_CHECK(!value_ && !error_, "Completion set twice");
      value_.emplace(std::forward<U>(v));
    }
    event_.set();
  }
  void set_exception(std::exception_ptr e) {
    {
      std::lock_guard lock(mutex_);
      REDCO_CHECK(!value_ && !error_, "Completion set twice");
      error_ = std::move(e);
    }
    event_.set();
  }
  bool ready() const { return event_.is_set(); }

  auto operator co_await() noexcept {
    struct Awaiter : AsyncEvent::Awaiter {
      Completion& c;
      T& await_resume() const {
        if (c.error_) std::rethrow_exception(c.error_);
        return *c.value_;
      }
    };
    return Awaiter{{event_}, *this};
  }

 private:
  std::mutex mutex_;
  std::optional<T> value_;
  std::exception_ptr error_;
  AsyncEvent event_;
};

template <>
class Completion<void> {
 public:
  void set() { event_.set(); }
  void set_exception(std::exception_ptr e) {
    {
      std::lock_guard lock(mutex_);
      REDCO_CHECK(!error_, "Completion set twice");
      error_ = std::move(e);
    }
    event_.set();
  }
  bool ready() const { return event_.is_set(); }

  auto operator co_await() noexcept {
    struct Awaiter : AsyncEvent::Awaiter {
      Completion& c;
      void await_resume() const {
        if (c.error_) std::rethrow_exception(c.error_);
      }
    };
    return Awaiter{{event_}, *this};
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  AsyncEvent event_;
};

}  // namespace redco::sched

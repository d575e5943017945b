#pragma once
// Task<T>: a lazy, move-only coroutine returning T.
//
// Nothing runs until the task is awaited (or handed to sync_wait/when_all).
// Awaiting a task runs it right away, on the awaiter's thread. A task that
// finishes while its awaiter is still starting it (it never suspended) just
// returns, and the awaiter carries on without suspending; a task that
// finishes later, resumed by someone else, transfers straight to its awaiter
// (symmetric transfer). So a loop of 100k co_awaits uses constant stack in
// every build — it does not depend on the optimiser turning the transfer
// into a tail call, which -O0 and sanitizer builds do not — and the stack
// grows only with the nesting depth of tasks. An exception escaping the task
// body is rethrown in the awaiter.
//
//   Task<int> answer() { co_return 42; }
//   Task<int> twice() { co_return 2 * co_await answer(); }
//   int v = sync_wait(twice());
#include <atomic>
#include <coroutine>
#include <exception>
#include <type_traits>
#include <utility>
#include <variant>

#include "redco/sched/run_queue.hpp"

namespace redco::sched {

template <typename T = void>
class Task;

namespace detail {

// The task and its awaiter race to a flag: whoever gets there second — the
// task finishing, or the awaiter's await_suspend returning — continues the
// awaiter.
struct FinalAwaiter {
  bool await_ready() const noexcept { return false; }
  template <typename Promise>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> h) const noexcept {
    auto& p = h.promise();
    if (p.second.exchange(true, std::memory_order_acq_rel)) return p.continuation;
    return std::noop_coroutine();  // back into the awaiter's await_suspend, which carries on
  }
  void await_resume() const noexcept {}
};

struct PromiseBase {
  std::coroutine_handle<> continuation;
  std::atomic<bool> second{false};  // see FinalAwaiter
  std::suspend_always initial_suspend() const noexcept { return {}; }
  FinalAwaiter final_suspend() const noexcept { return {}; }
};

template <typename T>
struct Promise : PromiseBase {
  // monostate: not finished; T: the value; exception_ptr: the body threw.
  std::variant<std::monostate, T, std::exception_ptr> result;
  Task<T> get_return_object() noexcept;
  void unhandled_exception() noexcept { result.template emplace<2>(std::current_exception()); }
  template <typename U>
  requires std::is_convertible_v<U&&, T>
  void return_value(U&& v) { result.template emplace<1>(std::forward<U>(v)); }
  T take() {
    if (result.index() == 2) std::rethrow_exception(std::get<2>(result));
    return std::move(std::get<1>(result));
  }
};

template <>
struct Promise<void> : PromiseBase {
  std::exception_ptr error;
  Task<void> get_return_object() noexcept;
  void unhandled_exception() noexcept { error = std::current_exception(); }
  void return_void() const noexcept {}
  void take() const {
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace detail

template <typename T>
class [[nodiscard]] Task {
 public:
  static_assert(!std::is_reference_v<T>, "Task<T&> is not supported: return a pointer");
  using promise_type = detail::Promise<T>;
  using value_type = T;

  Task() = default;
  explicit Task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { destroy(); }

  bool valid() const noexcept { return bool(h_); }
  bool done() const noexcept { return h_ && h_.done(); }

  // Awaiting starts the task; the result (or exception) is moved out once.
  auto operator co_await() && noexcept { return Awaiter{h_}; }
  auto operator co_await() & noexcept { return Awaiter{h_}; }

 private:
  struct Awaiter {
    std::coroutine_handle<promise_type> h;
    bool await_ready() const noexcept { return h.done(); }
    bool await_suspend(std::coroutine_handle<> awaiter) const {
      h.promise().continuation = awaiter;
      h.resume();
      // True: the task finished inside resume(), so don't suspend at all.
      return !h.promise().second.exchange(true, std::memory_order_acq_rel);
    }
    T await_resume() const { return h.promise().take(); }
  };

  void destroy() noexcept {
    if (h_) h_.destroy();
  }

  std::coroutine_handle<promise_type> h_;
};

namespace detail {

template <typename T>
Task<T> Promise<T>::get_return_object() noexcept {
  return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(*this));
}
inline Task<void> Promise<void>::get_return_object() noexcept {
  return Task<void>(std::coroutine_handle<Promise<void>>::from_promise(*this));
}

// The coroutine sync_wait drives: awaits the task, then tells the run queue
// that the caller may return.
class SyncDriver {
 public:
  struct promise_type {
    RunQueue* queue = nullptr;
    SyncDriver get_return_object() noexcept {
      return SyncDriver(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    auto final_suspend() const noexcept {
      struct Finish {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<promise_type> h) const noexcept {
          h.promise().queue->finish();  // last touch of the frame's queue: see RunQueue::finish
        }
        void await_resume() const noexcept {}
      };
      return Finish{};
    }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }  // drive() catches all
  };
  explicit SyncDriver(std::coroutine_handle<promise_type> h) : h_(h) {}
  SyncDriver(SyncDriver&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  ~SyncDriver() {
    if (h_) h_.destroy();
  }
  void start(RunQueue& q) {
    h_.promise().queue = &q;
    h_.resume();
  }

 private:
  std::coroutine_handle<promise_type> h_;
};

template <typename T>
struct SyncResult {
  std::variant<std::monostate, std::conditional_t<std::is_void_v<T>, std::monostate, T>,
               std::exception_ptr>
      value;
};

template <typename T>
SyncDriver drive(Task<T>& task, SyncResult<T>& out) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await task;
      out.value.template emplace<1>();
    } else {
      out.value.template emplace<1>(co_await task);
    }
  } catch (...) {
    out.value.template emplace<2>(std::current_exception());
  }
}

}  // namespace detail

// Runs `task` to completion, blocking the calling thread, and returns its
// value (or rethrows its exception). While blocked, the thread resumes the
// task's coroutines that other threads hand back to it (see RunQueue), so the
// whole task tree runs on this thread except work sent elsewhere on purpose
// (ComputeExecutor). Do not call from inside a coroutine or a oneTBB task:
// that would block the thread other coroutines need.
template <typename T>
T sync_wait(Task<T> task) {
  RunQueue queue;
  detail::SyncResult<T> result;
  detail::SyncDriver driver = detail::drive(task, result);
  {
    RunQueue* const outer = RunQueue::current();
    RunQueue::current() = &queue;
    driver.start(queue);  // runs until the first suspension
    RunQueue::current() = outer;
  }
  queue.drain();
  if (result.value.index() == 2) std::rethrow_exception(std::get<2>(result.value));
  if constexpr (!std::is_void_v<T>) return std::move(std::get<1>(result.value));
}

}  // namespace redco::sched

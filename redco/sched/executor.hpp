#pragma once
// ComputeExecutor: runs heavy work as oneTBB tasks and resumes the awaiting
// coroutine afterwards, on the thread it suspended on.
//
//   Tensor y = co_await executor.run([&] { return matmul(a, b); });
//
// The coroutine is suspended while the job runs, so its thread keeps driving
// the rank's other coroutines (a collective in flight, another bucket) —
// that is how compute and communication overlap. The job itself must not
// wait for a peer or call sync_wait: it would hold a TBB worker hostage.
#include <tbb/task_arena.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <variant>

#include "redco/sched/run_queue.hpp"

#if defined(__SANITIZE_THREAD__)
#define REDCO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REDCO_TSAN 1
#endif
#endif
#ifdef REDCO_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace redco::sched {

namespace detail {
// oneTBB is not built with ThreadSanitizer, so the order its queue gives
// (everything before task_arena::enqueue happens before the task starts) is
// invisible to TSan, which then reports every job's captures as a race. Under
// TSan a job carries a token released just before the enqueue and acquired
// when it starts; otherwise the job is passed through untouched.
#ifdef REDCO_TSAN
// The token is the wrapper's own address inside the std::function (on the
// heap, so moves keep it): the task reaches it without reading memory first.
struct HandedOff {
  std::function<void()> job;
  void operator()() {
    __tsan_acquire(this);
    job();
  }
};
inline std::function<void()> handed_off(std::function<void()> job) {
  std::function<void()> wrapped = HandedOff{std::move(job)};
  __tsan_release(wrapped.target<HandedOff>());  // last: the wrapper is complete
  return wrapped;
}
#else
inline std::function<void()> handed_off(std::function<void()> job) { return job; }
#endif
}  // namespace detail

class ComputeExecutor {
 public:
  // Uses all cores (oneTBB's default concurrency) unless told otherwise.
  ComputeExecutor() = default;
  explicit ComputeExecutor(int max_concurrency) : arena_(max_concurrency) {}
  ComputeExecutor(const ComputeExecutor&) = delete;
  ComputeExecutor& operator=(const ComputeExecutor&) = delete;
  // Waits for jobs still running: they hold pointers to this executor.
  ~ComputeExecutor() { wait_idle(); }

  // An awaitable that runs f() on a oneTBB worker; co_await yields f's result
  // and rethrows what f threw.
  template <typename F>
  auto run(F&& f) {
    return RunAwaiter<std::decay_t<F>>{*this, std::forward<F>(f), {}};
  }

  // Blocks until no job is queued or running.
  void wait_idle() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return in_flight_ == 0; });
  }

 private:
  template <typename F>
  struct RunAwaiter {
    using R = std::invoke_result_t<F&>;
    using Value = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
    ComputeExecutor& executor;
    F f;
    std::variant<std::monostate, Value, std::exception_ptr> result;

    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
      RunQueue* const queue = RunQueue::current();
      executor.submit([this, h, queue] {
        try {
          if constexpr (std::is_void_v<R>) {
            f();
            result.template emplace<1>();
          } else {
            result.template emplace<1>(f());
          }
        } catch (...) {
          result.template emplace<2>(std::current_exception());
        }
        resume_on(queue, h);  // `this` may be gone after this line
      });
    }
    R await_resume() {
      if (result.index() == 2) std::rethrow_exception(std::get<2>(result));
      if constexpr (!std::is_void_v<R>) return std::move(std::get<1>(result));
    }
  };

  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      ++in_flight_;
    }
    // enqueue (not a task_group spawn): fire-and-forget work that oneTBB
    // guarantees a worker for even when the submitting thread never joins
    // the arena.
    arena_.enqueue([this, job = detail::handed_off(std::move(job))] {
      job();
      std::lock_guard lock(mutex_);
      if (--in_flight_ == 0) idle_.notify_all();
    });
  }

  tbb::task_arena arena_;
  std::mutex mutex_;
  std::condition_variable idle_;
  int in_flight_ = 0;
};

}  // namespace redco::sched

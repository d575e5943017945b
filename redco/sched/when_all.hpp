#pragma once
// when_all: starts several tasks, resumes when the last one finishes.
//
//   auto [a, b] = co_await when_all(load(x), comm.all_reduce(g));  // void -> Unit
//   std::vector<int> v = co_await when_all(std::move(tasks));
//
// Tasks start in argument order on the awaiting thread; each runs until its
// first suspension before the next starts, so they overlap wherever they
// wait (a collective, a TBB job). Results come back in argument order. If any
// task throws, the others still run to completion (nothing is left touching
// freed state) and then the exception of the lowest-numbered failed task is
// rethrown: the choice is deterministic, unlike "whichever failed first".
#include <atomic>
#include <cstddef>
#include <optional>
#include <tuple>
#include <vector>

#include "redco/sched/task.hpp"

namespace redco::sched {

// Stands in for the result of a Task<void> in a tuple of results.
struct Unit {};

namespace detail {

template <typename T>
using Stored = std::conditional_t<std::is_void_v<T>, Unit, T>;

// Counts finished tasks; the last one to arrive (a task, or the parent once
// it has started them all) resumes the parent. Starts at n + 1 so the parent
// cannot be resumed before it has suspended.
struct Latch {
  explicit Latch(size_t n) : count(n + 1) {}
  std::atomic<size_t> count;
  std::coroutine_handle<> parent;
  bool arrive() noexcept { return count.fetch_sub(1, std::memory_order_acq_rel) == 1; }

  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> h) noexcept {
    parent = h;
    return !arrive();  // everyone already finished: carry on without suspending
  }
  void await_resume() const noexcept {}
};

// One started task; its frame stays suspended at its end until the parent
// destroys it, after reading the result.
class Runner {
 public:
  struct promise_type {
    Latch* latch = nullptr;
    Runner get_return_object() noexcept {
      return Runner(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    auto final_suspend() const noexcept {
      struct Arrive {
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
          Latch& latch = *h.promise().latch;
          if (latch.arrive()) return latch.parent;
          return std::noop_coroutine();
        }
        void await_resume() const noexcept {}
      };
      return Arrive{};
    }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }  // run_into catches all
  };
  explicit Runner(std::coroutine_handle<promise_type> h) : h_(h) {}
  Runner(Runner&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Runner& operator=(Runner&&) = delete;
  ~Runner() {
    if (h_) h_.destroy();
  }
  void start(Latch& latch) {
    h_.promise().latch = &latch;
    h_.resume();
  }

 private:
  std::coroutine_handle<promise_type> h_;
};

template <typename T>
Runner run_into(Task<T> task, std::optional<Stored<T>>& slot, std::exception_ptr& error) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(task);
      slot.emplace();
    } else {
      slot.emplace(co_await std::move(task));
    }
  } catch (...) {
    error = std::current_exception();
  }
}

inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

template <typename... Ts, size_t... I>
Task<std::tuple<Stored<Ts>...>> when_all_tuple(std::index_sequence<I...>, Task<Ts>... tasks) {
  std::tuple<std::optional<Stored<Ts>>...> slots;
  std::vector<std::exception_ptr> errors(sizeof...(Ts));
  std::vector<Runner> runners;
  runners.reserve(sizeof...(Ts));
  (runners.push_back(run_into(std::move(tasks), std::get<I>(slots), errors[I])), ...);
  Latch latch(runners.size());
  for (Runner& r : runners) r.start(latch);
  co_await latch;
  rethrow_first(errors);
  co_return std::tuple<Stored<Ts>...>(std::move(*std::get<I>(slots))...);
}

}  // namespace detail

template <typename... Ts>
Task<std::tuple<detail::Stored<Ts>...>> when_all(Task<Ts>... tasks) {
  return detail::when_all_tuple(std::index_sequence_for<Ts...>{}, std::move(tasks)...);
}

// Vector form: Task<std::vector<T>>, or Task<void> for void tasks.
template <typename T>
auto when_all(std::vector<Task<T>> tasks)
    -> Task<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> {
  std::vector<std::optional<detail::Stored<T>>> slots(tasks.size());
  std::vector<std::exception_ptr> errors(tasks.size());
  std::vector<detail::Runner> runners;
  runners.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i)
    runners.push_back(detail::run_into(std::move(tasks[i]), slots[i], errors[i]));
  detail::Latch latch(runners.size());
  for (detail::Runner& r : runners) r.start(latch);
  co_await latch;
  detail::rethrow_first(errors);
  if constexpr (!std::is_void_v<T>) {
    std::vector<T> out;
    out.reserve(slots.size());
    for (auto& s : slots) out.push_back(std::move(*s));
    co_return out;
  }
}

}  // namespace redco::sched

#pragma once
// RunQueue: where suspended coroutines go to be resumed.
//
// Every thread that drives coroutines (a rank's thread inside sync_wait) owns
// one RunQueue and drains it. An awaitable that suspends records the queue of
// the thread it suspended on (`RunQueue::current()`); whoever completes the
// operation later — a comm progress thread, a oneTBB worker, another rank's
// thread — posts the coroutine back to that queue instead of resuming it in
// place. So a rank's coroutines always run on the rank's own thread: no
// compute ever runs on the progress thread, a TBB worker never blocks waiting
// for a peer, and rank-local state needs no locks.
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <mutex>

namespace redco::sched {

class RunQueue {
 public:
  RunQueue() = default;
  RunQueue(const RunQueue&) = delete;
  RunQueue& operator=(const RunQueue&) = delete;

  // The queue drained by the calling thread, or null outside sync_wait.
  static RunQueue*& current() {
    thread_local RunQueue* q = nullptr;
    return q;
  }

  // Any thread: schedules `h` to be resumed by the draining thread.
  void post(std::coroutine_handle<> h) {
    std::lock_guard lock(mutex_);
    ready_.push_back(h);
    cv_.notify_one();
  }

  // Any thread: tells the draining thread to return once the queue is empty.
  // Notifies under the lock so the drainer cannot return (and destroy this
  // queue) before we have stopped touching it.
  void finish() {
    std::lock_guard lock(mutex_);
    finished_ = true;
    cv_.notify_one();
  }

  // Resumes posted coroutines on the calling thread until `done()` holds
  // (called under the queue's lock, so it may read what post and finish
  // write). What makes it true must run here (a coroutine posted to this
  // queue) or call finish().
  template <typename Done>
  void run_until(const Done& done) {
    RunQueue* const outer = current();
    current() = this;
    std::unique_lock lock(mutex_);
    while (!done()) {
      cv_.wait(lock, [&] { return !ready_.empty() || done(); });
      if (ready_.empty()) break;
      const std::coroutine_handle<> h = ready_.front();
      ready_.pop_front();
      lock.unlock();
      h.resume();
      lock.lock();
    }
    current() = outer;
  }

  // Resumes posted coroutines on the calling thread until finish() is called
  // and nothing is left to run.
  void drain() {
    run_until([this] { return finished_ && ready_.empty(); });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::coroutine_handle<>> ready_;
  bool finished_ = false;
};

// Resumes `h` on `queue` if it has one (the thread that suspended it), else
// right here: a coroutine awaited outside sync_wait has nowhere else to go.
inline void resume_on(RunQueue* queue, std::coroutine_handle<> h) {
  if (queue != nullptr) {
    queue->post(h);
  } else {
    h.resume();
  }
}

// A suspended coroutine plus the queue it must be resumed on.
struct Waiter {
  std::coroutine_handle<> handle;
  RunQueue* queue = nullptr;
  void resume() const { resume_on(queue, handle); }
};

// `co_await sched::yield()`: lets the other coroutines ready on this thread
// run first (goes to the back of the queue).
inline auto yield() {
  struct Awaiter {
    bool await_ready() const noexcept { return RunQueue::current() == nullptr; }
    void await_suspend(std::coroutine_handle<> h) const { RunQueue::current()->post(h); }
    void await_resume() const noexcept {}
  };
  return Awaiter{};
}

}  // namespace redco::sched

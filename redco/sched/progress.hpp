#pragma once
// ProgressEngine: one thread that keeps communication moving.
//
// Transports such as UCX only make progress when someone calls their progress
// function (`ucp_worker_progress`); completion callbacks then fire on that
// thread and set a Completion, which hands the waiting coroutine back to its
// own thread. The engine calls every registered poller in a loop. A poller
// returns true when it did something; while none do, the engine backs off —
// a few spins, then sleeps doubling from 1 µs up to `max_sleep` — so an idle
// process costs next to no CPU yet a busy one sees microsecond latency.
// wake() cuts a sleep short (e.g. when new work is posted).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"

namespace redco::sched {

class ProgressEngine {
 public:
  using Poller = std::function<bool()>;
  using PollerId = uint64_t;
  struct Options {
    int idle_spins = 64;                        // idle passes before sleeping
    std::chrono::microseconds max_sleep{1000};  // longest idle sleep
    // A transport that can sleep until it has work (a descriptor to poll)
    // passes how, and how wake() ends that sleep; the engine then calls
    // idle_wait(max_sleep) instead of its own backoff.
    std::function<void(std::chrono::microseconds)> idle_wait = {};
    std::function<void()> on_wake = {};
  };

  ProgressEngine() : ProgressEngine(Options{}) {}
  explicit ProgressEngine(Options opt) : opt_(opt), thread_([this] { loop(); }) {}
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;
  ~ProgressEngine() { stop(); }

  // Registers a poller; it runs on the progress thread from the next pass.
  // Not callable from inside a poller (the pass holds poll_mutex_).
  PollerId add(Poller p) {
    check_not_progress_thread("add");
    PollerId id;
    {
      std::lock_guard lock(poll_mutex_);
      id = next_id_++;
      pollers_.push_back({id, std::move(p)});
    }
    wake();
    return id;
  }

  // Unregisters a poller. On return it is not running and never will again,
  // so whatever it captured may be destroyed.
  void remove(PollerId id) {
    check_not_progress_thread("remove");
    std::lock_guard lock(poll_mutex_);
    std::erase_if(pollers_, [&](const Entry& e) { return e.id == id; });
  }

  void wake() {
    {
      std::lock_guard lock(mutex_);
      wake_ = true;
      cv_.notify_one();
    }
    if (opt_.on_wake) opt_.on_wake();
  }

  // Stops and joins the thread; idempotent. Pollers are not called again.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      cv_.notify_one();
    }
    if (opt_.on_wake && thread_.joinable()) opt_.on_wake();  // out of an idle_wait
    if (thread_.joinable()) thread_.join();
  }

  // A poller that throws is removed; its exception is kept for the owner
  // (the transport turns it into a failed world). Null when none failed.
  std::exception_ptr error() const {
    std::lock_guard lock(poll_mutex_);
    return error_;
  }

  // Counts completed polling passes (for tests and diagnostics).
  uint64_t passes() const { return passes_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    PollerId id;
    Poller poll;
  };

  void check_not_progress_thread(const char* what) const {
    REDCO_CHECK(std::this_thread::get_id() != thread_.get_id(),
                "ProgressEngine::{} called from a poller; register pollers from another thread",
                what);
  }

  // One pass over the pollers, holding poll_mutex_ (see remove()).
  bool poll_all() {
    std::lock_guard lock(poll_mutex_);
    bool progressed = false;
    for (size_t i = 0; i < pollers_.size();) {
      try {
        progressed |= pollers_[i].poll();
        ++i;
      } catch (...) {
        if (!error_) error_ = std::current_exception();
        pollers_.erase(pollers_.begin() + std::ptrdiff_t(i));
      }
    }
    passes_.fetch_add(1, std::memory_order_relaxed);
    return progressed;
  }

  void loop() {
    int idle = 0;
    std::chrono::microseconds sleep{1};
    for (;;) {
      const bool progressed = poll_all();
      std::unique_lock lock(mutex_);
      if (stopping_) break;
      if (progressed || wake_) {
        idle = 0;
        sleep = std::chrono::microseconds{1};
        wake_ = false;
        continue;
      }
      if (++idle < opt_.idle_spins) {
        lock.unlock();
        std::this_thread::yield();
        continue;
      }
      if (opt_.idle_wait) {
        lock.unlock();
        opt_.idle_wait(opt_.max_sleep);
        continue;
      }
      cv_.wait_for(lock, sleep, [&] { return stopping_ || wake_; });
      sleep = std::min(sleep * 2, opt_.max_sleep);
    }
  }

  Options opt_;
  mutable std::mutex poll_mutex_;  // held while pollers run: guards pollers_, error_
  mutable std::mutex mutex_;       // guards the wake/stop flags
  std::condition_variable cv_;
  std::vector<Entry> pollers_;
  PollerId next_id_ = 1;
  bool stopping_ = false;
  bool wake_ = false;
  std::atomic<uint64_t> passes_{0};
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after every other member is ready
};

}  // namespace redco::sched

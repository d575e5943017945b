#pragma once
// CallOrder: lets a backend start its calls in call order when their tasks
// start in another. Comm's collectives are lazy tasks paired across ranks by
// *call* order (comm.hpp), but a transport that enqueues work as it starts
// (NCCL on a stream) must enqueue in that order on every rank, or two ranks
// run different collectives against each other. A call k takes a Ticket and
// awaits its turn before enqueueing; the turn passes on when it hands the
// ticket back — or when its task is destroyed unstarted (the ticket dies
// with the coroutine frame), so a dropped task holds up no later call.
//
//   Task run(Ticket ticket) {        // made by comm.do_x(seq, ...)
//     Ticket mine = std::move(ticket);
//     co_await mine.wait();           // calls 0..k-1 have gone
//     enqueue();
//     mine.give_back();               // call k + 1 may go
//     ...
//   }
//
// Move the ticket into a local first: a coroutine's parameters live until its
// task is destroyed, which under when_all is after every other task has
// finished — one of which may be waiting for this turn — while its locals end
// with its body, also when the body throws.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "redco/sched/event.hpp"
#include "redco/sched/task.hpp"

namespace redco::comm {

class CallOrder {
 public:
  // Completes once every call before `seq` has finished its turn.
  sched::Task<void> wait(uint64_t seq) {
    std::shared_ptr<sched::AsyncEvent> turn;
    {
      std::lock_guard lock(mutex_);
      if (seq != next_) turn = waiting_[seq] = std::make_shared<sched::AsyncEvent>();
    }
    if (turn) co_await *turn;
  }
  // Call `seq`'s turn is over (it may not have come yet: a call handed back
  // early, such as one a backend passes to another transport).
  void finish(uint64_t seq) {
    std::shared_ptr<sched::AsyncEvent> wake;
    {
      std::lock_guard lock(mutex_);
      finished_.insert(seq);
      while (finished_.erase(next_)) ++next_;
      if (auto it = waiting_.find(next_); it != waiting_.end()) {
        wake = std::move(it->second);
        waiting_.erase(it);
      }
    }
    if (wake) wake->set();
  }

 private:
  std::mutex mutex_;
  uint64_t next_ = 0;            // the call whose turn it is
  std::set<uint64_t> finished_;  // finished ahead of next_
  std::map<uint64_t, std::shared_ptr<sched::AsyncEvent>> waiting_;
};

// Call `seq`'s place in a CallOrder, handed back exactly once.
class Ticket {
 public:
  Ticket(std::shared_ptr<CallOrder> order, uint64_t seq) : order_(std::move(order)), seq_(seq) {}
  Ticket(Ticket&& o) noexcept : order_(std::move(o.order_)), seq_(o.seq_) {}
  Ticket& operator=(Ticket&&) = delete;
  ~Ticket() { give_back(); }
  sched::Task<void> wait() { return order_->wait(seq_); }
  void give_back() {
    if (order_) std::exchange(order_, nullptr)->finish(seq_);
  }

 private:
  std::shared_ptr<CallOrder> order_;
  uint64_t seq_;
};

}  // namespace redco::comm

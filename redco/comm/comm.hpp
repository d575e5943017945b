#pragma once
// Comm: one rank's handle on a group of ranks, and the collectives over it.
//
// Every collective returns a lazy sched::Task: nothing moves until it is
// awaited, so a caller can launch several (`when_all`) and overlap them with
// compute. Ordering is fixed at *call* time, not at start time: each call
// takes the next sequence number of this communicator, and a backend pairs
// the k-th call on one rank with the k-th call on every other rank. So
//   co_await when_all(comm.all_reduce(a), comm.all_reduce(b));
// pairs a with a and b with b on every rank whatever order the two tasks
// happen to start in. The rule a program must follow: every rank of a group
// *calls* the group's collectives in the same order (the usual SPMD rule).
// Point-to-point messages are paired the same way: the k-th send(peer, tag)
// on one rank matches the k-th recv(from, tag) on the other.
//
// Tensors are passed by reference for the caller's convenience, but a task
// keeps its own handle (Tensor shares storage), so the Tensor object need not
// outlive the call; the storage must not be touched until the task finishes.
// Reductions are deterministic: the same inputs give bitwise the same output
// on every rank and in every run.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "redco/core/tensor.hpp"
#include "redco/sched/task.hpp"

namespace redco::comm {

enum class ReduceOp { sum, mean };

inline std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "mean"; }

class Comm {
 public:
  using Task = sched::Task<void>;
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  virtual ~Comm() = default;

  virtual int rank() const = 0;  // this rank's index in the group
  virtual int size() const = 0;
  // The index of group rank `r` in the world communicator (for messages).
  virtual int world_rank(int r) const = 0;

  // In place: every rank ends with the elementwise sum (or mean) over ranks.
  // Floating dtypes; reduced in f32 in rank order 0..n-1.
  Task all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum) {
    return do_all_reduce(next_seq(), t, op);
  }
  // `in` is [size * m, ...]; rank r receives the reduction of rows
  // [r*m, (r+1)*m) into `out` ([m, ...]). `out` may be a view of `in`.
  Task reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::sum) {
    return do_reduce_scatter(next_seq(), in, out, op);
  }
  // `in` is [m, ...] on every rank; `out` ([size * m, ...]) receives rank r's
  // rows at [r*m, (r+1)*m). `in` may be a view of `out` at this rank's rows.
  Task all_gather(const Tensor& in, Tensor& out) { return do_all_gather(next_seq(), in, out); }
  // Every rank's `t` receives root's `t`.
  Task broadcast(Tensor& t, int root) { return do_broadcast(next_seq(), t, root); }
  // Completes once every rank of the group has called it.
  Task barrier() { return do_barrier(next_seq()); }

  // Point-to-point. send completes once the data is on its way (the caller
  // may reuse `t` afterwards); recv completes when `t` holds the message,
  // whose shape and dtype must match `t`'s.
  Task send(const Tensor& t, int peer, int tag = 0) {
    return do_send(next_p2p(send_seq_, peer, tag), t, peer, tag);
  }
  Task recv(Tensor& t, int peer, int tag = 0) {
    return do_recv(next_p2p(recv_seq_, peer, tag), t, peer, tag);
  }

  // A communicator over some of this group's ranks (strictly increasing
  // group ranks, including this one); its rank r is ranks[r]. Every member
  // calls it with the same list, in the same order relative to other
  // subgroup() calls with that list; non-members do not call it.
  virtual std::unique_ptr<Comm> subgroup(std::span<const int> ranks) = 0;

 protected:
  virtual Task do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) = 0;
  virtual Task do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) = 0;
  virtual Task do_all_gather(uint64_t seq, Tensor in, Tensor out) = 0;
  virtual Task do_broadcast(uint64_t seq, Tensor t, int root) = 0;
  virtual Task do_barrier(uint64_t seq) = 0;
  virtual Task do_send(uint64_t seq, Tensor t, int peer, int tag) = 0;
  virtual Task do_recv(uint64_t seq, Tensor t, int peer, int tag) = 0;

 private:
  using P2pSeqs = std::map<std::pair<int, int>, uint64_t>;  // (peer, tag) -> next
  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t next_p2p(P2pSeqs& seqs, int peer, int tag) {
    std::lock_guard lock(p2p_mutex_);
    return seqs[{peer, tag}]++;
  }

  std::atomic<uint64_t> seq_{0};
  std::mutex p2p_mutex_;
  P2pSeqs send_seq_, recv_seq_;
};

}  // namespace redco::comm

#pragma once
// The threads backend: n ranks in one process, one std::thread each,
// collectives through shared memory.
//
//   ThreadsWorld world(4);
//   world.run([&](Comm& comm) {
//     Tensor g = ...;
//     sched::sync_wait(comm.all_reduce(g, ReduceOp::mean));
//   });
//
// How a collective runs: each rank's k-th call on a group meets the others
// at slot k of that group (a rendezvous). A rank arriving registers its
// buffer and suspends; the last to arrive posts everyone back to their own
// threads' run queues (so no rank ever runs another rank's code, and nothing
// blocks a TBB worker). Then every rank does its share of the work in
// parallel — for all_reduce, rank r reduces elements chunk r over ranks
// 0..n-1 in that order and publishes it, then all copy every chunk — which
// makes results bitwise identical on all ranks and across runs.
//
// Failures never hang: the k-th calls must match (op, dtype, shape, root) or
// every rank gets an error naming both calls; a watchdog on a ProgressEngine
// ends a collective that waits longer than `timeout` with an error naming the
// ranks that never arrived; a rank whose function throws (inside run())
// fails the world, and every rank waiting or arriving later gets an error
// naming it; a rank whose function returns ends the collectives it never
// joined. A failed world stays failed.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "redco/comm/comm.hpp"

namespace redco::comm {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct ThreadsOptions {
  // How long a collective (or a recv) may wait for the other ranks.
  std::chrono::milliseconds timeout{300'000};
};

namespace detail {
struct ThreadsState;
}

class ThreadsWorld {
 public:
  explicit ThreadsWorld(int n, ThreadsOptions options = {});
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  int size() const { return int(comms_.size()); }
  // Rank r's world communicator, for callers that run their own threads.
  Comm& comm(int rank);

  // Runs fn(comm(r)) on n threads and joins them. If a rank throws, the world
  // fails (peers get an error naming it) and run() rethrows the first
  // failure as redco::Error("rank r failed: ...").
  void run(const std::function<void(Comm&)>& fn);

  // What run() does for its threads, for callers that run their own:
  // `rank` is dead (every pending and later collective fails, naming it) ...
  void fail(int rank, const std::string& why);
  // ... or is done (the collectives it never joined fail, naming it).
  void exited(int rank);

 private:
  std::shared_ptr<detail::ThreadsState> state_;
  std::vector<std::unique_ptr<Comm>> comms_;
};

}  // namespace redco::comm

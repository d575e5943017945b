#pragma once
// The threads backend's shared state (redco/comm/threads_comm.hpp): what the
// ranks' communicators of one ThreadsWorld meet in, and how a failure or an
// exited rank ends what is in flight. Internal to threads_comm.cpp (the
// collectives) and threads_world.cpp (the world and its failures).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "redco/comm/threads_comm.hpp"
#include "redco/sched/progress.hpp"
#include "redco/sched/run_queue.hpp"

namespace redco::comm::detail {

using Clock = std::chrono::steady_clock;
using Waiters = std::vector<sched::Waiter>;

// One collective call, shared by the group's ranks from the first arrival
// until every rank has left its last rendezvous point.
struct Slot {
  uint64_t seq = 0;
  std::string desc;           // the first arrival's call, e.g. "all_reduce(sum, f32[4])"
  int first = 0;              // group rank of the first arrival
  int phases = 1;             // rendezvous points in this collective
  int phase = 0;              // the one being gathered
  int count = 0;              // arrivals at `phase`
  std::vector<int> reached;   // per group rank: rendezvous points reached
  std::vector<Tensor> bufs;   // per group rank: its tensor
  std::vector<Tensor> parts;  // per group rank: a partial result it publishes
  Waiters waiting;
  std::string error;        // why it failed; empty while healthy
  Clock::time_point since;  // when `phase` began gathering
};

struct Group {
  uint64_t id = 0;
  std::vector<int> members;                         // world ranks, by group rank
  std::map<uint64_t, std::shared_ptr<Slot>> slots;  // in flight, by sequence number
  std::string name() const { return fmt::format("[{}]", fmt::join(members, ", ")); }
};

// A point-to-point message, created by whichever of send/recv comes first
// and dropped when recv takes it.
struct Envelope {
  int src = 0;  // world rank
  Tensor data;
  bool sent = false;
  bool waiting = false;  // a recv is suspended on it
  sched::Waiter receiver;
  std::string error;
  Clock::time_point since;
};
using MailKey = std::tuple<uint64_t, int, int, int, uint64_t>;      // group, src, dst, tag, seq
using GroupKey = std::tuple<uint64_t, std::vector<int>, uint64_t>;  // parent, members, nth

struct ThreadsState {
  ThreadsState(int n, ThreadsOptions opt, sched::ProgressEngine::Options engine_opt)
      : options(opt), exited(size_t(n), false), watchdog(engine_opt) {}
  ThreadsOptions options;
  std::mutex mutex;     // guards everything below but the watchdog
  std::string failure;  // the first failure; empty while healthy
  std::vector<bool> exited;
  std::map<GroupKey, std::shared_ptr<Group>> groups;
  std::map<MailKey, std::shared_ptr<Envelope>> mail;
  uint64_t next_group_id = 1;
  sched::ProgressEngine watchdog;  // last: its thread stops before the rest goes
};

// Under the lock: `why` as the failure of a collective or a receive in flight,
// its waiters added to `wake` (resumed by the caller once the lock is gone).
void fail_slot(Slot& s, const std::string& why, Waiters& wake);
void fail_envelope(Envelope& e, const std::string& why, Waiters& wake);
// Under the lock. Records the first failure and ends everything in flight.
void fail_world(ThreadsState& st, const std::string& why, Waiters& wake);
// The world ranks of g that have not reached the slot's current phase.
std::vector<int> missing(const Group& g, const Slot& s);
// Under the lock: the collectives and receives that `rank` will now never join.
void rank_exited(ThreadsState& st, int rank, Waiters& wake);
// Fails what has waited longer than the world's timeout (the watchdog's job).
void check_timeouts(ThreadsState& st);

// Rank `rank` of group g's communicator.
std::unique_ptr<Comm> make_threads_comm(std::shared_ptr<ThreadsState> st, std::shared_ptr<Group> g,
                                        int rank);

}  // namespace redco::comm::detail

#pragma once
// Private to the UCX backend (ucx_comm.cpp, ucx_world.cpp): one process's
// UCX state (World), the messages in flight (Op), the tag layout, and the
// set-up that connects a rank to its peers. The algorithms (Ring, UcxComm)
// live in ucx_comm.cpp.

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "redco/comm/ucx_comm.hpp"
#include "redco/core/heartbeat.hpp"
#include "redco/core/tensor.hpp"
#include "redco/sched/event.hpp"
#include "redco/sched/progress.hpp"

namespace redco::comm::ucx_detail {

using Clock = std::chrono::steady_clock;

// A 64-bit UCP tag names one message exactly, so receives never need
// wildcards and messages of different calls can never be confused:
//   [63] point-to-point | [62..48] group | [47..37] source world rank |
//   [36..25] step within the algorithm (user tag for p2p) |
//   [24..14] segment of a pipelined ring step | [13..0] sequence.
// The sequence number wraps; only ranks 2^14 calls apart could clash, and
// every collective keeps the ranks of a group within one call of each other.
constexpr int kMaxRanks = 1 << 11;  // a ring's 2(n-1) steps must fit the step field
constexpr int kMaxSteps = 1 << 12;
constexpr int kMaxSegments = 1 << 11;
constexpr uint64_t kGroupMask = (uint64_t(1) << 15) - 1;

inline uint64_t make_tag(bool p2p, uint64_t group, int src, int step, uint64_t seq, int seg = 0) {
  return uint64_t(p2p) << 63 | (group & kGroupMask) << 48 | uint64_t(src) << 37 |
         uint64_t(step) << 25 | uint64_t(seg) << 14 | (seq & 0x3fff);
}

struct World;

// One posted send or receive. It lives in World::pending until UCX is done
// with the buffer (`keep` holds the buffer's storage until then, even if the
// awaiting coroutine gave up on it after a timeout).
// From construction to completion it counts as a message in flight for the
// heartbeat: a rank with one is waiting on a peer (see core/heartbeat.hpp).
struct Op {
  Op(World* w, Tensor k, int p, bool r, size_t n, Clock::time_point d)
      : world(w), keep(std::move(k)), peer(p), is_recv(r), expect(n), deadline(d) {
    heartbeat::wait_begin();
  }
  ~Op() {
    if (!completed) heartbeat::wait_end();
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  World* world = nullptr;
  sched::Completion<void> done;
  Tensor keep;
  int peer = 0;  // world rank
  bool is_recv = false;
  size_t expect = 0;  // receives: the message size
  Clock::time_point deadline;
  void* req = nullptr;     // the UCX request while in flight
  bool completed = false;  // `done` is (about to be) set
  // When set, runs instead of firing `done`: under the World's lock, on the
  // thread that settles the World (mostly the progress thread), with "" or
  // the reason it failed. A ring step uses it to chain the next message
  // without waiting for its caller's thread (so it overlaps with compute).
  std::function<void(const std::string&)> then;
};
using OpPtr = std::shared_ptr<Op>;

// One process's UCX state, shared by its world communicator and subgroups.
// `mutex` serialises every UCX call (the worker is created SERIALIZED), and
// callbacks run under it: they only record results in `to_fire`, which is
// delivered after unlocking, so a coroutine resumed inline never re-enters.
struct World {
  std::mutex mutex;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> eps;     // data, by world rank; null for this rank
  std::vector<ucp_ep_h> guards;  // same-host peers: an idle endpoint that detects their death
  std::vector<std::pair<World*, int>> peer_args;  // endpoint error-handler arguments
  int rank = 0, size = 1;
  UcxOptions options;
  std::map<Op*, OpPtr> pending;
  std::vector<std::pair<OpPtr, std::string>> to_fire;
  std::vector<std::pair<OpPtr, std::string>> chained;  // finished ops whose `then` is due
  std::vector<std::string> dead;  // per world rank: why it is gone; "" while alive
  std::string failure;            // the first timeout; "" while healthy
  bool closing = false;
  std::vector<uint8_t> goodbyes;  // one byte per peer: the closing handshake's buffers
  Clock::time_point last_check;
  int event_fd = -1;  // the worker's wakeup descriptor (UCP_FEATURE_WAKEUP); -1: none
  std::unique_ptr<sched::ProgressEngine> engine;

  ~World();
  void finish(const OpPtr& op, std::string why) {
    if (op->completed) return;
    op->completed = true;
    heartbeat::wait_end();
    (op->then ? chained : to_fire).emplace_back(op, std::move(why));
  }
  // Fails `op` now; a receive is also withdrawn, so no late message lands
  // in a buffer its owner has moved on from; sends are left to finish.
  void abort(const OpPtr& op, const std::string& why) {
    finish(op, why);
    if (op->is_recv && op->req != nullptr) ucp_request_cancel(worker, op->req);
  }
  // Under the lock: runs due continuations (which may post more messages),
  // then hands out the completions to deliver after unlocking.
  std::vector<std::pair<OpPtr, std::string>> settle() {
    while (!chained.empty()) {
      auto [op, why] = std::move(chained.back());
      chained.pop_back();
      std::exchange(op->then, {})(why);
    }
    return std::exchange(to_fire, {});
  }
  void submit(const OpPtr& op, uint64_t tag, void* buf, size_t len);
  void say_goodbye();
  void peer_failed(int peer, const std::string& why);
  void check_timeouts();
  bool poll();
  // The progress thread with nothing to do: sleeps on the worker's event
  // descriptor until the wire or signal() stirs it, at most `most`.
  void idle_wait(std::chrono::microseconds most);
  void signal();  // ends an idle_wait early (an operation was posted)
};

// Fires the completions `settle` handed out (after unlocking the World).
void deliver(std::vector<std::pair<OpPtr, std::string>> fired);

// UCX context and worker; returns "identity\0address" for the rendezvous.
std::string init_worker(World& w);

// Whether a UCX_TLS value limits UCX to TCP (and loopback to itself):
// "tcp,self", "tcp". A list that excludes ("^shm") or names another
// transport does not. init_worker then sends every message eagerly.
bool tcp_only(const char* tls);

// Under the lock: opens the endpoints to every peer from the rendezvous'
// blobs (see ucx_world.cpp for why same-host peers get two).
void connect_peers(World& w, const std::vector<std::string>& blobs);

}  // namespace redco::comm::ucx_detail

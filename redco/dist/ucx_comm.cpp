#include "redco/dist/ucx_comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/sched/event.hpp"
#include "redco/sched/progress.hpp"

namespace redco::dist {
namespace {

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

uint64_t make_tag(bool p2p, uint64_t group, int src, int step, uint64_t seq, int seg = 0) {
  return uint64_t(p2p) << 63 | (group & kGroupMask) << 48 | uint64_t(src) << 37 |
         uint64_t(step) << 25 | uint64_t(seg) << 14 | (seq & 0x3fff);
}

void check_ucs(ucs_status_t st, const char* what) {
  REDCO_CHECK(st == UCS_OK, "UCX: {} failed: {}", what, ucs_status_string(st));
}

struct World;

// One posted send or receive. It lives in World::pending until UCX is done
// with the buffer (`keep` holds the buffer's storage until then, even if the
// awaiting coroutine gave up on it after a timeout).
struct Op {
  Op(World* w, Tensor k, int p, bool r, size_t n, Clock::time_point d)
      : world(w), keep(std::move(k)), peer(p), is_recv(r), expect(n), deadline(d) {}
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
  Clock::time_point last_check;
  std::unique_ptr<sched::ProgressEngine> engine;

  ~World();
  void finish(const OpPtr& op, std::string why) {
    if (op->completed) return;
    op->completed = true;
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
  void peer_failed(int peer, const std::string& why);
  void check_timeouts();
  bool poll();
};

void deliver(std::vector<std::pair<OpPtr, std::string>> fired) {
  for (auto& [op, why] : fired)
    why.empty() ? op->done.set() : op->done.set_exception(std::make_exception_ptr(Error(why)));
}

// Under the lock (UCX calls callbacks from inside its own functions).
void on_done(Op* raw, void* request, ucs_status_t st, size_t length) {
  World& w = *raw->world;
  ucp_request_free(request);
  raw->req = nullptr;
  auto it = w.pending.find(raw);
  if (it == w.pending.end()) return;
  const OpPtr op = it->second;
  w.pending.erase(it);
  std::string why;
  if (st == UCS_ERR_MESSAGE_TRUNCATED || (st == UCS_OK && op->is_recv && length != op->expect)) {
    why = fmt::format("rank {} sent a message of a different size than the {} bytes expected",
                      op->peer, op->expect);
  } else if (st != UCS_OK && st != UCS_ERR_CANCELED) {  // UCX's verdict on the peer
    why = fmt::format("rank {} failed or disconnected (UCX: {})", op->peer, ucs_status_string(st));
    w.peer_failed(op->peer, why);
  } else if (st == UCS_ERR_CANCELED) {
    why = "cancelled";
  }
  w.finish(op, why);
}

void send_cb(void* request, ucs_status_t st, void* user) {
  on_done(static_cast<Op*>(user), request, st, 0);
}
void recv_cb(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
  on_done(static_cast<Op*>(user), request, st, info != nullptr ? info->length : 0);
}
void ep_error_cb(void* arg, ucp_ep_h, ucs_status_t st) {
  auto [w, rank] = *static_cast<std::pair<World*, int>*>(arg);
  w->peer_failed(
      rank, fmt::format("rank {} failed or disconnected (UCX: {})", rank, ucs_status_string(st)));
}

void World::peer_failed(int peer, const std::string& why) {
  if (closing || !dead[size_t(peer)].empty()) return;
  dead[size_t(peer)] = why;
  std::vector<OpPtr> hit;  // cancelling runs callbacks, which edit `pending`
  for (auto& [raw, op] : pending)
    if (op->peer == peer && !op->completed) hit.push_back(op);
  for (const OpPtr& op : hit) abort(op, why);
}

// A missed deadline leaves the sequence of calls out of step with the peers,
// so it fails the whole communicator.
void World::check_timeouts() {
  const Clock::time_point now = Clock::now();
  if (now - last_check < std::chrono::milliseconds(1)) return;
  last_check = now;
  const double secs = std::chrono::duration<double>(options.timeout).count();
  std::vector<OpPtr> late;
  for (auto& [raw, op] : pending)
    if (!op->completed && now > op->deadline) late.push_back(op);
  for (const OpPtr& op : late) {
    const std::string why =
        fmt::format("timed out after {:g} s waiting for rank {} to {}", secs, op->peer,
                    op->is_recv ? "send its message" : "take this rank's message");
    if (failure.empty()) failure = why;
    abort(op, why);
  }
}

bool World::poll() {
  std::vector<std::pair<OpPtr, std::string>> fired;
  bool progressed;
  {
    std::lock_guard lock(mutex);
    progressed = ucp_worker_progress(worker) != 0;
    check_timeouts();
    fired = settle();
  }
  progressed |= !fired.empty();
  deliver(std::move(fired));
  return progressed;
}

// Flushes and closes the endpoints (bounded: a dead peer cannot hold us),
// so messages this rank sent last still reach peers that are alive.
World::~World() {
  if (engine) engine->stop();
  std::lock_guard lock(mutex);
  closing = true;
  std::vector<OpPtr> left;  // cancelling runs callbacks, which edit `pending`
  for (auto& [raw, op] : pending) left.push_back(op);
  for (const OpPtr& op : left)
    if (op->is_recv && op->req != nullptr) ucp_request_cancel(worker, op->req);
  std::vector<void*> closes;
  const ucp_request_param_t flush{};  // no flags: flush, then close
  ucp_request_param_t force{};        // a dead peer cannot answer a flush
  force.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  force.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (size_t r = 0; r < eps.size(); ++r)
    for (ucp_ep_h ep : {eps[r], guards[r]})
      if (void* q = ep ? ucp_ep_close_nbx(ep, dead[r].empty() ? &flush : &force) : nullptr;
          UCS_PTR_IS_PTR(q))
        closes.push_back(q);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  for (void* r : closes) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker);
    ucp_request_free(r);
  }
  // Ops stay alive until the worker is gone: destroying it may still call
  // their callbacks.
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (context != nullptr) ucp_cleanup(context);
  pending.clear();
  to_fire.clear();
}

// A plain function, not a braced list inside co_await: g++ 12 rejects
// initializer lists in coroutine frames ("array used as initializer").
template <typename... Ops>
std::vector<OpPtr> ops_of(Ops... ops) {
  std::vector<OpPtr> v;
  (v.push_back(std::move(ops)), ...);
  return v;
}

std::string sig(const Tensor& t) { return fmt::format("{}{}", dtype_name(t.dtype()), t.shape()); }

void check_tensor(const Tensor& t, const char* op, bool reduce) {
  REDCO_CHECK(t.defined(), "{}: the tensor is undefined", op);
  REDCO_CHECK(t.device().is_cpu(), "{}: the UCX backend needs CPU tensors, got one on {}", op,
              t.device().str());
  REDCO_CHECK(!reduce || is_floating(t.dtype()),
              "{}: reductions need a floating tensor (f32, bf16, f16), got {}", op, sig(t));
}

// `whole` is [n * m, ...] and `part` [m, ...], of one dtype.
void check_split(const char* op, const Tensor& whole, const Tensor& part, int n, bool reduce) {
  check_tensor(whole, op, reduce);
  check_tensor(part, op, reduce);
  REDCO_CHECK(part.rank() >= 1 && whole.dtype() == part.dtype() && whole.rank() == part.rank() &&
                  whole.shape() == part.shape().with(0, part.dim(0) * n),
              "{} over {} ranks: the whole must be [{} * m, ...] and the part [m, ...] of the same "
              "dtype, got {} and {}",
              op, n, n, sig(whole), sig(part));
}

// The f32 buffer a reduction works in: `t` itself when it is f32, else a copy.
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor w = Tensor::empty(Shape{t.numel()});
  w.copy_from(t);
  return w;
}

// The n near-equal chunks the ring splits a buffer into; c is taken mod n.
struct Chunks {
  int64_t numel;
  int n;
  int64_t begin(int c) const { return numel * (((c % n) + n) % n) / n; }
  int64_t len(int c) const { return numel * ((((c % n) + n) % n) + 1) / n - begin(c); }
};

// A pipelined ring over `work`'s n chunks, each cut into `segs` segments that
// travel on their own: segment j of step s+1 leaves as soon as segment j of
// step s has arrived (and, reducing, been added), so one segment's transfer
// overlaps another's addition and no bandwidth is lost between steps. Each
// step after the first is posted by its predecessor's completion (Op::then,
// mostly on the progress thread), so the collective runs to the end while its
// caller computes. Steps 0..n-2 reduce-scatter: step s sends chunk rank-s-1
// right, receives chunk rank-s-2 from the left into a scratch slot and adds
// this rank's values to it, so chunk c is summed in ring order starting at
// rank c+1 and ends, complete, on rank c. The next n-1 steps all-gather:
// step g passes chunk rank-g right and receives chunk rank-g-1 in place.
struct Ring : std::enable_shared_from_this<Ring> {
  Ring(World* world, uint64_t g, uint64_t q, std::vector<int> ring_ranks, int r, Tensor buf,
       bool red, bool gat, bool avg)
      : w(world),
        group(g),
        seq(q),
        ranks(std::move(ring_ranks)),
        n(int(ranks.size())),
        rank(r),
        work(std::move(buf)),
        reduce(red),
        gather(gat),
        mean(avg),
        ch{work.numel(), n} {
    // Segments of at most segment_bytes, and at least 8 per chunk while
    // they stay above 64 KiB (smaller ones cost more in latency than they
    // gain in overlap).
    const int64_t max_len = (work.numel() + n - 1) / n;
    const int64_t seg = std::max<int64_t>(int64_t(w->options.segment_bytes), 4);
    const int64_t want = std::max((max_len * 4 + seg - 1) / seg,
                                  std::min<int64_t>(8, max_len * 4 / (int64_t(64) << 10)));
    segs = int(std::clamp<int64_t>(want, 1, kMaxSegments));
    seg_cap = (max_len + segs - 1) / segs + 1;
    scratch = Tensor::empty(Shape{reduce ? segs * seg_cap : 1});  // [segs * seg_cap] f32
    steps = (reduce ? n - 1 : 0) + (gather ? n - 1 : 0);
    final = std::make_shared<Op>(w, work, ranks[size_t(rank)], false, 0, Clock::time_point::max());
  }

  World* w;
  uint64_t group, seq;
  std::vector<int> ranks;  // world ranks, by group rank
  int n, rank;
  Tensor work;  // [numel] f32, reduced in place
  bool reduce, gather, mean;
  Chunks ch;
  int segs = 1;
  int64_t seg_cap = 0;  // the longest segment, in floats
  Tensor scratch;       // [segs * seg_cap] f32: one receive slot per segment
  int steps = 0, outstanding = 0, finished = 0;
  std::string failed;
  OpPtr final;                         // completes the caller's wait
  std::vector<std::weak_ptr<Op>> ops;  // to withdraw receives after a failure

  int64_t seg_begin(int c, int j) const { return ch.begin(c) + ch.len(c) * j / segs; }
  int64_t seg_len(int c, int j) const { return seg_begin(c, j + 1) - seg_begin(c, j); }
  bool reducing(int s) const { return reduce && s < n - 1; }
  int out_chunk(int s) const {
    return reducing(s) ? rank - s - 1 : rank - (reduce ? s - n + 1 : s);
  }
  int world_of(int r) const { return ranks[size_t(((r % n) + n) % n)]; }

  // Under the World's lock, like every member below.
  void start() {
    for (int j = 0; j < segs; ++j) post_step(0, j);
  }
  void post(bool recv, int s, int j, float* buf, int64_t len, const Tensor& keep) {
    const int peer = world_of(recv ? rank - 1 : rank + 1);
    auto op = std::make_shared<Op>(w, keep, peer, recv, size_t(len) * 4,
                                   Clock::now() + w->options.timeout);
    op->then = [self = shared_from_this(), recv, s, j](const std::string& why) {
      self->done(recv, s, j, why);
    };
    ++outstanding;
    ops.push_back(op);
    const int src = recv ? peer : ranks[size_t(rank)];
    w->submit(op, make_tag(false, group, src, s, seq, j), buf, size_t(len) * 4);
  }
  void post_step(int s, int j) {
    const int oc = out_chunk(s), ic = oc - 1;
    float* x = work.data<float>();
    float* in = reducing(s) ? scratch.data<float>() + j * seg_cap : x + seg_begin(ic, j);
    post(true, s, j, in, seg_len(ic, j), reducing(s) ? scratch : work);
    post(false, s, j, x + seg_begin(oc, j), seg_len(oc, j), work);
  }
  void done(bool recv, int s, int j, const std::string& why) {
    --outstanding;
    if (!why.empty()) return fail(why);
    if (recv && failed.empty()) {
      if (reducing(s)) {
        const int ic = out_chunk(s) - 1;
        const float* in = scratch.data<float>() + j * seg_cap;
        float* acc = work.data<float>() + seg_begin(ic, j);
        const int64_t len = seg_len(ic, j);
        for (int64_t i = 0; i < len; ++i) acc[i] = in[i] + acc[i];
        if (s == n - 2 && mean)  // chunk ic is this rank's, now complete
          for (int64_t i = 0; i < len; ++i) acc[i] /= float(n);
      }
      s + 1 < steps ? post_step(s + 1, j) : void(++finished);
    }
    if (failed.empty() && outstanding == 0 && finished == segs) w->finish(final, "");
  }
  void fail(const std::string& why) {
    if (!failed.empty()) return;
    failed = why;
    w->finish(final, why);
    for (const std::weak_ptr<Op>& weak : ops)
      if (OpPtr op = weak.lock(); op && op->is_recv && !op->completed) w->abort(op, "cancelled");
  }
};

uint64_t subgroup_id(uint64_t parent, const std::vector<int>& members, uint64_t nth) {
  uint64_t h = 1469598103934665603ull ^ parent;  // FNV-1a over the group's identity
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (int m : members) mix(uint64_t(m));
  mix(nth);
  return 1 + h % kGroupMask;  // never 0, the world's id
}

class UcxComm final : public Comm {
 public:
  UcxComm(std::shared_ptr<World> w, uint64_t id, std::vector<int> members, int rank)
      : w_(std::move(w)), id_(id), members_(std::move(members)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  int world_rank(int r) const override { return members_.at(size_t(r)); }
  std::unique_ptr<Comm> subgroup(std::span<const int> ranks) override;

 protected:
  Task do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) override;
  Task do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) override;
  Task do_all_gather(uint64_t seq, Tensor in, Tensor out) override;
  Task do_broadcast(uint64_t seq, Tensor t, int root) override;
  Task do_barrier(uint64_t seq) override;
  Task do_send(uint64_t seq, Tensor t, int peer, int tag) override {
    return p2p(false, seq, std::move(t), peer, tag);
  }
  Task do_recv(uint64_t seq, Tensor t, int peer, int tag) override {
    return p2p(true, seq, std::move(t), peer, tag);
  }

 private:
  std::string group_name() const { return fmt::format("[{}]", fmt::join(members_, ", ")); }
  [[noreturn]] void raise(const std::string& what, const std::string& why) const {
    fail("{} on group {} failed on rank {}: {}", what, group_name(), world_rank(rank_), why);
  }
  int right(int k = 1) const { return (rank_ + k) % size(); }
  int left(int k = 1) const { return (rank_ - k % size() + size()) % size(); }
  // Posts a message to / from group rank `peer`; `step` tells apart the
  // messages of one call.
  OpPtr post(bool recv, int peer, uint64_t tag, void* buf, size_t len, const Tensor& keep);
  OpPtr send_to(int peer, uint64_t seq, int step, const void* buf, size_t len, const Tensor& keep) {
    return post(false, peer, make_tag(false, id_, world_rank(rank_), step, seq),
                const_cast<void*>(buf), len, keep);
  }
  OpPtr recv_from(int peer, uint64_t seq, int step, void* buf, size_t len, const Tensor& keep) {
    return post(true, peer, make_tag(false, id_, world_rank(peer), step, seq), buf, len, keep);
  }
  Task wait(std::vector<OpPtr> ops, std::string what);
  Task gather(uint64_t seq, Tensor in, Tensor out, std::string what);
  Task direct_all_reduce(uint64_t seq, Tensor work, ReduceOp op, std::string what);
  Task ring(uint64_t seq, Tensor work, bool reduce, bool gather, ReduceOp op, std::string what);
  Task p2p(bool recv, uint64_t seq, Tensor t, int peer, int tag);

  std::shared_ptr<World> w_;
  uint64_t id_;
  std::vector<int> members_;  // world ranks, by group rank
  int rank_;
  std::map<std::vector<int>, uint64_t> created_;  // subgroups made, by member list
};

// Under the lock: hands `op` to UCX, or fails it at once when its peer or
// the communicator is known to be gone.
void World::submit(const OpPtr& op, uint64_t tag, void* buf, size_t len) {
  if (!failure.empty()) return finish(op, "the communicator failed earlier: " + failure);
  if (!dead[size_t(op->peer)].empty()) return finish(op, dead[size_t(op->peer)]);
  pending[op.get()] = op;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = op.get();
  void* r;
  if (op->is_recv) {
    p.cb.recv = recv_cb;
    r = ucp_tag_recv_nbx(worker, buf, len, tag, ~uint64_t(0), &p);
  } else {
    p.cb.send = send_cb;
    r = ucp_tag_send_nbx(eps[size_t(op->peer)], buf, len, tag, &p);
  }
  if (UCS_PTR_IS_ERR(r)) {
    pending.erase(op.get());
    finish(op, fmt::format("rank {}: UCX {}", op->peer, ucs_status_string(UCS_PTR_STATUS(r))));
  } else if (r == nullptr) {
    pending.erase(op.get());
    finish(op, "");
  } else if (pending.count(op.get()) != 0) {
    op->req = r;  // still in flight: its callback has not run yet
  }
}

OpPtr UcxComm::post(bool recv, int peer, uint64_t tag, void* buf, size_t len, const Tensor& keep) {
  World& w = *w_;
  auto op =
      std::make_shared<Op>(&w, keep, world_rank(peer), recv, len, Clock::now() + w.options.timeout);
  std::vector<std::pair<OpPtr, std::string>> fired;
  {
    std::lock_guard lock(w.mutex);
    w.submit(op, tag, buf, len);
    fired = w.settle();
  }
  deliver(std::move(fired));
  w.engine->wake();
  return op;
}

// Awaits every op, and turns the first failure into an error naming the call.
Comm::Task UcxComm::wait(std::vector<OpPtr> ops, std::string what) {
  std::string why;
  for (const OpPtr& op : ops) {
    try {
      co_await op->done;
    } catch (const std::exception& e) {
      why = e.what();
      break;
    }
  }
  if (!why.empty()) raise(what, why);
}

// Every rank sends its whole buffer to every other (a gather into one row
// per rank); each sums the rows in rank order 0..n-1, so all ranks compute
// the identical result.
Comm::Task UcxComm::direct_all_reduce(uint64_t seq, Tensor work, ReduceOp op, std::string what) {
  const int n = size();
  const int64_t numel = work.numel();
  Tensor all = Tensor::empty(Shape{n, numel});
  co_await gather(seq, work, all, what);
  const float* rows = all.data<float>();
  float* x = work.data<float>();
  std::memcpy(x, rows, size_t(numel) * 4);
  for (int r = 1; r < n; ++r)
    for (int64_t i = 0; i < numel; ++i) x[i] += rows[r * numel + i];
  if (op == ReduceOp::mean)
    for (int64_t i = 0; i < numel; ++i) x[i] /= float(n);
}

// Runs a Ring (see there) and waits for it; the caller's thread is free
// until the last segment has arrived.
Comm::Task UcxComm::ring(uint64_t seq, Tensor work, bool reduce, bool gather, ReduceOp op,
                         std::string what) {
  World& w = *w_;
  auto r = std::make_shared<Ring>(&w, id_, seq, members_, rank_, work, reduce, gather,
                                  op == ReduceOp::mean);
  std::vector<std::pair<OpPtr, std::string>> fired;
  {
    std::lock_guard lock(w.mutex);
    r->start();
    fired = w.settle();
  }
  deliver(std::move(fired));
  w.engine->wake();
  co_await wait(ops_of(r->final), what);
}

Comm::Task UcxComm::do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) {
  check_tensor(t, "all_reduce", true);
  const std::string what = fmt::format("all_reduce({}, {}) #{}", reduce_op_name(op), sig(t), seq);
  if (size() == 1) co_return;
  Tensor work = as_f32(t);
  if (size_t(work.numel()) * 4 <= w_->options.small_bytes) {
    co_await direct_all_reduce(seq, work, op, what);
  } else {
    co_await ring(seq, work, true, true, op, what);
  }
  if (work.raw() != t.raw()) t.copy_from(work);
}

Comm::Task UcxComm::do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) {
  check_split("reduce_scatter", in, out, size(), true);
  const std::string what =
      fmt::format("reduce_scatter({}, {}) #{}", reduce_op_name(op), sig(in), seq);
  Tensor work = Tensor::empty(Shape{in.numel()});
  work.copy_from(in);  // a copy: the ring writes partial sums, and `out` may alias `in`
  co_await ring(seq, work, true, false, op, what);
  out.copy_from(work.view(Shape{size(), out.numel()})[rank_]);
}

Comm::Task UcxComm::do_all_gather(uint64_t seq, Tensor in, Tensor out) {
  check_split("all_gather", out, in, size(), false);
  co_await gather(seq, in, out, fmt::format("all_gather({}) #{}", sig(in), seq));
}

// Direct: this rank's block goes to every other rank, theirs come straight
// into `out` (as many messages as a ring, without its n-1 latencies).
Comm::Task UcxComm::gather(uint64_t seq, Tensor in, Tensor out, std::string what) {
  const size_t bytes = in.nbytes();
  char* base = static_cast<char*>(out.raw());
  if (base + size_t(rank_) * bytes != in.raw() && bytes > 0)
    std::memmove(base + size_t(rank_) * bytes, in.raw(), bytes);
  std::vector<OpPtr> ops;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    ops.push_back(recv_from(r, seq, 0, base + size_t(r) * bytes, bytes, out));
    ops.push_back(send_to(r, seq, 0, base + size_t(rank_) * bytes, bytes, out));
  }
  co_await wait(std::move(ops), what);
}

Comm::Task UcxComm::do_broadcast(uint64_t seq, Tensor t, int root) {
  check_tensor(t, "broadcast", false);
  REDCO_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of group {}", root,
              group_name());
  const std::string what = fmt::format("broadcast({}, root {}) #{}", sig(t), root, seq);
  std::vector<OpPtr> ops;
  if (rank_ == root) {
    for (int r = 0; r < size(); ++r)
      if (r != rank_) ops.push_back(send_to(r, seq, 0, t.raw(), t.nbytes(), t));
  } else {
    ops.push_back(recv_from(root, seq, 0, t.raw(), t.nbytes(), t));
  }
  co_await wait(std::move(ops), what);
}

// Dissemination: in round j every rank signals rank+2^j and hears from
// rank-2^j; after ceil(log2 n) rounds everyone has (transitively) heard
// from everyone.
Comm::Task UcxComm::do_barrier(uint64_t seq) {
  const std::string what = fmt::format("barrier() #{}", seq);
  Tensor token = Tensor::empty(Shape{2});  // one float to send, one to receive into
  float* p = token.data<float>();
  int round = 0;
  for (int k = 1; k < size(); k *= 2, ++round) {
    OpPtr r = recv_from(left(k), seq, round, p + 1, 4, token);
    OpPtr o = send_to(right(k), seq, round, p, 4, token);
    co_await wait(ops_of(r, o), what);
  }
}

// Point-to-point messages carry the p2p bit and the user's tag in the step
// field, so they never match a collective's.
Comm::Task UcxComm::p2p(bool recv, uint64_t seq, Tensor t, int peer, int tag) {
  const char* name = recv ? "recv" : "send";
  check_tensor(t, name, false);
  REDCO_CHECK(peer >= 0 && peer < size() && peer != rank_,
              "rank {}: peer {} is not another rank of group {}", world_rank(rank_), peer,
              group_name());
  REDCO_CHECK(tag >= 0 && tag < kMaxSteps, "{}: the UCX backend needs tags in [0, {}), got {}",
              name, kMaxSteps, tag);
  const std::string what = fmt::format("{}({} {} rank {}, tag {})", name, sig(t),
                                       recv ? "from" : "to", world_rank(peer), tag);
  const uint64_t wire = make_tag(true, id_, world_rank(recv ? peer : rank_), tag, seq);
  co_await wait(ops_of(post(recv, peer, wire, t.raw(), t.nbytes(), t)), what);
}

std::unique_ptr<Comm> UcxComm::subgroup(std::span<const int> ranks) {
  const std::string list = fmt::format("[{}]", fmt::join(ranks, ", "));
  int me = -1;
  std::vector<int> members;
  for (size_t i = 0; i < ranks.size(); ++i) {
    REDCO_CHECK(ranks[i] >= 0 && ranks[i] < size() && (i == 0 || ranks[i] > ranks[i - 1]),
                "subgroup({}) of group {}: ranks must be strictly increasing ranks of the group",
                list, group_name());
    if (ranks[i] == rank_) me = int(i);
    members.push_back(world_rank(ranks[i]));
  }
  REDCO_CHECK(me >= 0, "rank {} called subgroup({}) of group {} but is not in it",
              world_rank(rank_), list, group_name());
  const uint64_t nth = created_[members]++;
  return std::make_unique<UcxComm>(w_, subgroup_id(id_, members, nth), members, me);
}

// What decides whether two ranks can share memory: the same kernel boot and
// the same network, IPC and PID namespaces (ranks in different network
// namespaces are treated as different hosts, as they are in the netns test).
std::string host_identity() {
  std::string id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  id += name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(boot, line);
  id += "|" + line;
  for (const char* ns : {"net", "ipc", "pid"}) {
    char link[128] = {};
    const std::string path = std::string("/proc/self/ns/") + ns;
    if (::readlink(path.c_str(), link, sizeof link - 1) > 0) id += std::string("|") + link;
  }
  return id;
}

ucp_ep_h open_ep(World& w, int r, const std::string& address, bool handle_errors) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = handle_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (handle_errors) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_handler.cb = ep_error_cb;
    ep.err_handler.arg = &w.peer_args[size_t(r)];
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t st = ucp_ep_create(w.worker, &ep, &h);
  REDCO_CHECK(st == UCS_OK, "UCX: rank {} cannot open an endpoint to rank {}: {}", w.rank, r,
              ucs_status_string(st));
  return h;
}

// `blobs` are "identity\0address". A peer on another host gets one endpoint
// that detects its failure (UCX then picks TCP or RDMA). UCX 1.13 offers no
// shared-memory transport that detects a dead peer, so a same-host peer gets
// two: one without error handling for data (shared memory, single-copy CMA
// for large messages) and an idle one with it (TCP), whose error callback
// reports the peer's death.
void connect_peers(World& w, const std::vector<std::string>& blobs) {
  w.eps.assign(size_t(w.size), nullptr);
  w.guards.assign(size_t(w.size), nullptr);
  w.peer_args.resize(size_t(w.size));  // sized once: endpoints keep pointers into it
  const std::string& mine = blobs[size_t(w.rank)];
  const std::string my_id = mine.substr(0, mine.find('\0'));
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    w.peer_args[size_t(r)] = {&w, r};
    const std::string& blob = blobs[size_t(r)];
    const size_t cut = blob.find('\0');
    REDCO_CHECK(cut != std::string::npos, "UCX: rank {} sent a malformed address", r);
    const std::string address = blob.substr(cut + 1);
    const bool local = blob.compare(0, cut, my_id) == 0;
    w.eps[size_t(r)] = open_ep(w, r, address, !local);
    if (local) w.guards[size_t(r)] = open_ep(w, r, address, true);
  }
}

// A same-host peer's data endpoint has no error handling (see connect_peers),
// and UCX 1.13 makes a failed single-copy read from a process that has just
// died fatal (abort) on such an endpoint. That death is reported properly by
// the peer's guard endpoint a moment later, so this log handler swallows
// exactly that message and lets UCX fail the transfer instead.
ucs_log_func_rc_t swallow_dead_peer_read(const char* file, unsigned, const char*,
                                         ucs_log_level_t level, const ucs_log_component_config_t*,
                                         const char* message, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL || std::strstr(file, "cma_ep.c") == nullptr)
    return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, message, copy);
  va_end(copy);
  return std::strstr(text, "No such process") != nullptr ? UCS_LOG_FUNC_RC_STOP
                                                         : UCS_LOG_FUNC_RC_CONTINUE;
}

// UCX context and worker; returns "identity\0address" for the rendezvous.
std::string init_worker(World& w) {
  static std::once_flag hook;
  std::call_once(hook, [] { ucs_log_push_handler(swallow_dead_peer_read); });
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  const ucs_status_t st = ucp_init(&params, config, &w.context);
  ucp_config_release(config);
  check_ucs(st, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // we lock around every call
  check_ucs(ucp_worker_create(w.context, &wp, &w.worker), "ucp_worker_create");
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check_ucs(ucp_worker_get_address(w.worker, &addr, &len), "ucp_worker_get_address");
  std::string blob = host_identity() + '\0';
  blob.append(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w.worker, addr);
  return blob;
}

}  // namespace

std::unique_ptr<Comm> connect_ucx(Rendezvous& rendezvous, const UcxOptions& options) {
  const RendezvousOptions& ro = rendezvous.options();
  REDCO_CHECK(ro.world_size <= kMaxRanks, "the UCX backend supports up to {} ranks, got {}",
              kMaxRanks, ro.world_size);
  REDCO_CHECK(options.timeout.count() > 0, "connect_ucx: the timeout must be positive");
  auto w = std::make_shared<World>();
  w->rank = ro.rank;
  w->size = ro.world_size;
  w->options = options;
  w->dead.assign(size_t(w->size), "");
  const std::vector<std::string> blobs = rendezvous.exchange(init_worker(*w));
  {
    std::lock_guard lock(w->mutex);
    connect_peers(*w, blobs);
  }
  // A short idle back-off: a message awaited waits at most ~50 us for the
  // next poll, while an idle process still sleeps instead of spinning.
  w->engine = std::make_unique<sched::ProgressEngine>(sched::ProgressEngine::Options{
      .idle_spins = 256, .max_sleep = std::chrono::microseconds(50)});
  w->engine->add([world = w.get()] { return world->poll(); });
  std::vector<int> members;
  for (int r = 0; r < w->size; ++r) members.push_back(r);
  return std::make_unique<UcxComm>(std::move(w), 0, std::move(members), ro.rank);
}

std::unique_ptr<Comm> connect_ucx(const UcxOptions& options) {
  const UcxOptions& o = options;
  Rendezvous rz(RendezvousOptions{o.rank, o.world_size, o.host0, o.port, o.job_token, o.plan_hash,
                                  o.timeout});
  return connect_ucx(rz, options);
}

}  // namespace redco::dist

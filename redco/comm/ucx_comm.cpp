#include "redco/comm/ucx_comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redco/comm/ucx_world.hpp"
#include "redco/core/error.hpp"

namespace redco::comm {
using namespace ucx_detail;
namespace {

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
// UCX moves host memory here: a device tensor is staged through a host copy
// (explicitly, as a GPU without GPUDirect would be), a CPU one used in place.
Tensor on_host(const Tensor& t) { return t.to(Device::cpu()); }
// A host buffer for results that land in `t`: t itself on the CPU.
Tensor host_like(const Tensor& t) {
  return t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
}

Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32 && t.device().is_cpu()) return t;
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
  Tensor work = as_f32(t);  // on the host
  if (size_t(work.numel()) * 4 <= w_->options.small_bytes) {
    co_await direct_all_reduce(seq, work, op, what);
  } else {
    co_await ring(seq, work, true, true, op, what);
  }
  if (!work.same(t)) t.copy_from(work);
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
  Tensor host = host_like(out);
  co_await gather(seq, on_host(in), host, fmt::format("all_gather({}) #{}", sig(in), seq));
  if (!host.same(out)) out.copy_from(host);
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
  Tensor host = rank_ == root ? on_host(t) : host_like(t);
  if (rank_ == root) {
    for (int r = 0; r < size(); ++r)
      if (r != rank_) ops.push_back(send_to(r, seq, 0, host.raw(), host.nbytes(), host));
  } else {
    ops.push_back(recv_from(root, seq, 0, host.raw(), host.nbytes(), host));
  }
  co_await wait(std::move(ops), what);
  if (rank_ != root && !host.same(t)) t.copy_from(host);
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
  Tensor host = recv ? host_like(t) : on_host(t);
  co_await wait(ops_of(post(recv, peer, wire, host.raw(), host.nbytes(), host)), what);
  if (recv && !host.same(t)) t.copy_from(host);
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
}  // namespace

std::unique_ptr<Comm> connect_ucx(Rendezvous& rendezvous, const UcxOptions& options) {
  const RendezvousOptions& ro = rendezvous.options();
  REDCO_CHECK(ro.world_size <= kMaxRanks, "the UCX backend supports up to {} ranks, got {}",
              kMaxRanks, ro.world_size);
  REDCO_CHECK(options.timeout.count() > 0, "connect_ucx: the timeout must be positive");
  heartbeat::start();  // a launcher watching for hangs hears from this rank from now on
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
  // Idle, the progress thread sleeps on the worker's event descriptor (at
  // most 1 ms, so timeouts are still checked): a message arriving or a
  // socket with room wakes it, as does an operation posted (wake()).
  World* world = w.get();
  w->engine = std::make_unique<sched::ProgressEngine>(sched::ProgressEngine::Options{
      .idle_spins = 256,
      .max_sleep = std::chrono::microseconds(1000),
      .idle_wait = [world](std::chrono::microseconds most) { world->idle_wait(most); },
      .on_wake = [world] { world->signal(); }});
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

UcxOptions ucx_options(const LaunchEnv& env) {
  return {.rank = env.rank,
          .world_size = env.world_size,
          .host0 = env.host0,
          .port = env.port,
          .job_token = env.job_token,
          .timeout = std::chrono::milliseconds(int64_t(env.timeout_s * 1000))};
}

}  // namespace redco::comm

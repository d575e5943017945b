// The threads backend's collectives and messages (threads_comm.hpp).
#include "redco/comm/threads_comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "redco/comm/threads_state.hpp"
#include "redco/core/error.hpp"

namespace redco::comm {
namespace detail {

namespace {

// The bytes of a tensor this backend reads and writes itself: CPU memory, or
// the test device's. The test device's memory is host memory behind a
// device's interface, and this backend is its transport (what NCCL is to a
// GPU, or the staging copies the UCX backend would make): the one place
// outside its backend that touches those bytes, explicitly.
void* bytes_of(const Tensor& t) { return t.device_ptr(); }

std::string sig(const Tensor& t) { return fmt::format("{}{}", dtype_name(t.dtype()), t.shape()); }

int64_t chunk_begin(int64_t n, int r, int parts) { return n * r / parts; }

// acc[0, len) (+)= src[begin, begin + len), converted to f32.
void accumulate(float* acc, const Tensor& src, int64_t begin, int64_t len, bool first) {
  auto add = [&](auto load) {
    if (first) {
      for (int64_t i = 0; i < len; ++i) acc[i] = load(begin + i);
    } else {
      for (int64_t i = 0; i < len; ++i) acc[i] += load(begin + i);
    }
  };
  const void* p = bytes_of(src);
  switch (src.dtype()) {
    case DType::f32:
      add([p](int64_t i) { return static_cast<const float*>(p)[i]; });
      break;
    case DType::bf16:
      add([p](int64_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); });
      break;
    case DType::f16:
      add([p](int64_t i) { return f16_to_float(static_cast<const uint16_t*>(p)[i]); });
      break;
    default:
      fail("cannot reduce {} tensors", dtype_name(src.dtype()));
  }
}

// The deterministic reduction: ranks in order 0..n-1, then the mean's division.
void reduce_range(float* acc, const std::vector<Tensor>& bufs, int64_t begin, int64_t len,
                  ReduceOp op) {
  for (size_t r = 0; r < bufs.size(); ++r) accumulate(acc, bufs[r], begin, len, r == 0);
  if (op == ReduceOp::mean) {
    const float n = float(bufs.size());
    for (int64_t i = 0; i < len; ++i) acc[i] /= n;
  }
}

// dst[begin, begin + len) = src[0, len), converted from f32.
void store(const float* src, Tensor& dst, int64_t begin, int64_t len) {
  void* p = bytes_of(dst);
  switch (dst.dtype()) {
    case DType::f32:
      std::memcpy(static_cast<float*>(p) + begin, src, size_t(len) * 4);
      break;
    case DType::bf16:
      for (int64_t i = 0; i < len; ++i)
        static_cast<uint16_t*>(p)[begin + i] = float_to_bf16(src[i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < len; ++i) static_cast<uint16_t*>(p)[begin + i] = float_to_f16(src[i]);
      break;
    default:
      fail("cannot reduce {} tensors", dtype_name(dst.dtype()));
  }
}

void check_tensor(const Tensor& t, const char* op, bool reduce) {
  REDCO_CHECK(t.defined(), "{}: the tensor is undefined", op);
  REDCO_CHECK(t.device().is_cpu() || t.device().kind == DeviceKind::test,
              "{}: the threads backend needs CPU or test-device tensors, got one on {}", op,
              t.device().str());
  REDCO_CHECK(!reduce || is_floating(t.dtype()),
              "{}: reductions need a floating tensor (f32, bf16, f16), got {}", op, sig(t));
}

void copy_bytes(void* dst, const void* src, size_t n) {
  if (dst != src && n > 0) std::memmove(dst, src, n);
}

}  // namespace

class ThreadsComm final : public Comm {
 public:
  ThreadsComm(std::shared_ptr<ThreadsState> st, std::shared_ptr<Group> g, int rank)
      : st_(std::move(st)), group_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return int(group_->members.size()); }
  int world_rank(int r) const override { return group_->members.at(size_t(r)); }
  std::unique_ptr<Comm> subgroup(std::span<const int> ranks) override;

 protected:
  Task do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) override;
  Task do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) override;
  Task do_all_gather(uint64_t seq, Tensor in, Tensor out) override;
  Task do_broadcast(uint64_t seq, Tensor t, int root) override;
  Task do_barrier(uint64_t seq) override { co_await join(seq, "barrier()", Tensor(), 1); }
  Task do_send(uint64_t seq, Tensor t, int peer, int tag) override;
  Task do_recv(uint64_t seq, Tensor t, int peer, int tag) override;

 private:
  struct Phase;
  struct Mailbox;

  [[noreturn]] void raise(const std::string& what, const std::string& why) const {
    fail("{} on group {} failed on rank {}: {}", what, group_->name(), world_rank(rank_), why);
  }
  void check_peer(int peer) const {
    REDCO_CHECK(peer >= 0 && peer < size() && peer != rank_,
                "rank {}: peer {} is not another rank of group {}", world_rank(rank_), peer,
                group_->name());
  }
  std::shared_ptr<Slot> enter(uint64_t seq, const std::string& desc, Tensor buf, int phases);
  bool arrive(Slot& s, int phase, sched::Waiter self, Waiters& wake);
  sched::Task<std::shared_ptr<Slot>> join(uint64_t seq, std::string desc, Tensor buf, int phases);

  std::shared_ptr<ThreadsState> st_;
  std::shared_ptr<Group> group_;
  int rank_;
  std::map<std::vector<int>, uint64_t> created_;  // subgroups made, by member list
};

// Awaits rendezvous point `phase` of a collective: suspends until every rank
// of the group reached it (the last one to arrive wakes the others), or
// throws why the collective failed.
struct ThreadsComm::Phase {
  ThreadsComm& comm;
  Slot& slot;
  int phase;
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> h) const {
    Waiters wake;
    bool suspend;
    {
      std::lock_guard lock(comm.st_->mutex);
      suspend = comm.arrive(slot, phase, {h, sched::RunQueue::current()}, wake);
    }
    for (const sched::Waiter& w : wake) w.resume();
    return suspend;
  }
  void await_resume() const {
    std::string why;
    {
      std::lock_guard lock(comm.st_->mutex);
      why = slot.error;
    }
    if (!why.empty()) comm.raise(fmt::format("{} #{}", slot.desc, slot.seq), why);
  }
};

bool ThreadsComm::arrive(Slot& s, int phase, sched::Waiter self, Waiters& wake) {
  if (!s.error.empty()) return false;
  s.reached[size_t(rank_)] = phase + 1;
  if (++s.count == size()) {
    s.count = 0;
    s.phase = phase + 1;
    s.since = Clock::now();
    wake.swap(s.waiting);
    if (s.phase == s.phases) group_->slots.erase(s.seq);
    return false;
  }
  for (int m : missing(*group_, s))
    if (st_->exited[size_t(m)]) {
      fail_slot(s, fmt::format("rank {} exited before joining it", m), wake);
      return false;
    }
  s.waiting.push_back(self);
  return true;
}

// Finds or opens slot `seq`, checks that this call matches the first
// arrival's, and registers this rank's buffer.
std::shared_ptr<Slot> ThreadsComm::enter(uint64_t seq, const std::string& desc, Tensor buf,
                                         int phases) {
  Waiters wake;
  std::string why;
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard lock(st_->mutex);
    if (!st_->failure.empty()) {
      why = st_->failure;
    } else {
      std::shared_ptr<Slot>& s = group_->slots[seq];
      if (!s) {
        s = std::make_shared<Slot>();
        s->seq = seq;
        s->desc = desc;
        s->first = rank_;
        s->phases = phases;
        s->reached.assign(size_t(size()), 0);
        s->bufs.resize(size_t(size()));
        s->parts.resize(size_t(size()));
        s->since = Clock::now();
      } else if (s->desc != desc) {
        why = fmt::format(
            "collective mismatch on group {} at call #{}: rank {} called {} but rank {} called {} "
            "(every rank must call a group's collectives in the same order)",
            group_->name(), seq, world_rank(s->first), s->desc, world_rank(rank_), desc);
        fail_world(*st_, why, wake);
      }
      if (why.empty()) {
        s->bufs[size_t(rank_)] = std::move(buf);
        slot = s;
      }
    }
  }
  for (const sched::Waiter& w : wake) w.resume();
  if (!why.empty()) raise(fmt::format("{} #{}", desc, seq), why);
  return slot;
}

sched::Task<std::shared_ptr<Slot>> ThreadsComm::join(uint64_t seq, std::string desc, Tensor buf,
                                                     int phases) {
  std::shared_ptr<Slot> slot = enter(seq, desc, std::move(buf), phases);
  co_await Phase{*this, *slot, 0};
  co_return slot;
}

// Rank r reduces elements [chunk r] over all ranks and publishes them; after
// the second rendezvous every rank copies all chunks.
Comm::Task ThreadsComm::do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) {
  check_tensor(t, "all_reduce", true);
  const std::string desc = fmt::format("all_reduce({}, {})", reduce_op_name(op), sig(t));
  const std::shared_ptr<Slot> slot = co_await join(seq, desc, t, 2);
  const int n = size();
  const int64_t numel = t.numel();
  const int64_t begin = chunk_begin(numel, rank_, n);
  Tensor part = Tensor::empty(Shape{chunk_begin(numel, rank_ + 1, n) - begin});
  reduce_range(part.data<float>(), slot->bufs, begin, part.numel(), op);
  slot->parts[size_t(rank_)] = part;  // read by others only after the next rendezvous
  co_await Phase{*this, *slot, 1};
  for (int r = 0; r < n; ++r) {
    const Tensor& p = slot->parts[size_t(r)];
    store(p.data<float>(), t, chunk_begin(numel, r, n), p.numel());
  }
}

Comm::Task ThreadsComm::do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) {
  check_tensor(in, "reduce_scatter", true);
  check_tensor(out, "reduce_scatter", true);
  REDCO_CHECK(in.device() == out.device(),
              "reduce_scatter: the input is on {} but the output on {}", in.device().str(),
              out.device().str());
  const int n = size();
  REDCO_CHECK(in.rank() >= 1 && in.dtype() == out.dtype() && out.rank() == in.rank() &&
                  in.shape() == out.shape().with(0, out.dim(0) * n),
              "reduce_scatter over {} ranks: `in` must be [{} * m, ...] and `out` [m, ...] of the "
              "same dtype, got in {} and out {}",
              n, n, sig(in), sig(out));
  const std::string desc = fmt::format("reduce_scatter({}, {})", reduce_op_name(op), sig(in));
  const std::shared_ptr<Slot> slot = co_await join(seq, desc, in, 2);
  std::vector<float> acc(size_t(out.numel()));
  reduce_range(acc.data(), slot->bufs, rank_ * out.numel(), out.numel(), op);
  // `out` may alias `in`: write only once nobody reads the inputs any more.
  co_await Phase{*this, *slot, 1};
  store(acc.data(), out, 0, out.numel());
}

Comm::Task ThreadsComm::do_all_gather(uint64_t seq, Tensor in, Tensor out) {
  check_tensor(in, "all_gather", false);
  check_tensor(out, "all_gather", false);
  REDCO_CHECK(in.device() == out.device(), "all_gather: the input is on {} but the output on {}",
              in.device().str(), out.device().str());
  const int n = size();
  REDCO_CHECK(in.rank() >= 1 && in.dtype() == out.dtype() && out.rank() == in.rank() &&
                  out.shape() == in.shape().with(0, in.dim(0) * n),
              "all_gather over {} ranks: `in` must be [m, ...] and `out` [{} * m, ...] of the "
              "same dtype, got in {} and out {}",
              n, n, sig(in), sig(out));
  const std::shared_ptr<Slot> slot =
      co_await join(seq, fmt::format("all_gather({})", sig(in)), in, 2);
  const size_t bytes = in.nbytes();
  for (int r = 0; r < n; ++r)
    copy_bytes(static_cast<char*>(bytes_of(out)) + size_t(r) * bytes,
               bytes_of(slot->bufs[size_t(r)]), bytes);
  co_await Phase{*this, *slot, 1};  // the inputs are read: their owners may reuse them
}

Comm::Task ThreadsComm::do_broadcast(uint64_t seq, Tensor t, int root) {
  check_tensor(t, "broadcast", false);
  REDCO_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of group {}", root,
              group_->name());
  const std::string desc = fmt::format("broadcast({}, root {})", sig(t), root);
  const std::shared_ptr<Slot> slot = co_await join(seq, desc, t, 2);
  if (rank_ != root) copy_bytes(bytes_of(t), bytes_of(slot->bufs[size_t(root)]), t.nbytes());
  co_await Phase{*this, *slot, 1};  // root's buffer is read: it may change it
}

// Eager: the data is copied into the envelope, so send never waits.
Comm::Task ThreadsComm::do_send(uint64_t seq, Tensor t, int peer, int tag) {
  check_tensor(t, "send", false);
  check_peer(peer);
  Tensor copy = t.clone();
  Waiters wake;
  std::string why;
  {
    std::lock_guard lock(st_->mutex);
    why = st_->failure;
    if (why.empty()) {
      std::shared_ptr<Envelope>& e = st_->mail[{group_->id, rank_, peer, tag, seq}];
      if (!e) e = std::make_shared<Envelope>();
      e->src = world_rank(rank_);
      e->data = std::move(copy);
      e->sent = true;
      if (e->waiting) {
        wake.push_back(e->receiver);
        e->waiting = false;
      }
    }
  }
  for (const sched::Waiter& w : wake) w.resume();
  if (!why.empty())
    raise(fmt::format("send({} to rank {}, tag {})", sig(t), world_rank(peer), tag), why);
  co_return;
}

// Suspends until the envelope has been sent or has failed.
struct ThreadsComm::Mailbox {
  ThreadsComm& comm;
  MailKey key;
  int src;
  std::shared_ptr<Envelope> env;
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> h) {
    ThreadsState& st = *comm.st_;
    std::lock_guard lock(st.mutex);
    std::shared_ptr<Envelope>& e = st.mail[key];
    if (!e) {
      e = std::make_shared<Envelope>();
      e->src = src;
    }
    env = e;
    if (e->sent || !e->error.empty()) return false;
    if (!st.failure.empty()) {
      e->error = st.failure;
    } else if (st.exited[size_t(src)]) {
      e->error = fmt::format("rank {} exited without sending it", src);
    } else {
      e->waiting = true;
      e->receiver = {h, sched::RunQueue::current()};
      e->since = Clock::now();
      return true;
    }
    return false;
  }
  std::string await_resume() const {
    std::lock_guard lock(comm.st_->mutex);
    comm.st_->mail.erase(key);
    return env->sent ? std::string() : env->error;
  }
};

Comm::Task ThreadsComm::do_recv(uint64_t seq, Tensor t, int peer, int tag) {
  check_tensor(t, "recv", false);
  check_peer(peer);
  const std::string what =
      fmt::format("recv({} from rank {}, tag {})", sig(t), world_rank(peer), tag);
  Mailbox box{*this, {group_->id, peer, rank_, tag, seq}, world_rank(peer), nullptr};
  const std::string why = co_await box;
  if (!why.empty()) raise(what, why);
  const Tensor& msg = box.env->data;
  if (msg.dtype() != t.dtype() || !(msg.shape() == t.shape()))
    raise(what, fmt::format("rank {} sent {}", world_rank(peer), sig(msg)));
  copy_bytes(bytes_of(t), bytes_of(msg), t.nbytes());
}

std::unique_ptr<Comm> ThreadsComm::subgroup(std::span<const int> ranks) {
  const std::string list = fmt::format("[{}]", fmt::join(ranks, ", "));
  int me = -1;
  std::vector<int> members;
  for (size_t i = 0; i < ranks.size(); ++i) {
    REDCO_CHECK(ranks[i] >= 0 && ranks[i] < size() && (i == 0 || ranks[i] > ranks[i - 1]),
                "subgroup({}) of group {}: ranks must be strictly increasing ranks of the group",
                list, group_->name());
    if (ranks[i] == rank_) me = int(i);
    members.push_back(world_rank(ranks[i]));
  }
  REDCO_CHECK(me >= 0, "rank {} called subgroup({}) of group {} but is not in it",
              world_rank(rank_), list, group_->name());
  const uint64_t nth = created_[members]++;
  std::lock_guard lock(st_->mutex);
  std::shared_ptr<Group>& g = st_->groups[{group_->id, members, nth}];
  if (!g) {
    g = std::make_shared<Group>();
    g->id = st_->next_group_id++;
    g->members = members;
  }
  return std::make_unique<ThreadsComm>(st_, g, me);
}

std::unique_ptr<Comm> make_threads_comm(std::shared_ptr<ThreadsState> st, std::shared_ptr<Group> g,
                                        int rank) {
  return std::make_unique<ThreadsComm>(std::move(st), std::move(g), rank);
}

}  // namespace detail

}  // namespace redco::comm

// The NCCL backend (nccl_comm.hpp): the communicator, the order in which its
// calls enqueue, and the thread that sees them finish.
#include "redco/comm/nccl_comm.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "redco/comm/call_order.hpp"
#include "redco/comm/device_comm.hpp"
#include "redco/comm/nccl_api.hpp"
#include "redco/core/error.hpp"
#include "redco/core/heartbeat.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/sched/event.hpp"

// Referenced through the linker (-u) so that a static libredco keeps this
// object, and with it the registration below.
extern "C" {
int redco_nccl_anchor = 0;
}

namespace redco::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string sig(const Tensor& t) { return fmt::format("{}{}", dtype_name(t.dtype()), t.shape()); }

// Makes `device` current for the scope (the destructor never throws).
struct OnDevice {
  int prev = 0;
  explicit OnDevice(int device) {
    REDCO_CUDA(cudaGetDevice(&prev));
    if (prev != device) cuda::set_device(device);
  }
  ~OnDevice() {
    int now = prev;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev) cudaSetDevice(prev);
  }
};

// One NCCL communicator and what its calls share; the NcclComm and each call
// in flight hold it, never the poller, so it is destroyed (ncclCommDestroy, a
// collective of its own) on a rank's thread.
//
// NCCL calls on `comm` come from two sides: rank threads enqueue collectives
// (counted in `enqueuing`); the poller asks for asynchronous errors (NCCL's
// watchdog call, allowed beside an enqueue) and aborts. The abort frees the
// communicator, so it waits until no enqueue is in progress: the first
// failure is recorded by whoever sees it, and the poller carries the abort
// out once `enqueuing` is 0 (or the destructor does). A rank blocked inside
// NCCL for good (a peer gone in the middle of a call's handshake) is ended by
// the launcher's hang detection (core/heartbeat.hpp), not here.
struct State {
  State(const NcclApi& a, int d, std::chrono::milliseconds t) : api(a), device(d), timeout(t) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (comm && !aborted) (failed.empty() ? api.comm_destroy : api.comm_abort)(comm);
    if (stream) cudaStreamDestroy(stream);
    for (cudaEvent_t e : spare) cudaEventDestroy(e);
  }

  // An event to record: a recycled one (a training step creates none), or new.
  cudaEvent_t event() {
    {
      std::lock_guard lock(mutex);
      if (!spare.empty()) {
        cudaEvent_t e = spare.back();
        spare.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    REDCO_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void recycle(cudaEvent_t e) {
    std::lock_guard lock(mutex);
    spare.push_back(e);
  }
  std::string failure() {
    std::lock_guard lock(mutex);
    return failed;
  }
  // A call about to enqueue: refused once the communicator has failed.
  void begin_enqueue(const std::string& what) {
    std::lock_guard lock(mutex);
    REDCO_CHECK(failed.empty(), "{} over NCCL: the communicator was aborted earlier ({})", what,
                failed);
    ++enqueuing;
  }
  void end_enqueue() {
    std::lock_guard lock(mutex);
    --enqueuing;
  }
  // The first failure is the one reported; every later call throws at once.
  void fail(const std::string& why) {
    std::lock_guard lock(mutex);
    if (failed.empty()) failed = why;
  }
  // Poller only: aborts a failed communicator once nothing enqueues on it
  // (its kernels stop, so nothing in flight waits for a dead peer any longer).
  // True once it is aborted.
  bool abort_if_failed() {
    {
      std::lock_guard lock(mutex);
      if (aborted) return true;
      if (failed.empty() || enqueuing > 0) return false;
      aborted = true;
    }
    api.comm_abort(comm);
    return true;
  }
  // Poller only: what NCCL reports of the network or the peers; empty while
  // all is well.
  std::string async_error() {
    {
      std::lock_guard lock(mutex);
      if (aborted) return {};
    }
    ncclResult_t r = ncclSuccess;
    if (api.comm_get_async_error(comm, &r) != ncclSuccess || r == ncclSuccess ||
        r == ncclInProgress)
      return {};
    return fmt::format("NCCL reported {} ({})", api.get_error_string(r), api.get_last_error(comm));
  }

  const NcclApi& api;
  const int device;
  const std::chrono::milliseconds timeout;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communication stream
  std::mutex mutex;               // guards what follows
  std::string failed;             // the first failure; empty while healthy
  int enqueuing = 0;              // rank threads inside an NCCL call on `comm`
  bool aborted = false;           // ncclCommAbort has run: `comm` is gone
  std::vector<cudaEvent_t> spare;
};

// A collective enqueued: the event recorded after it, the tensors it uses
// (alive until it has run), and the coroutine waiting for it.
struct Inflight {
  State* state = nullptr;  // kept alive by the call's coroutine until it settles
  std::string what;
  std::vector<Tensor> keep;
  cudaEvent_t done = nullptr;
  Clock::time_point deadline;
  sched::Completion<void> finished;
};

// One thread for the process that polls every collective in flight, about
// every 20 µs while there are any, and sleeps while there are none. It only
// sets completions: the waiting coroutines continue on their own threads.
class Poller {
 public:
  static Poller& instance() {
    static Poller* p = new Poller();  // leaked with its detached thread: alive until exit
    return *p;
  }
  void add(std::shared_ptr<Inflight> op) {
    {
      std::lock_guard lock(mutex_);
      ops_.push_back(std::move(op));
    }
    wake_.notify_one();
  }

 private:
  Poller() {
    std::thread([this] { loop(); }).detach();
  }

  void loop() {
    std::vector<std::shared_ptr<Inflight>> polling, left;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return !ops_.empty(); });
        polling.swap(ops_);
      }
      for (auto& op : polling)
        if (!settled(*op)) left.push_back(std::move(op));
      polling.clear();
      {
        std::lock_guard lock(mutex_);
        left.insert(left.end(), ops_.begin(), ops_.end());
        ops_.swap(left);
        left.clear();
        if (ops_.empty()) continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // True once `op` has finished or failed (its completion is then set, the
  // last thing done with it: the waiting coroutine may release the State).
  // A failed communicator fails every call in flight, even one whose event
  // was reached: an abort ends kernels early, so their results are partial.
  static bool settled(Inflight& op) {
    State& s = *op.state;
    cudaSetDevice(s.device);  // no context on another GPU for this thread
    std::string why = s.failure();
    if (why.empty()) {
      const cudaError_t e = cudaEventQuery(op.done);
      if (e == cudaSuccess) {
        s.recycle(op.done);
        op.keep.clear();
        heartbeat::wait_end();
        op.finished.set();
        return true;
      }
      if (e != cudaErrorNotReady) {
        cudaGetLastError();
        why = fmt::format("CUDA error {} while it ran", cudaGetErrorString(e));
      } else if ((why = s.async_error()).empty()) {
        if (Clock::now() < op.deadline) return false;
        why = fmt::format(
            "not finished after {} s: a rank of this group stopped calling collectives, called "
            "them in another order, or died",
            std::chrono::duration<double>(s.timeout).count());
      }
      s.fail(why);
    }
    // Its tensors stay alive until the abort has stopped the kernels using them.
    if (!s.abort_if_failed()) return false;
    op.keep.clear();
    cudaEventDestroy(op.done);  // never recycled: the stream of an aborted communicator
    heartbeat::wait_end();
    op.finished.set_exception(std::make_exception_ptr(
        Error(fmt::format("{} over NCCL: {}; the communicator is aborted", op.what, s.failure()))));
    return true;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Inflight>> ops_;
};

class NcclComm final : public Comm {
 public:
  NcclComm(std::unique_ptr<Comm> host, std::shared_ptr<State> state)
      : host_(std::move(host)), state_(std::move(state)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int world_rank(int r) const override { return host_->world_rank(r); }
  std::unique_ptr<Comm> subgroup(std::span<const int> ranks) override {
    return connect_nccl(host_->subgroup(ranks), Device::cuda(state_->device), state_->timeout);
  }

 protected:
  // Host tensors go to the host world at once (its own order is the call
  // order); their turn here is handed straight back.
  Task do_all_reduce(uint64_t seq, Tensor t, ReduceOp op) override {
    if (over_nccl(seq, t, t, "all_reduce")) return all_reduce(Ticket(order_, seq), t, op);
    return host_->all_reduce(t, op);
  }
  Task do_reduce_scatter(uint64_t seq, Tensor in, Tensor out, ReduceOp op) override {
    if (over_nccl(seq, in, out, "reduce_scatter"))
      return reduce_scatter(Ticket(order_, seq), in, out, op);
    return host_->reduce_scatter(in, out, op);
  }
  Task do_all_gather(uint64_t seq, Tensor in, Tensor out) override {
    if (over_nccl(seq, in, out, "all_gather")) return all_gather(Ticket(order_, seq), in, out);
    return host_->all_gather(in, out);
  }
  Task do_broadcast(uint64_t seq, Tensor t, int root) override {
    if (over_nccl(seq, t, t, "broadcast")) return broadcast(Ticket(order_, seq), t, root);
    return host_->broadcast(t, root);
  }
  Task do_barrier(uint64_t seq) override {
    order_->finish(seq);
    return host_->barrier();
  }
  Task do_send(uint64_t, Tensor t, int peer, int tag) override { return host_->send(t, peer, tag); }
  Task do_recv(uint64_t, Tensor t, int peer, int tag) override { return host_->recv(t, peer, tag); }

 private:
  // True for a tensor on this communicator's GPU; false for a host (or
  // test-device) tensor; an error for another GPU.
  bool on_device(const Tensor& t, const char* op) const {
    REDCO_CHECK(t.defined(), "{}: the tensor is undefined", op);
    if (t.device().kind != DeviceKind::cuda) return false;
    REDCO_CHECK(t.device().index == state_->device,
                "{}({}): the tensor is on {}, but this rank's NCCL communicator is on cuda:{}; "
                "move it there first (to(Device::cuda({})))",
                op, sig(t), t.device().str(), state_->device, state_->device);
    return true;
  }
  // Whether call `seq` on (in, out) runs over NCCL; if not (host tensors, or
  // an error thrown here), its turn is handed back at once.
  bool over_nccl(uint64_t seq, const Tensor& in, const Tensor& out, const char* op) {
    try {
      const bool d = on_device(in, op);
      REDCO_CHECK(d == on_device(out, op) && in.dtype() == out.dtype(),
                  "{}: the input is {} on {} but the output {} on {}; give both the same device "
                  "and dtype",
                  op, sig(in), in.device().str(), sig(out), out.device().str());
      if (!d) order_->finish(seq);
      return d;
    } catch (...) {
      order_->finish(seq);
      throw;
    }
  }

  Task all_reduce(Ticket ticket, Tensor t, ReduceOp op);
  Task reduce_scatter(Ticket ticket, Tensor in, Tensor out, ReduceOp op);
  Task all_gather(Ticket ticket, Tensor in, Tensor out);
  Task broadcast(Ticket ticket, Tensor t, int root);
  Task run(Ticket& ticket, std::string what, std::vector<Tensor> keep,
           const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call);

  std::unique_ptr<Comm> host_;
  std::shared_ptr<State> state_;
  std::shared_ptr<CallOrder> order_ = std::make_shared<CallOrder>();
};

// In this call's turn: the communication stream waits for the compute
// stream, `call` enqueues the collective, an event marks its end; then the
// poller is told, and the task completes when the event has been reached.
Comm::Task NcclComm::run(Ticket& ticket, std::string what, std::vector<Tensor> keep,
                         const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
  co_await ticket.wait();
  const std::shared_ptr<State> state = state_;  // alive until this call has settled
  State& s = *state;
  auto op = std::make_shared<Inflight>();
  {
    struct GiveBack {  // whatever happens below, the next call may go
      Ticket& t;
      ~GiveBack() { t.give_back(); }
    } give_back{ticket};
    s.begin_enqueue(what);
    struct EndEnqueue {  // an enqueue may wait for peers (NCCL connects lazily)
      State& s;
      explicit EndEnqueue(State& st) : s(st) { heartbeat::wait_begin(); }
      ~EndEnqueue() {
        heartbeat::wait_end();
        s.end_enqueue();
      }
    } end_enqueue{s};
    try {  // a failure on one rank only: its next call would pair with the peers' this one
      OnDevice on(s.device);
      cudaEvent_t ready = s.event();
      op->done = s.event();  // both events first: once NCCL has the call, nothing may throw
      REDCO_CUDA(cudaEventRecord(ready, cuda::stream()));
      REDCO_CUDA(cudaStreamWaitEvent(s.stream, ready, 0));
      s.recycle(ready);  // the wait took the record as it was: re-recording later is safe
      nccl_check(call(s.comm, s.stream), what.c_str(), s.comm);
    } catch (const std::exception& e) {
      s.fail(fmt::format("{} could not be enqueued: {}", what, e.what()));
      if (op->done) s.recycle(std::exchange(op->done, nullptr));  // never recorded
      throw;
    }
    // Enqueued: from here on the poller settles the call, even a failed one
    // (after the abort has stopped the kernels that use its tensors).
    if (const cudaError_t e = cudaEventRecord(op->done, s.stream); e != cudaSuccess) {
      cudaGetLastError();
      s.fail(fmt::format("{}: its completion could not be recorded ({})", what,
                         cudaGetErrorString(e)));
    }
  }
  op->state = &s;
  op->what = std::move(what);
  op->keep = std::move(keep);
  op->deadline = Clock::now() + s.timeout;
  heartbeat::wait_begin();  // until settled(): this rank waits for its peers
  Poller::instance().add(op);
  co_await op->finished;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclAvg; }

// What a collective keeps alive. A plain function, not a braced list inside
// co_await: g++ 12 rejects those.
std::vector<Tensor> tensors(Tensor a) { return {std::move(a)}; }
std::vector<Tensor> tensors(Tensor a, Tensor b) { return {std::move(a), std::move(b)}; }

// bf16 and f16 go through an f32 copy: reduced in f32, as the host backends do.
Comm::Task NcclComm::all_reduce(Ticket ticket, Tensor t, ReduceOp op) {
  Ticket mine = std::move(ticket);  // handed back when the body ends, even by a throw
  const std::string what = fmt::format("all_reduce({}, {})", reduce_op_name(op), sig(t));
  REDCO_CHECK(is_floating(t.dtype()), "{}: reductions need a floating tensor (f32, bf16, f16)",
              what);
  Tensor work = t.to(DType::f32);  // t itself when f32
  void* p = work.device_ptr();
  const size_t n = size_t(work.numel());
  const NcclApi& api = state_->api;
  co_await run(mine, what, tensors(work), [&](ncclComm_t c, cudaStream_t s) {
    return api.all_reduce(p, p, n, ncclFloat32, nccl_op(op), c, s);
  });
  if (!work.same(t)) t.copy_from(work);  // after NCCL wrote it: the host saw it finish
}

// NCCL's in-place form is `out` at this rank's rows of `in`; any other
// overlap, or a narrow dtype, goes through a separate f32 output.
Comm::Task NcclComm::reduce_scatter(Ticket ticket, Tensor in, Tensor out, ReduceOp op) {
  Ticket mine = std::move(ticket);  // handed back when the body ends, even by a throw
  const std::string what =
      fmt::format("reduce_scatter({}, {} -> {})", reduce_op_name(op), sig(in), sig(out));
  REDCO_CHECK(is_floating(in.dtype()), "{}: reductions need a floating tensor (f32, bf16, f16)",
              what);
  REDCO_CHECK(in.numel() == int64_t(size()) * out.numel(),
              "{}: the input must hold {} (ranks) times the output's {} elements", what, size(),
              out.numel());
  Tensor src = in.to(DType::f32), dst = out;
  const char* own_rows = static_cast<const char*>(in.device_ptr()) + size_t(rank()) * out.nbytes();
  if (out.dtype() != DType::f32 || (out.shares_storage_with(in) && out.device_ptr() != own_rows))
    dst = Tensor::empty(out.shape(), DType::f32, out.device());
  const size_t n = size_t(out.numel());
  const NcclApi& api = state_->api;
  co_await run(mine, what, tensors(src, dst), [&](ncclComm_t c, cudaStream_t s) {
    return api.reduce_scatter(src.device_ptr(), dst.device_ptr(), n, ncclFloat32, nccl_op(op), c,
                              s);
  });
  if (!dst.same(out)) out.copy_from(dst);
}

// Bytes: any dtype. NCCL's in-place form is `in` at this rank's rows of
// `out`; an input elsewhere in the output's storage is copied first.
Comm::Task NcclComm::all_gather(Ticket ticket, Tensor in, Tensor out) {
  Ticket mine = std::move(ticket);  // handed back when the body ends, even by a throw
  const std::string what = fmt::format("all_gather({} -> {})", sig(in), sig(out));
  REDCO_CHECK(out.numel() == int64_t(size()) * in.numel(),
              "{}: the output must hold {} (ranks) times the input's {} elements", what, size(),
              in.numel());
  const size_t bytes = in.nbytes();
  const char* own_rows = static_cast<const char*>(out.device_ptr()) + size_t(rank()) * bytes;
  Tensor src = in.shares_storage_with(out) && in.device_ptr() != own_rows ? in.clone() : in;
  const NcclApi& api = state_->api;
  co_await run(mine, what, tensors(src, out), [&](ncclComm_t c, cudaStream_t s) {
    return api.all_gather(src.device_ptr(), out.device_ptr(), bytes, ncclUint8, c, s);
  });
}

Comm::Task NcclComm::broadcast(Ticket ticket, Tensor t, int root) {
  Ticket mine = std::move(ticket);  // handed back when the body ends, even by a throw
  const std::string what = fmt::format("broadcast({}, root {})", sig(t), root);
  REDCO_CHECK(root >= 0 && root < size(), "{}: the root must be a rank of this group, 0 to {}",
              what, size() - 1);
  void* p = t.device_ptr();
  const size_t bytes = t.nbytes();
  const NcclApi& api = state_->api;
  co_await run(mine, what, tensors(t), [&](ncclComm_t c, cudaStream_t s) {
    return api.broadcast(p, p, bytes, ncclUint8, root, c, s);
  });
}

// REDCO_NCCL: unset or 1 uses NCCL when it can be opened; 0 keeps the host world.
bool nccl_wanted() {
  const char* env = std::getenv("REDCO_NCCL");
  const std::string_view v = env ? env : "";
  REDCO_CHECK(v.empty() || v == "0" || v == "1",
              "REDCO_NCCL=\"{}\": use 1 (NCCL for GPU tensors, the default) or 0 (GPU tensors "
              "through host memory)",
              v);
  return v != "0";
}

// Whether this rank can use NCCL; *why is empty when REDCO_NCCL=0 says not to.
bool nccl_usable(std::string* why) {
  if (!nccl_wanted()) {
    why->clear();
    return false;
  }
  return nccl_api(why) != nullptr;
}

// Collectives on GPU tensors go over NCCL in every program that links this
// object: a static libredco keeps it through the linker's -u redco_nccl_anchor
// (redco/meson.build, redco.pc), as the CUDA backend keeps its own.
struct Registrar {
  Registrar() { register_nccl_comm(); }
} registrar;

}  // namespace

void register_nccl_comm() {
  register_device_comm(DeviceKind::cuda, {.name = "NCCL",
                                          .usable = nccl_usable,
                                          .connect = [](std::unique_ptr<Comm> host, Device device,
                                                        std::chrono::milliseconds timeout) {
                                            return connect_nccl(std::move(host), device, timeout);
                                          }});
}

std::unique_ptr<Comm> connect_nccl(std::unique_ptr<Comm> host, Device device,
                                   std::chrono::milliseconds timeout) {
  REDCO_CHECK(device.kind == DeviceKind::cuda, "connect_nccl: {} is not a CUDA device",
              device.str());
  std::string why;
  const NcclApi* api = nccl_api(&why);
  REDCO_CHECK(api, "NCCL: {}; install NCCL (libnccl2) or set REDCO_NCCL=0", why);
  // Group rank 0's unique id, to every rank over the host world.
  ncclUniqueId id{};
  if (host->rank() == 0) nccl_check(api->get_unique_id(&id), "ncclGetUniqueId");
  Tensor blob = Tensor::empty({int64_t(sizeof id)}, DType::u8);
  std::memcpy(blob.raw(), &id, sizeof id);
  sched::sync_wait(host->broadcast(blob, 0));
  std::memcpy(&id, blob.raw(), sizeof id);
  auto state = std::make_shared<State>(*api, device.index, timeout);
  OnDevice on(device.index);
  REDCO_CUDA(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
  nccl_check(api->comm_init_rank(&state->comm, host->size(), id, host->rank()), "ncclCommInitRank");
  return std::make_unique<NcclComm>(std::move(host), std::move(state));
}

}  // namespace redco::comm

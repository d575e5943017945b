// bench_dp_overlap: how much of the gradient all-reduce a data-parallel step
// hides behind backward.
//
//   redco-run -n 2 ./build/tools/bench/bench_dp_overlap --steps 10
//
// One GPT step (forward + backward + gradient averaging, no optimizer) on
// every rank, three ways, taking turns so machine load hits all alike:
//   overlap   value_and_grad with DataParallel::watch: each bucket's
//             all-reduce starts as backward finishes its gradients; finish()
//   serial    plain value_and_grad, then DataParallel::average (all buckets
//             after backward)
//   alone     DataParallel::average on gradients of the same shapes, with no
//             compute: the all-reduce's own time
// Rank 0 prints the medians, how long finish() waited, when in the last
// overlapped step each bucket's all-reduce was called (by the backward hooks),
// and hidden = (serial - overlap) / alone, the fraction of the all-reduce that
// overlapping removed from the step.
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cli11_conventions.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/ucx_comm.hpp"
#include "redco/core/error.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// [rows, len] token ids, the same on every rank.
Tensor tokens(int64_t rows, int64_t len, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(size_t(rows * len));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int64_t(philox_bits(5, stream, i) % uint64_t(vocab));
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), Shape{rows, len});
}

void report(const std::vector<double>& t_overlap, const std::vector<double>& t_serial,
            const std::vector<double>& t_alone, const std::vector<double>& t_backward,
            const std::vector<double>& t_finish, const std::vector<double>& starts) {
  const double ov = median(t_overlap), se = median(t_serial), al = median(t_alone);
  std::printf(
      "fwd+bwd %.1f ms | serial %.1f ms | overlap %.1f ms (of which waiting in finish %.1f ms) "
      "| all-reduce alone %.1f ms\n",
      median(t_backward) * 1e3, se * 1e3, ov * 1e3, median(t_finish) * 1e3, al * 1e3);
  std::printf("last overlapped step: buckets started at");
  for (size_t b = 0; b + 1 < starts.size(); ++b) std::printf(" %.1f", starts[b] * 1e3);
  std::printf(" ms; backward ended at %.1f ms\n", starts.back() * 1e3);
  std::printf("hidden = (serial - overlap) / alone = %.2f\n", (se - ov) / al);
  std::fflush(stdout);
}

// Forwards to a communicator and notes when each all_reduce is called, to
// show where in backward the buckets start.
class NotingComm final : public comm::Comm {
 public:
  explicit NotingComm(comm::Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int world_rank(int r) const override { return inner_.world_rank(r); }
  std::unique_ptr<Comm> subgroup(std::span<const int> r) override { return inner_.subgroup(r); }
  std::vector<Clock::time_point> calls;

 protected:
  Task do_all_reduce(uint64_t, Tensor t, comm::ReduceOp op) override {
    calls.push_back(Clock::now());
    return inner_.all_reduce(t, op);
  }
  Task do_reduce_scatter(uint64_t, Tensor in, Tensor out, comm::ReduceOp op) override {
    return inner_.reduce_scatter(in, out, op);
  }
  Task do_all_gather(uint64_t, Tensor in, Tensor out) override {
    return inner_.all_gather(in, out);
  }
  Task do_broadcast(uint64_t, Tensor t, int root) override { return inner_.broadcast(t, root); }
  Task do_barrier(uint64_t) override { return inner_.barrier(); }
  Task do_send(uint64_t, Tensor t, int peer, int tag) override { return inner_.send(t, peer, tag); }
  Task do_recv(uint64_t, Tensor t, int peer, int tag) override { return inner_.recv(t, peer, tag); }

 private:
  comm::Comm& inner_;
};

struct Setup {
  int64_t dim = 256, layers = 4, heads = 4, vocab = 1024, len = 64, batch = 8;
  size_t bucket_kb = 2048;
  int steps = 10, threads = 1;
};

void run(comm::Comm& world, const Setup& s) {
  NotingComm comm(world);
  const models::Gpt2Config cfg{.vocab = s.vocab,
                               .context = s.len,
                               .dim = s.dim,
                               .layers = s.layers,
                               .heads = s.heads,
                               .dropout = 0.f};
  const auto model = models::gpt2(cfg);
  const auto order = train::param_order(shard::resolve(model, 1));
  const ParamTree params = nn::init_params(model, 3);
  train::DataParallel data(comm, s.bucket_kb << 10);
  const Tensor ids = data.local_batch(tokens(s.batch * comm.size(), s.len, s.vocab, 0));
  const Tensor labels = data.local_batch(tokens(s.batch * comm.size(), s.len, s.vocab, 1));
  auto loss_of = [&](const ParamTree& p) {
    return cross_entropy(nn::apply(model, p, ids), labels);
  };
  ParamTree zeros;  // gradients' shapes, for the all-reduce alone
  for (const auto& [name, p] : params) zeros.emplace(name, Tensor::zeros(p.shape()));
  std::vector<double> t_overlap, t_serial, t_alone, t_backward, t_finish;
  std::vector<double> starts;  // the last overlapped step's bucket starts, ms into the step
  size_t buckets = 0, early = 0;
  for (int i = -1; i < s.steps; ++i) {  // step -1 warms up
    for (int k = 0; k < 3; ++k) {
      const int mode = (i + 3 + k) % 3;  // rotate which goes first
      sched::sync_wait(comm.barrier());
      const Clock::time_point t0 = Clock::now();
      if (mode == 0) {
        comm.calls.clear();
        auto [loss, grads] = value_and_grad(
            [&](const ParamTree& p) { return loss_of(data.watch(p, order)); }, params);
        const Clock::time_point t1 = Clock::now();
        starts.clear();
        for (Clock::time_point c : comm.calls) starts.push_back(since(t0) - since(c));
        starts.push_back(since(t0));  // backward's end
        data.finish(grads);
        if (i >= 0) t_overlap.push_back(since(t0)), t_finish.push_back(since(t1));
        buckets = data.last_bucket_count();
        early = data.last_early_launches();
      } else if (mode == 1) {
        auto [loss, grads] = value_and_grad(loss_of, params);
        const double backward = since(t0);
        data.average(grads, order);
        if (i >= 0) t_serial.push_back(since(t0)), t_backward.push_back(backward);
      } else {
        ParamTree g = zeros;
        data.average(g, order);
        if (i >= 0) t_alone.push_back(since(t0));
      }
    }
  }
  if (comm.rank() != 0) return;
  size_t numel = 0;
  for (const auto& [name, p] : params) numel += size_t(p.numel());
  std::printf(
      "gpt d=%lld layers=%lld heads=%lld vocab=%lld len=%lld batch/rank=%lld, %zu params "
      "(%.1f MB of f32 gradients), %d ranks x %d thread(s), %zu buckets (%zu started by "
      "backward), medians of %d steps\n",
      (long long)s.dim, (long long)s.layers, (long long)s.heads, (long long)s.vocab,
      (long long)s.len, (long long)s.batch, numel, double(numel) * 4 / 1e6, comm.size(), s.threads,
      buckets, early, s.steps);
  report(t_overlap, t_serial, t_alone, t_backward, t_finish, starts);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hidden fraction of the DP gradient all-reduce (run under redco-run -n 2)"};
  Setup s;
  app.add_option("--dim", s.dim);
  app.add_option("--layers", s.layers);
  app.add_option("--heads", s.heads);
  app.add_option("--vocab", s.vocab);
  app.add_option("--len", s.len, "sequence length");
  app.add_option("--batch", s.batch, "rows per rank");
  app.add_option("--bucket-kb", s.bucket_kb, "DataParallel bucket size");
  app.add_option("--steps", s.steps, "timed steps per mode");
  app.add_option("--threads", s.threads, "compute threads per rank");
  REDCO_CLI11_PARSE(app, argc, argv);
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, size_t(s.threads));
  try {
    const comm::LaunchEnv env = comm::detect_launch_env();
    REDCO_CHECK(env.world_size >= 2,
                "bench_dp_overlap needs at least 2 ranks: run it under redco-run -n 2");
    std::unique_ptr<comm::Comm> comm = comm::connect_ucx(comm::ucx_options(env));
    run(*comm, s);
    sched::sync_wait(comm->barrier());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dp_overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}

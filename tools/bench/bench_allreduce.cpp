// bench_allreduce: all-reduce bus bandwidth of the UCX communicator.
//
//   redco-run -n 2 ./build/tools/bench/bench_allreduce --sizes-mb 1,16,64,256
//
// Every rank all-reduces (mean) one f32 buffer per size; after a warm-up the
// time of `iters` back-to-back calls is taken, and rank 0 prints one line per
// size:  allreduce bytes=B iters=I ms=T algbw=A busbw=U  (GB/s, 1e9 bytes),
// with busbw = algbw * 2(n-1)/n, the nccl-tests convention that makes the
// number comparable with a link's bandwidth. tools/bench/comm_bench runs it
// beside ucx_perftest and Gloo.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli11_conventions.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/ucx_comm.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/background.hpp"

using namespace redco;
using Clock = std::chrono::steady_clock;

namespace {

// Enough calls for ~256 MiB of traffic per size, at least 3.
int default_iters(size_t bytes) { return int(std::max<size_t>(3, (size_t(256) << 20) / bytes)); }

// ZeRO-3's gather: one broadcast from each rank of its 1/n of `t`, all
// started before any is awaited.
void gather_by_broadcasts(comm::Comm& comm, Tensor& t) {
  const int n = comm.size();
  std::vector<sched::Task<void>> parts;
  for (int r = 0; r < n; ++r) {
    Tensor part = t.slice0(t.dim(0) * r / n, t.dim(0) * (r + 1) / n);
    parts.push_back(comm.broadcast(part, r));
  }
  sched::Background background;
  std::vector<size_t> started;
  for (auto& p : parts) started.push_back(background.start(std::move(p)));
  for (size_t id : started) background.wait(id);
}

double bench_size(comm::Comm& comm, size_t bytes, int iters, bool broadcasts) {
  Tensor t = Tensor::full(Shape{int64_t(bytes / 4)}, 1.0f);  // [bytes/4] f32
  auto once = [&] {
    if (broadcasts) return gather_by_broadcasts(comm, t);
    sched::sync_wait(comm.all_reduce(t, comm::ReduceOp::mean));
  };
  once();  // warm-up: wires the peers
  sched::sync_wait(comm.barrier());
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < iters; ++i) once();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  // The mean of equal buffers is the buffer: anything else is a broken reduction.
  const float* x = t.data<float>();
  REDCO_CHECK(x[0] == 1.0f && x[t.numel() - 1] == 1.0f,
              "bench_allreduce: the reduction of {} bytes is wrong ({} at 0)", bytes, x[0]);
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"all-reduce bus bandwidth of the UCX communicator (run under redco-run -n N)"};
  std::vector<double> sizes_mb{1, 16, 64, 256};
  int iters = 0;
  comm::UcxOptions defaults;
  size_t small_kb = defaults.small_bytes >> 10, segment_kb = defaults.segment_bytes >> 10;
  app.add_option("--sizes-mb", sizes_mb, "buffer sizes in MiB")->delimiter(',');
  app.add_option("--iters", iters, "timed calls per size (default: ~256 MiB of traffic)");
  app.add_option("--small-kb", small_kb, "all-reduce up to this size directly (UcxOptions)");
  app.add_option("--segment-kb", segment_kb, "ring segment size (UcxOptions)");
  std::string op = "allreduce";
  app.add_option("--op", op, "allreduce, or broadcasts: one from each rank of its 1/n (ZeRO-3)")
      ->check(CLI::IsMember({"allreduce", "broadcasts"}));
  REDCO_CLI11_PARSE(app, argc, argv);
  try {
    const comm::LaunchEnv env = comm::detect_launch_env();
    REDCO_CHECK(env.world_size >= 2,
                "bench_allreduce needs at least 2 ranks: run it under redco-run -n 2");
    std::unique_ptr<comm::Comm> comm = comm::connect_ucx([&] {
      comm::UcxOptions o = comm::ucx_options(env);
      o.small_bytes = small_kb << 10;
      o.segment_bytes = segment_kb << 10;
      return o;
    }());
    const int n = comm->size();
    for (double mb : sizes_mb) {
      const size_t bytes = size_t(mb * double(1 << 20)) / 4 * 4;
      const int it = iters > 0 ? iters : default_iters(bytes);
      const bool broadcasts = op == "broadcasts";
      const double secs = bench_size(*comm, bytes, it, broadcasts);
      const double algbw = double(bytes) / secs / 1e9;
      if (comm->rank() == 0)
        std::printf("%s bytes=%zu iters=%d ms=%.3f algbw=%.3f busbw=%.3f\n", op.c_str(), bytes, it,
                    secs * 1e3, algbw, algbw * (broadcasts ? 1.0 : 2.0) * (n - 1) / n);
      std::fflush(stdout);
    }
    sched::sync_wait(comm->barrier());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 1;
  }
  return 0;
}

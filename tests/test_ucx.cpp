// The rendezvous (ranks as threads of this process) and the UCX backend
// (ranks as forked child processes, each its own UCX worker, meeting through
// a rendezvous on 127.0.0.1 whose rank-0 listener the parent binds on an
// ephemeral port before forking). A child reports failure through a pipe and
// its exit status; the parent kills every child that outlives a deadline, so
// a hang fails the test instead of stalling it.
//
// Transports (UCX 1.13 in the sandbox, no RDMA devices): UCX's own choice
// (UCX_TLS unset) and UCX_TLS=tcp,self both pass. UCX_TLS=sm,self alone
// does not: shared-memory transports cannot detect a dead peer, which the
// backend's peer-failure error mode requires, so opening endpoints fails
// with "Destination is unreachable".
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "redco/comm/rendezvous.hpp"
#include "redco/comm/ucx_comm.hpp"
#include "redco/comm/ucx_world.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/when_all.hpp"

using namespace redco;
using namespace redco::comm;
using Clock = std::chrono::steady_clock;

namespace {

// Runs n rendezvous clients as threads; returns each rank's result or error.
struct RzResult {
  std::vector<std::string> blobs;
  std::string error;
};
std::vector<RzResult> run_rendezvous(std::vector<RendezvousOptions> opts) {
  opts[0].port = 0;
  Rendezvous root(opts[0]);
  std::vector<RzResult> out(opts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < opts.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        if (i == 0) {
          out[i].blobs = root.exchange("blob0");
        } else {
          opts[i].port = root.port();
          Rendezvous rz(opts[i]);
          out[i].blobs = rz.exchange("blob" + std::to_string(opts[i].rank));
        }
      } catch (const Error& e) {
        out[i].error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<RendezvousOptions> agreeing(int n) {
  std::vector<RendezvousOptions> opts;
  for (int r = 0; r < n; ++r)
    opts.push_back({.rank = r,
                    .world_size = n,
                    .job_token = "job-7",
                    .plan_hash = 0xabc,
                    .timeout = std::chrono::milliseconds(5000)});
  return opts;
}

}  // namespace

TEST_CASE("rendezvous exchanges every rank's blob", "[rendezvous]") {
  const std::vector<RzResult> res = run_rendezvous(agreeing(4));
  for (const RzResult& r : res) {
    INFO(r.error);
    REQUIRE(r.error.empty());
    CHECK(r.blobs == std::vector<std::string>{"blob0", "blob1", "blob2", "blob3"});
  }
}

TEST_CASE("rendezvous rejects ranks that disagree", "[rendezvous]") {
  std::vector<RendezvousOptions> opts = agreeing(3);
  std::string expect;
  SECTION("world size") {
    opts[2].world_size = 8;
    expect = "rank 2 says world size 8 but rank 0 says 3";
  }
  SECTION("job token") {
    opts[1].job_token = "job-8";
    expect = "rank 1 has a different job token than rank 0";
  }
  SECTION("model plan") {
    opts[2].plan_hash = 0xabd;
    expect = "rank 2 has model plan hash 0000000000000abd but rank 0 has 0000000000000abc";
  }
  SECTION("duplicate rank") {
    opts[2].rank = 1;
    expect = "two processes both say they are rank 1";
  }
  for (const RzResult& r : run_rendezvous(opts)) {
    // A rank rejected before rank 0 saw every hello may instead time out
    // reaching a closed listener; every rank that got an answer has the reason.
    CHECK_THAT(r.error, Catch::Contains("rendezvous"));
    if (r.error.find("could not reach") == std::string::npos &&
        r.error.find("got no answer") == std::string::npos)
      CHECK_THAT(r.error, Catch::Contains(expect));
  }
}

TEST_CASE("rendezvous names the ranks that never joined", "[rendezvous]") {
  std::vector<RendezvousOptions> opts = agreeing(3);
  for (RendezvousOptions& o : opts) o.timeout = std::chrono::milliseconds(400);
  opts.pop_back();  // rank 2 never starts
  for (const RzResult& r : run_rendezvous(opts))
    CHECK_THAT(r.error, Catch::Contains("rendezvous failed: rank 0 timed out after 400 ms: "
                                        "rank(s) 2 never joined the rendezvous"));
}

TEST_CASE("rendezvous names host0 when rank 0 never comes", "[rendezvous]") {
  RendezvousOptions opt = agreeing(2)[1];
  {
    RendezvousOptions zero = agreeing(2)[0];
    zero.port = 0;
    opt.port = Rendezvous(zero).port();  // closed again: nobody listens there now
  }
  const int port = opt.port;
  opt.timeout = std::chrono::milliseconds(300);
  Rendezvous rz(opt);
  const Clock::time_point t0 = Clock::now();
  CHECK_THROWS_WITH(rz.exchange("x"),
                    Catch::Contains(fmt::format("rank 1 could not reach rank 0 at host0 "
                                                "127.0.0.1:{} within 300 ms",
                                                port)) &&
                        Catch::Contains("start rank 0"));
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));
}

namespace {

// Values that exercise rounding: a different sum order gives different bits.
float value(int rank, int64_t i, int salt) {
  uint64_t h = uint64_t(rank) * 0x9e3779b97f4a7c15ull ^ uint64_t(i) * 0xbf58476d1ce4e5b9ull ^
               uint64_t(salt) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  h *= 0xd6e9f8b1d1a6e47bull;
  h ^= h >> 29;
  return float(int64_t(h % 2000001) - 1000000) * 1e-3f + 1e-7f * float(h % 7);
}

Tensor filled(int rank, int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, i, salt);
  return Tensor::from(std::span<const float>(v), Shape{n});
}

// The documented orders: rank order 0..n-1 for the direct algorithm; for
// the ring, chunk c is summed starting at rank c+1.
float reference(int n, int64_t numel, int64_t i, int salt, bool ring, ReduceOp op) {
  int first = 0;
  if (ring) {
    int c = 0;
    while (numel * (c + 1) / n <= i) ++c;
    first = (c + 1) % n;
  }
  float acc = value(first, i, salt);
  for (int k = 1; k < n; ++k) acc = acc + value((first + k) % n, i, salt);
  return op == ReduceOp::mean ? acc / float(n) : acc;
}

constexpr size_t kSmallBytes = 4096;  // tests use both algorithms at modest sizes
// Small ring segments: many per chunk, of uneven lengths, so the pipelined
// steps (segment j of step s+1 after segment j of step s) are exercised.
constexpr size_t kSegmentBytes = 8192;

void check_all_reduce(Comm& c, int64_t numel, ReduceOp op, int salt) {
  const int n = c.size();
  Tensor t = filled(c.rank(), numel, salt);
  sched::sync_wait(c.all_reduce(t, op));
  const bool ring = size_t(numel) * 4 > kSmallBytes;
  const float* got = t.data<float>();
  for (int64_t i = 0; i < numel; ++i) {
    const float want = reference(n, numel, i, salt, ring, op);
    REDCO_CHECK(std::memcmp(&want, &got[i], 4) == 0,
                "all_reduce({}, {} floats, n={}): element {} is {} but the reference is {}",
                reduce_op_name(op), numel, n, i, got[i], want);
  }
}

void check_reduce_scatter(Comm& c) {
  const int n = c.size();
  const int64_t m = 1001;
  Tensor in = filled(c.rank(), n * m, 11);
  Tensor out = Tensor::empty(Shape{m});
  sched::sync_wait(c.reduce_scatter(in, out));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t g = c.rank() * m + i;
    const float want = reference(n, n * m, g, 11, true, ReduceOp::sum);
    REDCO_CHECK(std::memcmp(&want, out.data<float>() + i, 4) == 0,
                "reduce_scatter: element {} differs", i);
  }
}

void check_gather_broadcast_p2p(Comm& c) {
  const int n = c.size(), me = c.rank();
  Tensor in = Tensor::full(Shape{3, 2}, float(100 + me));
  Tensor out = Tensor::zeros(Shape{3 * n, 2});
  sched::sync_wait(c.all_gather(in, out));
  for (int64_t i = 0; i < 6 * n; ++i)
    REDCO_CHECK(out.data<float>()[i] == float(100 + i / 6), "all_gather: element {} wrong", i);
  Tensor b = filled(me, 5000, me == n - 1 ? 3 : 4);
  sched::sync_wait(c.broadcast(b, n - 1));
  for (int64_t i = 0; i < 5000; ++i)
    REDCO_CHECK(b.data<float>()[i] == value(n - 1, i, 3), "broadcast: element {} wrong", i);
  for (int k = 0; k < 3; ++k) sched::sync_wait(c.barrier());
  Tensor msg = Tensor::full(Shape{4}, float(me * 10));
  Tensor got = Tensor::zeros(Shape{4});
  sched::sync_wait(sched::when_all(c.send(msg, (me + 1) % n, 5), c.recv(got, (me + n - 1) % n, 5)));
  REDCO_CHECK(got.data<float>()[3] == float(((me + n - 1) % n) * 10), "recv: wrong payload");
}

void check_subgroups(Comm& c) {
  const int n = c.size(), me = c.rank();
  const std::vector<int> ends = {0, n - 1};
  if (me == 0 || me == n - 1) {
    std::unique_ptr<Comm> g = c.subgroup(ends);
    Tensor t = Tensor::full(Shape{3}, float(me + 1));
    sched::sync_wait(g->all_reduce(t));
    REDCO_CHECK(t.data<float>()[0] == float(1 + n), "subgroup all_reduce: got {}",
                t.data<float>()[0]);
    check_all_reduce(*g, 3000, ReduceOp::sum, 21);
  }
  sched::sync_wait(c.barrier());
}

void run_suite(Comm& c) {
  for (int64_t numel : {int64_t(1), int64_t(5), int64_t(1000), int64_t(1025), int64_t(4099),
                        int64_t(100003), int64_t(1) << 20})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) check_all_reduce(c, numel, op, int(numel));
  Tensor h = filled(c.rank(), 37, 9).to(DType::bf16);
  sched::sync_wait(c.all_reduce(h, ReduceOp::mean));
  // The reduction sees the bf16-rounded inputs, summed in f32 in rank order.
  Tensor want = Tensor::empty(Shape{37});
  for (int64_t i = 0; i < 37; ++i) {
    float acc = 0;
    for (int r = 0; r < c.size(); ++r) {
      const float x = bf16_to_float(float_to_bf16(value(r, i, 9)));
      acc = r == 0 ? x : acc + x;
    }
    want.data<float>()[i] = acc / float(c.size());
  }
  REDCO_CHECK(std::memcmp(want.to(DType::bf16).raw(), h.raw(), 74) == 0, "bf16 all_reduce differs");
  check_reduce_scatter(c);
  check_gather_broadcast_p2p(c);
  check_subgroups(c);
}

UcxOptions ucx_options(int rank, int n, int port, int timeout_ms) {
  return {.rank = rank,
          .world_size = n,
          .port = port,
          .job_token = "ucx-test",
          .plan_hash = 42,
          .timeout = std::chrono::milliseconds(timeout_ms),
          .small_bytes = kSmallBytes,
          .segment_bytes = kSegmentBytes};
}

// Forks n ranks running body(rank, comm); returns each child's error text
// ("" when it exited cleanly). Children still running at `limit` are killed.
std::vector<std::string> run_processes(int n, int timeout_ms, std::chrono::seconds limit,
                                       const std::function<void(int, Comm&)>& body) {
  Rendezvous root({.rank = 0,
                   .world_size = n,
                   .port = 0,
                   .job_token = "ucx-test",
                   .plan_hash = 42,
                   .timeout = std::chrono::milliseconds(20000)});
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < n; ++r) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      std::string why;
      try {
        UcxOptions opt = ucx_options(r, n, root.port(), timeout_ms);
        std::unique_ptr<Comm> comm = r == 0 ? connect_ucx(root, opt) : connect_ucx(opt);
        body(r, *comm);
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!why.empty() && ::write(fds[1], why.data(), why.size()) < 0) why += " (unreported)";
      ::_exit(why.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<std::string> errors(static_cast<size_t>(n));
  const Clock::time_point deadline = Clock::now() + limit;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    while (::waitpid(pids[size_t(r)], &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ::waitpid(pids[size_t(r)], &status, 0);
        errors[size_t(r)] = "hung: killed at the test's deadline";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    char buf[4096];
    ssize_t k;
    while ((k = ::read(pipes[size_t(r)], buf, sizeof buf)) > 0) errors[size_t(r)].append(buf, k);
    ::close(pipes[size_t(r)]);
    if (errors[size_t(r)].empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      errors[size_t(r)] = fmt::format("exited with status {}", status);
  }
  return errors;
}

void quiet_ucx() {
  // The sandbox has no RDMA devices; keep UCX from warning about them.
  ::setenv("UCX_LOG_LEVEL", "error", 0);
  ::setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
}

}  // namespace

TEST_CASE("UCX collectives match the deterministic reference", "[ucx]") {
  quiet_ucx();
  for (int n : {2, 3}) {
    INFO("world size " << n);
    const std::vector<std::string> errors =
        run_processes(n, 10000, std::chrono::seconds(25), [](int, Comm& c) { run_suite(c); });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << errors[size_t(r)]);
      CHECK(errors[size_t(r)].empty());
    }
  }
}

// Test-device tensors (host memory behind a device's rules) go through host
// copies, as GPU memory would without GPUDirect; the results land on the device.
void check_device_staging(Comm& c) {
  const Device d = Device::test();
  const int me = c.rank();
  auto host = [](const Tensor& t) { return t.to(Device::cpu()).values<float>(); };
  Tensor t = Tensor::full(Shape{5}, float(me + 1), DType::f32, d);
  sched::sync_wait(c.all_reduce(t));
  REDCO_CHECK(t.device() == d && host(t) == std::vector<float>(5, 3.f), "all_reduce on test:0");
  Tensor b = Tensor::full(Shape{3}, float(me), DType::f32, d);
  sched::sync_wait(c.broadcast(b, 1));
  REDCO_CHECK(host(b) == std::vector<float>(3, 1.f), "broadcast on test:0");
  Tensor out = Tensor::empty(Shape{2, 2}, DType::f32, d);
  sched::sync_wait(c.all_gather(Tensor::full(Shape{1, 2}, float(me), DType::f32, d), out));
  REDCO_CHECK(host(out) == (std::vector<float>{0.f, 0.f, 1.f, 1.f}), "all_gather on test:0");
  Tensor got = Tensor::zeros(Shape{4}, DType::f32, d);
  sched::sync_wait(
      sched::when_all(c.send(Tensor::full(Shape{4}, float(7 + me), DType::f32, d), 1 - me, 6),
                      c.recv(got, 1 - me, 6)));
  REDCO_CHECK(host(got) == std::vector<float>(4, float(8 - me)), "send/recv on test:0");
}

TEST_CASE("UCX: test-device tensors travel through host copies", "[ucx]") {
  quiet_ucx();
  const std::vector<std::string> errors = run_processes(
      2, 10000, std::chrono::seconds(25), [](int, Comm& c) { check_device_staging(c); });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[size_t(r)]);
    CHECK(errors[size_t(r)].empty());
  }
}

TEST_CASE("UCX: a dead peer ends the others with an error naming it", "[ucx]") {
  quiet_ucx();
  // Direct and ring all-reduces; the peers share this host, so the data goes
  // over shared memory and the death is reported by the guard endpoints.
  for (int64_t numel : {int64_t(1000), int64_t(1) << 18}) {
    INFO(numel << " floats");
    const std::vector<std::string> errors =
        run_processes(3, 5000, std::chrono::seconds(15), [numel](int rank, Comm& c) {
          Tensor t = Tensor::full(Shape{numel}, 1.0f);
          sched::sync_wait(c.all_reduce(t));
          REDCO_CHECK(t.data<float>()[0] == 3.0f, "first all_reduce wrong");
          // Rank 2 leaves only once the others have finished the first
          // all_reduce (their note to it says so): its own finishing first
          // does not mean theirs has, and their last messages must not race
          // its exit.
          Tensor note = Tensor::full(Shape{1}, 1.0f);
          if (rank == 2) {
            for (int from : {0, 1}) sched::sync_wait(c.recv(note, from));
            ::_exit(0);  // dies without a word, endpoints open
          }
          sched::sync_wait(c.send(note, 2));
          sched::sync_wait(c.all_reduce(t));
          fail("the second all_reduce completed without rank 2");
        });
    CHECK(errors[2].empty());
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << errors[size_t(r)]);
      // Detected, not waited out (a timeout says "timed out"); rank 0 may hear
      // first that rank 1 left after its own error, which names rank 1.
      CHECK_THAT(errors[size_t(r)],
                 Catch::Contains(fmt::format("all_reduce(sum, f32[{}]) #1", numel)) &&
                     Catch::Contains("failed or disconnected"));
    }
    CHECK_THAT(errors[0] + errors[1], Catch::Contains("rank 2 failed or disconnected"));
  }
}

TEST_CASE("UCX: a silent peer times out, naming it; the comm stays failed", "[ucx]") {
  quiet_ucx();
  const std::vector<std::string> errors =
      run_processes(2, 500, std::chrono::seconds(15), [](int rank, Comm& c) {
        sched::sync_wait(c.barrier());
        if (rank == 1) {
          // Alive (its endpoint answers) but never joins: only the deadline helps.
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        Tensor t = Tensor::full(Shape{10}, 1.0f);
        const Clock::time_point t0 = Clock::now();
        std::string first;
        try {
          sched::sync_wait(c.all_reduce(t));
        } catch (const Error& e) {
          first = e.what();
        }
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        REDCO_CHECK(secs < 2.0, "the timeout took {} s", secs);
        try {
          sched::sync_wait(c.barrier());
        } catch (const Error& e) {
          fail("{} | {}", first, e.what());
        }
        fail("the barrier after a timeout succeeded");
      });
  INFO(errors[0]);
  CHECK(errors[1].empty());
  CHECK_THAT(errors[0],
             Catch::Contains("all_reduce(sum, f32[10]) #1 on group [0, 1] failed on rank 0: timed "
                             "out after 0.5 s waiting for rank 1") &&
                 Catch::Contains("barrier() #2") &&
                 Catch::Contains("the communicator failed earlier"));
}

TEST_CASE("UCX all_reduce bus bandwidth, 64 MB on 2 processes", "[.][bench]") {
  quiet_ucx();
  const std::vector<std::string> errors =
      run_processes(2, 60000, std::chrono::seconds(120), [](int rank, Comm& c) {
        Tensor t = Tensor::full(Shape{int64_t(16) << 20}, 1.0f);
        sched::sync_wait(c.all_reduce(t));  // warm-up: wires up the endpoints
        const int iters = 5;
        const Clock::time_point t0 = Clock::now();
        for (int i = 0; i < iters; ++i) sched::sync_wait(c.all_reduce(t));
        const double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
        const double algbw = double(t.nbytes()) / s / 1e9;
        if (rank == 0)
          std::printf("all_reduce 64 MB, 2 processes: %.1f ms, algbw %.2f GB/s, busbw %.2f GB/s\n",
                      s * 1e3, algbw, algbw * 2 * (2 - 1) / 2);
        const Clock::time_point t1 = Clock::now();
        for (int i = 0; i < 1000; ++i) sched::sync_wait(c.barrier());
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t1).count();
        if (rank == 0) std::printf("barrier, 2 processes: %.1f us\n", us / 1000);
        std::fflush(stdout);  // the child leaves through _exit, which does not flush
      });
  for (const std::string& e : errors) CHECK(e.empty());
}

TEST_CASE("UCX_TLS lists that keep UCX on TCP are told apart", "[ucx]") {
  using comm::ucx_detail::tcp_only;
  CHECK(tcp_only("tcp,self"));
  CHECK(tcp_only("tcp"));
  CHECK(tcp_only("self,tcp"));
  CHECK_FALSE(tcp_only(nullptr));
  CHECK_FALSE(tcp_only(""));
  CHECK_FALSE(tcp_only("self"));
  CHECK_FALSE(tcp_only("tcp,sm,self"));
  CHECK_FALSE(tcp_only("^shm"));
  CHECK_FALSE(tcp_only("rc,tcp"));
}

// Communicators on the threads backend: collective semantics, bitwise
// determinism, subgroups of the mesh, random interleavings, and failures
// (mismatched calls, timeouts, dead and departed peers).
//
// Catch2 assertions are not thread-safe, so rank threads only record what
// they saw; the checks run on the test's thread after ThreadsWorld::run.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redco/comm/bytes.hpp"
#include "redco/comm/call_order.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/sched/background.hpp"
#include "redco/sched/executor.hpp"
#include "redco/sched/when_all.hpp"

using namespace redco;
using namespace redco::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using sched::sync_wait;
using sched::Task;
using sched::when_all;

namespace {

Tensor random_input(int rank, int64_t numel, uint64_t seed) {
  return Tensor::uniform(Shape{numel}, seed, uint64_t(rank), -1.f, 1.f);
}

// Small integers: sums of a few are exact in f32, so expected values are exact.
float pattern(uint64_t seed, int rank, int64_t i) {
  return float((seed * 31 + uint64_t(rank) * 1009 + uint64_t(i) * 7) % 1000);
}
Tensor pattern_tensor(uint64_t seed, int rank, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = pattern(seed, rank, i);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// all_reduce on n ranks; every rank's result, by rank.
std::vector<std::vector<float>> all_reduce_results(int n, int64_t numel, ReduceOp op) {
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  ThreadsWorld world(n);
  world.run([&](Comm& c) {
    Tensor t = random_input(c.rank(), numel, 7);
    sync_wait(c.all_reduce(t, op));
    out[size_t(c.rank())] = t.values<float>();
  });
  return out;
}

}  // namespace

TEST_CASE("all_reduce matches a serial sum in rank order, bitwise, on every rank", "[comm]") {
  for (int n = 1; n <= 4; ++n)
    for (int64_t numel : {1, 3, 7, 64, 1001, 4099})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
        INFO("ranks " << n << ", numel " << numel << ", op " << reduce_op_name(op));
        std::vector<float> expect = random_input(0, numel, 7).values<float>();
        for (int r = 1; r < n; ++r) {
          const std::vector<float> x = random_input(r, numel, 7).values<float>();
          for (int64_t i = 0; i < numel; ++i) expect[size_t(i)] += x[size_t(i)];
        }
        if (op == ReduceOp::mean)
          for (float& v : expect) v /= float(n);
        const auto got = all_reduce_results(n, numel, op);
        for (int r = 0; r < n; ++r) CHECK(same_bits(got[size_t(r)], expect));
      }
}

TEST_CASE("all_reduce is bitwise reproducible across runs, also in bf16", "[comm]") {
  CHECK(all_reduce_results(3, 5000, ReduceOp::mean) == all_reduce_results(3, 5000, ReduceOp::mean));

  std::vector<uint16_t> got[3];
  ThreadsWorld world(3);
  world.run([&](Comm& c) {
    Tensor t = random_input(c.rank(), 100, 9).to(DType::bf16);
    sync_wait(c.all_reduce(t));
    const auto* p = static_cast<const uint16_t*>(t.raw());
    got[c.rank()].assign(p, p + 100);
  });
  for (int64_t i = 0; i < 100; ++i) {
    float sum = 0;
    for (int r = 0; r < 3; ++r)
      sum += bf16_to_float(float_to_bf16(random_input(r, 100, 9).values<float>()[size_t(i)]));
    for (int r = 0; r < 3; ++r) CHECK(got[r][size_t(i)] == float_to_bf16(sum));
  }
}

TEST_CASE("byte strings: all_gather_bytes and broadcast_bytes, empty and binary ones too",
          "[comm]") {
  constexpr int n = 3;
  // Rank r's string: r * 1000 bytes 0..255 repeating (rank 0's is empty), and a NUL inside.
  const auto of = [](int r) {
    std::string s(size_t(r) * 1000, '\0');
    for (size_t i = 0; i < s.size(); ++i) s[i] = char(i * 7 + size_t(r));
    return s;
  };
  std::vector<std::vector<std::string>> gathered(n);
  std::vector<std::string> from_root(n), from_empty(n);
  ThreadsWorld world(n);
  world.run([&](Comm& c) {
    const int r = c.rank();
    gathered[size_t(r)] = all_gather_bytes(of(r), c);
    from_root[size_t(r)] = r == 2 ? of(2) : "stale";
    broadcast_bytes(from_root[size_t(r)], c, 2);
    from_empty[size_t(r)] = r == 0 ? "" : "stale";
    broadcast_bytes(from_empty[size_t(r)], c);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(gathered[size_t(r)].size() == size_t(n));
    for (int q = 0; q < n; ++q) CHECK(gathered[size_t(r)][size_t(q)] == of(q));
    CHECK(from_root[size_t(r)] == of(2));
    CHECK(from_empty[size_t(r)].empty());
  }
  std::string refused;  // checked here: Catch's assertions belong to the test's thread
  ThreadsWorld(1).run([&](Comm& c) {
    try {
      broadcast_bytes(from_root[0], c, 1);
    } catch (const Error& e) {
      refused = e.what();
    }
  });
  CHECK_THAT(refused, Contains("root 1 is not a rank of 1"));
}

TEST_CASE("reduce_scatter, all_gather, broadcast, barrier semantics", "[comm]") {
  constexpr int n = 3;
  std::vector<std::vector<float>> rs(n), rs_inplace(n), ag(n), ag_inplace(n), bc(n);
  ThreadsWorld world(n);
  world.run([&](Comm& c) {
    const int r = c.rank();
    Tensor in = pattern_tensor(1, r, Shape{n * 2, 3});
    Tensor out = Tensor::zeros(Shape{2, 3});
    sync_wait(c.reduce_scatter(in, out));
    rs[size_t(r)] = out.values<float>();
    Tensor own = in.slice0(r * 2, r * 2 + 2);  // in place: the result lands in this rank's rows
    sync_wait(c.reduce_scatter(in, own, ReduceOp::mean));
    rs_inplace[size_t(r)] = own.values<float>();

    Tensor mine = pattern_tensor(2, r, Shape{2, 3});
    Tensor all = Tensor::zeros(Shape{n * 2, 3});
    sync_wait(c.all_gather(mine, all));
    ag[size_t(r)] = all.values<float>();
    Tensor buf = Tensor::zeros(Shape{n * 2, 3});
    Tensor slot = buf.slice0(r * 2, r * 2 + 2);
    slot.copy_from(mine);
    sync_wait(c.all_gather(slot, buf));
    ag_inplace[size_t(r)] = buf.values<float>();

    Tensor b = pattern_tensor(3, r, Shape{5});
    sync_wait(c.broadcast(b, 1));
    sync_wait(c.barrier());
    bc[size_t(r)] = b.values<float>();
  });
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < 6; ++i) {
      float sum = 0;
      for (int k = 0; k < n; ++k) sum += pattern(1, k, r * 6 + i);
      CHECK(rs[size_t(r)][size_t(i)] == sum);
      CHECK(rs_inplace[size_t(r)][size_t(i)] == sum / float(n));
    }
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < 6; ++i) {
        CHECK(ag[size_t(r)][size_t(k * 6 + i)] == pattern(2, k, i));
        CHECK(ag_inplace[size_t(r)][size_t(k * 6 + i)] == pattern(2, k, i));
      }
    CHECK(bc[size_t(r)] == pattern_tensor(3, 1, Shape{5}).values<float>());
  }
}

TEST_CASE("send/recv pair the k-th send with the k-th recv per peer and tag", "[comm]") {
  constexpr int n = 4;
  std::vector<std::vector<float>> got(n);
  std::vector<std::string> errors(n);
  ThreadsWorld world(n);
  world.run([&](Comm& c) {
    const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
    auto ring = [&]() -> Task<void> {
      Tensor a = Tensor::full(Shape{3}, float(r)), b = Tensor::full(Shape{3}, float(10 + r));
      Tensor t1 = Tensor::full(Shape{2}, float(100 + r));
      co_await c.send(a, next, 0);
      co_await c.send(t1, next, 1);
      co_await c.send(b, next, 0);
      a.fill(-1);  // send copied: reusing the buffer is fine
      Tensor x = Tensor::zeros(Shape{3}), y = Tensor::zeros(Shape{3}), z = Tensor::zeros(Shape{2});
      // Started in reverse order, still matched in call order.
      auto rx = c.recv(x, prev, 0);
      auto ry = c.recv(y, prev, 0);
      co_await when_all(c.recv(z, prev, 1), std::move(ry), std::move(rx));
      got[size_t(r)] = {x.values<float>()[0], y.values<float>()[0], z.values<float>()[1]};
    };
    sync_wait(ring());
    Tensor wrong = Tensor::zeros(Shape{4});
    if (r == 0) sync_wait(c.send(Tensor::zeros(Shape{3}), 1, 7));
    if (r == 1) {
      try {
        sync_wait(c.recv(wrong, 0, 7));
      } catch (const Error& e) {
        errors[1] = e.what();
      }
    }
  });
  for (int r = 0; r < n; ++r) {
    const float p = float((r + n - 1) % n);
    CHECK(got[size_t(r)] == std::vector<float>{p, 10 + p, 100 + p});
  }
  CHECK_THAT(errors[1],
             Contains("recv(f32[4] from rank 0, tag 7)") && Contains("rank 0 sent f32[3]"));
}

TEST_CASE("Mesh: dp x mp with neighbouring mp groups; subgroups run independently", "[comm]") {
  const MeshShape shape(4, 2);
  CHECK(shape.dp_size() == 2);
  CHECK(shape.mp_group(0) == std::vector<int>{0, 1});
  CHECK(shape.mp_group(3) == std::vector<int>{2, 3});
  CHECK(shape.dp_group(0) == std::vector<int>{0, 2});
  CHECK(shape.dp_group(3) == std::vector<int>{1, 3});
  CHECK_THROWS_WITH(MeshShape(4, 3),
                    Contains("n_model_shards = 3 does not divide the world size 4"));
  CHECK(MeshShape(6, 3).dp_group(4) == std::vector<int>{1, 4});

  std::vector<std::vector<float>> mp_sum(4), dp_sum(4);
  std::vector<std::vector<int>> ranks(4);
  ThreadsWorld world(4);
  world.run([&](Comm& c) {
    Mesh mesh(c, 2);
    Tensor a = Tensor::full(Shape{5}, float(1 << c.rank()));
    Tensor b = Tensor::full(Shape{7}, float(1 << c.rank()));
    // Both axes and the world in flight at once.
    sync_wait(when_all(mesh.mp_comm().all_reduce(a), mesh.dp_comm().all_reduce(b), c.barrier()));
    mp_sum[size_t(c.rank())] = a.values<float>();
    dp_sum[size_t(c.rank())] = b.values<float>();
    ranks[size_t(c.rank())] = {mesh.dp_rank(), mesh.mp_rank(), mesh.dp_comm().rank(),
                               mesh.mp_comm().rank(), mesh.mp_comm().world_rank(1)};
  });
  const float mp_expect[] = {1 + 2, 1 + 2, 4 + 8, 4 + 8},
              dp_expect[] = {1 + 4, 2 + 8, 1 + 4, 2 + 8};
  for (int r = 0; r < 4; ++r) {
    CHECK(mp_sum[size_t(r)] == std::vector<float>(5, mp_expect[r]));
    CHECK(dp_sum[size_t(r)] == std::vector<float>(7, dp_expect[r]));
    CHECK(ranks[size_t(r)] == std::vector<int>{r / 2, r % 2, r / 2, r % 2, (r / 2) * 2 + 1});
  }
}

namespace {

// One stream of the interleaving test: a rank issues `ops` collectives on one
// communicator, chosen from a seed every rank shares, with its own random
// delays in between. Mismatches found are appended to `errors`.
struct Stream {
  Comm& comm;
  uint64_t seed;             // the same on every rank
  std::mt19937& jitter_rng;  // this rank's own
  sched::ComputeExecutor& exec;
  std::vector<std::string>& errors;

  Task<void> jitter() {
    const unsigned kind = jitter_rng() % 4, us = jitter_rng() % 200;
    if (kind == 1) {
      for (unsigned k = 0; k <= us % 3; ++k) co_await sched::yield();
    } else if (kind == 2) {
      co_await exec.run([us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
    } else if (kind == 3) {
      std::this_thread::sleep_for(std::chrono::microseconds(us / 4));  // blocks the whole rank
    }
  }
  Task<void> delayed(Task<void> t) {
    co_await jitter();
    co_await std::move(t);
  }
  void expect(bool ok, uint64_t s, const char* what) {
    if (!ok)
      errors.push_back(fmt::format("rank {} op {} ({}): wrong result", comm.rank(), s, what));
  }

  // Whether t holds the pattern summed over ranks, divided by `div`.
  bool reduced(const Tensor& t, uint64_t s, int div) const {
    for (int64_t i = 0; i < t.numel(); ++i) {
      float sum = 0;
      for (int k = 0; k < comm.size(); ++k) sum += pattern(s, k, i);
      if (t.data<float>()[i] != sum / float(div)) return false;
    }
    return true;
  }

  Task<void> one(uint64_t s) {
    const int n = comm.size(), g = comm.rank();
    const int64_t m = int64_t(s % 37) + 1;
    Tensor t = pattern_tensor(s, g, Shape{m, 3});
    bool ok = true;
    switch (s % 6) {
      case 0: {  // two all-reduces started in random order: paired by call order
        Tensor u = pattern_tensor(s + 1, g, Shape{m + 1});
        co_await when_all(delayed(comm.all_reduce(t)), delayed(comm.all_reduce(u, ReduceOp::mean)));
        ok = reduced(t, s, 1) && reduced(u, s + 1, n);
        break;
      }
      case 1:
        co_await comm.all_reduce(t);
        ok = reduced(t, s, 1);
        break;
      case 2: {
        const int root = int(s % uint64_t(n));
        co_await comm.broadcast(t, root);
        ok = t.values<float>() == pattern_tensor(s, root, t.shape()).values<float>();
        break;
      }
      case 3: {
        Tensor all = Tensor::empty(Shape{n * m, 3});
        co_await comm.all_gather(t, all);
        for (int k = 0; k < n; ++k)
          ok &= all.slice0(k * m, (k + 1) * m).values<float>() ==
                pattern_tensor(s, k, t.shape()).values<float>();
        break;
      }
      case 4: {
        Tensor in = pattern_tensor(s, g, Shape{n * m, 3}), out = Tensor::empty(Shape{m, 3});
        co_await comm.reduce_scatter(in, out);
        for (int64_t i = 0; i < out.numel(); ++i) {
          float sum = 0;
          for (int k = 0; k < n; ++k) sum += pattern(s, k, g * out.numel() + i);
          ok &= out.data<float>()[i] == sum;
        }
        break;
      }
      default:
        co_await comm.barrier();
    }
    expect(ok, s, "collective");
  }

  Task<void> run(int ops) {
    for (int i = 0; i < ops; ++i) {
      co_await jitter();
      co_await one(seed * 1000 + uint64_t(i));
    }
  }
};

}  // namespace

TEST_CASE("random interleavings on several subgroups: no deadlock, no reordering", "[comm]") {
  constexpr int n = 4, rounds = 40, ops = 12;
  sched::ComputeExecutor exec;
  std::vector<std::vector<std::string>> errors(n);
  std::vector<int> completed(n, 0);
  ThreadsWorld world(n, {.timeout = 20s});  // a deadlock fails the test instead of hanging it
  world.run([&](Comm& c) {
    const int r = c.rank();
    Mesh mesh(c, 2);
    std::unique_ptr<Comm> world2 = c.subgroup(std::vector<int>{0, 1, 2, 3});
    std::mt19937 rng(1234u + unsigned(r));
    Comm* comms[] = {&c, &mesh.mp_comm(), &mesh.dp_comm(), world2.get()};
    for (int round = 0; round < rounds; ++round) {
      std::vector<Task<void>> streams;
      std::vector<Stream> state;
      state.reserve(4);
      for (int s = 0; s < 4; ++s) {
        state.push_back({*comms[s], uint64_t(round * 4 + s), rng, exec, errors[size_t(r)]});
        streams.push_back(state.back().run(ops));
      }
      sync_wait(when_all(std::move(streams)));
      ++completed[size_t(r)];
    }
  });
  for (int r = 0; r < n; ++r) {
    CHECK(completed[size_t(r)] == rounds);
    CHECK(errors[size_t(r)] == std::vector<std::string>{});
  }
}

TEST_CASE("mismatched collectives fail on every rank, naming both calls", "[comm]") {
  std::vector<std::string> msg(2);
  ThreadsWorld world(2);
  const auto body = [&](Comm& c) {
    Tensor t = Tensor::zeros(Shape{4});
    try {
      if (c.rank() == 0) sync_wait(c.all_reduce(t));
      if (c.rank() == 1) sync_wait(c.broadcast(t, 0));
    } catch (const Error& e) {
      msg[size_t(c.rank())] = e.what();
    }
  };
  CHECK_THROWS_WITH(world.run(body), Contains("collective mismatch on group [0, 1] at call #0"));
  for (const std::string& m : msg) {
    CHECK_THAT(m, Contains("all_reduce(sum, f32[4])") && Contains("broadcast(f32[4], root 0)"));
    CHECK_THAT(m, Contains("rank 0 called") && Contains("rank 1 called"));
  }
}

TEST_CASE("a collective that waits too long names the rank that never came", "[comm]") {
  std::string msg;
  std::atomic<bool> released{false};
  ThreadsWorld world(3, {.timeout = 200ms});
  const auto start = std::chrono::steady_clock::now();
  world.run([&](Comm& c) {
    if (c.rank() == 2) {  // alive but never calls: only the timeout can end the wait
      for (int i = 0; i < 10000 && !released; ++i) std::this_thread::sleep_for(1ms);
      return;
    }
    Tensor t = Tensor::zeros(Shape{4});
    try {
      sync_wait(c.all_reduce(t));
    } catch (const Error& e) {
      if (c.rank() == 0) msg = e.what();
    }
    released = true;
  });
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_THAT(msg, Contains("all_reduce(sum, f32[4]) #0 on group [0, 1, 2] failed on rank 0"));
  CHECK_THAT(msg, Contains("timed out after 0.2 s: rank(s) 2 never arrived"));
  CHECK(secs >= 0.19);
  CHECK(secs < 8);

  std::string recv_msg;
  std::atomic<bool> failed{false};
  ThreadsWorld p2p(2, {.timeout = 100ms});
  p2p.run([&](Comm& c) {
    Tensor t = Tensor::zeros(Shape{2});
    if (c.rank() == 0) {
      try {
        sync_wait(c.recv(t, 1, 5));
      } catch (const Error& e) {
        recv_msg = e.what();
      }
      failed = true;
    } else {
      for (int i = 0; i < 10000 && !failed; ++i) std::this_thread::sleep_for(1ms);
    }
  });
  CHECK_THAT(recv_msg, Contains("recv(f32[2] from rank 1, tag 5)") &&
                           Contains("timed out after 0.1 s: rank 1 never sent it"));
}

TEST_CASE("a dead or departed peer ends the others' waits with its name", "[comm]") {
  std::vector<std::string> msg(4);
  ThreadsWorld world(4, {.timeout = 60s});
  const auto start = std::chrono::steady_clock::now();
  const auto body = [&](Comm& c) {
    if (c.rank() == 2) {
      std::this_thread::sleep_for(30ms);  // the others are already waiting
      throw std::runtime_error("out of memory in layer 7");
    }
    Tensor t = Tensor::zeros(Shape{8});
    try {
      sync_wait(c.all_reduce(t));
    } catch (const Error& e) {
      msg[size_t(c.rank())] = e.what();
      throw;
    }
  };
  CHECK_THROWS_WITH(world.run(body), "rank 2 failed: out of memory in layer 7");
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // not the 60 s timeout
  for (int r : {0, 1, 3}) CHECK_THAT(msg[size_t(r)], Contains("rank 2 failed: out of memory"));
  // A failed world stays failed.
  CHECK_THROWS_WITH(world.run([](Comm& c) { sync_wait(c.barrier()); }), Contains("rank 2 failed"));

  std::vector<std::string> left(2);
  ThreadsWorld early(2, {.timeout = 60s});
  early.run([&](Comm& c) {
    if (c.rank() == 1) return;  // done: never joins rank 0's calls
    Tensor t = Tensor::zeros(Shape{2});
    try {
      sync_wait(c.all_reduce(t));
    } catch (const Error& e) {
      left[0] = e.what();
    }
    try {
      sync_wait(c.recv(t, 1));
    } catch (const Error& e) {
      left[1] = e.what();
    }
  });
  CHECK_THAT(left[0], Contains("rank 1 exited before joining it"));
  CHECK_THAT(left[1], Contains("rank 1 exited without sending it"));
}

// Collectives left in flight while a rank computes (ZeRO's parameter
// broadcasts, train/param_share.hpp): every rank roots one broadcast and
// waits first for the one the next rank roots. A threads broadcast ends only
// when its root has moved past its second rendezvous, which needs the root's
// thread; waiting for one task of a Background also runs the others'
// continuations, so the waits do not deadlock.
TEST_CASE("Background: in-flight broadcasts, waited for out of order, all complete", "[comm]") {
  constexpr int n = 3;
  std::vector<std::vector<std::vector<float>>> got(n);
  std::vector<std::string> error(n);
  ThreadsWorld world(n, {.timeout = 20s});
  world.run([&](Comm& c) {
    const int r = c.rank();
    std::vector<Tensor> t;
    for (int root = 0; root < n; ++root) t.push_back(pattern_tensor(7, r, Shape{64}));
    sched::Background bg;
    std::vector<size_t> task;
    for (int root = 0; root < n; ++root)
      task.push_back(bg.start(c.broadcast(t[size_t(root)], root)));
    for (int k = 1; k <= n; ++k) bg.wait(task[size_t((r + k) % n)]);  // the next rank's first
    for (const Tensor& x : t) got[size_t(r)].push_back(x.values<float>());
    // A failed task rethrows at its wait: a broadcast from a root out of range.
    Tensor bad = Tensor::zeros(Shape{1});
    try {
      const size_t b = bg.start(c.broadcast(bad, n));
      bg.wait(b);
    } catch (const Error& e) {
      error[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    for (int root = 0; root < n; ++root)
      CHECK(got[size_t(r)][size_t(root)] == pattern_tensor(7, root, Shape{64}).values<float>());
    CHECK_THAT(error[size_t(r)], Contains("root 3 is not a rank"));
  }
}

// What a backend that enqueues as its calls start (NCCL) relies on: started
// in any order, the calls go in call order; a call dropped unstarted, handed
// back early (passed to another transport) or failing holds up nobody.
namespace {
Task<void> enqueue_in_turn(Ticket ticket, int call, std::vector<int>* went, bool fail = false) {
  Ticket mine = std::move(ticket);
  co_await mine.wait();
  if (fail) throw Error(fmt::format("call {} failed", call));  // `mine` goes back as it unwinds
  went->push_back(call);
  mine.give_back();
}
}  // namespace

TEST_CASE("CallOrder: calls go in call order whatever order their tasks start in", "[comm]") {
  auto order = std::make_shared<CallOrder>();
  std::vector<int> went;
  std::vector<Task<void>> tasks;
  for (int k = 0; k < 6; ++k) tasks.push_back(enqueue_in_turn(Ticket(order, k), k, &went));
  std::vector<Task<void>> reversed;
  for (int k = 5; k >= 0; --k) reversed.push_back(std::move(tasks[size_t(k)]));
  sync_wait(when_all(std::move(reversed)));
  CHECK(went == std::vector<int>{0, 1, 2, 3, 4, 5});

  // Calls 6..10: 7 is dropped unstarted, 8 goes elsewhere (handed back at
  // once), 9 fails; 10, started first, still goes, after 6.
  went.clear();
  auto c6 = enqueue_in_turn(Ticket(order, 6), 6, &went);
  { auto dropped = enqueue_in_turn(Ticket(order, 7), 7, &went); }
  order->finish(8);
  auto c9 = enqueue_in_turn(Ticket(order, 9), 9, &went, true);
  auto c10 = enqueue_in_turn(Ticket(order, 10), 10, &went);
  std::vector<Task<void>> rest;
  rest.push_back(std::move(c10));
  rest.push_back(std::move(c9));
  rest.push_back(std::move(c6));
  CHECK_THROWS_WITH(sync_wait(when_all(std::move(rest))), Contains("call 9 failed"));
  CHECK(went == std::vector<int>{6, 10});
}

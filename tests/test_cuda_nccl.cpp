// The NCCL communicator on a GPU ([nccl], its own Meson test): it skips (77)
// without a GPU or without libnccl. One rank exercises every path of the
// plumbing — the streams and events, the poller, the f32 copies of bf16,
// NCCL's in-place forms and the copies around other overlaps, host tensors
// through the host world, tasks started out of call order. Two ranks (threads,
// one GPU each) need two GPUs: NCCL refuses two ranks on one device.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "redco/comm/nccl_api.hpp"
#include "redco/comm/nccl_comm.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/task.hpp"
#include "redco/sched/when_all.hpp"

namespace redco {
namespace {

using namespace cuda_test;
using comm::ReduceOp;
using sched::sync_wait;

void require_nccl() {
  REQUIRE_GPU();
  std::string why;
  if (!comm::nccl_api(&why)) test::skip("NCCL cannot be opened: " + why);
}

// The NCCL communicator of a one-rank threads world on GPU 0.
std::unique_ptr<comm::Comm> one_rank(comm::ThreadsWorld& world) {
  const int members[] = {0};
  return comm::connect_nccl(world.comm(0).subgroup(members), kGpu);
}

std::vector<float> on_host(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

TEST_CASE("NCCL, one rank: every collective, in place and not, f32 and bf16", "[nccl]") {
  require_nccl();
  comm::ThreadsWorld world(1);
  auto c = one_rank(world);
  REQUIRE(c->size() == 1);
  const Tensor x = rnd({6, 5}, 1);
  // all_reduce: one rank's sum and mean are its values (f32 exactly; bf16
  // through its f32 copy, so exactly the bf16 values too).
  Tensor s = dev(x);
  sync_wait(c->all_reduce(s, ReduceOp::sum));
  same(s, x);
  Tensor m = dev(x).to(DType::bf16);
  sync_wait(c->all_reduce(m, ReduceOp::mean));
  CHECK(on_host(m) == x.to(DType::bf16).to_vector());
  // reduce_scatter: into a separate output, and in place (the output at this rank's rows).
  Tensor out = Tensor::zeros({6, 5}, DType::f32, kGpu);
  sync_wait(c->reduce_scatter(dev(x), out));
  same(out, x);
  Tensor in = dev(x);
  Tensor own = in.slice0(0, 6);
  sync_wait(c->reduce_scatter(in, own));
  same(own, x);
  // all_gather: separate, in place, and as bytes (an integer tensor).
  Tensor gathered = Tensor::zeros({6, 5}, DType::f32, kGpu);
  sync_wait(c->all_gather(dev(x), gathered));
  same(gathered, x);
  Tensor whole = dev(x);
  Tensor rows = whole.slice0(0, 6);
  sync_wait(c->all_gather(rows, whole));
  same(whole, x);
  const Tensor ids = Tensor::from<int64_t>(std::vector<int64_t>{3, -1, 7}, {3});
  Tensor ids_out = Tensor::zeros({3}, DType::i64, kGpu);
  sync_wait(c->all_gather(ids.to(kGpu), ids_out));
  CHECK(ids_out.values<int64_t>() == ids.values<int64_t>());
  // Stream order: an input the compute stream is still producing when the
  // collective is called (40 passes over 64 MiB), reduced into a separate
  // NaN-filled output: NCCL must wait for the last pass.
  Tensor big = Tensor::zeros({int64_t(1) << 24}, DType::f32, kGpu);
  for (int i = 0; i < 40; ++i) big = gpu().binary_scalar(BinaryOp::add, big, 0.5f);
  Tensor sums = Tensor::empty({int64_t(1) << 24}, DType::f32, kGpu);
  sums.fill(NAN);
  sync_wait(c->reduce_scatter(big, sums));
  const std::vector<float> got = on_host(sums);
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 20.f; }));
  // broadcast from the only root.
  Tensor b = dev(x);
  sync_wait(c->broadcast(b, 0));
  same(b, x);
  sync_wait(c->barrier());
}

TEST_CASE("NCCL, one rank: host tensors go through the host world; misuse is named", "[nccl]") {
  require_nccl();
  comm::ThreadsWorld world(1);
  auto c = one_rank(world);
  Tensor h = Tensor::from({1.f, 2.f, 3.f}, {3});
  sync_wait(c->all_reduce(h, ReduceOp::sum));
  CHECK(h.to_vector() == std::vector<float>{1.f, 2.f, 3.f});
  // A GPU input with a host output is refused with both devices named...
  Tensor cpu_out = Tensor::zeros({3}, DType::f32);
  CHECK_THROWS_WITH(sync_wait(c->all_gather(h.to(kGpu), cpu_out)),
                    Catch::Contains("all_gather") && Catch::Contains("cpu"));
  // ... a reduction of integers too; and neither blocks the next call.
  Tensor ints = Tensor::zeros({3}, DType::i64, kGpu);
  CHECK_THROWS_WITH(sync_wait(c->all_reduce(ints)), Catch::Contains("floating"));
  Tensor g = dev(h);
  sync_wait(c->all_reduce(g));
  same(g, h);
}

TEST_CASE("NCCL, one rank: tasks started against call order, or dropped, block nothing", "[nccl]") {
  require_nccl();
  comm::ThreadsWorld world(1);
  auto c = one_rank(world);
  const Tensor x = rnd({1000}, 2), y = rnd({77}, 3);
  Tensor a = dev(x), b = dev(y);
  auto first = c->all_reduce(a, ReduceOp::sum);  // call order: a, then (dropped), then b
  { auto dropped = c->all_reduce(a, ReduceOp::sum); }
  auto third = c->all_reduce(b, ReduceOp::mean);
  // when_all starts them in its own order; the later call waits for its turn.
  sync_wait(sched::when_all(std::move(third), std::move(first)));
  same(a, x);
  same(b, y);
  Tensor d = dev(y);
  sync_wait(c->broadcast(d, 0));
  same(d, y);
}

TEST_CASE("NCCL, two ranks on two GPUs: sums, means, scatter, gather, subgroups", "[nccl]") {
  require_nccl();
  if (cuda::device_count() < 2) test::skip("two ranks need two GPUs (NCCL: one rank a device)");
  // Catch2's assertions are not thread-safe: the ranks note what failed, the
  // test's thread checks.
  std::vector<std::string> failed[2];
  comm::ThreadsWorld world(2);
  world.run([&](comm::Comm& host) {
    const int r = host.rank(), both[] = {0, 1};
    auto expect = [&](bool ok, const char* what) {
      if (!ok) failed[r].push_back(what);
    };
    const Device gpu = Device::cuda(r);
    auto c = comm::connect_nccl(host.subgroup(both), gpu);
    const Tensor x0 = rnd({4, 3}, 10), x1 = rnd({4, 3}, 11), mine_x = r == 0 ? x0 : x1;
    std::vector<float> sum = x0.to_vector(), mean = sum;
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += x1.to_vector()[i], mean[i] = sum[i] / 2;  // (a + b) / 2 as NCCL's average
    Tensor t = mine_x.to(gpu);
    sync_wait(c->all_reduce(t));
    expect(on_host(t) == sum, "all_reduce sum");
    Tensor u = mine_x.to(gpu);
    sync_wait(c->all_reduce(u, ReduceOp::mean));
    const std::vector<float> got = on_host(u);
    for (size_t i = 0; i < got.size(); ++i)
      expect(std::fabs(got[i] - mean[i]) <= 1e-6f * std::fabs(mean[i]) + 1e-7f, "mean");
    // bf16 through its f32 copy: the sum of the two bf16 values, rounded once.
    Tensor h = mine_x.to(DType::bf16).to(gpu);
    sync_wait(c->all_reduce(h));
    const std::vector<float> b0 = x0.to(DType::bf16).to_vector(),
                             b1 = x1.to(DType::bf16).to_vector();
    std::vector<float> bsum(b0.size());
    for (size_t i = 0; i < b0.size(); ++i) bsum[i] = b0[i] + b1[i];
    expect(on_host(h) == Tensor::from<float>(bsum, {4, 3}).to(DType::bf16).to_vector(), "bf16");
    // reduce_scatter: rank r keeps rows [2r, 2r + 2) of the sum.
    Tensor part = Tensor::zeros({2, 3}, DType::f32, gpu);
    sync_wait(c->reduce_scatter(mine_x.to(gpu), part));
    expect(on_host(part) == std::vector<float>(sum.begin() + 6 * r, sum.begin() + 6 * r + 6),
           "reduce_scatter");
    // all_gather in place, then into a separate output: each rank's rows, in rank order.
    std::vector<float> want = x0.to_vector(), w1 = x1.to_vector();
    want.insert(want.end(), w1.begin(), w1.end());
    Tensor all = Tensor::zeros({2, 4, 3}, DType::f32, gpu);
    Tensor mine = all[r];
    mine.copy_from(mine_x.to(gpu));
    sync_wait(c->all_gather(mine.view({1, 4, 3}), all));
    expect(on_host(all) == want, "all_gather in place");
    Tensor apart = Tensor::zeros({8, 3}, DType::f32, gpu);
    sync_wait(c->all_gather(mine_x.to(gpu), apart));
    expect(on_host(apart) == want, "all_gather");
    // broadcast from rank 1.
    Tensor b = mine_x.to(gpu);
    sync_wait(c->broadcast(b, 1));
    expect(on_host(b) == x1.to_vector(), "broadcast");
    // A subgroup of one: its own NCCL communicator.
    const int self[] = {r};
    auto alone = c->subgroup(self);
    Tensor v = x0.to(gpu);
    sync_wait(alone->all_reduce(v));
    expect(on_host(v) == x0.to_vector(), "subgroup");
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << "'s failed checks");
    CHECK(failed[r] == std::vector<std::string>{});
  }
}

}  // namespace
}  // namespace redco

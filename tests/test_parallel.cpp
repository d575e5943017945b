// Tensor and data parallelism on the threads backend: differentiable
// collectives, parameter shards, GPT-2 run tensor-parallel through nn::apply,
// and bucketed gradient averaging, each checked against the single-rank run.
// (Every other model kind runs tensor-parallel in test_tensor_parallel.cpp.)
// Catch2's assertions are not thread-safe, so ranks store what they computed
// and the checks run on the test's thread after ThreadsWorld::run returns.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/vision.hpp"
#include "redco/nn/parallel_ops.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;

namespace {

using test::max_abs_diff;

Tensor randn(const Shape& s, uint64_t stream) { return Tensor::normal(s, 7, stream, 0.f, 1.f); }

models::Gpt2Config tiny_gpt() {
  return {.vocab = 16, .context = 8, .dim = 16, .layers = 2, .heads = 4, .dropout = 0.f};
}

Tensor token_batch(int64_t rows, int64_t len, uint64_t stream) {
  std::vector<int64_t> ids(size_t(rows * len));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(philox_bits(3, stream, i) % 16);
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), Shape{rows, len});
}

}  // namespace

TEST_CASE("reduce_from_parallel sums forward and passes the gradient through", "[parallel]") {
  const Tensor w = randn({2, 3}, 9);
  std::vector<Tensor> out(2), grads(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const int r = comm.rank();
    Tensor x = randn({2, 3}, uint64_t(r)).set_requires_grad(true);
    Tensor y = nn::reduce_from_parallel(x, comm);
    grads[size_t(r)] = grad({sum(y * w)}, {x})[0];
    out[size_t(r)] = y.detach();
  });
  const Tensor expect = randn({2, 3}, 0) + randn({2, 3}, 1);
  for (int r = 0; r < 2; ++r) {
    CHECK(max_abs_diff(out[size_t(r)], expect) < 1e-6f);
    CHECK(max_abs_diff(grads[size_t(r)], w) == 0.f);
  }
}

TEST_CASE("copy_to_parallel is the identity whose gradient sums over ranks", "[parallel]") {
  const Tensor x0 = randn({3, 4}, 1);
  std::vector<Tensor> out(2), grads(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const int r = comm.rank();
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor y = nn::copy_to_parallel(x, comm);
    grads[size_t(r)] = grad({sum(tanh(y) * randn({3, 4}, 20 + uint64_t(r)))}, {x})[0];
    out[size_t(r)] = y.detach();
  });
  // One rank: the two ranks' losses added, differentiated at the shared x.
  Tensor x = x0.clone().set_requires_grad(true);
  const Tensor expect =
      grad({sum(tanh(x) * randn({3, 4}, 20)) + sum(tanh(x) * randn({3, 4}, 21))}, {x})[0];
  for (int r = 0; r < 2; ++r) {
    CHECK(max_abs_diff(out[size_t(r)], x0) == 0.f);
    CHECK(max_abs_diff(grads[size_t(r)], expect) < 1e-6f);
  }
}

TEST_CASE("gather_from_parallel concatenates and hands back each rank's slice", "[parallel]") {
  const Tensor w = randn({2, 6, 4}, 30);
  for (int dim : {0, 1, -1}) {
    const int axis = dim < 0 ? 2 : dim;
    Shape part = w.shape();
    part[axis] /= 2;
    std::vector<Tensor> out(2), grads(2), parts(2);
    comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
      const int r = comm.rank();
      parts[size_t(r)] = randn(part, 40 + uint64_t(r));
      Tensor x = parts[size_t(r)].clone().set_requires_grad(true);
      Tensor y = nn::gather_from_parallel(x, comm, dim);
      out[size_t(r)] = y.detach();
      grads[size_t(r)] = grad({sum(square(y) * w)}, {x})[0];
    });
    // One rank: the concatenation, differentiated piece by piece.
    Tensor a = parts[0].clone().set_requires_grad(true);
    Tensor b = parts[1].clone().set_requires_grad(true);
    const Tensor whole = concat({a, b}, axis);
    const TensorList g = grad({sum(square(whole) * w)}, {a, b});
    for (int r = 0; r < 2; ++r) {
      CHECK(max_abs_diff(out[size_t(r)], whole.detach()) == 0.f);
      CHECK(max_abs_diff(grads[size_t(r)], g[size_t(r)]) < 1e-6f);
    }
  }
}

TEST_CASE("a sharded initialisation equals the slice of the whole one", "[parallel]") {
  const auto model = models::gpt2(tiny_gpt());
  const auto entries = nn::param_entries(model);
  const ParamTree full = nn::init_params(model, 11);
  for (int n : {1, 2, 4}) {
    const auto plan = shard::resolve(model, n);
    std::vector<ParamTree> shards;
    for (int r = 0; r < n; ++r) {
      const ParamTree drawn = train::init_shard(entries, plan, 11, r, n);
      const ParamTree cut = train::shard_params(full, plan, r, n);
      REQUIRE(drawn.size() == full.size());
      for (const shard::ParamSplit& s : plan) {
        INFO(s.name << " shard " << r << " of " << n);
        CHECK(drawn.at(s.name).shape() == shard::shard_shape(s, n));
        CHECK(max_abs_diff(drawn.at(s.name), cut.at(s.name)) == 0.f);
      }
      shards.push_back(cut);
    }
    // The shards put back together along the split dim are the whole tensor.
    for (const shard::ParamSplit& s : plan) {
      if (s.split_dim < 0) continue;
      TensorList parts;
      for (const ParamTree& t : shards) parts.push_back(t.at(s.name));
      INFO(s.name);
      CHECK(max_abs_diff(concat(parts, s.split_dim), full.at(s.name)) == 0.f);
    }
  }
  // Both kinds of split occur: rows (q, fc1, wte) and columns (o, fc2).
  const auto plan = shard::resolve(model, 2);
  auto split_of = [&](const std::string& name) {
    for (const auto& s : plan)
      if (s.name == name) return s.split_dim;
    return -2;
  };
  CHECK(split_of("h.0.attn.q_proj.weight") == 0);
  CHECK(split_of("h.1.mlp.fc2.weight") == 1);
  CHECK(split_of("wte.weight") == 0);
  CHECK(split_of("h.0.ln_1.weight") == -1);
}

namespace {

struct LossAndGrads {
  float loss = 0.f;
  Tensor logits;
  ParamTree grads;
};

// GPT-2 on whole parameters, through the model DSL.
LossAndGrads reference_run(const Tensor& ids, const Tensor& labels) {
  const auto model = models::gpt2(tiny_gpt());
  LossAndGrads out;
  auto [loss, grads] = value_and_grad(
      [&](const ParamTree& p) {
        Tensor logits = nn::apply(model, p, ids);
        out.logits = logits.detach();
        return cross_entropy(logits, labels);
      },
      nn::init_params(model, 5));
  out.loss = loss.item();
  out.grads = std::move(grads);
  return out;
}

// The same on `mp` ranks from their shards, through the same nn::apply;
// gradients gathered to whole tensors. The loss reads the vocabulary-split
// logits as they are, or gathers them first.
std::vector<LossAndGrads> tensor_parallel_run(int mp, const Tensor& ids, const Tensor& labels,
                                              bool vocab_parallel_loss) {
  const auto model = models::gpt2(tiny_gpt());
  const auto plan = shard::resolve(model, mp);
  std::vector<LossAndGrads> out(static_cast<size_t>(mp));
  comm::ThreadsWorld(mp).run([&](comm::Comm& comm) {
    LossAndGrads& mine = out[size_t(comm.rank())];
    const ParamTree shard = train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), mp);
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) {
          nn::Ctx ctx{.train = true, .mp = &comm};
          const Tensor split = nn::apply(model, p, ids, ctx);
          const Tensor logits = nn::whole(split);
          mine.logits = logits.detach();
          return cross_entropy(vocab_parallel_loss ? split : logits, labels);
        },
        shard);
    mine.loss = loss.item();
    for (const shard::ParamSplit& s : plan)
      mine.grads.emplace(s.name, train::unshard(grads.at(s.name), s, comm));
  });
  return out;
}

void check_matches(const LossAndGrads& got, const LossAndGrads& want) {
  CHECK(std::abs(got.loss - want.loss) <= 1e-5f * std::abs(want.loss));
  CHECK(max_abs_diff(got.logits, want.logits) < 1e-5f);
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO(name);
    CHECK(max_abs_diff(got.grads.at(name), g) < 1e-5f);
  }
}

}  // namespace

TEST_CASE("tensor-parallel GPT-2 matches the single-rank model", "[parallel]") {
  const Tensor ids = token_batch(2, 8, 1), labels = token_batch(2, 8, 2);
  const LossAndGrads want = reference_run(ids, labels);
  REQUIRE(std::isfinite(want.loss));
  for (int mp : {1, 2, 4})
    for (bool vocab_loss : {false, true}) {
      INFO("mp " << mp << (vocab_loss ? ", vocab-parallel loss" : ", gathered logits"));
      for (const LossAndGrads& got : tensor_parallel_run(mp, ids, labels, vocab_loss))
        check_matches(got, want);
    }
}

TEST_CASE("vocab-parallel cross entropy skips ignored labels like cross_entropy", "[parallel]") {
  const Tensor logits = randn({3, 8}, 50);
  const std::vector<int64_t> label_values{5, -100, 1};
  const Tensor labels = Tensor::from<int64_t>(std::span<const int64_t>(label_values), Shape{3});
  Tensor whole = logits.clone().set_requires_grad(true);
  const Tensor want_loss = cross_entropy(whole, labels);
  const Tensor want_grad = grad({want_loss}, {whole})[0];
  std::vector<float> losses(2);
  std::vector<Tensor> grads(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const int r = comm.rank();
    Tensor mine = slice(logits, 1, 4 * r, 4 * r + 4).clone().set_requires_grad(true);
    const Tensor loss = train::vocab_parallel_cross_entropy(mine, labels, comm);
    losses[size_t(r)] = loss.item();
    grads[size_t(r)] = grad({loss}, {mine})[0];
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(losses[size_t(r)] == Approx(want_loss.item()).epsilon(1e-6));
    CHECK(max_abs_diff(grads[size_t(r)], slice(want_grad, 1, 4 * r, 4 * r + 4)) < 1e-6f);
  }
}

namespace {

struct TrainRun {
  std::vector<float> losses;  // the global batch's mean loss, per step
  ParamTree params;           // after the last step, whole
  size_t buckets = 0, early = 0;
};

// 10 SGD steps of the tiny GPT-2 on a dp x mp mesh of threads, every replica
// seeing its rows of the same global batches; what rank 0 saw.
TrainRun train_on_mesh(int dp, int mp) {
  const auto model = models::gpt2(tiny_gpt());
  const auto plan = shard::resolve(model, mp);
  TrainRun run;
  comm::ThreadsWorld(dp * mp).run([&](comm::Comm& world) {
    comm::Mesh mesh(world, mp);
    ParamTree params = train::init_shard(nn::param_entries(model), plan, 5, mesh.mp_rank(), mp);
    // A small bucket size, so gradients travel in several buckets.
    train::DataParallel data(mesh.dp_comm(), 4096);
    optim::Optimizer opt = optim::sgd(0.5f, {.momentum = 0.9f});
    std::vector<float> losses;
    for (uint64_t step = 0; step < 10; ++step) {
      // Two global batches in turn, so the loss falls as the model learns them.
      const Tensor ids = data.local_batch(token_batch(4, 8, 100 + step % 2));
      const Tensor labels = data.local_batch(token_batch(4, 8, 200 + step % 2));
      auto [loss, grads] = value_and_grad(
          [&](const ParamTree& p) {
            nn::Ctx ctx{.train = true, .mp = &mesh.mp_comm()};
            const ParamTree watched = data.watch(p, train::param_order(plan));
            return cross_entropy(nn::apply(model, watched, ids, ctx), labels);
          },
          params);
      data.finish(grads);
      opt.step(params, grads);
      Tensor global = loss.detach().clone();
      sched::sync_wait(mesh.dp_comm().all_reduce(global, comm::ReduceOp::mean));
      losses.push_back(global.item());
    }
    ParamTree whole;
    for (const shard::ParamSplit& s : plan)
      whole.emplace(s.name, train::unshard(params.at(s.name), s, mesh.mp_comm()));
    if (world.rank() == 0)
      run = {losses, std::move(whole), data.last_bucket_count(), data.last_early_launches()};
  });
  return run;
}

}  // namespace

TEST_CASE("dp x mp training gives the single-rank losses and parameters", "[parallel]") {
  const TrainRun want = train_on_mesh(1, 1);
  REQUIRE(want.losses.size() == 10);
  CHECK(want.losses.back() < want.losses.front());  // it does learn
  CHECK(want.buckets > 1);
  CHECK(want.early == want.buckets);  // every bucket was started by backward
  for (auto [dp, mp] : {std::pair{2, 1}, {1, 2}, {2, 2}}) {
    INFO("dp " << dp << " mp " << mp);
    const TrainRun got = train_on_mesh(dp, mp);
    for (size_t i = 0; i < want.losses.size(); ++i)
      CHECK(std::abs(got.losses[i] - want.losses[i]) <= 1e-5f * std::abs(want.losses[i]));
    for (const auto& [name, p] : want.params) {
      INFO(name);
      CHECK(max_abs_diff(got.params.at(name), p) <= 1e-5f);
    }
  }
}

TEST_CASE("DataParallel rejects a batch that does not split", "[parallel]") {
  std::vector<std::string> errors(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    train::DataParallel data(comm);
    try {
      data.local_batch(Tensor::zeros({3, 2}));
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) CHECK_THAT(e, Catch::Contains("multiple of 2"));
}

TEST_CASE("DataParallel::average means gradients over replicas, bucket by bucket", "[parallel]") {
  const std::vector<std::string> order{"a", "b", "c"};
  std::vector<ParamTree> out(2);
  std::vector<size_t> buckets(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const uint64_t r = uint64_t(comm.rank());
    ParamTree grads{
        {"a", randn({3, 2}, 60 + r)}, {"b", randn({5}, 70 + r)}, {"c", randn({2, 2}, 80 + r)}};
    train::DataParallel data(comm, 16);  // 16 bytes: "c" alone, then "b", then "a"
    data.average(grads, order);
    out[r] = grads;
    buckets[r] = data.last_bucket_count();
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(buckets[size_t(r)] == 3);
    CHECK(max_abs_diff(out[size_t(r)].at("a"), (randn({3, 2}, 60) + randn({3, 2}, 61)) * 0.5f) <
          1e-6f);
    CHECK(max_abs_diff(out[size_t(r)].at("b"), (randn({5}, 70) + randn({5}, 71)) * 0.5f) < 1e-6f);
    CHECK(max_abs_diff(out[size_t(r)].at("c"), (randn({2, 2}, 80) + randn({2, 2}, 81)) * 0.5f) <
          1e-6f);
  }
}

namespace {

// 10 SGD steps of a small CNN data-parallel over `dp` threads; rank 0's losses
// and final parameters.
TrainRun train_cnn(int dp) {
  const auto model =
      models::small_cnn({.channels = 1, .size = 8, .classes = 4, .conv1 = 4, .conv2 = 4});
  const auto order = train::param_order(shard::resolve(model, 1));
  TrainRun run;
  comm::ThreadsWorld(dp).run([&](comm::Comm& comm) {
    ParamTree params = nn::init_params(model, 9);
    train::DataParallel data(comm, 256);
    optim::Optimizer opt = optim::sgd(0.1f, {.momentum = 0.9f});
    std::vector<float> losses;
    for (uint64_t step = 0; step < 10; ++step) {
      const Tensor images = data.local_batch(randn({4, 1, 8, 8}, 300 + step % 2));
      std::vector<int64_t> classes(4);
      for (size_t i = 0; i < 4; ++i) classes[i] = int64_t(philox_bits(1, 400 + step % 2, i) % 4);
      const Tensor labels =
          data.local_batch(Tensor::from<int64_t>(std::span<const int64_t>(classes), Shape{4}));
      auto [loss, grads] = value_and_grad(
          [&](const ParamTree& p) {
            return cross_entropy(nn::apply(model, data.watch(p, order), images), labels);
          },
          params);
      data.finish(grads);
      opt.step(params, grads);
      Tensor global = loss.detach().clone();
      sched::sync_wait(comm.all_reduce(global, comm::ReduceOp::mean));
      losses.push_back(global.item());
    }
    if (comm.rank() == 0)
      run = {losses, params, data.last_bucket_count(), data.last_early_launches()};
  });
  return run;
}

}  // namespace

TEST_CASE("a data-parallel CNN gives the single-rank losses and parameters", "[parallel]") {
  const TrainRun want = train_cnn(1);
  CHECK(want.losses.back() < want.losses.front());
  CHECK(want.buckets > 1);
  for (int dp : {2, 4}) {
    INFO("dp " << dp);
    const TrainRun got = train_cnn(dp);
    CHECK(got.early == got.buckets);
    for (size_t i = 0; i < want.losses.size(); ++i)
      CHECK(std::abs(got.losses[i] - want.losses[i]) <= 1e-5f * std::abs(want.losses[i]));
    for (const auto& [name, p] : want.params) {
      INFO(name);
      CHECK(max_abs_diff(got.params.at(name), p) <= 1e-5f);
    }
  }
}

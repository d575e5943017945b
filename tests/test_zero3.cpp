// ZeRO-3 (Deployer zero_stage 3: parameters partitioned too, gathered as the
// forward and backward read them, train/param_gather.hpp): on dp x mp meshes
// of threads it trains bit for bit as ZeRO-2 (the same gradients reach the
// same owners; the optimizer steps the same parts), also with recomputation
// and with a tied embedding split among the owners, and as the plain run
// where ZeRO-2 does; each rank keeps about 1/dp of the parameters;
// evaluation gathers them too;
// checkpoints stay whole and move between ZeRO-3 and plain runs.
#include <catch2/catch.hpp>
#include <cstring>

#include "redco/train/param_gather.hpp"
#include "tree_checks.hpp"
#include "zero_fit.hpp"

using namespace redco;
using namespace zero_fit;
using test::check_bitwise;
using test::check_close;

namespace {

double rank_value(const io::Json& m, int rank, const std::string& key) {
  return m.at("rank" + std::to_string(rank) + "." + key).as_double();
}

}  // namespace

TEST_CASE("ZeRO-3 trains as ZeRO-2 bit for bit, with and without recomputation", "[zero3]") {
  for (const auto& [model, tied] : {std::pair{kGpt, false}, std::pair{kTied, true}})
    for (const auto& [world, mp] : {std::pair{2, 1}, std::pair{4, 2}, std::pair{4, 1}})
      for (const bool recompute : {false, true}) {
        INFO((tied ? "tied embedding 40%" : "small vocabulary")
             << ": dp " << world / mp << ", mp " << mp << (recompute ? ", recompute" : ""));
        const Run base{.world = world, .mp = mp, .model = model, .recompute = recompute};
        Run two = base, three = base;
        two.zero = 2, three.zero = 3;
        const Result z2 = fit(two), z3 = fit(three);
        REQUIRE(z3.losses.size() == 10);
        CHECK(z3.losses == z2.losses);
        check_bitwise(z3.params, z2.params);
        // The optimizer state is partitioned as under ZeRO-2.
        CHECK(z3.state_bytes == z2.state_bytes);
      }
}

TEST_CASE("ZeRO-3 equals the plain run where ZeRO-2 does", "[zero3]") {
  const Result plain = fit({.world = 2});
  const Result z2 = fit({.world = 2, .zero = 2});
  const Result z3 = fit({.world = 2, .zero = 3});
  CHECK(z2.losses == plain.losses);
  CHECK(z3.losses == z2.losses);
  CHECK(z3.losses == plain.losses);
  check_bitwise(z2.params, plain.params);
  check_bitwise(z3.params, plain.params);
}

TEST_CASE("ZeRO-3 keeps 1/dp of the parameters per rank", "[zero3]") {
  // The allocator's peak is the process's, shared by these thread ranks: the
  // peak per rank is measured with one process per rank by
  // tools/bench/bench_memory_model.sh.
  for (const auto& model : {kGpt, kTied}) {
    const double params_mib =
        double(nn::count_parameters(nn::init_params(models::gpt2(model), 0))) * 4 / 1048576.0;
    TempDir dir;
    fit({.world = 4, .zero = 3, .max_steps = 2, .workdir = dir.path, .model = model});
    const io::Json m = memory_line(dir.path);
    REQUIRE(m.contains("rank3.params_mib"));
    double params = 0, grads = 0;
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      const double p = rank_value(m, r, "params_mib");
      CHECK(p < 1.25 * params_mib / 4);
      params += p;
      grads += rank_value(m, r, "grads_mib");
    }
    CHECK(params == Approx(params_mib).epsilon(1e-6));  // each parameter once, at its owner(s)
    CHECK(grads == Approx(params_mib).epsilon(1e-4));
  }
}

TEST_CASE("ZeRO-3 holds no whole copy of the model once a checkpoint is written", "[zero3]") {
  // Checkpoints hold whole tensors, so ZeRO-3 gathers the model to write one;
  // the copy is let go after it. Kept, it is a whole model on each of the 4
  // replicas and leaves ZeRO-3 holding more than ZeRO-2 after training (3.6
  // models more than without it, measured); let go, ZeRO-3 holds about 2
  // models less than ZeRO-2 here (the parameters' 3/4 that are not its
  // parts, on 4 ranks, less what else the two stages keep differently).
  const double params = double(nn::count_parameters(nn::init_params(models::gpt2(kGpt), 0))) * 4;
  TempDir z2_dir, z3_dir;
  const Run base{.world = 4, .max_steps = 4, .save_every = 2, .save_at_end = true};
  Run z2 = base, z3 = base;
  z2.zero = 2, z2.workdir = z2_dir.path;
  z3.zero = 3, z3.workdir = z3_dir.path;
  const Result two = fit(z2), three = fit(z3);
  REQUIRE(fs::exists(z3_dir.path / "ckpt" / "step-000004"));
  INFO("bytes in use after fit: ZeRO-2 " << two.bytes_after_fit << ", ZeRO-3 "
                                         << three.bytes_after_fit << "; the model " << params);
  CHECK(double(two.bytes_after_fit) - double(three.bytes_after_fit) > params);
}

TEST_CASE("ZeRO-3 evaluation gathers the parameters as it reads them", "[zero3]") {
  const Result plain = fit({.world = 2, .max_steps = 3, .eval = true});
  const Result z3 = fit({.world = 2, .zero = 3, .max_steps = 3, .eval = true});
  REQUIRE(plain.eval_loss > 0);
  CHECK(z3.eval_loss == plain.eval_loss);
}

TEST_CASE("a checkpoint saved under ZeRO-3 resumes without it, and the other way", "[zero3]") {
  for (const auto& model : {kGpt, kTied}) {
    const Result straight = fit({.world = 2, .max_steps = 10, .model = model});
    for (const auto& [first, then] : {std::pair{3, 0}, std::pair{0, 3}, std::pair{3, 3}}) {
      INFO("first half with zero_stage " << first << ", second half with " << then);
      const Result resumed = save_then_resume(first, then, model);
      REQUIRE(resumed.losses.size() == 5);
      // ZeRO-2's and 3's norm of a split embedding is summed in another order.
      check_close(resumed.losses, {straight.losses.begin() + 5, straight.losses.end()}, 1e-6);
      check_close(resumed.params, straight.params, 1e-5);
    }
  }
  SECTION("and on another mesh: 2 model shards x 2 replicas under ZeRO-3") {
    const Result straight = fit({.world = 2, .max_steps = 10});
    const Result resumed = save_then_resume(3, 3, kGpt, 4, 2);
    check_close(resumed.losses, {straight.losses.begin() + 5, straight.losses.end()}, 1e-5);
  }
}

TEST_CASE("ZeRO-3 gathers a parameter from its owners into one tensor", "[zero3]") {
  const auto gpt = models::gpt2(kTied);
  const std::vector<shard::ParamSplit> plan = shard::resolve(gpt, 1);
  const ParamTree whole = nn::init_params(gpt, 7);
  constexpr int kWorld = 4;
  std::vector<ParamTree> parts(kWorld), gathered(kWorld);
  comm::ThreadsWorld w(kWorld);
  w.run([&](comm::Comm& c) {  // no Catch assertion on these threads
    train::ZeroPartition zero(plan, kWorld, c.rank());
    parts[size_t(c.rank())] = zero.keep_parts(whole);
    for (const auto& [name, part] : parts[size_t(c.rank())])
      gathered[size_t(c.rank())].emplace(name, train::ParamGather::gather(zero, name, part, c));
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const train::ZeroPartition zero(plan, kWorld, r);
    for (const auto& [name, t] : whole) {
      INFO(name);
      const int64_t mine = zero.owns(name) ? zero.part(name, t, r).numel() : 0;
      CHECK(parts[size_t(r)].at(name).numel() == mine);
    }
    check_bitwise(gathered[size_t(r)], whole);
  }
}

TEST_CASE("Trainer::params() under ZeRO-3 is the whole of this rank's parameters", "[zero3]") {
  const std::vector<Window> data = windows();
  const auto gpt = models::gpt2(kTied);
  std::vector<ParamTree> got(2), whole(2);
  comm::ThreadsWorld w(2);
  w.run([&](comm::Comm& c) {
    train::Deployer d({.seed = 3, .quiet = true, .world = &c, .zero_stage = 3});
    train::Trainer trainer(
        d, gpt, collate,
        [](auto& model, const LmBatch& b, train::Rng) {
          return cross_entropy(model(b.inputs), b.targets);
        },
        optim::adamw(optim::constant(1e-2f)));
    trainer.fit(data,
                {.global_batch_size = 8, .n_epochs = 1, .save_at_end = false, .max_steps = 2});
    got[size_t(c.rank())] = trainer.params();  // gathered: collective
    whole[size_t(c.rank())] = trainer.whole_params();
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    check_bitwise(got[size_t(r)], whole[size_t(r)]);
  }
}

namespace {

// Calls of the profile's un-prefetched ZeRO-3 gather ("zero3.gather", any
// path) while `body` runs.
template <typename F>
int64_t gathers_not_ahead(F&& body) {
  profile::enable(true);
  profile::reset();
  body();
  int64_t calls = 0;
  for (const profile::Entry& e : profile::report())
    if (e.path.ends_with("zero3.gather")) calls += e.calls;
  profile::enable(false);
  return calls;
}

}  // namespace

TEST_CASE("a shape read under ZeRO-3 gathers nothing; a value read gathers", "[zero3]") {
  const auto gpt = models::gpt2(kTied);
  const std::vector<shard::ParamSplit> plan = shard::resolve(gpt, 1);
  const ParamTree whole = nn::init_params(gpt, 7);
  const std::string name = "h.0.attn.q_proj.weight";
  std::vector<Shape> shapes(2);
  // Each rank reads `name` through a ParamGather over its parts (the model's
  // tree lacks it): its shape only, or its values.
  auto read = [&](bool values) {
    return gathers_not_ahead([&] {
      comm::ThreadsWorld w(2);
      w.run([&](comm::Comm& c) {
        train::ZeroPartition zero(plan, 2, c.rank());
        train::ParamGather gather(zero, zero.keep_parts(whole), {}, c);
        const ParamTree empty;
        const nn::Params p(empty);
        if (values) (void)p[name];
        shapes[size_t(c.rank())] = p.shape(name);
      });
    });
  };
  CHECK(read(false) == 0);
  CHECK(shapes[0] == whole.at(name).shape());
  CHECK(shapes[1] == whole.at(name).shape());
  CHECK(read(true) == 2);  // one on each rank
}

TEST_CASE("from its second step ZeRO-3 sets every gather going before its read", "[zero3]") {
  // The first step reads in forward order and records the reads (q, k, v
  // weights before their biases; the tied table twice); later steps follow
  // the record, so each gather is on its way before the model asks.
  auto misses = [](int64_t steps) {
    return gathers_not_ahead([&] { fit({.world = 2, .zero = 3, .max_steps = steps}); });
  };
  const int64_t first = misses(1);
  CHECK(first > 0);
  CHECK(misses(3) == first);
}

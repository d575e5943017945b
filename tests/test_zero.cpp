// ZeRO stages 1 and 2 (Deployer zero_stage): on dp x mp meshes of threads
// the trained parameters and losses equal those of the same mesh without
// ZeRO (bit for bit: the owners' updates are the plain optimizer's, except
// ZeRO-2 with model shards or split parameters, within 1e-6: its gradient
// norm is summed in another order), each rank's optimizer state falls to
// about 1/dp, also when one parameter is 40% of the model (split among the
// owners), and checkpoints move between runs with and without ZeRO.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "redco/comm/threads_comm.hpp"
#include "redco/io/json.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/nn/param_read_hook.hpp"
#include "redco/train/memory_account.hpp"
#include "redco/train/trainer.hpp"
#include "tree_checks.hpp"
#include "zero_fit.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

using namespace zero_fit;

using test::check_bitwise;
using test::check_close;

// A key projection's bias has a gradient that is rounding noise (softmax
// does not change when every score of a row moves alike), which Adam scales
// up to steps of ~lr: runs that differ by rounding differ there by ~1e-6 of
// the weights' scale, not of the bias's own.
ParamTree without_key_bias(const ParamTree& t) {
  ParamTree out;
  for (const auto& [name, v] : t)
    if (!name.ends_with("k_proj.bias")) out.emplace(name, v);
  return out;
}

// Rank k of model shard m owns at most `slack`/dp of shard m's optimizer
// state; together the replicas hold it exactly once.
void check_state_shares(const Result& zero, const Result& plain, int dp, int mp, double slack) {
  for (int m = 0; m < mp; ++m) {
    uint64_t sum = 0;
    for (int k = 0; k < dp; ++k) {
      const uint64_t b = zero.state_bytes[size_t(k * mp + m)];
      const uint64_t whole = plain.state_bytes[size_t(k * mp + m)];
      INFO("replica " << k << ": " << b << " of " << whole << " bytes");
      CHECK(double(b) < slack * double(whole) / dp);
      sum += b;
    }
    // "step" (8 bytes) is kept by every replica.
    CHECK(sum == plain.state_bytes[size_t(m)] + uint64_t(dp - 1) * 8);
  }
}

}  // namespace

TEST_CASE("ZeRO-1 and 2 train as the plain run and keep 1/dp of the optimizer state", "[zero]") {
  for (const auto& [model, tied] : {std::pair{kGpt, false}, std::pair{kTied, true}})
    for (const auto& [world, mp] : {std::pair{2, 1}, std::pair{4, 2}, std::pair{4, 1}})
      for (const int stage : {1, 2}) {
        const int dp = world / mp;
        INFO((tied ? "tied embedding 40%" : "small vocabulary")
             << ": dp " << dp << ", mp " << mp << ", stage " << stage);
        if (tied) CHECK(splits_some(model, dp, mp));
        const Result plain = fit({.world = world, .mp = mp, .model = model});
        const Result zero = fit({.world = world, .mp = mp, .zero = stage, .model = model});
        REQUIRE(plain.losses.size() == 10);
        check_close(zero.losses, plain.losses, 1e-6);
        // The same updates; ZeRO-2 sums the norm's parts over the replicas in
        // another order when there are model shards or split parameters.
        const bool same_order = stage == 1 || (mp == 1 && !splits_some(model, dp, mp));
        if (same_order) check_bitwise(zero.params, plain.params);
        // Another order of the clipping norm's sum differs in its last bits;
        // ten AdamW steps (lr 1e-2, which divides by the root of tiny second
        // moments) carry that to a few 1e-6 of a tensor's largest value
        // (measured 5.4e-6 with the vocabulary-split head fused with its loss).
        check_close(without_key_bias(zero.params), without_key_bias(plain.params),
                    same_order ? 1e-6 : 2e-5);
        // Split parameters balance the state: within 10% of 1/dp each.
        check_state_shares(zero, plain, dp, mp, tied ? 1.1 : 1.25);
      }
}

TEST_CASE("ZeRO's parameter broadcast overlapped with the next forward changes no bit", "[zero]") {
  for (const auto& [model, tied] : {std::pair{kGpt, false}, std::pair{kTied, true}})
    for (const auto& [world, mp] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1}})
      for (const int stage : {1, 2}) {
        INFO((tied ? "tied embedding 40%" : "small vocabulary")
             << ": world " << world << ", mp " << mp << ", stage " << stage);
        const Result off =
            fit({.world = world, .mp = mp, .zero = stage, .model = model, .overlap = false});
        const Result on = fit({.world = world, .mp = mp, .zero = stage, .model = model});
        REQUIRE(on.losses.size() == 10);
        CHECK(on.losses == off.losses);
        check_bitwise(on.params, off.params);
        // The overlap is real: after each step the next forward would find
        // parameters in flight, except at the end of an epoch (4 steps of 32
        // windows) and of fit, which wait for them.
        const std::vector<bool> overlapped = {true, true, true,  false, true,
                                              true, true, false, true,  false};
        CHECK(on.in_flight == (world / mp > 1 ? overlapped : std::vector<bool>(10, false)));
        CHECK(off.in_flight == std::vector<bool>(10, false));
      }
}

// Wide enough that its weight matrices are 1 MiB or more ([512, 512] is
// exactly 1 MiB) while biases and norms stay small.
const models::Gpt2Config kWide{
    .vocab = 64, .context = 16, .dim = 512, .layers = 1, .heads = 4, .dropout = 0.1f};

TEST_CASE("ZeRO shares a weight of 1 MiB or more in place, packing only small parts", "[zero]") {
  const auto gpt = models::gpt2(kWide);
  const std::vector<shard::ParamSplit> plan = shard::resolve(gpt, 1);
  const ParamTree params = nn::init_params(gpt, 3);
  std::map<std::string, size_t> position;  // in the plan
  for (const auto& s : plan) position.emplace(s.name, position.size());
  constexpr int64_t kAlone = (int64_t(1) << 20) / 4, kBucket = (int64_t(32) << 20) / 4;
  for (const int dp : {2, 4}) {
    const train::ZeroPartition zero(plan, dp, 0);
    std::map<std::pair<int, std::string>, int> seen;  // (owner, name) -> times shared
    size_t last_first = 0, alone = 0, small = 0;
    for (const auto& b : zero.share_buckets(params)) {
      INFO("dp " << dp << ", bucket from owner " << b.root << " starting with " << b.names[0]);
      REQUIRE(b.names.size() == b.parts.size());
      CHECK(position.at(b.names[0]) >= last_first);  // buckets in the order of their first part
      last_first = position.at(b.names[0]);
      int64_t floats = 0;
      for (size_t i = 0; i < b.parts.size(); ++i) {
        ++seen[{b.root, b.names[i]}];
        const Tensor owned = zero.part(b.names[i], params.at(b.names[i]), b.root);
        CHECK(b.parts[i].shape() == owned.shape());
        floats += b.parts[i].numel();
        if (b.parts[i].numel() < kAlone) {
          ++small;
          continue;
        }
        ++alone;
        CHECK(b.parts.size() == 1);  // alone, and the parameter itself: received in place
        CHECK(b.parts[i].data<float>() == owned.data<float>());
      }
      CHECK(floats <= std::max(kBucket, b.parts[0].numel()));
    }
    CHECK(alone >= 4);  // c_attn, attn c_proj, c_fc, mlp c_proj at least
    CHECK(small >= 4);  // the biases and norms
    // Every owner's every part travels exactly once.
    for (const auto& s : plan)
      for (int r = 0; r < dp; ++r) {
        const std::vector<int>& owners = zero.part_owners(s.name);
        const bool owns = std::find(owners.begin(), owners.end(), r) != owners.end();
        const auto it = seen.find({r, s.name});
        CHECK((it == seen.end() ? 0 : it->second) == (owns ? 1 : 0));
      }
  }
  // And training over it is the overlap-free run, bit for bit.
  const Result off = fit({.world = 2, .zero = 2, .model = kWide, .overlap = false});
  const Result on = fit({.world = 2, .zero = 2, .model = kWide});
  CHECK(on.losses == off.losses);
  check_bitwise(on.params, off.params);
}

// A rank that fails while parameters are still on their way (its pending
// broadcasts are waited for as it unwinds, which its peers' forwards let
// finish) ends the job with its error at once, not at the 60 s timeout.
TEST_CASE("a rank failing with parameters in flight stops the job at once", "[zero]") {
  const std::vector<Window> data = windows();
  int in_flight_losses = 0;  // rank 1's losses begun with parameters in flight
  comm::ThreadsWorld w(2, {.timeout = std::chrono::seconds(60)});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(w.run([&](comm::Comm& c) {
    train::Deployer d({.seed = 3, .quiet = true, .world = &c, .zero_stage = 1});
    train::Trainer trainer(
        d, models::gpt2(kGpt), collate,
        [&](auto& model, const LmBatch& b, train::Rng) {
          if (c.rank() == 1 && nn::param_read_hook() != nullptr && ++in_flight_losses == 3)
            throw std::runtime_error("bad batch on rank 1");
          return cross_entropy(model(b.inputs), b.targets);
        },
        optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {}));
    trainer.fit(data, {.global_batch_size = 8, .n_epochs = 100, .max_steps = 10});
  }),
                    Catch::Contains("bad batch on rank 1"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("a checkpoint saved under ZeRO resumes without it, and the other way", "[zero]") {
  const Result straight = fit({.world = 2, .max_steps = 10});
  for (const auto& [first, then] : {std::pair{1, 0}, std::pair{0, 1}, std::pair{2, 0}}) {
    INFO("first half with zero_stage " << first << ", second half with " << then);
    const Result resumed = save_then_resume(first, then, kGpt);
    REQUIRE(resumed.losses.size() == 5);
    check_close(resumed.losses, {straight.losses.begin() + 5, straight.losses.end()}, 1e-6);
    check_bitwise(resumed.params, straight.params);
  }
  SECTION("with the embedding split among the owners") {
    const Result tied = fit({.world = 2, .max_steps = 10, .model = kTied});
    for (const auto& [first, then] : {std::pair{1, 0}, std::pair{0, 1}, std::pair{2, 1}}) {
      INFO("first half with zero_stage " << first << ", second half with " << then);
      const Result resumed = save_then_resume(first, then, kTied);
      REQUIRE(resumed.losses.size() == 5);
      check_close(resumed.losses, {tied.losses.begin() + 5, tied.losses.end()}, 1e-6);
      if (first != 2) check_bitwise(resumed.params, tied.params);
      check_close(without_key_bias(resumed.params), without_key_bias(tied.params), 1e-6);
    }
  }
  SECTION("and on another mesh: 2 model shards x 2 replicas under ZeRO") {
    const Result resumed = save_then_resume(1, 1, kGpt, 4, 2);
    check_close(resumed.losses, {straight.losses.begin() + 5, straight.losses.end()}, 1e-5);
  }
}

TEST_CASE("zero_stage out of range is one clear error", "[zero]") {
  CHECK_THROWS_WITH(train::Deployer({.zero_stage = 4}), Catch::Contains("zero_stage"));
}

TEST_CASE("ZeRO-2 averages each gradient into its owner as the all-reduce does", "[zero]") {
  for (const auto& model : {kGpt, kTied}) {
    const auto gpt = models::gpt2(model);
    const std::vector<shard::ParamSplit> plan = shard::resolve(gpt, 1);
    std::vector<std::string> order;
    for (const auto& e : nn::param_entries(gpt)) order.emplace_back(e.name.view());
    for (const int world : {2, 4}) {
      INFO("dp " << world);
      std::vector<ParamTree> plain(static_cast<size_t>(world)), owned(plain.size());
      comm::ThreadsWorld w(world);
      w.run([&](comm::Comm& c) {
        ParamTree g = nn::init_params(gpt, uint64_t(10 + c.rank()));  // this rank's "gradients"
        ParamTree h;
        for (const auto& [k, t] : g) h.emplace(k, t.clone());
        train::DataParallel all(c, 4096), some(c, 4096);
        const train::ZeroPartition zero(plan, world, c.rank());
        some.reduce_to_owners(&zero);
        all.average(g, order);
        some.average(h, order);
        plain[size_t(c.rank())] = g;
        owned[size_t(c.rank())] = h;
      });
      for (int r = 0; r < world; ++r) {
        const train::ZeroPartition zero(plan, world, r);
        CHECK(owned[size_t(r)].size() == zero.owned(plain[size_t(r)]).size());
        check_bitwise(owned[size_t(r)], zero.owned(plain[size_t(r)]));
      }
    }
  }
}

TEST_CASE("ZeRO-2 keeps 1/dp of the gradients and of the optimizer state per rank", "[zero]") {
  // kTied: whole, the embedding alone would be 40% of the model at one replica.
  for (const auto& model : {kGpt, kTied}) {
    const double params_mib =
        double(nn::count_parameters(nn::init_params(models::gpt2(model), 0))) * 4 / 1048576.0;
    TempDir dir;
    fit({.world = 4, .zero = 2, .max_steps = 1, .workdir = dir.path, .model = model});
    const io::Json m = memory_line(dir.path);
    REQUIRE(m.contains("rank3.grads_mib"));
    double grads = 0, state = 0;
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      const double g = m.at("rank" + std::to_string(r) + ".grads_mib").as_double();
      CHECK(m.at("rank" + std::to_string(r) + ".params_mib").as_double() ==
            Approx(params_mib).epsilon(1e-6));
      CHECK(g < 1.25 * params_mib / 4);
      grads += g;
      state += m.at("rank" + std::to_string(r) + ".opt_state_mib").as_double();
    }
    CHECK(grads == Approx(params_mib).epsilon(1e-4));  // each gradient once, at its owner
    CHECK(state == Approx(2 * params_mib + 4 * 8 / 1048576.0).epsilon(1e-4));  // + 4 "step"s
  }
}

TEST_CASE("ZeRO-2 lowers the gradient peak of backward, not only the gradients kept", "[zero]") {
  // Buckets of 16 KiB, so that a replica's buckets leave as backward
  // finalises them: the peak is its own half plus the buckets in flight.
  const models::Gpt2Config wide{.vocab = 256, .context = 16, .dim = 64, .layers = 2, .heads = 4};
  // Not so for kTied: its tied embedding (40%) is final last, when its own
  // half, the half it sends and the one it receives are all held at once.
  for (const auto& model : {wide}) {
    const double params_mib =
        double(nn::count_parameters(nn::init_params(models::gpt2(model), 0))) * 4 / 1048576.0;
    auto peak = [&](int stage, int rank) {
      TempDir dir;
      fit({.world = 2,
           .zero = stage,
           .max_steps = 1,
           .workdir = dir.path,
           .model = model,
           .batch = 2,
           .bucket = size_t(16) << 10});
      return memory_line(dir.path).at("rank" + std::to_string(rank) + ".grad_peak_mib").as_double();
    };
    for (const int rank : {0, 1}) {
      const double plain = peak(0, rank), one = peak(1, rank), two = peak(2, rank);
      INFO("rank " << rank << ": gradient peak plain " << plain << " MiB, ZeRO-1 " << one
                   << " MiB, ZeRO-2 " << two << " MiB; parameters " << params_mib << " MiB");
      // Without ZeRO-2 the buckets hold every gradient once, until the step.
      CHECK(plain == Approx(params_mib).epsilon(1e-6));
      CHECK(one == Approx(params_mib).epsilon(1e-6));
      // With it, this replica's half and at most two 16 KiB buckets (a little
      // over, each closing at the parameter that fills it) of each owner in flight.
      CHECK(two < 0.75 * params_mib);
    }
  }
}

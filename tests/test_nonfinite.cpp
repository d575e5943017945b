// The Trainer's NaN/Inf policy (NonFinite): a loss or gradient that goes
// non-finite at a chosen step either stops fit() with one error naming the
// step and the tensor, before any update (the parameters are bitwise those of
// a clean run stopped one step earlier), or skips exactly that update
// (counted, logged to metrics.jsonl and the console) and trains on. On one
// process and on data-parallel (and model-parallel) meshes of threads, where
// the bad value appears on one rank only and every rank must decide alike.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "redco/comm/threads_comm.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kIn = 8, kClasses = 3;

struct Example {
  std::vector<float> x;
  int64_t y = 0;
};
struct Batch {
  Tensor x, y;
};

std::vector<Example> make_data(int64_t n) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  std::vector<Example> out(static_cast<size_t>(n));
  for (Example& e : out) {
    for (int64_t k = 0; k < kIn; ++k) e.x.push_back(normal(rng));
    e.y = (e.x[0] > 0) + (e.x[1] > 0);  // 0..2
  }
  return out;
}

Batch collate(std::span<const Example> ex) {
  const auto n = int64_t(ex.size());
  Batch b{Tensor::empty({n, kIn}), Tensor::empty({n}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy(ex[size_t(i)].x.begin(), ex[size_t(i)].x.end(), b.x.data<float>() + i * kIn);
    b.y.data<int64_t>()[i] = ex[size_t(i)].y;
  }
  return b;
}

const auto mlp = nn::linear(kIn, 16) | nn::relu() | nn::linear(16, kClasses);

enum class Poison { loss, gradient };

// Cross entropy, made non-finite on its `bad_call`-th call (1-based; one call
// per step without accumulation) on world rank `bad_rank`:
//   loss      adds a NaN constant: the loss is NaN, every gradient finite;
//   gradient  adds sum(sqrt(0 * w)) for the parameter `victim`: 0 forward,
//             but its backward is 0 * inf = NaN in that gradient only.
struct PoisonedLoss {
  Poison what;
  int bad_call;
  int bad_rank = 0;
  int rank = 0;
  std::string victim = {};
  std::shared_ptr<int> calls = std::make_shared<int>(0);

  template <typename M>
  Tensor operator()(M& model, const Batch& b, Rng) const {
    Tensor l = cross_entropy(model(b.x), b.y);
    if (++*calls != bad_call || rank != bad_rank) return l;
    if (what == Poison::loss)
      return l + Tensor::full(Shape{}, std::numeric_limits<float>::quiet_NaN());
    return l + sum(sqrt(model.params().at(victim) * 0.f));
  }
};

optim::Optimizer make_opt() { return optim::adamw(optim::constant(1e-2f)); }

bool bitwise_equal(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a)
    if (t.shape() != b.at(name).shape() || std::memcmp(t.raw(), b.at(name).raw(), t.nbytes()))
      return false;
  return true;
}

ParamTree clone(const ParamTree& t) {
  ParamTree out;
  for (const auto& [name, x] : t) out.emplace(name, x.clone());
  return out;
}

struct Run {
  std::vector<StepInfo> steps;
  std::vector<ParamTree> params;  // whole parameters after each step
  std::string error;              // what fit() threw, if anything
  std::string console;
  int64_t optimizer_steps = 0;
};

struct Spec {
  int world = 1, mp = 1;
  int64_t max_steps = 6;
  NonFinite policy = NonFinite::stop;
  fs::path workdir = {};
};

// fit() on `world` threads; every rank's Run (they must agree).
std::vector<Run> run(const std::vector<Example>& data, PoisonedLoss loss, const Spec& s) {
  std::vector<Run> runs(size_t(s.world));
  auto body = [&](comm::Comm* world, int rank) {
    Run& r = runs[size_t(rank)];
    std::ostringstream console;
    Deployer d({.n_model_shards = s.mp,
                .seed = 5,
                .workdir = s.workdir,
                .console = &console,
                .world = world});
    PoisonedLoss mine = loss;
    mine.rank = rank;
    mine.calls = std::make_shared<int>(0);
    Trainer t(d, mlp, collate, mine, make_opt());
    try {
      t.fit(data, {.global_batch_size = 8,
                   .n_epochs = 10,
                   .log_every = 1,
                   .max_steps = s.max_steps,
                   .on_step =
                       [&](const StepInfo& i) {
                         r.steps.push_back(i);
                         r.params.push_back(clone(t.whole_params()));
                       },
                   .on_non_finite = s.policy});
    } catch (const Error& e) {
      r.error = e.what();
    }
    r.optimizer_steps = t.optimizer().steps();
    r.console = console.str();
  };
  if (s.world == 1) {
    body(nullptr, 0);
  } else {
    comm::ThreadsWorld w(s.world);
    w.run([&](comm::Comm& c) { body(&c, c.rank()); });
  }
  return runs;
}

// The name of the last parameter of the model (any would do: only its gradient goes bad).
std::string last_param_name() {
  const ParamTree p = nn::init_params(mlp, 1);
  return p.rbegin()->first;
}

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / fmt::format("redco-nonfinite-{}", std::random_device{}());
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("a NaN loss stops fit before the update, naming the step", "[nonfinite]") {
  const auto data = make_data(64);
  const Run clean = run(data, {Poison::loss, 0}, {.max_steps = 2})[0];
  REQUIRE(clean.error.empty());
  const Run bad = run(data, {Poison::loss, 3}, {})[0];
  INFO(bad.error);
  CHECK_THAT(bad.error, Contains("fit: step 3: the loss is nan") &&
                            Contains("parameters, optimizer state and checkpoints are those after "
                                     "step 2") &&
                            Contains("NonFinite::skip_step"));
  CHECK(bad.steps.size() == 2);
  CHECK(bad.optimizer_steps == 2);
  // Nothing was applied: the parameters are those of the clean 2-step run.
  REQUIRE(bad.params.size() == 2);
  CHECK(bitwise_equal(bad.params[1], clean.params[1]));
}

TEST_CASE("a non-finite gradient stops fit, naming the parameter", "[nonfinite]") {
  const auto data = make_data(64);
  const std::string victim = last_param_name();
  const Run bad = run(data, {Poison::gradient, 2, 0, 0, victim}, {})[0];
  INFO(bad.error);
  CHECK_THAT(bad.error, Contains("fit: step 2: the gradient of '" + victim + "'") &&
                            Contains("holds nan at element 0"));
  CHECK(bad.optimizer_steps == 1);
}

TEST_CASE("skip_step skips exactly the bad update, counts and logs it", "[nonfinite]") {
  const auto data = make_data(64);
  TempDir tmp;
  const Run r = run(data, {Poison::loss, 3},
                    {.max_steps = 6, .policy = NonFinite::skip_step, .workdir = tmp.path})[0];
  REQUIRE(r.error.empty());
  REQUIRE(r.steps.size() == 6);
  for (size_t i = 0; i < 6; ++i) {
    INFO("step " << i + 1);
    CHECK(r.steps[i].step == int64_t(i + 1));
    CHECK(r.steps[i].skipped == (i == 2));
    CHECK(std::isnan(r.steps[i].loss) == (i == 2));
  }
  CHECK(r.optimizer_steps == 5);
  CHECK(bitwise_equal(r.params[2], r.params[1]));   // step 3 changed nothing
  CHECK(!bitwise_equal(r.params[3], r.params[2]));  // step 4 trained again
  CHECK_THAT(r.console,
             Contains("step 3: the loss is nan: update skipped (1 step skipped so far)"));
  // metrics.jsonl: the skip at step 3, and the count on every later train line.
  std::ifstream in(tmp.path / "metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  int skip_lines = 0;
  for (const std::string& l : lines) {
    if (l.find("\"skipped_steps\"") == std::string::npos) continue;
    ++skip_lines;
    CHECK(l.find("\"step\": 2") == std::string::npos);  // nothing before the skip
  }
  CHECK(skip_lines == 1 + 4);  // the skip itself, then the train lines of steps 3..6
  // The count survives in state.json for a resumed run.
  std::ifstream state(tmp.path / "ckpt" / "step-000006" / "state.json");
  std::stringstream ss;
  ss << state.rdbuf();
  CHECK_THAT(ss.str(), Contains("\"skipped_steps\": 1"));
}

TEST_CASE("data parallel: one rank's NaN stops or skips on every rank alike", "[nonfinite]") {
  const auto data = make_data(64);
  for (const Spec& mesh : {Spec{.world = 2, .mp = 1}, Spec{.world = 2, .mp = 2}}) {
    INFO("world " << mesh.world << ", n_model_shards " << mesh.mp);
    // The clean run on this mesh, for the parameters after step 2.
    const Run clean = run(data, {Poison::loss, 0}, {.world = mesh.world, .mp = mesh.mp})[0];
    REQUIRE(clean.error.empty());

    Spec stop = mesh;
    const std::vector<Run> stopped = run(data, {Poison::loss, 3, 1}, stop);
    for (const Run& r : stopped) {
      INFO(r.error);
      CHECK_THAT(r.error, Contains("step 3"));
      CHECK(r.optimizer_steps == 2);
    }
    CHECK_THAT(stopped[1].error, Contains("fit: step 3: the loss is nan"));

    Spec skip = mesh;
    skip.policy = NonFinite::skip_step;
    const std::vector<Run> skipped =
        run(data, {Poison::gradient, 3, 1, 0, last_param_name()}, skip);
    for (const Run& r : skipped) {
      REQUIRE(r.error.empty());
      REQUIRE(r.steps.size() == 6);
      CHECK(r.optimizer_steps == 5);
      CHECK(r.steps[2].skipped);
      CHECK(bitwise_equal(r.params[2], r.params[1]));
      CHECK(bitwise_equal(r.params[1], clean.params[1]));
      CHECK(bitwise_equal(r.params[5], skipped[0].params[5]));
    }
    CHECK_THAT(skipped[0].console, Contains("step 3: ") && Contains("update skipped"));
  }
}

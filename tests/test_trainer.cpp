// Trainer, Predictor and Deployer on a small classifier over synthetic data
// with a learnable rule (labels from a fixed random linear teacher): the loss
// falls, accumulation matches one big batch, an interrupted and resumed run
// ends bit-identical to an uninterrupted one, prediction keeps input order,
// and checkpoints (periodic, best, retention) hold what resuming needs.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redco/io/json.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kIn = 8, kClasses = 3;

struct Example {
  std::array<float, kIn> x{};
  int64_t y = 0;
  int64_t id = 0;
};
struct Batch {
  Tensor x, y, ids;
};

// Points from N(0, 1); the label is the argmax of a fixed random linear map,
// so a small MLP can learn it but the initial model cannot guess it.
std::vector<Example> make_data(int64_t n, uint64_t seed) {
  const Tensor teacher = Tensor::normal({kClasses, kIn}, 7, 1, 0.f, 1.f);
  const Tensor xs = Tensor::normal({n, kIn}, seed, 2, 0.f, 1.f);
  const float* w = teacher.data<float>();
  const float* x = xs.data<float>();
  std::vector<Example> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Example& e = out[size_t(i)];
    std::copy_n(x + i * kIn, kIn, e.x.begin());
    float best = -1e30f;
    for (int64_t c = 0; c < kClasses; ++c) {
      float s = 0;
      for (int64_t k = 0; k < kIn; ++k) s += w[c * kIn + k] * e.x[size_t(k)];
      if (s > best) best = s, e.y = c;
    }
    e.id = i;
  }
  return out;
}

const auto mlp = nn::linear(kIn, 32) | nn::relu() | nn::linear(32, kClasses);
const auto mlp_dropout =
    nn::linear(kIn, 32) | nn::relu() | nn::dropout(0.2f) | nn::linear(32, kClasses);

Batch collate(std::span<const Example> ex) {
  const auto n = int64_t(ex.size());
  Batch b{Tensor::empty({n, kIn}), Tensor::empty({n}, DType::i64), Tensor::empty({n}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy(ex[size_t(i)].x.begin(), ex[size_t(i)].x.end(), b.x.data<float>() + i * kIn);
    b.y.data<int64_t>()[i] = ex[size_t(i)].y;
    b.ids.data<int64_t>()[i] = ex[size_t(i)].id;
  }
  return b;
}

const auto loss_fn = [](auto& model, const Batch& b, Rng) {
  return cross_entropy(model(b.x), b.y);
};
const auto predict_fn = [](auto& model, const Batch& b, Rng) {
  return argmax(model(b.x), 1).template values<int64_t>();
};

Metrics accuracy(std::span<const Example> ex, std::span<const int64_t> pred) {
  double correct = 0;
  for (size_t i = 0; i < ex.size(); ++i) correct += double(ex[i].y == pred[i]);
  return {{"accuracy", correct / double(ex.size())}};
}

// A fresh, empty work directory per test.
fs::path workdir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("redco_test_trainer_" + name);
  fs::remove_all(dir);
  return dir;
}

bool same_bytes(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.shape() != t.shape() || it->second.dtype() != t.dtype())
      return false;
    if (std::memcmp(t.raw(), it->second.raw(), t.nbytes()) != 0) return false;
  }
  return true;
}

double max_abs_diff(const ParamTree& a, const ParamTree& b) {
  double d = 0;
  for (const auto& [name, t] : a) {
    const std::vector<float> x = t.to_vector(), y = b.at(name).to_vector();
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::abs(x[i] - y[i])));
  }
  return d;
}

}  // namespace

TEST_CASE("trainer: the loss falls and training is logged", "[trainer]") {
  const auto train = make_data(512, 1), valid = make_data(128, 2);
  const fs::path dir = workdir("falls");
  Deployer deployer({.seed = 3, .workdir = dir, .quiet = true});
  Trainer trainer(deployer, mlp, collate, loss_fn,
                  optim::adam(deployer.linear_schedule({.learning_rate = 1e-2f,
                                                        .n_examples = 512,
                                                        .global_batch_size = 32,
                                                        .n_epochs = 4,
                                                        .warmup_fraction = 0.1})));
  const double before = trainer.eval_loss(valid, 64);
  trainer.fit(train, {.per_device_batch_size = 32,
                      .n_epochs = 4,
                      .eval_examples = valid,
                      .log_every = 4,
                      .throughput = {.items_per_example = 3,
                                     .item_name = "points",
                                     .flops_per_item = 1e3,
                                     .peak_flops = 1e12}});
  const double after = trainer.eval_loss(valid, 64);
  INFO("eval loss " << before << " -> " << after);
  CHECK(after < 0.4 * before);
  CHECK(trainer.optimizer().steps() == 4 * 16);

  // metrics.jsonl: a train line every 4 steps, an eval line per epoch, the
  // first step's memory.
  int train_lines = 0, eval_lines = 0, memory_lines = 0;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const io::Json j = io::Json::parse(line);
    if (j.at("split").as_string() == "train") {
      ++train_lines;
      CHECK(j.contains("lr"));
      // Throughput in the named items (3 per example), MFU and peak memory.
      CHECK(j.at("points_per_s").as_double() > 0);
      CHECK(j.at("mfu").as_double() ==
            Approx(j.at("points_per_s").as_double() * 1e3 / 1e12).epsilon(1e-9));
      CHECK(j.at("alloc_peak_mib").as_double() > 0);
      CHECK(j.at("max_rss_mib").as_double() > 0);
    } else if (j.at("split").as_string() == "memory") {
      ++memory_lines;
      CHECK(j.at("step").as_int() == 2);  // after the second step: the optimizer's state held
      CHECK(j.at("rank0.params_mib").as_double() > 0);
      CHECK(j.at("rank0.peak_mib").as_double() > j.at("rank0.params_mib").as_double());
    } else {
      ++eval_lines;
      CHECK(j.at("split").as_string() == "eval");
      CHECK(j.at("step").as_int() % 16 == 0);
    }
  }
  CHECK(train_lines == 16);
  CHECK(eval_lines == 4);
  CHECK(memory_lines == 1);
}

TEST_CASE("trainer: accumulation over 4 micro-batches equals one big batch", "[trainer]") {
  const auto train = make_data(256, 4);
  auto run = [&](int64_t per_device, std::vector<double>* lrs) {
    Deployer deployer({.seed = 5, .quiet = true});
    const optim::Schedule sched = deployer.linear_schedule(
        {.learning_rate = 0.1f, .n_examples = 256, .global_batch_size = 32, .n_epochs = 2});
    Trainer trainer(deployer, mlp, collate, loss_fn, optim::sgd(sched, {.momentum = 0.9f}));
    trainer.fit(train, {.per_device_batch_size = per_device,
                        .global_batch_size = 32,
                        .n_epochs = 2,
                        .save_at_end = false,
                        .on_step = [&](const StepInfo& s) { lrs->push_back(s.lr); }});
    CHECK(trainer.optimizer().steps() == 16);  // one optimizer step per 32 examples
    for (size_t i = 0; i < lrs->size(); ++i) CHECK((*lrs)[i] == Approx(sched(int64_t(i))));
    return trainer.params();
  };
  std::vector<double> lr_small, lr_big;
  const ParamTree small = run(8, &lr_small), big = run(32, &lr_big);
  CHECK(lr_small == lr_big);
  CHECK(lr_small.size() == 16);
  CHECK(max_abs_diff(small, big) < 1e-5);
  CHECK(max_abs_diff(small, nn::init_params(mlp, 5)) > 1e-2);  // it did train
}

TEST_CASE("trainer: an interrupted and resumed run is bitwise the uninterrupted one", "[trainer]") {
  const auto train = make_data(200, 6), valid = make_data(40, 7);
  // Dropout, shuffling, accumulation, AdamW with warmup: everything a step
  // depends on must come back from the checkpoint.
  auto options = [&](bool resume) {
    return FitOptions<Example>{.per_device_batch_size = 8,
                               .global_batch_size = 16,
                               .n_epochs = 3,
                               .eval_examples = valid,
                               .save_every_steps = 5,
                               .keep_last = 2,
                               .resume = resume,
                               .log_every = 3};
  };
  auto make_trainer = [&](Deployer& d) {
    return Trainer(d, mlp_dropout, collate, loss_fn,
                   optim::adamw(d.cosine_schedule({.learning_rate = 5e-3f,
                                                   .n_examples = 200,
                                                   .global_batch_size = 16,
                                                   .n_epochs = 3,
                                                   .warmup_fraction = 0.2})));
  };
  Deployer whole_d({.seed = 11, .workdir = workdir("whole"), .quiet = true});
  auto whole = make_trainer(whole_d);
  whole.fit(train, options(false));
  REQUIRE(whole.optimizer().steps() == 36);

  SECTION("a crash mid-epoch (resumes from the last checkpoint, redoing 3 steps)") {
    Deployer d({.seed = 11, .workdir = workdir("crash"), .quiet = true});
    {
      auto first = make_trainer(d);
      auto o = options(false);
      o.on_step = [](const StepInfo& s) {
        if (s.step == 18) throw std::runtime_error("simulated crash");
      };
      CHECK_THROWS_WITH(first.fit(train, o), "simulated crash");
    }
    REQUIRE(d.latest_checkpoint()->step == 15);
    auto second = make_trainer(d);
    std::vector<int64_t> redone;
    auto o = options(true);
    o.on_step = [&](const StepInfo& s) { redone.push_back(s.step); };
    second.fit(train, o);
    REQUIRE(redone.size() == 21);  // it continued from step 15 rather than starting over
    CHECK(redone.front() == 16);
    CHECK(second.optimizer().steps() == 36);
    CHECK(same_bytes(second.params(), whole.params()));
    CHECK(same_bytes(second.optimizer().state(), whole.optimizer().state()));
  }
  SECTION("max_steps stops at an epoch boundary and saves there") {
    Deployer d({.seed = 11, .workdir = workdir("maxsteps"), .quiet = true});
    {
      auto first = make_trainer(d);
      auto o = options(false);
      o.max_steps = 12;
      first.fit(train, o);
      CHECK(first.optimizer().steps() == 12);
    }
    REQUIRE(d.latest_checkpoint()->step == 12);
    auto second = make_trainer(d);
    auto o = options(true);
    int64_t first_step = 0;
    o.on_step = [&](const StepInfo& s) { first_step = first_step ? first_step : s.step; };
    second.fit(train, o);
    CHECK(first_step == 13);
    CHECK(same_bytes(second.params(), whole.params()));
  }
  SECTION("resuming a finished run changes nothing") {
    auto again = make_trainer(whole_d);
    auto o = options(true);
    o.on_step = [](const StepInfo&) { FAIL("a finished run took another step"); };
    again.fit(train, o);
    CHECK(same_bytes(again.params(), whole.params()));
  }
}

TEST_CASE("trainer: checkpoints hold params, optimizer state and state.json", "[trainer]") {
  const auto train = make_data(96, 8), valid = make_data(60, 9);
  const fs::path dir = workdir("ckpt");
  Deployer deployer({.seed = 13, .workdir = dir, .quiet = true});
  Trainer trainer(deployer, mlp, collate, loss_fn, optim::adam(2e-2f));
  Predictor predictor(deployer, mlp, collate, predict_fn);
  std::vector<double> seen;
  auto recording_accuracy = [&](std::span<const Example> ex, std::span<const int64_t> pred) {
    Metrics m = accuracy(ex, pred);
    seen.push_back(m[0].second);
    return m;
  };
  trainer.fit(train, {.per_device_batch_size = 8,
                      .global_batch_size = 16,
                      .n_epochs = 4,
                      .eval_examples = valid,
                      .evaluate = {predictor, recording_accuracy},
                      .eval_every_steps = 2,
                      .save_best_by = {{"accuracy", Mode::max}},
                      .save_every_steps = 4,
                      .keep_last = 2});
  // 6 steps an epoch, 24 in all; saves at 4, 8, ..., 24, the newest two kept.
  std::vector<int64_t> steps;
  for (const auto& e : deployer.list_checkpoints()) steps.push_back(e.step);
  CHECK(steps == std::vector<int64_t>{20, 24});

  const CheckpointData last = deployer.load_checkpoint(deployer.step_dir(24));
  for (const char* f : {"params.safetensors", "opt_state.safetensors", "state.json"})
    CHECK(fs::exists(deployer.step_dir(24) / f));
  CHECK(same_bytes(last.params, trainer.params()));
  CHECK(same_bytes(last.opt_state, trainer.optimizer().state()));
  const io::Json state = io::Json::parse(last.state_json);
  CHECK(state.at("step").as_int() == 24);
  CHECK(state.at("epoch").as_int() == 4);
  CHECK(state.at("step_in_epoch").as_int() == 0);
  CHECK(state.at("optimizer_step").as_int() == 24);
  CHECK(state.at("seed").as_uint() == 13);
  CHECK(state.at("config").at("global_batch_size").as_int() == 16);
  CHECK(state.at("config").at("accumulation_steps").as_int() == 2);

  // The best checkpoint holds the parameters that scored the best accuracy.
  REQUIRE(seen.size() == 12);  // every 2 steps (epoch ends coincide)
  const double best = *std::max_element(seen.begin(), seen.end());
  const CheckpointData b = deployer.load_checkpoint(deployer.best_dir("accuracy"));
  const io::Json bs = io::Json::parse(b.state_json);
  CHECK(bs.at("best").at("accuracy").at("value").as_double() == best);
  CHECK(accuracy(valid, predictor.predict(valid, 7, b.params))[0].second == best);
  CHECK(io::Json::parse(last.state_json).at("best").at("accuracy").at("value").as_double() == best);
}

TEST_CASE("predictor: every example once, in input order, through the output function",
          "[trainer]") {
  const auto examples = make_data(10, 10);
  Deployer deployer({.seed = 1, .quiet = true});
  std::vector<int64_t> batch_sizes;
  auto ids = [&](auto& model, const Batch& b, Rng) {
    CHECK_FALSE(model.training());
    batch_sizes.push_back(b.ids.numel());
    CHECK(model(b.x).dim(0) == b.ids.numel());
    return b.ids.template values<int64_t>();
  };
  auto name = [](int64_t id) { return "example " + std::to_string(id); };
  Predictor predictor(deployer, mlp, collate, ids, name);
  const std::vector<std::string> out =
      predictor.predict(examples, 4, nn::init_params(mlp, deployer.seed()));
  REQUIRE(out.size() == 10);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == "example " + std::to_string(i));
  CHECK(batch_sizes == std::vector<int64_t>{4, 4, 2});

  // Without an output function the model's outputs come back as they are.
  Predictor plain(deployer, mlp, collate, predict_fn);
  plain.set_params(nn::init_params(mlp, 2));
  const std::vector<int64_t> labels = plain.predict(examples, 3);
  CHECK(labels.size() == 10);
  CHECK(labels == plain.predict(examples, 10));  // batching does not change the answers
}

TEST_CASE("deployer: epoch order, schedules, options checked", "[trainer]") {
  Deployer d({.seed = 21, .quiet = true});
  const auto o0 = d.epoch_order(0, 1000), o1 = d.epoch_order(1, 1000);
  CHECK(o0 == d.epoch_order(0, 1000));
  CHECK(o0 != o1);
  CHECK(std::set<int64_t>(o0.begin(), o0.end()).size() == 1000);
  CHECK(*std::max_element(o0.begin(), o0.end()) == 999);
  CHECK(d.epoch_order(0, 5, false) == std::vector<int64_t>{0, 1, 2, 3, 4});

  const ScheduleSpec spec{.learning_rate = 1.f,
                          .n_examples = 100,
                          .global_batch_size = 10,
                          .n_epochs = 2,
                          .warmup_fraction = 0.25};
  CHECK(Deployer::total_steps(spec) == 20);
  const optim::Schedule s = d.linear_schedule(spec);
  CHECK(s(0) == 0.f);
  CHECK(s(5) == Approx(1.f));
  CHECK(s(20) == Approx(0.f).margin(1e-6));

  CHECK_THROWS_AS(Deployer({.n_model_shards = 2}), Error);
  const auto train = make_data(20, 3);
  Trainer t(d, mlp, collate, loss_fn, optim::sgd(0.1f));
  CHECK_THROWS_WITH(t.fit(train, {.per_device_batch_size = 8, .global_batch_size = 12}),
                    Catch::Contains("multiple of per_device_batch_size"));
  CHECK_THROWS_WITH(t.fit(train, {.per_device_batch_size = 32}), Catch::Contains("make no step"));
  CHECK_THROWS_WITH(t.fit(train, {.per_device_batch_size = 4, .save_every_steps = 1}),
                    Catch::Contains("workdir"));

  const Rng r{1, 2, 3};
  CHECK(r.split(0) == Rng{1, 2, 3}.split(0));
  CHECK(r.split(0).stream_id() != r.split(1).stream_id());
  CHECK(r.uniform01(0) >= 0.0);
  CHECK(r.uniform01(0) < 1.0);
}

namespace {

// The Predictor over 6 batches whose step sleeps 30 ms.
void check_collation_overlaps_step() {
  using Clock = std::chrono::steady_clock;
  const auto examples = make_data(24, 12);
  std::mutex mu;
  std::vector<Clock::time_point> collate_start, predict_end;
  auto slow_collate = [&](std::span<const Example> ex) {
    {
      std::lock_guard lock(mu);
      collate_start.push_back(Clock::now());
    }
    return collate(ex);
  };
  auto slow_predict = [&](auto& model, const Batch& b, Rng) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    auto out = argmax(model(b.x), 1).template values<int64_t>();
    std::lock_guard lock(mu);
    predict_end.push_back(Clock::now());
    return out;
  };
  Deployer deployer({.seed = 1, .quiet = true});
  Predictor predictor(deployer, mlp, slow_collate, slow_predict);
  CHECK(predictor.predict(examples, 4, nn::init_params(mlp, 1)).size() == 24);
  REQUIRE(collate_start.size() == 6);
  REQUIRE(predict_end.size() == 6);
  // Batch b + 1 is being collated before batch b's step has finished.
  for (size_t b = 0; b + 1 < 6; ++b) CHECK(collate_start[b + 1] < predict_end[b]);
}

}  // namespace

TEST_CASE("trainer: collation of the next batch overlaps the current step", "[trainer]") {
  // Two oneTBB threads even on one CPU (where oneTBB starts no worker by
  // default): collation runs on the second while the step sleeps.
  tbb::global_control two_threads(tbb::global_control::max_allowed_parallelism, 2);
  tbb::task_arena arena(2);
  arena.execute([] { check_collation_overlaps_step(); });
}

TEST_CASE("trainer: progress and one line per evaluation on the console", "[trainer]") {
  const auto train = make_data(64, 14), valid = make_data(16, 15);
  std::ostringstream console;
  Deployer deployer({.seed = 2, .console = &console});
  Trainer trainer(deployer, mlp, collate, loss_fn, optim::sgd(0.1f));
  Predictor predictor(deployer, mlp, collate, predict_fn);
  trainer.fit(train, {.per_device_batch_size = 16,
                      .n_epochs = 2,
                      .eval_examples = valid,
                      .evaluate = {&predictor, accuracy}});
  const std::string out = console.str();
  INFO(out);
  int eval_lines = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("eval  step", 0) != 0) continue;
    ++eval_lines;
    CHECK(line.find(" loss ") != std::string::npos);
    CHECK(line.find(" accuracy ") != std::string::npos);
  }
  CHECK(eval_lines == 2);
  CHECK(out.find("train") != std::string::npos);
}

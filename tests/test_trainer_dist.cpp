// Trainer, Predictor and Deployer on dp × mp meshes of threads: the same
// global batches give the single-device losses (a GPT, which splits, and a
// CNN, which stays whole), predictions come back in input order, checkpoints
// hold whole tensors and resume on another mesh, only rank 0 writes logs.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "redco/comm/threads_comm.hpp"
#include "redco/generation/generate.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/vision.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;

namespace {

// ---- a tiny language model over sequences with a learnable rule ---------------------------

constexpr int64_t kT = 8, kVocab = 32;
const models::Gpt2Config kGpt{.vocab = kVocab, .context = kT, .dim = 16, .layers = 2, .heads = 4};

struct Seq {
  std::vector<int64_t> ids;  // kT + 1 tokens: inputs are [0, kT), targets [1, kT]
  int64_t id = 0;
};
struct LmBatch {
  Tensor inputs, targets, ids;
};

// Token t + 1 = (3 t + k) mod vocab with a per-sequence k: learnable, not trivial.
std::vector<Seq> make_seqs(int64_t n) {
  std::mt19937_64 rng(5);
  std::vector<Seq> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Seq& s = out[size_t(i)];
    const auto k = int64_t(rng() % 4);
    s.ids.push_back(int64_t(rng() % kVocab));
    for (int64_t t = 0; t < kT; ++t) s.ids.push_back((3 * s.ids.back() + k) % kVocab);
    s.id = i;
  }
  return out;
}

LmBatch lm_collate(std::span<const Seq> ex) {
  const auto n = int64_t(ex.size());
  LmBatch b{Tensor::empty({n, kT}, DType::i64), Tensor::empty({n, kT}, DType::i64),
            Tensor::empty({n}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    const auto& ids = ex[size_t(i)].ids;
    std::copy_n(ids.begin(), kT, b.inputs.data<int64_t>() + i * kT);
    std::copy_n(ids.begin() + 1, kT, b.targets.data<int64_t>() + i * kT);
    b.ids.data<int64_t>()[i] = ex[size_t(i)].id;
  }
  return b;
}

const auto lm_loss = [](auto& model, const LmBatch& b, Rng) {
  return cross_entropy(model(b.inputs), b.targets);
};

// One string per example: its id and the argmax token after the last position.
const auto lm_predict = [](auto& model, const LmBatch& b, Rng) {
  const Tensor logits = nn::whole(model(b.inputs));  // [n, kT, vocab]
  const int64_t n = b.inputs.dim(0);
  const Tensor last = argmax(reshape(logits, {n * kT, kVocab}), 1);  // [n * kT]
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(
        fmt::format("{}:{}", b.ids.data<int64_t>()[i], last.data<int64_t>()[i * kT + kT - 1]));
  return out;
};

// ---- a tiny CNN over 8x8 images ------------------------------------------------------------

struct Image {
  std::vector<float> px;  // 1 x 8 x 8
  int64_t y = 0;
};
struct ImBatch {
  Tensor x, y;
};

// The label is the quadrant holding the brightest pixel.
std::vector<Image> make_images(int64_t n) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  std::vector<Image> out(static_cast<size_t>(n));
  for (Image& im : out) {
    for (int i = 0; i < 64; ++i) im.px.push_back(normal(rng));
    const auto top = std::max_element(im.px.begin(), im.px.end()) - im.px.begin();
    im.y = (top / 8 >= 4 ? 2 : 0) + (top % 8 >= 4 ? 1 : 0);
  }
  return out;
}

ImBatch im_collate(std::span<const Image> ex) {
  const auto n = int64_t(ex.size());
  ImBatch b{Tensor::empty({n, 1, 8, 8}), Tensor::empty({n}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy(ex[size_t(i)].px.begin(), ex[size_t(i)].px.end(), b.x.data<float>() + i * 64);
    b.y.data<int64_t>()[i] = ex[size_t(i)].y;
  }
  return b;
}

const auto im_loss = [](auto& model, const ImBatch& b, Rng) {
  return cross_entropy(model(b.x), b.y);
};

const auto cnn =
    models::small_cnn({.channels = 1, .size = 8, .classes = 4, .conv1 = 4, .conv2 = 8});

// ---- running on a mesh ---------------------------------------------------------------------

struct Mesh {
  int world, mp;
};
const std::vector<Mesh> kMeshes = {{1, 1}, {2, 1}, {2, 2}, {4, 2}};

// fn(world communicator or nullptr, world rank) on `world` threads, or here alone.
void on_ranks(int world, const std::function<void(comm::Comm*, int)>& fn) {
  if (world == 1) return fn(nullptr, 0);
  comm::ThreadsWorld w(world);
  w.run([&](comm::Comm& c) { fn(&c, c.rank()); });
}

optim::Optimizer make_opt() {
  return optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {.max_grad_norm = 0.5f});
}

bool bitwise_equal(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    if (t.shape() != u.shape() || std::memcmp(t.raw(), u.raw(), t.nbytes()) != 0) {
      UNSCOPED_INFO("'" << name << "' differs");
      return false;
    }
  }
  return true;
}

struct FitSpec {
  fs::path workdir = {};
  int64_t max_steps = 10;
  bool resume = false;
};

// The step losses every rank saw (they must agree) and the final whole parameters.
struct Result {
  std::vector<double> losses;
  ParamTree params;
};

template <typename Model, typename Data, typename Collate, typename Loss>
Result run_fit(const Model& model, const Data& data, Collate collate, Loss loss, Mesh mesh,
               const FitSpec& spec = {}) {
  std::vector<Result> per_rank(size_t(mesh.world));
  on_ranks(mesh.world, [&](comm::Comm* world, int rank) {
    Deployer d({.n_model_shards = mesh.mp,
                .seed = 3,
                .workdir = spec.workdir,
                .quiet = true,
                .world = world});
    Trainer trainer(d, model, collate, loss, make_opt());
    Result& r = per_rank[size_t(rank)];
    trainer.fit(data, {.global_batch_size = 8,
                       .n_epochs = 100,
                       .resume = spec.resume,
                       .max_steps = spec.max_steps,
                       .on_step = [&](const StepInfo& s) { r.losses.push_back(s.loss); }});
    r.params = trainer.whole_params();
  });
  for (const Result& r : per_rank) CHECK(r.losses == per_rank[0].losses);
  for (const Result& r : per_rank) CHECK(bitwise_equal(r.params, per_rank[0].params));
  return per_rank[0];
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i + 1 << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("redco-trainer-dist-{}", std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("gpt: every dp x mp mesh trains with the single-device losses", "[trainer_dist]") {
  const auto gpt = models::gpt2(kGpt);
  const std::vector<Seq> data = make_seqs(96);
  const Result one = run_fit(gpt, data, lm_collate, lm_loss, {1, 1});
  REQUIRE(one.losses.size() == 10);
  CHECK(one.losses.back() < one.losses.front());  // it learns
  for (const Mesh& m : kMeshes) {
    if (m.world == 1) continue;
    INFO("world " << m.world << ", n_model_shards " << m.mp);
    const Result r = run_fit(gpt, data, lm_collate, lm_loss, m);
    check_close(r.losses, one.losses, 1e-5);
  }
}

TEST_CASE("cnn: every dp x mp mesh trains with the single-device losses", "[trainer_dist]") {
  const std::vector<Image> data = make_images(96);
  const Result one = run_fit(cnn, data, im_collate, im_loss, {1, 1});
  for (const Mesh& m : kMeshes) {
    if (m.world == 1) continue;
    INFO("world " << m.world << ", n_model_shards " << m.mp);
    check_close(run_fit(cnn, data, im_collate, im_loss, m).losses, one.losses, 1e-5);
  }
}

TEST_CASE("predictions come back whole and in input order on every rank", "[trainer_dist]") {
  const auto gpt = models::gpt2(kGpt);
  const std::vector<Seq> data = make_seqs(13);  // uneven: the last batches are partial
  const ParamTree params = nn::init_params(gpt, 11);
  auto predict_on = [&](Mesh m) {
    std::vector<std::vector<std::string>> per_rank(size_t(m.world));
    std::vector<double> losses(size_t(m.world));
    on_ranks(m.world, [&](comm::Comm* world, int rank) {
      Deployer d({.n_model_shards = m.mp, .seed = 3, .world = world});
      Predictor p(d, gpt, lm_collate, lm_predict);
      per_rank[size_t(rank)] = p.predict(data, 4, params);  // whole params are sliced
      Trainer t(d, gpt, lm_collate, lm_loss, make_opt(), params);
      losses[size_t(rank)] = t.eval_loss(data, 4);
    });
    for (int r = 1; r < m.world; ++r) {
      CHECK(per_rank[size_t(r)] == per_rank[0]);
      CHECK(losses[size_t(r)] == losses[0]);
    }
    return std::pair{per_rank[0], losses[0]};
  };
  const auto [one, one_loss] = predict_on({1, 1});
  REQUIRE(one.size() == data.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].starts_with(fmt::format("{}:", i)));
  for (const Mesh& m : kMeshes) {
    INFO("world " << m.world << ", n_model_shards " << m.mp);
    const auto [got, loss] = predict_on(m);
    CHECK(got == one);
    CHECK(std::abs(loss - one_loss) <= 1e-5 * one_loss);
  }
}

// Sampled generation in predict: draws are keyed by the prompt (Philox), so
// each example gets its 1-device tokens whichever replica and batch it lands
// in, and the model shards agree.
TEST_CASE("sampled generation in predict gives the 1-device tokens on every mesh",
          "[trainer_dist]") {
  const auto gpt = models::gpt2(kGpt);
  const std::vector<Seq> data = make_seqs(7);
  const ParamTree params = nn::init_params(gpt, 5);
  const auto predict = [](auto& model, const LmBatch& b, Rng) {
    std::vector<std::vector<int64_t>> prompts;
    // Each example's first 3 tokens (+ 5 new: the context, 8).
    for (int64_t i = 0; i < b.inputs.dim(0); ++i)
      prompts.push_back({b.inputs.data<int64_t>() + i * kT, b.inputs.data<int64_t>() + i * kT + 3});
    const generation::GenerationConfig how{.max_new_tokens = 5, .do_sample = true, .seed = 9};
    std::vector<std::string> out;
    const auto gen = generation::generate(model.layer(), model.params(), prompts, how, model.ctx());
    for (size_t i = 0; i < gen.sequences.size(); ++i)
      out.push_back(
          fmt::format("{}:{}", b.ids.data<int64_t>()[i], fmt::join(gen.sequences[i], ",")));
    return out;
  };
  auto predict_on = [&](Mesh m) {
    std::vector<std::vector<std::string>> per_rank(size_t(m.world));
    on_ranks(m.world, [&](comm::Comm* world, int rank) {
      Deployer d({.n_model_shards = m.mp, .seed = 3, .world = world});
      Predictor p(d, gpt, lm_collate, predict);
      per_rank[size_t(rank)] = p.predict(data, 2, params);
    });
    for (int r = 1; r < m.world; ++r) CHECK(per_rank[size_t(r)] == per_rank[0]);
    return per_rank[0];
  };
  const auto one = predict_on({1, 1});
  REQUIRE(one.size() == data.size());
  CHECK(one[0].substr(one[0].find(':')) != one[1].substr(one[1].find(':')));  // draws differ
  for (const Mesh& m : kMeshes) {
    INFO("world " << m.world << ", n_model_shards " << m.mp);
    CHECK(predict_on(m) == one);
  }
}

TEST_CASE("a checkpoint holds whole tensors and resumes on another mesh", "[trainer_dist]") {
  const auto gpt = models::gpt2(kGpt);
  const std::vector<Seq> data = make_seqs(96);
  TempDir tmp;
  const Result whole_run = run_fit(gpt, data, lm_collate, lm_loss, {1, 1});
  const Result first =
      run_fit(gpt, data, lm_collate, lm_loss, {2, 2}, {.workdir = tmp.path / "a", .max_steps = 5});
  // The files are plain safetensors of whole tensors, equal to the gathered shards.
  const fs::path ckpt = io::checkpoint_dir(tmp.path / "a", 5);
  const ParamTree saved = io::load_safetensors(ckpt / "params.safetensors");
  CHECK(bitwise_equal(saved, first.params));
  for (const shard::ParamSplit& s : shard::resolve(gpt, 1))
    CHECK(saved.at(s.name).shape() == s.shape);
  const ParamTree opt = io::load_safetensors(ckpt / "opt_state.safetensors");
  CHECK(opt.at("adamw.m.wte.weight").shape() == saved.at("wte.weight").shape());
  for (const auto& [key, t] : opt)  // moments of the model's parameters, nothing else
    if (key.starts_with("adamw.m.") || key.starts_with("adamw.v."))
      CHECK(saved.at(key.substr(8)).shape() == t.shape());

  const std::vector<double> tail(whole_run.losses.begin() + 5, whole_run.losses.end());
  for (const Mesh& m : std::vector<Mesh>{{2, 1}, {1, 1}}) {
    INFO("resumed at world " << m.world << ", n_model_shards " << m.mp);
    const fs::path dir = tmp.path / fmt::format("resume-{}-{}", m.world, m.mp);
    fs::copy(tmp.path / "a", dir, fs::copy_options::recursive);
    const Result r = run_fit(gpt, data, lm_collate, lm_loss, m, {.workdir = dir, .resume = true});
    check_close(r.losses, tail, 1e-5);
  }
}

TEST_CASE("resuming on the same mesh is bitwise exact", "[trainer_dist]") {
  const auto gpt = models::gpt2(kGpt);
  const std::vector<Seq> data = make_seqs(96);
  for (const Mesh& m : std::vector<Mesh>{{2, 1}, {2, 2}}) {
    INFO("world " << m.world << ", n_model_shards " << m.mp);
    TempDir tmp;
    const Result straight = run_fit(gpt, data, lm_collate, lm_loss, m);
    run_fit(gpt, data, lm_collate, lm_loss, m, {.workdir = tmp.path, .max_steps = 4});
    const Result resumed =
        run_fit(gpt, data, lm_collate, lm_loss, m, {.workdir = tmp.path, .resume = true});
    const std::vector<double> tail(straight.losses.begin() + 4, straight.losses.end());
    CHECK(resumed.losses == tail);
    CHECK(bitwise_equal(resumed.params, straight.params));
  }
}

TEST_CASE("only rank 0 logs, prints and writes metrics", "[trainer_dist]") {
  const std::vector<Image> data = make_images(64), valid = make_images(12);
  TempDir tmp;
  std::vector<std::ostringstream> consoles(2);
  on_ranks(2, [&](comm::Comm* world, int rank) {
    Deployer d(
        {.seed = 3, .workdir = tmp.path, .console = &consoles[size_t(rank)], .world = world});
    Trainer t(d, cnn, im_collate, im_loss, make_opt());
    t.fit(data, {.global_batch_size = 8,
                 .n_epochs = 1,
                 .eval_examples = valid,
                 .eval_every_steps = 4,
                 .log_every = 1});
    d.console() << "done\n";
  });
  CHECK(consoles[1].str().empty());
  CHECK(consoles[0].str().find("eval") != std::string::npos);
  std::ifstream in(tmp.path / "metrics.jsonl");
  int train_lines = 0, eval_lines = 0;
  for (std::string line; std::getline(in, line);) {
    train_lines += line.find("\"split\": \"train\"") != std::string::npos ||
                   line.find("\"split\":\"train\"") != std::string::npos;
    eval_lines += line.find("eval") != std::string::npos;
  }
  CHECK(train_lines == 8);  // one per step, not one per rank
  CHECK(eval_lines == 2);
  int event_files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path))
    event_files += e.path().filename().string().starts_with("events.out.tfevents");
  CHECK(event_files == 1);
}

TEST_CASE("a mesh that does not fit the world is one clear error", "[trainer_dist]") {
  comm::ThreadsWorld w(2);
  CHECK_THROWS_WITH(w.run([&](comm::Comm& c) { Deployer d({.n_model_shards = 3, .world = &c}); }),
                    Catch::Contains("n_model_shards = 3 does not divide the 2 ranks"));
  comm::ThreadsWorld w2(2);
  CHECK_THROWS_WITH(w2.run([&](comm::Comm& c) {
    Deployer d({.world = &c});
    Trainer t(d, cnn, im_collate, im_loss, make_opt());
    t.fit(make_images(16), {.global_batch_size = 3});
  }),
                    Catch::Contains("global_batch_size 3 does not split across 2"));
}

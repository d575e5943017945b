// The test device (DeviceKind::test): host memory behind an accelerator's
// rules. Everything a training run and a generation do runs on it and must
// equal the CPU run bit for bit (the kernels are the CPU's), which proves
// that nothing the library creates falls back to the CPU silently: such a
// tensor would meet a device tensor in some op, and that op would throw.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "lm_windows.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/ops/backend.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;

namespace {

const Device kTest = Device::test();

const models::Gpt2Config kGpt{
    .vocab = 64, .context = 16, .dim = 32, .layers = 2, .heads = 4, .dropout = 0.1f};

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data<float>(), y.data<float>(), x.nbytes()) == 0;
}

void check_bitwise(const ParamTree& got, const ParamTree& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(same_bits(got.at(name), t));
  }
}

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("redco-device-" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<test::Window> windows(int n) {
  std::vector<test::Window> data(static_cast<size_t>(n));
  std::mt19937_64 rng(5);
  for (test::Window& w : data)
    for (int t = 0; t < 17; ++t) w.ids.push_back(int64_t(rng() % 64));
  return data;
}

struct Run {
  ParamTree params;  // whole, on the CPU
  std::vector<double> losses;
  bool placed = true;   // every parameter and optimizer buffer was on the run's device
  float grad_norm = 0;  // the last step's, before clipping
};

// 5 AdamW steps (clipped: the gradient norm of this model is above 0.5) of a
// small GPT with dropout on a (world, mp) mesh of threads. With `stop_at`, the
// run saves at that step and a second Trainer resumes it from the checkpoint.
Run fit(const std::string& device, int world, int mp, const std::filesystem::path& workdir = {},
        int64_t stop_at = 0) {
  const std::vector<test::Window> data = windows(40);
  const auto gpt = models::gpt2(kGpt);
  std::vector<Run> out(static_cast<size_t>(world));
  auto rank = [&](comm::Comm* c) {
    train::Deployer d({.n_model_shards = mp,
                       .seed = 3,
                       .workdir = workdir,
                       .quiet = true,
                       .world = c,
                       .device = device});
    auto make = [&] {
      return train::Trainer(
          d, gpt, test::collate_windows,
          [](auto& model, const test::LmBatch& b, train::Rng) {
            return cross_entropy(model(b.inputs), b.targets);
          },
          optim::adamw(optim::constant(1e-2f), {.max_grad_norm = 0.5f}));
    };
    Run& r = out[size_t(c ? c->rank() : 0)];
    auto log = [&](const train::StepInfo& s) { r.losses.push_back(s.loss); };
    using T = decltype(make());
    std::unique_ptr<T> trainer(new T(make()));
    train::FitOptions<test::Window> o{.global_batch_size = 8, .save_at_end = false, .on_step = log};
    if (stop_at > 0) {
      o.max_steps = stop_at, o.save_at_end = true;
      trainer->fit(data, o);
      // A fresh start: everything it has comes from the checkpoint.
      trainer.reset(new T(make()));
      o.max_steps = 0, o.resume = true, o.save_at_end = false;
    }
    trainer->fit(data, o);
    for (const auto& [name, t] : trainer->params()) r.placed = r.placed && t.device() == d.device();
    for (const auto& [name, t] : trainer->optimizer().state())
      if (name != "step") r.placed = r.placed && t.device() == d.device();
    r.grad_norm = trainer->optimizer().last_grad_norm();
    for (auto& [name, t] : trainer->whole_params()) r.params.emplace(name, t.to(Device::cpu()));
  };
  if (world == 1) {
    rank(nullptr);
  } else {
    comm::ThreadsWorld w(world);
    w.run([&](comm::Comm& c) { rank(&c); });
  }
  return out[0];
}

}  // namespace

TEST_CASE("test device: its memory is its own and the host reads it only by copying", "[device]") {
  const AllocatorStats cpu0 = CachingAllocator::cpu().stats();
  const size_t dev0 = device_memory(kTest).stats(0).bytes_in_use;
  Tensor t = Tensor::full({2, 3}, 1.5f, DType::f32, kTest);
  CHECK(t.device().str() == "test:0");
  CHECK(device_memory(kTest).stats(0).bytes_in_use >= dev0 + 24);
  CHECK(CachingAllocator::cpu().stats().bytes_in_use == cpu0.bytes_in_use);
  // Pointers into device memory are refused on the host...
  for (auto read :
       std::vector<std::function<void()>>{[&] { (void)t.data<float>(); }, [&] { (void)t.raw(); }})
    CHECK_THROWS_WITH(read(),
                      Catch::Contains("lives on test:0") && Catch::Contains("t.to(Device::cpu())"));
  // ...while the copying reads (item, values, to_vector) and to() bring the values over.
  CHECK(t.view({-1}).slice0(0, 1).item() == 1.5f);
  CHECK(t.values<float>() == std::vector<float>(6, 1.5f));
  CHECK(t.to_vector() == std::vector<float>(6, 1.5f));
  CHECK(t.to(Device::cpu()).values<float>() == std::vector<float>(6, 1.5f));
  const Tensor h = Tensor::from({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  t.copy_from(h);
  const Tensor half = t.to(DType::bf16);
  CHECK(half.device() == kTest);
  CHECK(half.to(Device::cpu()).to(DType::f32).values<float>() == h.values<float>());
  Tensor back = Tensor::zeros({6});
  back.copy_from(t);
  CHECK(back.values<float>() == h.values<float>());
}

TEST_CASE("test device: an op mixing devices names the op and both devices", "[device]") {
  const Tensor d = Tensor::ones({2, 3}).to(kTest), c = Tensor::ones({2, 3});
  CHECK_THROWS_WITH(kernels::binary(BinaryOp::add, d, c),
                    Catch::Contains("binary: operands on two devices, test:0 and cpu"));
  CHECK_THROWS_WITH(kernels::matmul(c, d, false, true),
                    Catch::Contains("matmul: operands on two devices, cpu and test:0"));
  const Tensor w = Tensor::ones({3, 3}).to(kTest).set_requires_grad();
  CHECK_THROWS_WITH(matmul(c, w), Catch::Contains("operands on two devices"));
  // An op on the device gives the CPU's result, on the device.
  const Tensor y = kernels::binary(BinaryOp::add, d, d);
  CHECK(y.device() == kTest);
  CHECK(y.to(Device::cpu()).values<float>() == std::vector<float>(6, 2.f));
  CHECK_THROWS_WITH(train::Deployer({.quiet = true, .device = "tpu"}),
                    Catch::Contains("unknown device \"tpu\""));
}

TEST_CASE("Deployer: the device from its config, else REDCO_DEVICE (--device), else the CPU",
          "[device]") {
  const int gpus =
      has_device_memory(DeviceKind::cuda) ? device_memory(Device::cuda()).device_count() : 0;
  CHECK(train::Deployer({.quiet = true}).device() == Device::cpu());
  CHECK(train::Deployer({.quiet = true, .device = "test"}).device() == kTest);
  CHECK(train::Deployer({.quiet = true, .device = "auto"}).device() ==
        (gpus > 0 ? Device::cuda(0) : Device::cpu()));
  if (gpus == 0)
    CHECK_THROWS_WITH(train::Deployer({.quiet = true, .device = "cuda"}),
                      Catch::Contains("device \"cuda\"") && Catch::Contains("--device cpu"));
  ::setenv("REDCO_DEVICE", "test", 1);  // what the samples' --device test does
  const Device from_env = train::Deployer({.quiet = true}).device();
  const Device config_wins = train::Deployer({.quiet = true, .device = "cpu"}).device();
  ::unsetenv("REDCO_DEVICE");
  CHECK(from_env == kTest);
  CHECK(config_wins == Device::cpu());
}

TEST_CASE("test device: a small GPT trains as on the CPU, bit for bit", "[device]") {
  for (const auto& [world, mp] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{2, 1}}) {
    INFO("world " << world << ", n_model_shards " << mp);
    const Run cpu = fit("cpu", world, mp), dev = fit("test", world, mp);
    REQUIRE(cpu.losses.size() == 5);
    CHECK(cpu.grad_norm > 0.5f);  // so clipping took part
    CHECK(dev.grad_norm == cpu.grad_norm);
    CHECK(dev.losses == cpu.losses);
    CHECK(dev.placed);
    check_bitwise(dev.params, cpu.params);
  }
}

TEST_CASE("test device: a checkpoint saved at step 2 resumes to the uninterrupted run",
          "[device]") {
  TempDir tmp;
  const Run whole = fit("cpu", 1, 1), resumed = fit("test", 1, 1, tmp.path, 2);
  REQUIRE(resumed.losses.size() == 5);
  CHECK(resumed.losses == whole.losses);
  CHECK(resumed.placed);
  check_bitwise(resumed.params, whole.params);
}

TEST_CASE("test device: greedy generation with the KV cache", "[device]") {
  const auto gpt = models::gpt2(kGpt);
  const ParamTree cpu = nn::init_params(gpt, 7);
  ParamTree dev;
  for (const auto& [name, t] : cpu) dev.emplace(name, t.to(kTest));
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4}, {5, 6}};
  const generation::GenerationConfig config{.max_new_tokens = 8};
  const auto want = generation::generate(gpt, cpu, prompts, config);
  const auto got = generation::generate(gpt, dev, prompts, config);
  REQUIRE(want.sequences.size() == 2);
  CHECK(want.sequences[0].size() == 8);
  CHECK(got.sequences == want.sequences);
}

// Off the CPU the fused LM head pads an odd vocabulary for the GEMMs
// (autodiff/ops_lm_head.cpp; the GPU's cuBLAS is several times faster so):
// the same loss and gradients as the CPU's unpadded head, f32 and bf16,
// over several chunks, with an ignored label.
TEST_CASE("test device: the LM head pads an odd vocabulary to the same gradients", "[device]") {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](const Shape& s) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(gen);
    return t;
  };
  const Tensor x0 = rnd({70, 48}), w0 = rnd({1001, 48});
  Tensor labels = Tensor::empty({70}, DType::i64);
  for (int64_t i = 0; i < 70; ++i) labels.data<int64_t>()[i] = (i * 389) % 1001;
  labels.data<int64_t>()[5] = -100;
  for (Precision p : {Precision::f32, Precision::bf16}) {
    PrecisionGuard guard(p);
    auto run = [&](Device d, float* loss_out) {
      Tensor x = x0.to(d).set_requires_grad(), w = w0.to(d).set_requires_grad();
      const Tensor loss = linear_cross_entropy(x, w, labels.to(d), -100, 32);
      *loss_out = loss.item();
      TensorList g = grad({loss}, {x, w}, {Tensor::ones({}).to(d)});
      for (Tensor& t : g) t = t.to(Device::cpu());
      return g;
    };
    float lc = 0, ld = 0;
    const TensorList gc = run(Device::cpu(), &lc), gd = run(kTest, &ld);
    CHECK(ld == Approx(lc).epsilon(1e-6));
    for (size_t i = 0; i < gc.size(); ++i) {
      REQUIRE(gd[i].shape() == gc[i].shape());
      const std::vector<float> a = gd[i].to_vector(), b = gc[i].to_vector();
      float worst = 0;
      for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::fabs(a[j] - b[j]));
      CHECK(worst < 1e-6f);
    }
  }
}

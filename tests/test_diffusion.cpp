// Diffusion (redco/generation/diffusion.hpp): the schedules, DDIM's timesteps
// and steps against Hugging Face diffusers (committed goldens, written by
// tests/python/make_diffusion_goldens.py); DDIM with an exact noise
// predictor recovers x0, with classifier-free guidance too; the training
// loss's draws come from the rng alone.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/generation/diffusion.hpp"
#include "redco/models/unet.hpp"
#include "redco/train/bound_model.hpp"
#include "redco/train/rng.hpp"

using namespace redco;
using generation::BetaSchedule;
using redco::test::max_abs_diff;
using redco::test::randn;
namespace fs = std::filesystem;

namespace {
std::vector<std::string> golden_lines() {
  std::error_code ec;
  fs::path file;
  for (fs::path start : {fs::path(__FILE__).parent_path().parent_path(), fs::current_path()})
    for (fs::path p = fs::absolute(start, ec); file.empty() && !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/goldens/diffusion.txt", ec))
        file = p / "tests/goldens/diffusion.txt";
      if (p == p.parent_path()) break;
    }
  REQUIRE(!file.empty());
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  return lines;
}
BetaSchedule kind_of(const std::string& name) {
  REQUIRE((name == "linear" || name == "cosine"));
  return name == "linear" ? BetaSchedule::linear : BetaSchedule::cosine;
}
Tensor closed_form(double freq, double scale, bool use_sin) {
  std::vector<float> v(12);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float((use_sin ? std::sin(freq * double(i)) : std::cos(freq * double(i))) * scale);
  return Tensor::from<float>(v, {1, 3, 2, 2});
}

// The exact noise predictor for data that is the single image x0: eps = (x - sqrt(a) x0) / sqrt(1 -
// a).
generation::Denoiser exact(const generation::NoiseSchedule& s, Tensor x0_cond, Tensor x0_uncond,
                           int64_t* rows_seen = nullptr) {
  return [&s, x0_cond, x0_uncond, rows_seen](const Tensor& x, const Tensor& t, const Tensor& text) {
    if (rows_seen) *rows_seen += x.dim(0);
    std::vector<Tensor> rows;
    const auto ts = t.to_vector();
    for (int64_t b = 0; b < x.dim(0); ++b) {
      const double a = s.alphas_cumprod[size_t(ts[size_t(b)])];
      const bool uncond =
          max_abs_diff(slice(text, 0, b, b + 1), slice(text, 0, b, b + 1) * 0.f) == 0.f;
      const int64_t r = b % x0_cond.dim(0);  // guided calls stack [uncond; cond]
      const Tensor x0 = slice(uncond ? x0_uncond : x0_cond, 0, r, r + 1);
      rows.push_back((slice(x, 0, b, b + 1) - x0 * float(std::sqrt(a))) *
                     float(1.0 / std::sqrt(1.0 - a)));
    }
    return concat(rows, 0);
  };
}
}  // namespace

TEST_CASE("noise schedules and DDIM steps equal diffusers'", "[diffusion]") {
  int checked = 0;
  for (const std::string& line : golden_lines()) {
    std::istringstream in(line);
    std::string what, name;
    in >> what;
    INFO(line.substr(0, 60));
    if (what == "alphas_cumprod") {
      int64_t T = 0, n = 0;
      in >> name >> T >> n;
      const auto s = generation::noise_schedule({.kind = kind_of(name), .steps = T});
      for (int64_t k = 0; k < n; ++k) {
        int64_t i = 0;
        double want = 0;
        in >> i >> want;
        INFO(name << " T=" << T << " alphas_cumprod[" << i << "] " << s.alphas_cumprod[size_t(i)]
                  << " vs " << want);
        CHECK(std::abs(s.alphas_cumprod[size_t(i)] - want) <= 2e-4 * want);  // torch's f32 cumprod
      }
    } else if (what == "timesteps") {
      int64_t T = 0, n = 0;
      in >> T >> n;
      std::vector<int64_t> want(static_cast<size_t>(n));
      for (auto& t : want) in >> t;
      CHECK(generation::ddim_timesteps(T, n) == want);
    } else if (what == "ddim") {
      int64_t t = 0, prev = 0, n = 0;
      int clip = 0;
      in >> name >> t >> prev >> clip >> n;
      std::vector<float> want(static_cast<size_t>(n));
      for (auto& v : want) in >> v;
      const auto s = generation::noise_schedule({.kind = kind_of(name)});
      const Tensor got = generation::ddim_step(
          s, closed_form(0.9, 1.5, true), closed_form(0.4, 1.0, false), t, prev, clip ? 1.f : 0.f);
      CHECK(max_abs_diff(got, Tensor::from<float>(want, got.shape())) <= 5e-5f);
    } else {
      FAIL("unknown golden record " << what);
    }
    ++checked;
  }
  CHECK(checked == 4 + 3 + 16);
}

TEST_CASE("DDIM with an exact noise predictor recovers x0, guided or not", "[diffusion]") {
  const Tensor x0 = Tensor::uniform({2, 1, 4, 4}, 5, 1, -0.9f, 0.9f);
  const Tensor x0_u = Tensor::uniform({2, 1, 4, 4}, 5, 2, -0.3f, 0.3f);
  const Tensor noise = randn({2, 1, 4, 4}, 3), text = randn({2, 3, 5}, 4) + 0.5f;
  for (BetaSchedule kind : {BetaSchedule::linear, BetaSchedule::cosine}) {
    const auto s = generation::noise_schedule({.kind = kind});
    int64_t rows = 0;
    const Tensor got = generation::ddim_sample(s, exact(s, x0, x0_u, &rows), noise, text,
                                               {.steps = 20, .guidance = 1.f, .clip = 0.f});
    CHECK(max_abs_diff(got, x0) < 1e-4f);
    CHECK(rows == 20 * 2);  // guidance 1: the conditional rows only
    // Guidance g moves x0 to x0_u + g (x0 - x0_u): eps is affine in x0.
    rows = 0;
    const Tensor guided = generation::ddim_sample(s, exact(s, x0, x0_u, &rows), noise, text,
                                                  {.steps = 10, .guidance = 3.f, .clip = 0.f});
    CHECK(max_abs_diff(guided, x0_u + (x0 - x0_u) * 3.f) < 1e-4f);
    CHECK(rows == 10 * 4);  // unconditional and conditional rows in one call
    // Clipping keeps the guided result in [-1, 1].
    const Tensor clipped = generation::ddim_sample(s, exact(s, x0, x0_u), noise, text,
                                                   {.steps = 10, .guidance = 3.f, .clip = 1.f});
    for (float v : clipped.to_vector()) CHECK(std::abs(v) <= 1.f + 1e-5f);
  }
}

TEST_CASE("noise-prediction loss: draws from the rng alone, exact predictor gives 0",
          "[diffusion]") {
  const auto s = generation::noise_schedule({.kind = BetaSchedule::cosine, .steps = 100});
  const Tensor x0 = Tensor::uniform({64, 1, 2, 2}, 5, 1, -1.f, 1.f), text = randn({64, 2, 3}, 2);
  const train::Rng rng{.seed = 7, .step = 3, .stream = 1};
  const auto a = generation::draw_noise(s, x0, rng, 0.25f);
  const auto b = generation::draw_noise(s, x0, rng, 0.25f);
  const auto c =
      generation::draw_noise(s, x0, train::Rng{.seed = 7, .step = 4, .stream = 1}, 0.25f);
  CHECK(max_abs_diff(a.noise, b.noise) == 0.f);
  CHECK(max_abs_diff(a.t, b.t) == 0.f);
  CHECK(max_abs_diff(a.t, c.t) > 0.f);
  float dropped = 0.f;
  for (float t : a.t.to_vector()) CHECK((t >= 0.f && t < 100.f && t == std::floor(t)));
  for (float k : a.keep.to_vector()) dropped += 1.f - k;
  CHECK((dropped >= 6.f && dropped <= 28.f));  // 16 expected of 64
  // The predictor that knows x0 recovers the noise exactly; zeros give mean(noise^2).
  generation::Denoiser knows = [&](const Tensor& x, const Tensor& t, const Tensor&) {
    const Tensor signal = generation::add_noise(s, x0, x0 * 0.f, t);             // sqrt(a) x0
    const Tensor sigma = generation::add_noise(s, x0 * 0.f, x0 * 0.f + 1.f, t);  // sqrt(1 - a)
    return (x - signal) / sigma;
  };
  CHECK(generation::noise_prediction_loss(s, x0, text, a, knows).item() < 1e-8f);
  generation::Denoiser zeros = [](const Tensor& x, const Tensor&, const Tensor&) {
    return x * 0.f;
  };
  CHECK(std::abs(generation::noise_prediction_loss(s, x0, text, a, zeros).item() -
                 mean(square(a.noise)).item()) < 1e-6f);
  // Dropped rows see zero text, kept ones their own.
  generation::Denoiser sees = [&](const Tensor& x, const Tensor&, const Tensor& t) {
    CHECK(max_abs_diff(t, text * a.keep) == 0.f);
    return x;
  };
  generation::noise_prediction_loss(s, x0, text, a, sees);
}

TEST_CASE("a UNet through a bound model: trained by the loss, sampled by DDIM", "[diffusion]") {
  const auto model =
      models::unet({.channels = 1, .size = 8, .base = 4, .text_dim = 6, .heads = 2, .groups = 2});
  const nn::ParamTree params = nn::init_params(model, 3);
  const auto s = generation::noise_schedule({.steps = 50});
  const Tensor x0 = Tensor::uniform({2, 1, 8, 8}, 5, 1, -1.f, 1.f), text = randn({2, 3, 6}, 9);
  auto [loss, grads] = value_and_grad(
      [&](const nn::ParamTree& p) {
        train::BoundModel bound(model, p, nn::Ctx{.train = true});
        auto eps = [&](const Tensor& x, const Tensor& t, const Tensor& txt) {
          return models::predict_noise(bound, x, t, txt);
        };
        return generation::noise_prediction_loss(s, x0, text, train::Rng{.seed = 1}, eps, 0.1f);
      },
      params);
  CHECK(std::isfinite(loss.item()));
  CHECK(grads.size() == params.size());
  CHECK(max_abs_diff(grads.at("mid_attn.cross_attn.k_proj.weight"),
                     params.at("mid_attn.cross_attn.k_proj.weight") * 0.f) > 0.f);
  train::BoundModel bound(model, params, nn::Ctx{});
  auto eps = [&](const Tensor& x, const Tensor& t, const Tensor& txt) {
    return models::predict_noise(bound, x, t, txt);
  };
  const Tensor img =
      generation::ddim_sample(s, eps, randn({2, 1, 8, 8}, 10), text, {.steps = 5, .guidance = 2.f});
  CHECK(img.shape() == Shape{2, 1, 8, 8});
  CHECK_FALSE(bound.ctx().timesteps.defined());  // predict_noise leaves the context as it was
}

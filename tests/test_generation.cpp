// Generation with the KV cache: the same tokens as transformers.generate
// (greedy, penalties, beam search: tests/fixtures/hf/*/generation.json from
// tests/python/make_generation_goldens.py), as the uncached loop, alone or in
// any batch, on 1 or 2 model shards; sampling keyed by the prompt.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "generation_goldens.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/generation/generate.hpp"
#include "redco/io/json.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"
#include "reference_generate.hpp"

using namespace redco;
namespace fs = std::filesystem;
using generation::GenerationConfig;
using Prompts = std::vector<std::vector<int64_t>>;

namespace {

fs::path fixture(const std::string& name) { return test::hf_fixture(name); }
using test::config_of;
using test::ints;
using test::until_eos;

template <typename M>
void check_goldens(const std::string& name) {
  INFO("fixture " << name);
  const auto p = models::from_pretrained<M>(fixture(name));
  const io::Json cases = test::generation_cases(name);
  for (size_t i = 0; i < cases.size(); ++i) {
    const io::Json& k = cases.at(i);
    INFO("case " << i << ": " << k.at("config").dump());
    const GenerationConfig c = config_of(k.at("config"));
    const auto out = generation::generate(p.model, p.params, {ints(k.at("prompt"))}, c);
    if (c.num_beams == 1) {
      REQUIRE(out.sequences.size() == 1);
      CHECK(out.sequences[0] == ints(k.at("tokens")));
      continue;
    }
    REQUIRE(int64_t(out.sequences.size()) == c.num_return_sequences);
    for (size_t s = 0; s < out.sequences.size(); ++s) {
      CHECK(out.sequences[s] == until_eos(ints(k.at("sequences").at(s)), c));
      CHECK(std::abs(out.scores[s] - float(k.at("scores").at(s).as_double())) < 1e-4f);
    }
  }
}

}  // namespace

TEST_CASE("greedy, penalties and beam search equal transformers.generate", "[generation]") {
  check_goldens<models::Gpt2>("gpt2");
  check_goldens<models::Llama>("llama");
  check_goldens<models::Llama>("llama3_tied");
  check_goldens<models::Llama>("qwen2");
}

TEST_CASE("cached greedy equals the uncached loop; batched equals one by one", "[generation]") {
  const auto p = models::from_pretrained<models::Llama>(fixture("llama_head_dim"));
  const Prompts prompts{{5, 17, 33, 2}, {60}, {9, 9, 41, 70, 12, 3, 88}, {1, 2}};
  const GenerationConfig c{.max_new_tokens = 20};
  const auto batched = generation::generate(p.model, p.params, prompts, c);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    const auto alone = generation::generate(p.model, p.params, {prompts[i]}, c);
    CHECK(alone.sequences[0] == batched.sequences[i]);
    const Tensor prompt = Tensor::from<int64_t>(std::span<const int64_t>(prompts[i]),
                                                {1, int64_t(prompts[i].size())});
    const Tensor full = test::generate(p.model, p.params, prompt, {.max_new = 20, .greedy = true});
    const std::vector<int64_t> all = full.values<int64_t>();
    CHECK(std::vector<int64_t>(all.begin() + int64_t(prompts[i].size()), all.end()) ==
          batched.sequences[i]);
  }
}

TEST_CASE("generation on 2 model shards gives the 1-shard tokens", "[generation]") {
  const Prompts prompts{{5, 17, 33, 2}, {60, 1, 2}};
  // f32, and bf16 in decode panels (each rank packs its own slice of every
  // matrix, the vocabulary-split embedding and LM head too).
  const models::hf::LoadOptions f32_opts{}, panel_opts{.dtype = DType::bf16, .decode_panels = true};
  for (const auto& [name, load] :
       {std::pair{"gpt2", f32_opts}, std::pair{"llama_head_dim", f32_opts},
        std::pair{"gpt2", panel_opts}, std::pair{"llama_head_dim", panel_opts}}) {
    INFO(name << (load.decode_panels ? " in decode panels" : ""));
    std::visit(
        [&](const auto& whole) {
          using M = std::decay_t<decltype(whole.model)>;
          const GenerationConfig greedy{.max_new_tokens = 10};
          const GenerationConfig beams{.max_new_tokens = 8, .num_beams = 3};
          const auto want = generation::generate(whole.model, whole.params, prompts, greedy);
          const auto want_beams = generation::generate(whole.model, whole.params, prompts, beams);
          std::vector<generation::Generated> got(2), got_beams(2);
          comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
            models::hf::LoadOptions opts = load;
            opts.n_shards = 2, opts.rank = comm.rank();
            const auto part = models::from_pretrained<M>(fixture(name), opts);
            nn::Ctx ctx;
            ctx.mp = &comm;
            got[size_t(comm.rank())] =
                generation::generate(part.model, part.params, prompts, greedy, ctx);
            got_beams[size_t(comm.rank())] =
                generation::generate(part.model, part.params, prompts, beams, ctx);
          });
          for (int r = 0; r < 2; ++r) {
            CHECK(got[size_t(r)].sequences == want.sequences);
            CHECK(got_beams[size_t(r)].sequences == want_beams.sequences);
          }
        },
        models::from_pretrained_any(fixture(name), load));
  }
}

TEST_CASE("sampling: a prompt draws the same tokens in any batch", "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(fixture("gpt2"));
  GenerationConfig c{.max_new_tokens = 16,
                     .do_sample = true,
                     .temperature = 0.9f,
                     .top_k = 20,
                     .top_p = 0.95f,
                     .min_p = 0.01f,
                     .seed = 7};
  const Prompts prompts{{5, 17, 33, 2}, {60}, {9, 9, 41}};
  const auto batched = generation::generate(p.model, p.params, prompts, c);
  const auto alone = generation::generate(p.model, p.params, {prompts[1]}, c);
  CHECK(alone.sequences[0] == batched.sequences[1]);
  c.seed = 8;
  CHECK(generation::generate(p.model, p.params, {prompts[1]}, c).sequences[0] !=
        alone.sequences[0]);
  // Several return sequences differ from each other.
  c.num_return_sequences = 3;
  const auto three = generation::generate(p.model, p.params, {prompts[0]}, c);
  REQUIRE(three.sequences.size() == 3);
  CHECK(three.sequences[0] != three.sequences[1]);
  // Streaming: the callback sees every token in order and can stop a row.
  std::vector<int64_t> seen;
  const auto stopped = generation::generate(p.model, p.params, {prompts[0]}, {.max_new_tokens = 10},
                                            {}, [&](int64_t, int64_t tok) {
                                              seen.push_back(tok);
                                              return seen.size() < 4;
                                            });
  CHECK(stopped.sequences[0].size() == 4);
  CHECK(seen == stopped.sequences[0]);
}

TEST_CASE("generation refuses bad options with one message", "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(fixture("gpt2"));
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(generation::generate(p.model, p.params, {{}}, {}), Contains("empty"));
  CHECK_THROWS_WITH(generation::generate(p.model, p.params, {{1}}, {.top_p = 0.f}),
                    Contains("top_p"));
  CHECK_THROWS_WITH(
      generation::generate(p.model, p.params, {{1}}, {.num_beams = 2, .num_return_sequences = 3}),
      Contains("num_return_sequences"));
  // The fixture's context is 32 positions.
  CHECK_THROWS_WITH(generation::generate(p.model, p.params, {{1, 2, 3}}, {.max_new_tokens = 40}),
                    Contains("maximum 32"));
}

TEST_CASE("bf16 weights decode as their f32 widening does", "[generation][bf16]") {
  // Loaded as bf16, the projections of a decoded token and the embedding
  // lookups read the weights as stored (ops/cpu/skinny_bf16.hpp) and the KV
  // cache is bf16; the same values widened to f32 take the general path (with
  // a bf16 cache asked for). Same tokens, near logits.
  auto same_tokens = [&]<typename M>(const std::string& name) {
    const auto p16 = models::from_pretrained<M>(fixture(name), {.dtype = DType::bf16});
    nn::ParamTree p32;
    for (const auto& [k, t] : p16.params) p32.emplace(k, t.to(DType::f32));
    const Prompts prompts{{5, 17, 33, 2}, {60}, {9, 9, 41, 70, 12, 3, 88}};
    const GenerationConfig c{.max_new_tokens = 16};
    GenerationConfig c32 = c;
    c32.cache_dtype = DType::bf16;
    const auto a = generation::generate(p16.model, p16.params, prompts, c);
    const auto b = generation::generate(p16.model, p32, prompts, c32);
    INFO(name);
    CHECK(a.sequences == b.sequences);
  };
  same_tokens.operator()<models::Gpt2>("gpt2");
  same_tokens.operator()<models::Llama>("llama");
  same_tokens.operator()<models::Llama>("qwen2");
}

TEST_CASE("bf16 weights in decode panels decode as row-major bf16 does", "[generation][bf16]") {
  // Loaded with decode_panels, every matrix is packed (pack_panels):
  // decode projections and prefills below 32 rows read the panels
  // (ops/cpu/skinny_panels.hpp), tied heads' embedding lookups gather from
  // them, and q, k and v are projected one by one, never stacked (which
  // would widen them). Same tokens as the same bf16 values row-major.
  auto same_tokens = [&]<typename M>(const std::string& name) {
    const auto pp =
        models::from_pretrained<M>(fixture(name), {.dtype = DType::bf16, .decode_panels = true});
    nn::ParamTree rows;
    int64_t packed = 0;
    for (const auto& [k, t] : pp.params) {
      packed += in_panels(t);
      CHECK((t.rank() == 2 && k.find("wpe") == std::string::npos) == in_panels(t));
      rows.emplace(k, t.to(DType::bf16));
    }
    CHECK(packed > 0);
    const Prompts prompts{{5, 17, 33, 2}, {60}, {9, 9, 41, 70, 12, 3, 88}, {1, 2, 3, 4, 5, 6}};
    const GenerationConfig c{.max_new_tokens = 16};
    const auto a = generation::generate(pp.model, pp.params, prompts, c);
    const auto b = generation::generate(pp.model, rows, prompts, c);
    INFO(name);
    CHECK(a.sequences == b.sequences);
  };
  same_tokens.operator()<models::Gpt2>("gpt2");  // tied: wte is the LM head
  same_tokens.operator()<models::Llama>("llama");
  same_tokens.operator()<models::Llama>("qwen2");
}

TEST_CASE("long prompts prefill on the prefill kernels within bf16 rounding of f32",
          "[generation][bf16][int8]") {
  // 2 prompts x 24 tokens = 48 rows: bf16 panels and int8 rows take the
  // prefill kernels (ops/cpu/prefill_panels.hpp, prefill_i8.hpp: AMX or
  // vdpbf16ps where the CPU has them, activations rounded to bf16), not the
  // decode kernels. The prefill's logits against the same weights in f32.
  const auto prefill_logits = [](const auto& p, const nn::ParamTree& params) {
    Prompts prompts(2);
    for (int64_t i = 0; i < 24; ++i) {
      prompts[0].push_back((i * 7 + 3) % 90 + 3);
      prompts[1].push_back((i * 13 + 5) % 90 + 3);
    }
    std::vector<float> first;
    const generation::StepFn step = [&](const Tensor& ids, nn::Ctx& c) {
      Tensor logits = nn::apply(p.model, params, ids, c);
      if (first.empty()) first = logits.to(DType::f32).to_vector();
      return logits;
    };
    GenerationConfig c{.max_new_tokens = 2};
    c.cache_dtype = DType::bf16;  // as bf16 and int8 weights have by default
    generation::generate(step, prompts, c, nn::Ctx{});
    return first;
  };
  for (const auto& [dtype, panels] :
       {std::pair{DType::bf16, true}, std::pair{DType::i8, false}, std::pair{DType::i8, true}}) {
    const auto p = models::from_pretrained<models::Llama>(
        fixture("llama"), {.dtype = dtype, .decode_panels = panels});
    nn::ParamTree f32;
    for (const auto& [k, t] : p.params) f32.emplace(k, t.to(DType::f32));
    const std::vector<float> got = prefill_logits(p, p.params), want = prefill_logits(p, f32);
    REQUIRE(got.size() == want.size());
    REQUIRE(got.size() == 2 * 96);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      scale = std::max(scale, std::abs(double(want[i])));
    }
    INFO(dtype_name(dtype) << (panels ? " in panels" : "") << ": worst " << worst << " of "
                           << scale);
    // Rounding the activations to bf16 moves these logits by up to ~1.5% of
    // their scale (the f32 chain kernels: ~1e-7); a misplaced weight, row or
    // scale moves them by the scale itself.
    CHECK(scale > 0.01);
    CHECK(worst <= 3e-2 * scale);
  }
}

TEST_CASE("int8 weights decode as their dequantized values do", "[generation][int8]") {
  // Loaded as i8, every matrix is quantized by rows: decode projections read a
  // byte a weight (ops/cpu/skinny_i8.hpp; in decode panels skinny_i8_panels.hpp),
  // embedding lookups scale the rows they gather; the dequantized f32 values
  // take the general path.
  auto same_tokens = [&]<typename M>(const std::string& name, bool panels) {
    const auto p8 =
        models::from_pretrained<M>(fixture(name), {.dtype = DType::i8, .decode_panels = panels});
    nn::ParamTree p32;
    int64_t quantized = 0;
    for (const auto& [k, t] : p8.params) {
      quantized += (panels ? in_i8_panels(t) : row_scales(t) != nullptr);
      CHECK((t.rank() == 2) == (t.dtype() == DType::i8));  // matrices only; norms stay f32
      p32.emplace(k, t.to(DType::f32));
    }
    CHECK(quantized > 0);
    const Prompts prompts{{5, 17, 33, 2}, {60}, {9, 9, 41, 70, 12, 3, 88}};
    const GenerationConfig c{.max_new_tokens = 16};
    GenerationConfig c32 = c;
    c32.cache_dtype = DType::bf16;  // as int8 weights have by default
    const auto a = generation::generate(p8.model, p8.params, prompts, c);
    const auto b = generation::generate(p8.model, p32, prompts, c32);
    INFO(name << (panels ? " in panels" : ""));
    CHECK(a.sequences == b.sequences);
  };
  for (const bool panels : {false, true}) {
    same_tokens.operator()<models::Gpt2>("gpt2", panels);
    same_tokens.operator()<models::Llama>("llama", panels);
  }
}

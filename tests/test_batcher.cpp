// Continuous batching (generation/batcher.hpp): every request gets the tokens
// generation::generate gives its prompt alone, whatever joins or leaves the
// batch around it; stop strings end the text before them; cancellation and
// bad requests; the KV cache's rows move without losing a token.
#include <catch2/catch.hpp>
#include <map>

#include "generation_goldens.hpp"
#include "redco/generation/batcher.hpp"
#include "redco/models/causal_lm.hpp"
#include "redco/models/pretrained.hpp"

using namespace redco;
using generation::Batcher;
using generation::Finish;
using generation::GenerationConfig;

namespace {

struct Outcome {
  std::vector<int64_t> tokens;
  std::string text;
  std::optional<Finish> why;
};

// The step a Batcher runs: the model's forward pass with the cache in ctx.
generation::StepFn step_of(const models::Pretrained<models::CausalLM>& p) {
  return [&p](const Tensor& ids, nn::Ctx& ctx) { return nn::apply(p.model, p.params, ids, ctx); };
}

generation::RequestEvents record(Outcome& o, int64_t cancel_after = -1) {
  return {.on_token =
              [&o, cancel_after](int64_t t, std::string_view text) {
                o.tokens.push_back(t);
                o.text += text;
                return cancel_after < 0 || int64_t(o.tokens.size()) < cancel_after;
              },
          .on_finish =
              [&o](Finish why, std::string_view text) {
                REQUIRE(!o.why);  // once
                o.why = why;
                o.text += text;
              }};
}

void run_until_idle(Batcher& b) {
  for (int guard = 0; b.step(); ++guard) REQUIRE(guard < 10000);
  CHECK(b.running() == 0);
  CHECK(b.queued() == 0);
  CHECK(b.free_rows() == b.options().slots);
}

const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 17, 33}, {40}, {9, 9, 41, 70, 12, 3, 88, 21}, {60, 4}, {11, 23, 5, 8, 2, 90}, {7, 7}};

}  // namespace

TEST_CASE("continuous batching gives each request the tokens generate gives it alone",
          "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  for (bool sample : {false, true}) {
    INFO("sampling " << sample);
    // 2 rows for 6 requests of different lengths: requests wait, join as
    // others end, and rows move (the last running row into a freed one).
    Batcher b(step_of(p), {.slots = 2, .context = 64, .vocab_size = p.model.vocab_size()});
    std::vector<Outcome> out(kPrompts.size());
    std::vector<GenerationConfig> configs;
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      GenerationConfig c{.max_new_tokens = 3 + int64_t(i % 3) * 5};
      c.do_sample = sample, c.temperature = 0.8f, c.top_k = 20, c.seed = 7 + i;
      configs.push_back(c);
      REQUIRE(b.submit(kPrompts[i], c, record(out[i])));
      if (i == 3) b.step();  // the later ones arrive while others run
    }
    run_until_idle(b);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      INFO("request " << i);
      const auto alone = generation::generate(p.model, p.params, {kPrompts[i]}, configs[i]);
      CHECK(out[i].tokens == alone.sequences[0]);
      CHECK(out[i].why == Finish::length);
    }
  }
}

TEST_CASE("a batcher's text: streamed pieces, end ids, stop strings dropped from the text",
          "[batcher]") {
  const auto dir = test::hf_fixture("gpt2_text");
  const auto p = models::from_pretrained<models::CausalLM>(dir);
  const auto tok = data::Tokenizer::from_file(dir);
  Batcher b(step_of(p), {.slots = 3, .context = 48}, &tok);
  std::vector<int64_t> prompt;
  for (int32_t id : tok.encode("In the beginning God created").ids) prompt.push_back(id);
  const GenerationConfig plain{.max_new_tokens = 24};
  const auto alone = generation::generate(p.model, p.params, {prompt}, plain).sequences[0];
  std::vector<int32_t> ids(alone.begin(), alone.end());
  const std::string full = tok.decode(ids, true);
  REQUIRE(full.size() > 6);

  Outcome whole, stopped, eos;
  b.submit(prompt, plain, record(whole));
  // A stop string from the middle of the text: the text ends before it.
  const std::string stop = full.substr(full.size() / 2, 3);
  GenerationConfig with_stop = plain;
  with_stop.stop_strings = {"never appears \x01", stop};
  b.submit(prompt, with_stop, record(stopped));
  // An end id: the request ends at it.
  GenerationConfig with_eos = plain;
  with_eos.eos_token_ids = {alone[4]};
  b.submit(prompt, with_eos, record(eos));
  run_until_idle(b);

  CHECK(whole.text == full);
  CHECK(whole.why == Finish::length);
  CHECK(stopped.why == Finish::stop);
  CHECK(stopped.text == full.substr(0, full.find(stop)));
  CHECK(stopped.tokens ==
        std::vector<int64_t>(alone.begin(), alone.begin() + int64_t(stopped.tokens.size())));
  CHECK(eos.why == Finish::stop);
  CHECK(eos.tokens.back() == alone[4]);
  CHECK(eos.tokens.size() <= 5);
}

TEST_CASE("a batcher cancels, refuses and keeps the others going", "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  Batcher b(step_of(p),
            {.slots = 2, .context = 32, .max_queue = 3, .vocab_size = p.model.vocab_size()});
  const GenerationConfig c{.max_new_tokens = 10};
  Outcome a, by_callback, queued, by_id;
  b.submit(kPrompts[0], c, record(a));
  b.submit(kPrompts[1], c, record(by_callback, 3));  // its on_token says stop at the third
  const auto q = b.submit(kPrompts[2], c, record(queued));
  const auto id = b.submit(kPrompts[3], c, record(by_id));
  REQUIRE((q && id));
  // Two free rows and three waiting: a sixth request is refused, not dropped later.
  Outcome refused;
  b.submit(kPrompts[4], c, {});
  CHECK_FALSE(b.submit(kPrompts[5], c, record(refused)));
  CHECK(!refused.why);
  b.cancel(*id);  // still waiting: it ends without a token
  run_until_idle(b);
  CHECK(by_callback.why == Finish::cancelled);
  CHECK(by_callback.tokens.size() == 3);
  CHECK(by_id.why == Finish::cancelled);
  CHECK(by_id.tokens.empty());
  for (auto* o : {&a, &queued}) CHECK(o->why == Finish::length);
  const auto alone = generation::generate(p.model, p.params, {kPrompts[2]}, c);
  CHECK(queued.tokens == alone.sequences[0]);

  auto refuses = [&](std::vector<int64_t> prompt, GenerationConfig g, const char* says) {
    INFO(says);
    CHECK_THROWS_WITH(b.submit(std::move(prompt), g, {}), Catch::Contains(says));
  };
  refuses({}, c, "the prompt is empty");
  refuses(std::vector<int64_t>(32, 1), c, "the prompt has 32 tokens but the context holds 32");
  refuses({1, p.model.vocab_size()}, c, "not in the vocabulary");
  refuses({1}, GenerationConfig{.num_beams = 2}, "one sequence per request");
  refuses({1}, GenerationConfig{.stop_strings = {"x"}}, "stop strings need the tokenizer");
  refuses({1}, GenerationConfig{.do_sample = true, .top_p = 0.f}, "top_p");

  // A request that reaches the context's end stops there, for length.
  Outcome full;
  b.submit(std::vector<int64_t>(30, 3), GenerationConfig{.max_new_tokens = 100}, record(full));
  run_until_idle(b);
  CHECK(full.why == Finish::length);
  CHECK(full.tokens.size() == 2);
}

TEST_CASE("a KV cache's rows narrow and move with their tokens", "[batcher]") {
  nn::KVCache cache(3, 4, DType::f32), other(1, 6, DType::f32);
  auto& s = cache.self("a", 2, 2, DType::f32);
  REQUIRE(s.k.shape() == Shape{3, 2, 4, 2});
  auto& o = other.self("a", 2, 2, DType::f32);
  for (int64_t i = 0; i < o.k.numel(); ++i)
    o.k.data<float>()[i] = float(i), o.v.data<float>()[i] = -float(i);
  other.begin({3});
  other.commit();
  cache.copy_row(2, other, 0);  // a prefilled row in: 3 tokens x 2 heads
  CHECK(cache.length(2) == 3);
  cache.set_rows(1);
  CHECK(cache.batch() == 1);
  CHECK(cache.self("a", 2, 2, DType::f32).k.shape() == Shape{1, 2, 4, 2});
  cache.copy_row(0, 2);  // the last row into a freed one
  const auto& k = cache.self("a", 2, 2, DType::f32).k;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t d = 0; d < 2; ++d)
        CHECK(k.data<float>()[(h * 4 + t) * 2 + d] == float((h * 6 + t) * 2 + d));
  CHECK(cache.length(0) == 3);
  CHECK_THROWS_WITH(cache.set_rows(4), Catch::Contains("the cache holds 3"));
  cache.begin({1});
  CHECK_THROWS_WITH(cache.set_rows(2), Catch::Contains("between steps"));
}

TEST_CASE("a batcher reuses the keys and values of a shared prompt prefix", "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  // A 20-token "system prompt" shared by every request, then each its own question.
  std::vector<int64_t> system;
  for (int64_t i = 0; i < 20; ++i) system.push_back(3 + (i * 7) % 90);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& tail : kPrompts) {
    prompts.push_back(system);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
  }
  // A prompt seen just before (still stored): all but its last token reused.
  const std::vector<int64_t> again = prompts[2];
  prompts.insert(prompts.begin() + 3, again);
  for (int64_t prefix_rows : {0, 2}) {
    INFO("prefix rows " << prefix_rows);
    Batcher b(step_of(p), {.slots = 2,
                           .context = 64,
                           .vocab_size = p.model.vocab_size(),
                           .prefix_rows = prefix_rows,
                           .min_prefix = 16});
    const GenerationConfig c{.max_new_tokens = 6};
    std::vector<Outcome> out(prompts.size());
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      b.submit(prompts[i], c, record(out[i]));
      total += int64_t(prompts[i].size());
    }
    run_until_idle(b);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("request " << i);
      CHECK(out[i].tokens == generation::generate(p.model, p.params, {prompts[i]}, c).sequences[0]);
    }
    // Every prompt but the first finds the system prompt (a running row or a
    // stored prompt); the repeated one all of itself but the last token.
    const int64_t reused =
        prefix_rows == 0 ? 0 : 20 * int64_t(kPrompts.size() - 1) + int64_t(prompts[3].size()) - 1;
    CHECK(b.reused_tokens() == reused);
    CHECK(b.prompt_tokens() + b.reused_tokens() == total);
  }
}

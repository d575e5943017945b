// Continuous batching (generation/batcher.hpp): every request gets the tokens
// generation::generate gives its prompt alone, whatever joins or leaves the
// batch around it; stop strings end the text before them; cancellation and
// bad requests; the KV cache's rows move without losing a token; a paged
// cache shares, copies on write and moves blocks, and gives a model the
// logits of rows of slots bit for bit.
#include <catch2/catch.hpp>
#include <limits>
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
  // No block leaked: every one free or held by a stored prompt.
  CHECK(b.kv_blocks_free() + b.kv_blocks_stored() == b.kv_blocks());
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
  b.cancel(*id);  // still waiting: it ends without a token, at the next step
  b.step();
  CHECK(by_id.why == Finish::cancelled);
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

namespace {
// Row `row`'s tokens of layer "a", head h, as stored (f32), through the
// cache's own reader: a copy into a one-row cache of plain slots.
std::vector<float> tokens_of(const nn::KVCache& cache, int64_t row, int64_t h) {
  nn::KVCache out(1, cache.capacity(), DType::f32);
  out.copy_row(0, cache, row);
  const auto& s = out.self("a", 2, 2, DType::f32);
  const float* k = s.k.data<float>() + h * cache.capacity() * 2;
  return {k, k + cache.length(row) * 2};
}
}  // namespace

TEST_CASE("a paged KV cache shares blocks, copies the shared one it writes into, moves rows",
          "[batcher]") {
  // 3 rows of capacity 10 over 6 blocks of 4 tokens; layer "a": 2 heads x 2.
  nn::KVCache cache(3, 10, DType::f32, {.block_tokens = 4, .blocks = 6});
  REQUIRE(cache.paged());
  const nn::KVBlocks& kb = *cache.blocks();
  auto& pool = cache.self("a", 2, 2, DType::f32);
  REQUIRE(pool.k.shape() == Shape{6, 2, 4, 2});
  // A step writes token values: row r's token t, head h, element d = 1000r + 10t + h + d/10.
  auto step = [&](std::vector<int64_t> appended, int64_t T) {
    const auto B = int64_t(appended.size());
    cache.set_rows(B);
    cache.begin(appended);
    Tensor k = Tensor::empty({B, 2, T, 2});
    for (int64_t r = 0; r < B; ++r)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < 2; ++d)
            k.data<float>()[((r * 2 + h) * T + t) * 2 + d] =
                float(1000 * r + 10 * (cache.length(r) + t) + h) + 0.1f * float(d);
    cache.store(cache.self("a", 2, 2, DType::f32), k, k);
    cache.commit();
  };
  auto expect = [&](int64_t row, int64_t writer_row, int64_t n) {
    const auto got = tokens_of(cache, row, 1);
    REQUIRE(int64_t(got.size()) == n * 2);
    for (int64_t t = 0; t < n; ++t)
      CHECK(got[size_t(t * 2 + 1)] == float(1000 * writer_row + 10 * t + 1) + 0.1f);
  };
  step({6}, 6);  // row 0: 6 tokens, 2 blocks
  CHECK(kb.free_blocks() == 4);
  CHECK(cache.block_table().shape() == Shape{1, 3});
  cache.copy_row(1, cache, 0, 5);  // row 1 shares both blocks (the second partly)
  CHECK(kb.free_blocks() == 4);
  CHECK(kb.at(1, 0) == kb.at(0, 0));
  CHECK(kb.shared(kb.at(0, 1)));
  CHECK(cache.blocks_to_append(std::vector<int64_t>{1, 1}) == 2);  // both write the shared one
  // Both write into the shared second block: row 0 first, into a copy of it;
  // row 1 then holds the original alone and writes into it.
  step({1, 1}, 1);
  CHECK(kb.free_blocks() == 3);
  CHECK(kb.at(1, 0) == kb.at(0, 0));
  CHECK(kb.at(1, 1) != kb.at(0, 1));
  CHECK(cache.length(0) == 7);
  CHECK(cache.length(1) == 6);
  // Row 0 kept its tokens; row 1 has row 0's first 5 and its own sixth.
  expect(0, 0, 7);
  const auto got = tokens_of(cache, 1, 0);
  CHECK(got[5 * 2] == 1000.f + 50.f);
  CHECK(got[4 * 2] == 40.f);
  cache.move_row(0, 1);  // row 0 ends: row 1's blocks and tokens take its place
  CHECK(cache.length(1) == 0);
  CHECK(kb.free_blocks() == 4);  // row 0's own second block came back; the first is row 1's now
  CHECK(tokens_of(cache, 0, 0) == got);
  // Out of blocks: a clear message, and nothing taken is lost.
  cache.release_row(0);
  CHECK(kb.free_blocks() == 6);
  step({10, 10, 0}, 10);  // rows 0 and 1: 3 blocks each
  CHECK(kb.free_blocks() == 0);
  cache.set_rows(3);
  CHECK_THROWS_WITH(cache.begin({0, 0, 1}), Catch::Contains("blocks of 4 tokens are all held"));
  // Beam search's reorder: rows take others' blocks (shared, not copied).
  nn::KVCache beams(2, 8, DType::f32, {.block_tokens = 4, .blocks = 4});
  beams.self("a", 2, 2, DType::f32);
  beams.begin({5, 3});
  beams.commit();
  beams.reorder({1, 1});
  CHECK(beams.blocks()->at(0, 0) == beams.blocks()->at(1, 0));
  CHECK(beams.blocks()->free_blocks() == 3);
  CHECK(beams.length(0) == 3);
}

TEST_CASE("a paged KV cache gives a model the logits of rows of slots, bit for bit", "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  const std::vector<int64_t> prompt = {9, 9, 41, 70, 12, 3, 88, 21, 5, 17, 33};
  for (int64_t block : {4, 16}) {
    INFO("block " << block);
    nn::KVCache rows(2, 24), paged(2, 24, std::nullopt, {.block_tokens = block, .blocks = 12});
    nn::Ctx ctx;
    ctx.train = false;
    NoGradGuard no_grad;
    auto run = [&](nn::KVCache& cache, const Tensor& ids, std::vector<int64_t> appended) {
      ctx.cache = &cache;
      cache.begin(std::move(appended));
      Tensor logits = nn::apply(p.model, p.params, ids, ctx);
      cache.commit();
      return logits;
    };
    // A ragged prefill (row 1 shorter, right-padded), then decode steps.
    Tensor ids = Tensor::full({2, 11}, 1.f, DType::i64);
    std::copy(prompt.begin(), prompt.end(), ids.data<int64_t>());
    std::copy(prompt.begin(), prompt.begin() + 6, ids.data<int64_t>() + 11);
    const Tensor a = run(rows, ids, {11, 6}), b = run(paged, ids, {11, 6});
    REQUIRE(a.shape() == b.shape());
    for (int64_t i = 0; i < a.numel(); ++i) REQUIRE(a.data<float>()[i] == b.data<float>()[i]);
    for (int64_t t = 0; t < 6; ++t) {
      Tensor next = Tensor::full({2, 1}, float(30 + t), DType::i64);
      const Tensor x = run(rows, next, {1, 1}), y = run(paged, next, {1, 1});
      for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(x.data<float>()[i] == y.data<float>()[i]);
    }
  }
}

TEST_CASE(
    "a batcher whose KV cache holds fewer tokens than its rows could: requests wait for "
    "blocks and get generate's tokens",
    "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  std::vector<int64_t> system;
  for (int64_t i = 0; i < 20; ++i) system.push_back(3 + (i * 5) % 80);
  // 4 rows of context 64 (256 tokens), but 80 tokens of cache in blocks of 8:
  // a request of up to 32 tokens reserves 4 blocks, so at most 2 run at once
  // (with the system prompt shared, and a stored prompt given up when needed).
  Batcher b(step_of(p), {.slots = 4,
                         .context = 64,
                         .vocab_size = p.model.vocab_size(),
                         .prefix_rows = 2,
                         .min_prefix = 16,
                         .kv_block = 8,
                         .kv_tokens = 80});
  CHECK(b.kv_blocks() == 10);
  const GenerationConfig c{.max_new_tokens = 8};
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& tail : kPrompts) {
    prompts.push_back(system);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
  }
  std::vector<Outcome> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) REQUIRE(b.submit(prompts[i], c, record(out[i])));
  int64_t most_running = 0;
  for (int guard = 0; b.step(); ++guard) {
    REQUIRE(guard < 10000);
    most_running = std::max(most_running, b.running());
    CHECK(b.kv_blocks_free() >= 0);
  }
  CHECK(most_running == 2);
  CHECK(b.reused_tokens() >= 20 * int64_t(prompts.size() - 1));
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(out[i].tokens == generation::generate(p.model, p.params, {prompts[i]}, c).sequences[0]);
  }
  run_until_idle(b);
  // A request that could never fit the pool is refused, naming the fix.
  Batcher small(step_of(p), {.slots = 1, .context = 64, .kv_block = 8, .kv_tokens = 40});
  CHECK_THROWS_WITH(
      small.submit(std::vector<int64_t>(30, 3), GenerationConfig{.max_new_tokens = 20}, {}),
      Catch::Contains("the request may hold 50 tokens (a prompt of 30 and up to 20 "
                      "new), more than the KV cache's 40 (5 blocks of 8)"));
  // However many tokens it asks for, a request holds at most the context.
  CHECK_THROWS_WITH(
      small.submit({1, 2, 3},
                   GenerationConfig{.max_new_tokens = std::numeric_limits<int64_t>::max()}, {}),
      Catch::Contains("the request may hold 64 tokens (a prompt of 3 and up to 61"));
  // By default every row can fill the context: whole blocks per row.
  Batcher rows(step_of(p), {.slots = 3, .context = 100, .prefix_rows = 0, .kv_block = 64});
  CHECK(rows.kv_blocks() == 6);
}

TEST_CASE("chunked prefill: a long prompt joins over several steps while the others decode",
          "[batcher]") {
  const auto p = models::from_pretrained<models::CausalLM>(test::hf_fixture("llama"));
  std::vector<int64_t> long_prompt;
  for (int64_t i = 0; i < 23; ++i) long_prompt.push_back(4 + (i * 11) % 85);
  for (int64_t chunk : {4, 7, 0}) {
    INFO("prefill chunk " << chunk);
    Batcher b(
        step_of(p),
        {.slots = 3, .context = 64, .vocab_size = p.model.vocab_size(), .prefill_chunk = chunk});
    const GenerationConfig c{.max_new_tokens = 12};
    Outcome first, second, third;
    REQUIRE(b.submit(kPrompts[0], c, record(first)));
    b.step();                           // the first runs: its first token
    REQUIRE(first.tokens.size() == 2);  // and one decode step's
    REQUIRE(b.submit(long_prompt, c, record(second)));
    REQUIRE(b.submit(kPrompts[2], c, record(third)));
    // Until the long prompt's last chunk, each step decodes the first once more.
    const int64_t steps = chunk == 0 ? 1 : (23 + chunk - 1) / chunk;
    for (int64_t s = 1; s <= steps; ++s) {
      b.step();
      INFO("step " << s);
      CHECK(int64_t(first.tokens.size()) == 2 + s);
      CHECK(second.tokens.size() == (s < steps ? 0u : 2u));
      // One decoding and one prefilling; at the last, the budget the long
      // prompt left starts the third.
      CHECK(b.running() == (s < steps ? 2 : 3));
    }
    run_until_idle(b);
    CHECK(b.prompt_tokens() == int64_t(kPrompts[0].size() + 23 + kPrompts[2].size()));
    for (auto [o, prompt] : {std::pair{&first, kPrompts[0]}, std::pair{&second, long_prompt},
                             std::pair{&third, kPrompts[2]}})
      CHECK(o->tokens == generation::generate(p.model, p.params, {prompt}, c).sequences[0]);
  }
}

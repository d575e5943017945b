// redco-generate: completions from a Hugging Face checkpoint folder, streamed
// as they are produced.
//
//   redco-generate MODEL_DIR --prompt 15496,11,995 --max-new-tokens 32 --do-sample --top-p 0.9
//   echo "15496 11 995" | redco-generate MODEL_DIR          # one prompt (token ids) per line
//   redco-run -n 2 redco-generate MODEL_DIR --n-model-shards 2 --prompt 1,2,3
//   redco-generate MODEL_DIR --bench --prompt-length 512 --batch 1 --max-new-tokens 128
//
// Prompts are token ids (comma- or space-separated). Every rank computes;
// the main one prints. --bench times prefill and decode on random prompts and
// prints one JSON line.
#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <sstream>

#include "redco/core/philox.hpp"
#include "redco/dist/mesh.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/train/deployer.hpp"
#include "redco_cli.hpp"

using namespace redco;
using Prompts = std::vector<std::vector<int64_t>>;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int64_t> parse_ids(std::string text) {
  for (char& c : text)
    if (c == ',') c = ' ';
  std::istringstream in(text);
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    REDCO_CHECK(used == word.size() && v >= 0,
                "redco-generate: '{}' is not a token id (prompts are ids: '15496,11,995')", word);
    ids.push_back(v);
  }
  return ids;
}

Prompts random_prompts(int64_t batch, int64_t length, int64_t vocab) {
  Prompts p(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < length; ++t)
      p[size_t(b)].push_back(int64_t(philox_bits(1, uint64_t(b), uint64_t(t)) % uint64_t(vocab)));
  return p;
}

struct Timing {
  Clock::time_point start, first, last;
  int64_t tokens = 0;
};

template <typename M>
void run(const models::Pretrained<M>& m, const Prompts& prompts,
         const generation::GenerationConfig& config, nn::Ctx ctx, bool bench, bool print) {
  Timing t;
  t.start = Clock::now();
  const bool stream = print && !bench && prompts.size() == 1 && config.num_beams == 1;
  const auto out = generation::generate(
      m.model, m.params, prompts, config, ctx, [&](int64_t, int64_t tok) {
        const auto now = Clock::now();
        if (t.tokens++ == 0) t.first = now;
        t.last = now;
        if (stream) std::cout << tok << ' ' << std::flush;
        return true;
      });
  if (!print) return;
  if (bench) {
    const double prefill = std::chrono::duration<double>(t.first - t.start).count();
    const double decode = std::chrono::duration<double>(t.last - t.first).count();
    const int64_t B = int64_t(prompts.size()), steps = t.tokens / B;
    std::cout << fmt::format(
        "{{\"batch\": {}, \"prompt\": {}, \"new\": {}, \"prefill_s\": {:.4f}, "
        "\"prefill_tok_s\": {:.1f}, \"decode_tok_s\": {:.2f}}}\n",
        B, prompts[0].size(), steps, prefill, double(B * prompts[0].size()) / prefill,
        double(B * (steps - 1)) / decode);
    return;
  }
  if (stream) std::cout << '\n';
  for (size_t i = 0; !stream && i < out.sequences.size(); ++i)
    std::cout << fmt::format("{}\n", fmt::join(out.sequences[i], " "));
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"redco-generate: stream completions from a Hugging Face checkpoint"};
  std::string dir;
  std::vector<std::string> prompt_args;
  generation::GenerationConfig c{.max_new_tokens = 32};
  int shards = 1;
  bool bench = false;
  int64_t batch = 1, prompt_length = 512;
  app.add_option("model", dir, "checkpoint folder (config.json + safetensors)")->required();
  app.add_option("--prompt", prompt_args,
                 "token ids, e.g. 15496,11,995 (repeatable; default: stdin)");
  app.add_option("--max-new-tokens", c.max_new_tokens)->check(redco::cli::at_least(0));
  app.add_option("--min-new-tokens", c.min_new_tokens)->check(redco::cli::at_least(0));
  app.add_option("--eos", c.eos_token_ids, "end-of-sequence ids");
  app.add_option("--pad", c.pad_token_id);
  app.add_flag("--do-sample", c.do_sample);
  app.add_option("--temperature", c.temperature);
  app.add_option("--top-k", c.top_k);
  app.add_option("--top-p", c.top_p);
  app.add_option("--min-p", c.min_p);
  app.add_option("--repetition-penalty", c.repetition_penalty);
  app.add_option("--presence-penalty", c.presence_penalty);
  app.add_option("--frequency-penalty", c.frequency_penalty);
  app.add_option("--no-repeat-ngram-size", c.no_repeat_ngram_size);
  app.add_option("--num-beams", c.num_beams)->check(redco::cli::at_least(1));
  app.add_option("--length-penalty", c.length_penalty);
  app.add_flag("--early-stopping", c.early_stopping);
  app.add_option("--num-return-sequences", c.num_return_sequences);
  app.add_option("--seed", c.seed);
  app.add_option("--n-model-shards", shards, "tensor-parallel shards")
      ->check(redco::cli::at_least(1));
  app.add_flag("--bench", bench, "time prefill and decode on random prompts (JSON line)");
  app.add_option("--batch", batch, "--bench: prompts per batch")->check(redco::cli::at_least(1));
  app.add_option("--prompt-length", prompt_length, "--bench: tokens per prompt")
      ->check(redco::cli::at_least(1));
  REDCO_CLI_PARSE(app, argc, argv);

  train::Deployer deployer({.n_model_shards = shards, .quiet = true});
  const models::hf::LoadOptions load{.n_shards = shards, .rank = deployer.mp_rank()};
  const std::string type = models::hf::Config(dir).model_type();
  REDCO_CHECK(type != "t5" && type != "bart" && type != "bert" && type != "roberta",
              "redco-generate: '{}' holds a '{}' model; this tool runs decoder-only language "
              "models (an encoder-decoder needs its source: call generation::generate with "
              "ctx.source set)",
              dir, type);
  auto any = models::from_pretrained_any(dir, load);
  nn::Ctx ctx;
  ctx.mp = &deployer.mesh().mp_comm();
  std::visit(
      [&](const auto& m) {
        Prompts prompts;
        if (bench) prompts = random_prompts(batch, prompt_length, m.config.vocab);
        for (const std::string& p : prompt_args) prompts.push_back(parse_ids(p));
        if (prompts.empty())
          for (std::string line; std::getline(std::cin, line);)
            if (!parse_ids(line).empty()) prompts.push_back(parse_ids(line));
        REDCO_CHECK(!prompts.empty(),
                    "redco-generate: no prompts (give --prompt or lines on stdin)");
        if (bench) run(m, prompts, c, ctx, true, false);  // warm-up: buffers and caches
        run(m, prompts, c, ctx, bench, deployer.is_main());
      },
      any);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "redco-generate: " << e.what() << '\n';
  return 1;
}

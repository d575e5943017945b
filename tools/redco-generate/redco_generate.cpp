// redco-generate: completions from a Hugging Face checkpoint folder, streamed
// as they are produced.
//
//   redco-generate MODEL_DIR --prompt "In the beginning" --max-new-tokens 32 --stop "."
//   redco-generate MODEL_DIR --prompts-file prompts.txt      # one text prompt per line
//   echo "In the beginning" | redco-generate MODEL_DIR       # stdin: one per line
//   redco-generate MODEL_DIR --ids --prompt 15496,11,995 --do-sample --top-p 0.9
//   redco-run -n 2 redco-generate MODEL_DIR --n-model-shards 2 --prompt "Hello"
//   redco-generate MODEL_DIR --bench --prompt-length 512 --batch 1 --max-new-tokens 128
//
// With a tokenizer.json in MODEL_DIR, prompts are text, tokenised with it,
// and each completion is printed as text on its own line, in prompt order,
// the current one streamed as its characters complete. With --ids (or no
// tokenizer.json) prompts and output are token ids (comma- or
// space-separated). Every rank computes; the main one prints. --bench times
// prefill and decode on random prompts and prints one JSON line.
// For an encoder-decoder (T5, BART) prompts are token ids: the encoder's
// source, and the output its generated ids; the decoder start, end, pad and
// forced ids come from the folder's generation_config.json unless given.
// --bench's prefill is then the encoder and the first decoder step.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "redco/comm/mesh.hpp"
#include "redco/core/philox.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/hf_generation.hpp"
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

// Text output in prompt order: the first unfinished row streams; later rows
// wait in buffers and are printed when their turn comes.
struct InOrder {
  std::vector<std::string> held;
  std::vector<bool> ended;
  size_t head = 0;
  void on_text(int64_t row, std::string_view piece, bool last) {
    held[size_t(row)] += piece;
    ended[size_t(row)] = ended[size_t(row)] || last;
    while (head < held.size()) {
      std::cout << held[head];
      held[head].clear();
      if (!ended[head]) break;
      std::cout << '\n';
      ++head;
    }
    std::cout << std::flush;
  }
};

template <typename M>
constexpr bool kSeq2seq = std::is_same_v<M, models::T5> || std::is_same_v<M, models::Bart>;

template <typename M>
void run(const models::Pretrained<M>& m, const Prompts& prompts,
         const generation::GenerationConfig& config, nn::Ctx ctx, bool bench, bool print,
         const data::Tokenizer* tok = nullptr) {
  Timing t;
  t.start = Clock::now();
  InOrder order{std::vector<std::string>(prompts.size() * size_t(config.num_return_sequences)),
                std::vector<bool>(prompts.size() * size_t(config.num_return_sequences)), 0};
  generation::TextOptions text;
  if (tok) {
    text.tokenizer = tok;
    if (print && !bench && config.num_beams == 1)
      text.on_text = [&](int64_t r, std::string_view piece, bool last) {
        order.on_text(r, piece, last);
      };
  }
  const bool stream = !tok && print && !bench && prompts.size() == 1 && config.num_beams == 1;
  const generation::OnToken on_token = [&](int64_t, int64_t id) {
    const auto now = Clock::now();
    if (t.tokens++ == 0) t.first = now;
    t.last = now;
    if (stream) std::cout << id << ' ' << std::flush;
    return true;
  };
  generation::Generated out;
  if constexpr (kSeq2seq<M>)
    out = generation::generate_seq2seq(m.model, m.params, prompts, config, ctx, on_token);
  else
    out = generation::generate(m.model, m.params, prompts, config, ctx, on_token, text);
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
  if (tok) {
    if (!text.on_text)  // beam search: the texts are final only now
      for (const auto& seq : out.sequences) std::cout << tok->decode(seq, true) << '\n';
    return;
  }
  for (size_t i = 0; !stream && i < out.sequences.size(); ++i)
    std::cout << fmt::format("{}\n", fmt::join(out.sequences[i], " "));
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"redco-generate: stream completions from a Hugging Face checkpoint"};
  std::string dir;
  std::vector<std::string> prompt_args;
  std::string prompts_file;
  bool ids_mode = false;
  generation::GenerationConfig c{.max_new_tokens = 32};
  int shards = 1;
  bool bench = false;
  int64_t batch = 1, prompt_length = 512;
  std::string dtype = "f32";
  app.add_option("model", dir, "checkpoint folder (config.json + safetensors)")->required();
  app.add_option("--prompt", prompt_args,
                 "a text prompt, or token ids with --ids (repeatable; default: stdin, one a line)");
  app.add_option("--prompts-file", prompts_file, "prompts, one a line");
  app.add_flag("--ids", ids_mode,
               "prompts and output are token ids, e.g. 15496,11,995 (the default without a "
               "tokenizer.json in the model folder)");
  app.add_option("--stop", c.stop_strings, "stop strings (text mode; repeatable)");
  app.add_option("--max-new-tokens", c.max_new_tokens)->check(redco::cli::at_least(0));
  app.add_option("--min-new-tokens", c.min_new_tokens)->check(redco::cli::at_least(0));
  app.add_option("--eos", c.eos_token_ids, "end-of-sequence ids");
  app.add_option("--pad", c.pad_token_id);
  app.add_option("--decoder-start", c.decoder_start_token_id,
                 "encoder-decoders: the decoder's first input (default: the checkpoint's)");
  app.add_option("--forced-bos", c.forced_bos_token_id, "the first generated token");
  app.add_option("--forced-eos", c.forced_eos_token_id, "the token at max_new_tokens");
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
  app.add_option("--dtype", dtype, "weights in memory (bf16: decoding reads half the bytes)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_flag("--bench", bench, "time prefill and decode on random prompts (JSON line)");
  app.add_option("--batch", batch, "--bench: prompts per batch")->check(redco::cli::at_least(1));
  app.add_option("--prompt-length", prompt_length, "--bench: tokens per prompt")
      ->check(redco::cli::at_least(1));
  REDCO_CLI_PARSE(app, argc, argv);

  train::Deployer deployer({.n_model_shards = shards, .quiet = true});
  const models::hf::LoadOptions load{.dtype = dtype == "bf16" ? DType::bf16 : DType::f32,
                                     .n_shards = shards,
                                     .rank = deployer.mp_rank()};
  const std::string type = models::hf::Config(dir).model_type();
  REDCO_CHECK(type != "bert" && type != "roberta",
              "redco-generate: '{}' holds a '{}' model, an encoder without a decoder; this tool "
              "runs language models and encoder-decoders (T5, BART)",
              dir, type);
  if (type == "t5" || type == "bart") {  // the checkpoint's ids where no flag gives them
    const generation::GenerationConfig f = models::generation_config(dir);
    for (auto [flag, mine, theirs] :
         {std::tuple{"--decoder-start", &c.decoder_start_token_id, f.decoder_start_token_id},
          std::tuple{"--forced-bos", &c.forced_bos_token_id, f.forced_bos_token_id},
          std::tuple{"--forced-eos", &c.forced_eos_token_id, f.forced_eos_token_id},
          std::tuple{"--pad", &c.pad_token_id, f.pad_token_id}})
      if (app.count(flag) == 0) *mine = theirs;
    // --bench generates max_new_tokens whatever the random sources give.
    if (app.count("--eos") == 0 && !bench) c.eos_token_ids = f.eos_token_ids;
  }
  auto any = models::from_pretrained_any(dir, load);
  std::optional<data::Tokenizer> tok;
  const bool seq2seq = type == "t5" || type == "bart";  // ids in, ids out
  if (!ids_mode && !bench && !seq2seq &&
      std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"))
    tok.emplace(data::Tokenizer::from_file(dir));
  REDCO_CHECK(tok || c.stop_strings.empty(),
              "redco-generate: --stop needs text mode (a tokenizer.json in {}, without --ids)",
              dir);
  std::vector<std::string> lines = prompt_args;
  if (!prompts_file.empty()) {
    std::ifstream f(prompts_file);
    REDCO_CHECK(f, "redco-generate: cannot open --prompts-file {}", prompts_file);
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty() && !bench)
    for (std::string line; std::getline(std::cin, line);)
      if (!line.empty()) lines.push_back(line);
  nn::Ctx ctx;
  ctx.mp = &deployer.mesh().mp_comm();
  std::visit(
      [&](const auto& m) {
        Prompts prompts;
        if (bench) prompts = random_prompts(batch, prompt_length, m.config.vocab);
        for (const std::string& p : lines) {
          if (!tok) {
            if (!parse_ids(p).empty()) prompts.push_back(parse_ids(p));
            continue;
          }
          std::vector<int64_t> ids;
          for (int32_t id : tok->encode(p).ids) ids.push_back(id);
          REDCO_CHECK(!ids.empty(), "redco-generate: the prompt '{}' has no tokens", p);
          REDCO_CHECK(*std::max_element(ids.begin(), ids.end()) < m.config.vocab,
                      "redco-generate: {}'s tokenizer.json gives ids beyond the model's "
                      "vocabulary ({}); the folder's tokenizer does not belong to its model",
                      dir, m.config.vocab);
          prompts.push_back(std::move(ids));
        }
        REDCO_CHECK(!prompts.empty(),
                    "redco-generate: no prompts (give --prompt, --prompts-file or lines on stdin)");
        if (bench) run(m, prompts, c, ctx, true, false);  // warm-up: buffers and caches
        run(m, prompts, c, ctx, bench, deployer.is_main(), tok ? &*tok : nullptr);
      },
      any);
  return 0;
} catch (const std::exception& e) {
  const std::string_view m = e.what();  // most messages name the tool already
  std::cerr << (m.starts_with("redco-generate:") ? "" : "redco-generate: ") << m << '\n';
  return 1;
}

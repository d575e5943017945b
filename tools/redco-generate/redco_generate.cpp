// redco-generate: completions from a Hugging Face checkpoint folder, streamed
// as they are produced.
//
//   redco-generate MODEL_DIR --prompt "In the beginning" --max-new-tokens 32 --stop "."
//   redco-generate MODEL_DIR --prompts-file prompts.txt      # one text prompt per line
//   echo "In the beginning" | redco-generate MODEL_DIR       # stdin: one per line
//   redco-generate MODEL_DIR --ids --prompt 15496,11,995 --do-sample --top-p 0.9
//   redco-run -n 2 redco-generate MODEL_DIR --n-model-shards 2 --prompt "Hello"
//   redco-run -n 2 redco-generate MODEL_DIR --prompts-file prompts.txt  # 2 replicas
//   redco-generate MODEL_DIR --bench --prompt-length 512 --batch 1 --max-new-tokens 128
//
// With a tokenizer.json in MODEL_DIR, prompts are text, tokenised with it,
// and each completion is printed as text on its own line, in prompt order,
// the current one streamed as its characters complete (beam search: each
// prompt's when its search ends). With --ids prompts and output are token
// ids (comma- or space-separated). A completion is the new tokens only, the
// prompt not repeated (transformers' generate returns prompt + new), ending
// with the end-of-sequence id when one was generated.
// For an encoder-decoder (T5, BART) a prompt is the encoder's source (text
// tokenised with the folder's special tokens, e.g. T5's closing </s>, or
// ids) and the output is what the decoder generates from it, after its start
// id. For every model the end, pad and forced ids (and an encoder-decoder's
// decoder start) come from the folder's generation_config.json (or its
// config.json, as transformers reads them) unless a flag gives them.
// --bench's prefill is the encoder and the first decoder step for an
// encoder-decoder.
//
// Processes: the model-parallel ranks of a replica (--n-model-shards) compute
// together; the data-parallel replicas (the rest of the process count) each
// take a contiguous block of the prompts, and the main rank prints its own
// block as it streams, then the others' in prompt order. Draws are keyed by
// the prompt, so a sampled completion is the same on any number of
// processes. --bench times prefill and decode on random prompts and prints
// one JSON line (every replica runs the whole batch).
#include <CLI/CLI.hpp>
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "cli11_conventions.hpp"
#include "redco/comm/bytes.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/core/philox.hpp"
#include "redco/core/profile.hpp"
#include "redco/core/threads.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/hf_generation.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/nn/shard_plan.hpp"
#include "redco/ops/cpu/skinny_panels.hpp"
#include "redco/train/deployer.hpp"

using namespace redco;
using Prompts = std::vector<std::vector<int64_t>>;
using Clock = std::chrono::steady_clock;

namespace {

// `why`: why the prompts are ids here (--ids, or no tokenizer in the folder).
std::vector<int64_t> parse_ids(std::string text, std::string_view why) {
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
                "redco-generate: '{}' is not a token id; prompts are ids ('15496,11,995') {}", word,
                why);
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

// Text output in prompt order: each row's text is kept; when printing, the
// first unfinished row streams and later rows wait until their turn comes.
struct InOrder {
  bool print;
  std::vector<std::string> text;  // each row's text so far
  std::vector<bool> ended;
  size_t head = 0, shown = 0;  // the row being printed, and how much of it is
  void on_text(int64_t row, std::string_view piece, bool last) {
    text[size_t(row)] += piece;
    ended[size_t(row)] = ended[size_t(row)] || last;
    if (!print) return;
    while (head < text.size()) {
      std::cout << std::string_view(text[head]).substr(shown);
      shown = text[head].size();
      if (!ended[head]) break;
      std::cout << '\n';
      ++head, shown = 0;
    }
    std::cout << std::flush;
  }
};

template <typename M>
constexpr bool kSeq2seq = std::is_same_v<M, models::T5> || std::is_same_v<M, models::Bart>;

void print_bench(const Timing& t, const Prompts& prompts) {
  const double prefill = std::chrono::duration<double>(t.first - t.start).count();
  const double decode = std::chrono::duration<double>(t.last - t.first).count();
  const int64_t B = int64_t(prompts.size()), steps = t.tokens / B;
  std::cout << fmt::format(
      "{{\"batch\": {}, \"prompt\": {}, \"new\": {}, \"prefill_s\": {:.4f}, "
      "\"prefill_tok_s\": {:.1f}, \"decode_tok_s\": {:.2f}, \"threads\": {}}}\n",
      B, prompts[0].size(), steps, prefill, double(B * prompts[0].size()) / prefill,
      double(B * (steps - 1)) / decode, num_threads());
}

// Per-op time of the decode steps (after the first token), to stderr.
void print_decode_profile(int64_t steps) {
  profile::enable(false);
  const std::vector<profile::Entry> entries = profile::report();
  profile::reset();
  double total = 0;
  for (const auto& e : entries) total += e.seconds;
  std::cerr << fmt::format("per-op decode time over {} steps (exclusive; ms per step, calls):\n",
                           steps);
  for (const auto& e : entries)
    std::cerr << fmt::format("  {:8.3f} ms {:5.1f}%  {:7.1f}  {}\n",
                             1e3 * e.seconds / double(steps), 100 * e.seconds / total,
                             double(e.calls) / double(steps), e.path);
  std::cerr << fmt::format("  {:8.3f} ms in profiled scopes per step\n",
                           1e3 * total / double(steps));
}

// Generates the prompts' completions and returns one output line per row
// (text, or ids separated by spaces); prints them too when `print`,
// streaming. --bench prints its JSON line instead and returns nothing.
template <typename M>
std::vector<std::string> run(const models::Pretrained<M>& m, const Prompts& prompts,
                             const generation::GenerationConfig& config, nn::Ctx ctx, bool bench,
                             bool print, const data::Tokenizer* tok = nullptr,
                             bool profile_decode = false) {
  if (prompts.empty()) return {};  // a replica with no prompts of its own
  Timing t;
  t.start = Clock::now();
  const size_t rows = prompts.size() * size_t(config.num_return_sequences);
  InOrder order{print && !bench, std::vector<std::string>(rows), std::vector<bool>(rows)};
  generation::TextOptions text;
  if (tok) {
    text.tokenizer = tok;
    if (!bench)
      text.on_text = [&](int64_t r, std::string_view piece, bool last) {
        order.on_text(r, piece, last);
      };
  }
  const bool stream = !tok && print && !bench && rows == 1 && config.num_beams == 1;
  const generation::OnToken on_token = [&](int64_t, int64_t id) {
    const auto now = Clock::now();
    if (t.tokens++ == 0) {
      t.first = now;
      if (profile_decode) profile::enable(true);  // decode only, not the prefill
    }
    t.last = now;
    if (stream) std::cout << (t.tokens > 1 ? " " : "") << id << std::flush;
    return true;
  };
  generation::Generated out;
  if constexpr (kSeq2seq<M>)
    out = generation::generate_seq2seq(m.model, m.params, prompts, config, ctx, on_token, text);
  else
    out = generation::generate(m.model, m.params, prompts, config, ctx, on_token, text);
  if (bench) {
    if (print) print_bench(t, prompts);
    if (profile_decode) print_decode_profile(t.tokens / int64_t(prompts.size()) - 1);
    return {};
  }
  if (stream) std::cout << '\n';
  if (tok) {  // rows that produced no text (--max-new-tokens 0) still get their line
    for (size_t r = 0; r < rows; ++r)
      if (!order.ended[r]) order.on_text(int64_t(r), "", true);
    return std::move(order.text);
  }
  std::vector<std::string> lines;
  for (const auto& seq : out.sequences) lines.push_back(fmt::format("{}", fmt::join(seq, " ")));
  if (print && !stream)
    for (const std::string& line : lines) std::cout << line << '\n';
  return lines;
}

// Refuses a model-shard count the model's plan cannot split evenly: those
// layers would be whole on every rank, computed n times over for nothing.
template <typename M>
void check_even_split(const M& model, int shards) {
  if (shards == 1) return;
  auto uneven = [&](int n) {
    std::vector<shard::ParamSplit> plan = shard::resolve(model, n);
    auto it = std::find_if(plan.begin(), plan.end(), [](auto& p) { return !p.note.empty(); });
    return it == plan.end() ? std::string() : it->note;
  };
  const std::string why = uneven(shards);
  if (why.empty()) return;
  std::vector<int> even;
  for (int n = 2; n <= 64; ++n)
    if (uneven(n).empty()) even.push_back(n);
  fail(
      "redco-generate: --n-model-shards {} does not split this model evenly ({}); give a count "
      "that does: {}",
      shards, why,
      even.empty() ? std::string("1 (nothing in it splits)")
                   : fmt::format("{}", fmt::join(even, ", ")));
}

// Prompts [begin, end) of n for this data-parallel replica: contiguous
// blocks in replica order, so the replicas' outputs in rank order are in
// prompt order.
std::pair<size_t, size_t> replica_block(size_t n, int replicas, int replica) {
  return {n * size_t(replica) / size_t(replicas), n * size_t(replica + 1) / size_t(replicas)};
}

// The other replicas' output lines to the main rank, printed after its own.
// Collective over the data-parallel group.
void print_other_replicas(const std::vector<std::string>& mine, train::Deployer& deployer) {
  std::ostringstream os;
  {
    cereal::BinaryOutputArchive ar(os);
    ar(mine);
  }
  const std::vector<std::string> parts =
      comm::all_gather_bytes(os.str(), deployer.mesh().dp_comm());
  if (!deployer.is_main()) return;
  for (size_t r = 1; r < parts.size(); ++r) {
    std::vector<std::string> lines;
    std::istringstream is(parts[r]);
    cereal::BinaryInputArchive ar(is);
    ar(lines);
    for (const std::string& line : lines) std::cout << line << '\n';
  }
  std::cout << std::flush;
}

std::vector<std::string> read_lines(const std::vector<std::string>& args,
                                    const std::string& prompts_file, bool bench) {
  std::vector<std::string> lines = args;
  if (!prompts_file.empty()) {
    std::ifstream f(prompts_file);
    REDCO_CHECK(f, "redco-generate: cannot open --prompts-file {}", prompts_file);
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty() && !bench)
    for (std::string line; std::getline(std::cin, line);)
      if (!line.empty()) lines.push_back(line);
  return lines;
}

// The prompts' ids: through the tokenizer (text mode) or parsed (ids).
Prompts to_prompts(const std::vector<std::string>& lines, const data::Tokenizer* tok, int64_t vocab,
                   const std::string& dir, bool ids_flag) {
  const std::string why = ids_flag
                              ? "with --ids"
                              : fmt::format(
                                    "because {} has no tokenizer.json; for text prompts put the "
                                    "model's tokenizer.json there",
                                    dir);
  Prompts prompts;
  for (const std::string& p : lines) {
    if (!tok) {
      if (std::vector<int64_t> ids = parse_ids(p, why); !ids.empty())
        prompts.push_back(std::move(ids));
      continue;
    }
    std::vector<int64_t> ids;
    for (int32_t id : tok->encode(p).ids) ids.push_back(id);
    REDCO_CHECK(!ids.empty(), "redco-generate: the prompt '{}' has no tokens", p);
    REDCO_CHECK(*std::max_element(ids.begin(), ids.end()) < vocab,
                "redco-generate: {}'s tokenizer.json gives ids beyond the model's "
                "vocabulary ({}); the folder's tokenizer does not belong to its model",
                dir, vocab);
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// The special ids from the folder's generation_config.json (else config.json)
// where no flag gives them: transformers' generate stops at the checkpoint's
// end-of-sequence id for every model, not only for encoder-decoders.
void checkpoint_defaults(generation::GenerationConfig& c, const CLI::App& app,
                         const std::string& dir, bool bench, bool seq2seq) {
  const generation::GenerationConfig f = models::generation_config(dir);
  for (auto [flag, mine, theirs] :
       {std::tuple{"--decoder-start", &c.decoder_start_token_id, f.decoder_start_token_id},
        std::tuple{"--forced-bos", &c.forced_bos_token_id, f.forced_bos_token_id},
        std::tuple{"--forced-eos", &c.forced_eos_token_id, f.forced_eos_token_id},
        std::tuple{"--pad", &c.pad_token_id, f.pad_token_id}})
    if (app.count(flag) == 0 && (seq2seq || mine != &c.decoder_start_token_id)) *mine = theirs;
  // --bench generates max_new_tokens whatever the random sources give.
  if (app.count("--eos") == 0 && !bench) c.eos_token_ids = f.eos_token_ids;
}

// The command line.
struct Options {
  std::string dir;
  std::vector<std::string> prompt_args;
  std::string prompts_file;
  bool ids_mode = false;
  generation::GenerationConfig c{.max_new_tokens = 32};
  int shards = 1;
  bool bench = false;
  int64_t batch = 1, prompt_length = 512;
  std::string dtype = "f32";
  std::string cache_dtype = "auto";
  std::string layout = "auto";
  bool profile = false;
  int threads = 0;  // 0: every core this process may use
};

void add_options(CLI::App& app, Options& o) {
  generation::GenerationConfig& c = o.c;
  app.add_option("model", o.dir, "checkpoint folder (config.json + safetensors)")->required();
  app.add_option("--prompt", o.prompt_args,
                 "a text prompt, or token ids with --ids (repeatable; default: stdin, one a line)");
  app.add_option("--prompts-file", o.prompts_file, "prompts, one a line");
  app.add_flag("--ids", o.ids_mode,
               "prompts and output are token ids, e.g. 15496,11,995 (the default without a "
               "tokenizer.json in the model folder)");
  app.add_option("--stop", c.stop_strings, "stop strings (text mode; repeatable)");
  app.add_option("--max-new-tokens", c.max_new_tokens)->check(redco::cli11::at_least(0));
  app.add_option("--min-new-tokens", c.min_new_tokens)->check(redco::cli11::at_least(0));
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
  app.add_option("--num-beams", c.num_beams)->check(redco::cli11::at_least(1));
  app.add_option("--length-penalty", c.length_penalty);
  app.add_flag("--early-stopping", c.early_stopping);
  app.add_option("--num-return-sequences", c.num_return_sequences);
  app.add_option("--seed", c.seed);
  app.add_option("--n-model-shards", o.shards, "tensor-parallel shards")
      ->check(redco::cli11::at_least(1));
  app.add_option("--dtype", o.dtype,
                 "weights in memory (bf16: decoding reads half the bytes; int8: matrices "
                 "quantized by rows, a quarter)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  app.add_option("--weight-layout", o.layout,
                 "bf16 and int8 matrices in memory: panels (packed for decoding), rows (as "
                 "stored), or auto (panels on a CPU where they pay: AVX-512)")
      ->check(CLI::IsMember({"auto", "panels", "rows"}));
  app.add_option("--cache-dtype", o.cache_dtype,
                 "KV cache elements (auto: bf16 with bf16 or int8 weights, else f32)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  app.add_flag("--bench", o.bench, "time prefill and decode on random prompts (JSON line)");
  app.add_option("--batch", o.batch, "--bench: prompts per batch")
      ->check(redco::cli11::at_least(1));
  app.add_option("--prompt-length", o.prompt_length, "--bench: tokens per prompt")
      ->check(redco::cli11::at_least(1));
  app.add_flag("--profile", o.profile, "--bench: per-op time of the decode steps (stderr)");
  app.add_option("--threads", o.threads,
                 "CPU threads to compute with (like llama-bench -t; 0: every core this process "
                 "may use)")
      ->check(redco::cli11::at_least(0));
}

// Whether prompts are text: the folder holds a tokenizer redco reads
// (tokenizer.json, or GPT-2's slow vocab.json + merges.txt). A folder with
// only another slow tokenizer's files (tokenizer.model, spiece.model,
// vocab.txt) is an error naming the command that writes its tokenizer.json,
// not a silent switch to token ids.
bool text_mode(const std::string& dir) {
  try {
    return data::Tokenizer::found_in(dir);
  } catch (const Error& e) {
    fail("{}\n(or give --ids to prompt with token ids)", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "redco-generate: stream completions from a Hugging Face checkpoint. Each prompt's output "
      "line is its new tokens only, not the prompt (transformers' generate returns prompt + new), "
      "ending with the end-of-sequence id when one was generated; the end, pad and forced ids "
      "come from the folder's generation_config.json unless given"};
  Options o;
  add_options(app, o);
  REDCO_CLI11_PARSE(app, argc, argv);
  set_num_threads(o.threads);

  train::Deployer deployer({.n_model_shards = o.shards, .quiet = true});
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : o.dtype == "int8" ? DType::i8 : DType::f32;
  // bf16 or int8 on the CPU: the matrices packed for decoding where it pays (skinny_panels.hpp,
  // skinny_i8_panels.hpp).
  const models::hf::LoadOptions load{
      .dtype = dtype,
      .n_shards = o.shards,
      .rank = deployer.mp_rank(),
      .decode_panels = dtype != DType::f32 && deployer.device().is_cpu() &&
                       (o.layout == "panels" || (o.layout == "auto" && cpu::panels_pay()))};
  const std::string type = models::hf::Config(o.dir).model_type();
  REDCO_CHECK(type != "bert" && type != "roberta",
              "redco-generate: '{}' holds a '{}' model, an encoder without a decoder; this tool "
              "runs language models and encoder-decoders (T5, BART)",
              o.dir, type);
  const bool seq2seq = type == "t5" || type == "bart";
  if (o.cache_dtype != "auto") o.c.cache_dtype = o.cache_dtype == "bf16" ? DType::bf16 : DType::f32;
  checkpoint_defaults(o.c, app, o.dir, o.bench, seq2seq);
  auto any = models::from_pretrained_any(o.dir, load);
  std::optional<data::Tokenizer> tok;
  if (!o.ids_mode && !o.bench && text_mode(o.dir)) tok.emplace(data::Tokenizer::from_file(o.dir));
  REDCO_CHECK(tok || o.c.stop_strings.empty(),
              "redco-generate: --stop needs text mode (a tokenizer.json in {}, without --ids)",
              o.dir);
  // Every process would read its own share of one stdin.
  REDCO_CHECK(
      deployer.n_devices() == 1 || o.bench || !o.prompt_args.empty() || !o.prompts_file.empty(),
      "redco-generate: on {} processes give the prompts with --prompt or --prompts-file "
      "(stdin is one stream, which the processes would split between them)",
      deployer.n_devices());
  const std::vector<std::string> lines = read_lines(o.prompt_args, o.prompts_file, o.bench);
  nn::Ctx ctx;
  ctx.mp = &deployer.mesh().mp_comm();
  std::visit(
      [&](const auto& m) {
        check_even_split(m.model, o.shards);
        Prompts prompts =
            to_prompts(lines, tok ? &*tok : nullptr, m.config.vocab, o.dir, o.ids_mode);
        if (o.bench) prompts = random_prompts(o.batch, o.prompt_length, m.config.vocab);
        REDCO_CHECK(!prompts.empty(),
                    "redco-generate: no prompts (give --prompt, --prompts-file or lines on stdin)");
        if (o.bench) {
          run(m, prompts, o.c, ctx, true, false);  // warm-up: buffers and caches
          run(m, prompts, o.c, ctx, true, deployer.is_main(), nullptr, o.profile);
          return;
        }
        const auto [begin, end] =
            replica_block(prompts.size(), deployer.dp_size(), deployer.dp_rank());
        const Prompts mine(prompts.begin() + int64_t(begin), prompts.begin() + int64_t(end));
        const auto out = run(m, mine, o.c, ctx, false, deployer.is_main(), tok ? &*tok : nullptr);
        if (deployer.dp_size() > 1) print_other_replicas(out, deployer);
      },
      any);
  return 0;
} catch (const std::exception& e) {
  const std::string_view m = e.what();  // most messages name the tool already
  std::cerr << (m.starts_with("redco-generate:") ? "" : "redco-generate: ") << m << '\n';
  return 1;
}

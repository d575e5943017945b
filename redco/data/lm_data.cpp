#include "redco/data/lm_data.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <unordered_map>

#include "redco/core/error.hpp"
#include "redco/data/bpe.hpp"

namespace redco::data {

namespace {

// Earlier versions kept the learned tokenizer as GPT-2's two files in a
// `tokenizer/` folder beside `file`. Such a tokenizer is read and returned
// as tokenizer.json (saved at `file` by the caller), so a workdir's
// checkpoints keep their vocabulary; one of another size is reported, not
// silently replaced. Empty when there is none.
std::string old_layout_json(const std::filesystem::path& file, int64_t vocab_size) {
  const std::filesystem::path old = file.parent_path() / "tokenizer";
  if (std::filesystem::exists(file) || !std::filesystem::exists(old / "vocab.json") ||
      !std::filesystem::exists(old / "merges.txt"))
    return {};
  std::string json = Bpe::load(old).to_tokenizer_json();
  const int64_t have = Tokenizer::from_json(json, (old / "vocab.json").string()).vocab_size();
  REDCO_CHECK(have == vocab_size,
              "{} holds a tokenizer in the old layout (vocab.json + merges.txt) with {} tokens, "
              "not the {} asked for; ask for {} to go on with it and the checkpoints trained "
              "with it, or remove {} to learn a new one",
              old.string(), have, vocab_size, have, old.string());
  fmt::print(stderr,
             "note: read the tokenizer in the old layout {} (vocab.json + merges.txt); it is "
             "kept as {} from now on\n",
             old.string(), file.string());
  return json;
}

}  // namespace

Tokenizer load_or_train_bpe(const std::filesystem::path& file, std::string_view text,
                            int64_t vocab_size, bool save) {
  REDCO_CHECK(vocab_size >= 256,
              "load_or_train_bpe: a byte-level BPE needs a vocabulary of at least 256 (the "
              "bytes), got {}",
              vocab_size);
  if (std::filesystem::exists(file)) {
    Tokenizer saved = Tokenizer::from_file(file);
    if (saved.vocab_size() == vocab_size) return saved;
  }
  std::string json = old_layout_json(file, vocab_size);
  if (json.empty()) json = Bpe::train(text, vocab_size).to_tokenizer_json();
  if (save) {
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    // A name of this process's own, renamed over `file` once complete.
    std::filesystem::path tmp = file;
    tmp += ".tmp-" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f << json;
      REDCO_CHECK(f.good(), "load_or_train_bpe: could not write {} (is the folder writable?)",
                  tmp.string());
    }
    std::filesystem::rename(tmp, file);
  }
  return Tokenizer::from_json(json, file.string());
}

TokenizerFile pick_tokenizer(const std::filesystem::path& file,
                             const std::filesystem::path& checkpoint,
                             const std::filesystem::path& learned, std::string_view text,
                             int64_t vocab_size, bool save) {
  if (!file.empty()) return {Tokenizer::from_file(file), file};
  if (!checkpoint.empty()) {
    REDCO_CHECK(std::filesystem::is_directory(checkpoint),
                "{} is not a folder: name a Hugging Face checkpoint folder (config.json, "
                "model.safetensors, tokenizer.json)",
                checkpoint.string());
    const std::filesystem::path own = checkpoint / "tokenizer.json";
    REDCO_CHECK(std::filesystem::exists(own),
                "{} has no tokenizer.json: name the checkpoint's tokenizer file with --tokenizer",
                checkpoint.string());
    return {Tokenizer::from_file(own), own};
  }
  return {load_or_train_bpe(learned, text, vocab_size, save), learned};
}

std::vector<int64_t> token_ids(const Tokenizer& tok, std::string_view text) {
  const std::vector<int32_t> ids = tok.encode(text, /*add_special_tokens=*/false).ids;
  return {ids.begin(), ids.end()};
}

std::vector<TokenWindow> token_windows(std::span<const int64_t> tokens, int64_t context,
                                       int64_t stride) {
  REDCO_CHECK(context >= 1, "token_windows: context must be >= 1, got {}", context);
  REDCO_CHECK(stride >= 0, "token_windows: stride must be >= 0, got {}", stride);
  const auto step = size_t(stride == 0 ? context : stride), len = size_t(context) + 1;
  std::vector<TokenWindow> out;
  for (size_t s = 0; s + len <= tokens.size(); s += step) out.push_back(tokens.subspan(s, len));
  return out;
}

LmBatch shifted_batch(std::span<const TokenWindow> windows) {
  REDCO_CHECK(!windows.empty(), "shifted_batch: no windows");
  const auto B = int64_t(windows.size()), T = int64_t(windows[0].size()) - 1;
  REDCO_CHECK(T >= 1, "shifted_batch: a window needs at least 2 tokens, got {}", T + 1);
  LmBatch b{Tensor::empty({B, T}, DType::i64), Tensor::empty({B, T}, DType::i64)};
  int64_t* inputs = b.inputs.data<int64_t>();    // [B, T]
  int64_t* targets = b.targets.data<int64_t>();  // [B, T]
  for (int64_t i = 0; i < B; ++i) {
    const TokenWindow w = windows[size_t(i)];
    REDCO_CHECK(int64_t(w.size()) == T + 1,
                "shifted_batch: window {} has {} tokens, window 0 has {}; windows of one batch "
                "must have the same length",
                i, w.size(), T + 1);
    std::copy_n(w.begin(), T, inputs + i * T);
    std::copy_n(w.begin() + 1, T, targets + i * T);
  }
  return b;
}

double unigram_entropy(std::span<const int64_t> tokens) {
  std::unordered_map<int64_t, double> count;
  for (int64_t t : tokens) count[t] += 1;
  const auto n = double(tokens.size());
  double h = 0;
  for (const auto& [t, c] : count) h -= c / n * std::log(c / n);
  return h;
}

}  // namespace redco::data

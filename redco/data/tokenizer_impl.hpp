#pragma once
// Tokenizer::Impl, shared by the files that implement data::Tokenizer
// (internal to redco/data).
#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <optional>

#include "redco/data/tokenizer.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data {

using tok::Decoder;
using tok::IdToToken;
using tok::Json;
using tok::Model;
using tok::Normalizer;
using tok::Piece;
using tok::PostProcessor;
using tok::PreTokenizer;
using tok::Token;

constexpr size_t kMaxCachedWord = 64, kCacheEntries = 1 << 16;

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

struct Tokenizer::Impl {
  const uint64_t serial = next_serial();
  static uint64_t next_serial() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::vector<const AddedToken*> raw_tokens, norm_tokens;  // matched before / after normalizing
  std::vector<std::string> norm_contents;                  // norm_tokens' normalized text
  IdToToken vocab;                                         // id -> token, added ones included
  std::vector<int8_t> is_special;                          // [vocab.size()]
  std::optional<Truncation> truncation;
  std::optional<Padding> padding;
  std::map<std::string, int32_t, std::less<>> named_specials;
  // From tokenizer_config.json (tokenizer_config.cpp).
  std::optional<int64_t> model_max_length;
  Side padding_side = Side::right, truncation_side = Side::right;
  bool clean_up_spaces = false;
  // To check options against.
  io::Json pre_tokenizer_json, normalizer_json, post_processor_json, decoder_json;
  std::string source = "tokenizer.json";  // the file, for messages
  Regex ws_start{"^[\\s\\x{85}]*"}, ws_end{"[\\s\\x{85}]*$"};
  Regex word_start{"^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]"};
  Regex word_end{"[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]$"};

  void load(const Json& j);
  void split_added(std::vector<Piece>& pieces, bool normalized_stage) const;
  std::array<bool, 256> added_first_byte{};  // bytes an added token's text can start with
  void encode_one(std::string_view text, tok::Encoding& enc) const;
  const std::vector<Token>& tokenize_cached(std::string_view word) const;
  // Truncates and post-processes `seqs` in place.
  void finish(std::vector<tok::Encoding>& seqs, bool add_special) const;
  data::Encoding encode_seqs(std::span<const std::string_view> texts, bool add_special) const;
  size_t added_by_processor(size_t n_seqs) const;
  // tokenizer_config.json / special_tokens_map.json in `folder`.
  void load_config(const std::filesystem::path& folder);
  void apply_bos_eos(const io::Json& cfg, const std::string& cls,
                     const std::map<std::string, std::string, std::less<>>& names,
                     const std::string& file);
  void check_unapplied(const io::Json& cfg, const std::string& cls, const std::string& file) const;
  void check_prefix_space(const io::Json& cfg, const std::string& cls,
                          const std::string& file) const;
  int32_t token_id(std::string_view token) const;  // -1 when absent
};

std::string read_file(const std::filesystem::path& p);
// The shell command with which transformers writes `dir`/tokenizer.json
// (AutoTokenizer converts a slow tokenizer's files on loading).
std::string resave_command(const std::filesystem::path& dir);

}  // namespace redco::data

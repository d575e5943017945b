#pragma once
// Byte-level byte-pair encoding, as in GPT-2 (Radford et al., 2019): every
// byte string encodes, and decoding gives back exactly the same bytes.
//
//   auto bpe = data::Bpe::train(text, 2048);   // 256 byte tokens + 1792 merges
//   std::vector<int32_t> ids = bpe.encode("In the beginning");
//   std::string back = bpe.decode(ids);         // == "In the beginning"
//   bpe.save(dir);                              // dir/vocab.json, dir/merges.txt
//   bpe.save_tokenizer_json(dir / "tokenizer.json");  // for data::Tokenizer / HF
//   auto gpt2 = data::Bpe::load(dir_with_gpt2_files);
//
// Text is first split into words roughly as GPT-2's regex does (a run of
// letters, of digits or of other symbols with at most one leading space;
// English contractions such as 's and 'll; whitespace runs), and merges never
// cross a word boundary. Bytes >= 0x80 count as letters, so UTF-8 words stay
// whole.
//
// Files are GPT-2's: vocab.json maps each token, spelled with GPT-2's
// byte-to-unicode alphabet (a space is "Ġ"), to its id; merges.txt holds one
// merge per line ("Ġ t"), highest priority first, after a "#version" line.
// GPT-2's own files load as they are.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace redco::data {

class Bpe {
 public:
  // Learns merges from `text` until the vocabulary has `vocab_size` tokens
  // (at least 256: the bytes) or no two adjacent tokens are left to merge.
  // Each step merges the most frequent adjacent pair; ties go to the pair
  // with the smallest (left id, right id). Ids 0..255 are the bytes in byte
  // order and merge r creates id 256 + r.
  static Bpe train(std::string_view text, int64_t vocab_size);

  // Reads dir/vocab.json and dir/merges.txt; errors name the file and line.
  static Bpe load(const std::filesystem::path& dir);
  // Writes dir/vocab.json and dir/merges.txt (creating dir if needed).
  void save(const std::filesystem::path& dir) const;
  // A Hugging Face tokenizer.json of this tokenizer (split_words as a Split
  // regex, then ByteLevel): data::Tokenizer and the `tokenizers` package
  // load it and give encode()'s ids.
  std::string to_tokenizer_json() const;
  void save_tokenizer_json(const std::filesystem::path& file) const;
  static const char* const kSplitPattern;

  // Each distinct word is encoded once per call.
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws redco::Error for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;
  std::string decode(std::span<const int64_t> ids) const;

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  // The bytes a token stands for.
  const std::string& token(int64_t id) const;
  struct Merge {
    int32_t left, right, result;
  };
  // In priority order: merges_[0] is applied first.
  const std::vector<Merge>& merges() const { return merges_; }

  // The pre-tokenizer's words, as views into `text`; they concatenate to it.
  static std::vector<std::string_view> split_words(std::string_view text);

 private:
  void add_merge(int32_t left, int32_t right, int32_t result);
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id -> bytes
  int32_t byte_id_[256] = {};        // byte -> id of its one-byte token
  std::vector<Merge> merges_;
  // (left << 32 | right) -> index into merges_ (its rank)
  std::unordered_map<uint64_t, int32_t> rank_;
};

}  // namespace redco::data

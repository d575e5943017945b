#pragma once
// data::Tokenizer: Hugging Face tokenizers from their tokenizer.json, with
// the ids, offsets and decodes of the `tokenizers` package (byte-level BPE as
// in GPT-2/LLaMA-3/RoBERTa, SentencePiece-style BPE with byte fallback as in
// LLaMA-2, Unigram as in T5, WordPiece as in BERT).
//
//   auto tok = data::Tokenizer::from_file("gpt2/tokenizer.json");  // or the folder
//   data::Encoding e = tok.encode("In the beginning");
//   e.ids;       // token ids
//   e.offsets;   // [begin, end) byte ranges of each token in the input
//   std::string s = tok.decode(e.ids, /*skip_special_tokens=*/true);
//   auto batch = tok.encode_batch(texts);   // on threads; padded/truncated if set
//   batch[i].ids;                            // spans into the batch's pooled storage
//
//   data::Tokenizer::Stream stream(tok);     // streaming generation
//   for (int32_t id : new_ids) std::cout << stream.step(id);  // whole characters only
//
// From the folder's tokenizer_config.json / special_tokens_map.json, as
// transformers' AutoTokenizer applies them: the named special tokens,
// add_bos_token / add_eos_token (the LLaMA, CodeLlama, Gemma, Cohere and
// GPT-NeoX fast tokenizers rebuild the post-processor from them),
// model_max_length, padding_side, truncation_side, pad_token and
// clean_up_tokenization_spaces; an option that would make the reference
// rebuild another part of tokenizer.json is accepted only where it agrees
// with the file, else rejected with an Error naming it.
// Every component and option a file uses is implemented exactly or rejected
// with an Error naming it: redco never silently tokenizes differently.
// Implemented: normalizers NFC/NFD/NFKC/NFKD, Lowercase, StripAccents,
// BertNormalizer, Replace, Prepend, Strip, Precompiled, Sequence;
// pre-tokenizers ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit,
// BertPreTokenizer, Digits, Punctuation, Sequence; models BPE, Unigram,
// WordPiece; post-processors TemplateProcessing, ByteLevel,
// RobertaProcessing, BertProcessing, Sequence; decoders ByteLevel, Metaspace,
// ByteFallback, Fuse, Strip, Replace, WordPiece, Sequence. Rejected: e.g.
// WordLevel, UnicodeScripts, CharDelimiterSplit, BPE dropout, the BPE/CTC
// decoders, truncation strategies other than LongestFirst or with a stride.
// Where the reference uses older Unicode tables (categories: 8.0,
// normalization and accents: 9.0), redco restricts its own by character age.
// Offsets are byte offsets into the input (the Python package reports
// character offsets; a token that covers part of a character there covers
// the whole character here only where the reference does too).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace redco::data {

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;
  std::vector<std::pair<uint32_t, uint32_t>> offsets;  // byte [begin, end) in the input
  std::vector<uint8_t> special_tokens_mask;  // 1: added by the post-processor / a special token
  std::vector<uint8_t> attention_mask;       // 0 on padding
  size_t size() const { return ids.size(); }
};

// One encoding of an EncodingBatch, viewing the batch's storage (valid while
// the batch lives).
struct EncodingView {
  std::span<const int32_t> ids;
  std::span<const int32_t> type_ids;
  std::span<const std::pair<uint32_t, uint32_t>> offsets;
  std::span<const uint8_t> special_tokens_mask;
  std::span<const uint8_t> attention_mask;
  size_t size() const { return ids.size(); }
  Encoding to_encoding() const;  // an owning copy
};

// encode_batch's result. The encodings of every 64 consecutive texts share
// one set of exactly sized buffers, so a batch of n texts makes ~n/64 * 5
// allocations instead of 5n small ones (fresh memory is what limited
// encode_batch on threads).
class EncodingBatch {
 public:
  static constexpr size_t kChunk = 64;  // texts per storage chunk
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  EncodingView operator[](size_t i) const;

 private:
  friend class Tokenizer;
  struct Chunk {
    std::vector<uint32_t> starts;  // [texts + 1] token offsets of each encoding
    std::vector<int32_t> ids, type_ids;
    std::vector<std::pair<uint32_t, uint32_t>> offsets;
    std::vector<uint8_t> special_tokens_mask, attention_mask;
  };
  std::vector<Chunk> chunks_;
  size_t n_ = 0;
};

enum class Side : uint8_t { right, left };

struct Truncation {
  int64_t max_length = 512;  // including the special tokens the post-processor adds
  Side side = Side::right;   // which end loses tokens
};

struct Padding {
  int64_t length = 0;  // 0: pad a batch to its longest encoding
  int64_t multiple_of = 0;
  Side side = Side::right;
  int32_t pad_id = 0;
  int32_t pad_type_id = 0;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json or a folder holding one (its
  // tokenizer_config.json / special_tokens_map.json are read when present,
  // for the named special tokens), or a folder of GPT2Tokenizer's slow
  // files (vocab.json + merges.txt + tokenizer_config.json), built as
  // transformers converts them. A folder with only another slow layout
  // (tokenizer.model, spiece.model, vocab.txt, ...) is refused with an Error
  // naming its files and the command that writes tokenizer.json. Errors name
  // the file and the problem.
  static Tokenizer from_file(const std::filesystem::path& path);
  // Whether `dir` holds a tokenizer from_file reads: false when it holds no
  // tokenizer files at all; an Error (as from_file's) when it holds only a
  // slow layout redco does not read.
  static bool found_in(const std::filesystem::path& dir);
  static Tokenizer from_json(std::string_view json, std::string_view source = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Throws redco::Error for text that is not valid UTF-8 (the reference
  // accepts only Unicode strings).
  Encoding encode(std::string_view text, bool add_special_tokens = true) const;
  Encoding encode_pair(std::string_view a, std::string_view b,
                       bool add_special_tokens = true) const;
  // Encodes on `threads` threads (0: all), then pads as set; batch[i] is
  // encode(texts[i]) (before padding).
  EncodingBatch encode_batch(std::span<const std::string> texts, bool add_special_tokens = true,
                             int threads = 0) const;
  EncodingBatch encode_batch(std::span<const std::string_view> texts,
                             bool add_special_tokens = true, int threads = 0) const;

  // Throws redco::Error naming an id outside the vocabulary. clean_up_spaces
  // (" ." -> ".", " 's" -> "'s", ... as transformers' clean_up_tokenization)
  // defaults to tokenizer_config.json's clean_up_tokenization_spaces (false).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false,
                     std::optional<bool> clean_up_spaces = std::nullopt) const;
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = false,
                     std::optional<bool> clean_up_spaces = std::nullopt) const;

  void set_truncation(std::optional<Truncation> t);
  void set_padding(std::optional<Padding> p);

  // What transformers' `truncation=True` / `padding=True` mean for this
  // folder's tokenizer_config.json: truncation to model_max_length on
  // truncation_side (nullopt without a model_max_length: the reference then
  // truncates nothing), padding to the longest with pad_token's id on
  // padding_side (throws when no pad_token is named).
  std::optional<Truncation> default_truncation() const;
  Padding default_padding() const;
  std::optional<int64_t> model_max_length() const;

  int64_t vocab_size() const;                         // model vocabulary plus added tokens
  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  std::string id_to_token(int32_t id) const;          // throws for an unknown id
  // A named special token from tokenizer_config.json / special_tokens_map.json
  // ("bos_token", "eos_token", "unk_token", "pad_token", ...): its id, or -1.
  int32_t special_token_id(std::string_view name) const;

  // Incremental decoding for streaming: step() returns the text the new id
  // completes, never a partial UTF-8 character, and the pieces concatenate
  // to decode() of all ids so far (once it ends on a whole character),
  // without clean_up_spaces, which would rewrite text already emitted.
  class Stream {
   public:
    explicit Stream(const Tokenizer& tok, bool skip_special_tokens = false)
        : tok_(&tok), skip_(skip_special_tokens) {}
    std::string step(int32_t id);
    // The text held back at the end (an incomplete character decodes as
    // U+FFFD, as in decode()); the pieces then add up to decode() exactly.
    std::string flush();

   private:
    const Tokenizer* tok_;
    bool skip_;
    std::vector<int32_t> ids_;
    std::string prefix_;  // decode of ids_[0, read_)
    size_t prefix_start_ = 0, read_ = 0;
  };

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  void encode_chunk(std::span<const std::string_view> texts, bool add_special,
                    EncodingBatch::Chunk& out) const;
  static void pad_one(Encoding& e, const Padding& p);
  static void pad_batch(EncodingBatch& batch, const Padding& p);
  std::unique_ptr<Impl> impl_;
};

}  // namespace redco::data

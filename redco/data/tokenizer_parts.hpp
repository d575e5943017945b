#pragma once
// The stages of a Hugging Face tokenizer pipeline, as redco implements them
// (internal to redco/data; users see data::Tokenizer). A text goes:
//   added tokens split off -> normalizer -> pre-tokenizer -> model -> post-processor,
// and ids come back through the decoder. Each stage is built from its
// tokenizer.json object by make_*; a "type" or option redco does not
// implement throws redco::Error naming it, so a file is never silently read
// differently from the reference.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redco/data/regex.hpp"
#include "redco/data/utf8.hpp"
#include "redco/io/json.hpp"

namespace redco::data::tok {

using io::Json;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// A byte range [begin, end) in the caller's original text.
struct Span {
  uint32_t begin = 0, end = 0;
};

// A piece of (normalized) text and, for each of its bytes, the original
// range that byte came from (every byte of one original character maps to
// that whole character), as Hugging Face's NormalizedString keeps it.
struct Piece {
  std::string text;
  std::vector<Span> align;  // [text.size()]
  Span whole;               // the original range of the piece, also when it is empty
  int32_t added_id = -1;    // >= 0: the piece is this added token, not to be tokenized

  // The original range of text bytes [b, e); an empty range maps to a point.
  Span original(size_t b, size_t e) const;
  // Sub-piece of text bytes [b, e).
  Piece slice(size_t b, size_t e) const;
};

// Replaces each character of `p` by what f(codepoint, out) appends to out:
// the output bytes take that character's alignment (a removed character
// leaves nothing), as Hugging Face's NormalizedString::transform does.
template <typename F>
void map_chars(Piece& p, F&& f);

// The general form: (character, change) pairs as Hugging Face's
// NormalizedString::transform takes them (0: replaces the next original
// character, > 0: inserted, < 0: replaces it and removes -change more).
void apply_changes(Piece& p, const std::vector<std::pair<char32_t, int>>& changes);

// UTF-8 helpers: decode the character at s[i] (advancing i); append one
// (data::append_utf8, redco/data/utf8.hpp).
char32_t next_char(std::string_view s, size_t& i);
using data::append_utf8;
// Throws redco::Error naming the byte offset when `s` is not valid UTF-8.
void check_utf8(std::string_view s, std::string_view what);
bool is_whitespace(char32_t c);  // Rust's char::is_whitespace (White_Space)
// The reference classifies punctuation, "other" characters and nonspacing
// marks with Unicode 8.0 tables (Rust's unicode_categories crate), and
// normalizes and strips accents with Unicode 9.0 tables, so these leave out
// characters assigned later (their age comes from ICU).
bool unicode_age_at_most(char32_t c, int major);
bool is_punctuation(char32_t c);      // P* categories
bool is_control(char32_t c);          // Cc, Cf, Co (the reference's "other"; unassigned excluded)
bool is_nonspacing_mark(char32_t c);  // Mn
bool is_chinese_char(char32_t c);     // the CJK blocks BERT isolates

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(Piece& p) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may rewrite) every piece with added_id < 0; others stay.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

// A token from the model, with its byte range in the piece's text.
struct Token {
  int32_t id;
  uint32_t begin, end;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual void tokenize(std::string_view word, std::vector<Token>& out) const = 0;
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 when absent
  virtual const std::string* id_to_token(int32_t id) const = 0;   // nullptr when absent
  virtual int64_t vocab_size() const = 0;
};

// An encoding as the post-processor sees it.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;
  std::vector<Span> offsets;
  std::vector<uint8_t>
      special;  // 1 for tokens the post-processor or added vocabulary marks special
  // The text an added token matched (with the spaces lstrip/rstrip took),
  // which ByteLevel's offset trimming looks at; empty for the other tokens.
  // Sparse: empty when no added token matched, and may be shorter than ids
  // (missing entries are empty), so most encodings make no strings.
  std::vector<std::string> values;
  void clear() { ids.clear(), type_ids.clear(), offsets.clear(), special.clear(), values.clear(); }
};

using IdToToken = std::vector<std::string>;  // the whole vocabulary incl. added tokens

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // `seqs` holds one encoding, or two for a pair; special tokens are added
  // only when add_special. The caller concatenates the results.
  virtual void process(std::vector<Encoding>& seqs, bool add_special,
                       const IdToToken& vocab) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Hugging Face's decode_chain: tokens in, tokens out.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Factories, one per stage; a JSON null is "no stage" and gives nullptr.
std::unique_ptr<Normalizer> make_normalizer(const Json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j);
std::unique_ptr<Model> make_model(const Json& j);
std::unique_ptr<PostProcessor> make_post_processor(const Json& j);
std::unique_ptr<Decoder> make_decoder(const Json& j);

// A tokenizer.json pattern, {"String": literal} or {"Regex": r}, compiled
// so that \s, \S, \w and \W mean what they mean in the reference's
// Oniguruma (White_Space incl. U+0085; Alphabetic, marks, Nd, Pc).
Regex make_pattern(const Json& pattern, std::string_view stage);
Regex make_regex(std::string_view oniguruma_pattern);

// Reading options: a key the stage does not know throws, naming it.
void check_keys(const Json& j, std::string_view stage,
                std::initializer_list<std::string_view> known);
bool get_bool(const Json& j, std::string_view key, bool fallback);
std::string get_string(const Json& j, std::string_view key, std::string_view fallback);
[[noreturn]] void unsupported(std::string_view stage, std::string_view what);

// ---- implementation of map_chars --------------------------------------------
template <typename F>
void map_chars(Piece& p, F&& f) {
  std::string text;
  std::vector<Span> align;
  text.reserve(p.text.size());
  align.reserve(p.text.size());
  std::string out;
  for (size_t i = 0; i < p.text.size();) {
    const size_t start = i;
    const char32_t c = next_char(p.text, i);
    out.clear();
    f(c, out);
    text += out;
    align.insert(align.end(), out.size(), p.align[start]);
  }
  p.text = std::move(text);
  p.align = std::move(align);
}

}  // namespace redco::data::tok

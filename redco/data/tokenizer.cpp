// data::Tokenizer: loading tokenizer.json, the added vocabulary, and the
// encode pipeline (added tokens -> normalizer -> pre-tokenizer -> model ->
// post-processor) in the order and with the offsets of Hugging Face's
// tokenizers; padding, truncation, batches on threads, decoding, streaming.
#include "redco/data/tokenizer.hpp"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <array>
#include <atomic>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_impl.hpp"

namespace redco::data {

using tok::check_keys;
using tok::check_utf8;
using tok::Decoder;
using tok::get_bool;
using tok::get_string;
using tok::IdToToken;
using tok::Json;
using tok::make_decoder;
using tok::make_model;
using tok::make_normalizer;
using tok::make_post_processor;
using tok::make_pre_tokenizer;
using tok::Model;
using tok::next_char;
using tok::Normalizer;
using tok::Piece;
using tok::PostProcessor;
using tok::PreTokenizer;
using tok::Span;
using tok::Token;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REDCO_CHECK(f, "cannot open {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {

// Aho-Corasick's leftmost-longest, non-overlapping matches of `tokens` in s.
template <typename F>
void find_added(std::string_view s, const std::vector<const AddedToken*>& tokens,
                const std::vector<std::string>* contents, const std::array<bool, 256>& first,
                F&& f) {
  for (size_t i = 0; i < s.size();) {
    if (!first[uint8_t(s[i])]) {  // most bytes start no added token
      ++i;
      continue;
    }
    size_t best = SIZE_MAX, len = 0;
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& c = contents ? (*contents)[k] : tokens[k]->content;
      if (!c.empty() && c.size() > len && s.compare(i, c.size(), c) == 0) best = k, len = c.size();
    }
    if (best == SIZE_MAX) {
      ++i;
      continue;
    }
    f(tokens[best], i, i + len);
    i += len;
  }
}

Truncation read_truncation(const Json& t) {
  check_keys(t, "truncation", {"max_length", "strategy", "stride", "direction"});
  REDCO_CHECK(
      get_string(t, "strategy", "LongestFirst") == "LongestFirst" &&
          (!t.contains("stride") || t.at("stride").as_int() == 0),
      "tokenizer.json: truncation strategy/stride other than LongestFirst/0 is not supported");
  return Truncation{t.at("max_length").as_int(),
                    get_string(t, "direction", "Right") == "Left" ? Side::left : Side::right};
}

Padding read_padding(const Json& p) {
  check_keys(p, "padding",
             {"strategy", "direction", "pad_to_multiple_of", "pad_id", "pad_type_id", "pad_token"});
  Padding pad;
  const Json& st = p.at("strategy");
  if (st.is_object() && st.contains("Fixed")) pad.length = st.at("Fixed").as_int();
  pad.side = get_string(p, "direction", "Right") == "Left" ? Side::left : Side::right;
  if (p.contains("pad_to_multiple_of") && !p.at("pad_to_multiple_of").is_null())
    pad.multiple_of = p.at("pad_to_multiple_of").as_int();
  pad.pad_id = int32_t(p.contains("pad_id") ? p.at("pad_id").as_int() : 0);
  pad.pad_type_id = int32_t(p.contains("pad_type_id") ? p.at("pad_type_id").as_int() : 0);
  return pad;
}

}  // namespace

void Tokenizer::Impl::load(const Json& j) {
  for (const auto& [k, v] : j.as_object()) {
    static const std::string_view known[] = {"version",      "truncation",     "padding",
                                             "added_tokens", "normalizer",     "pre_tokenizer",
                                             "model",        "post_processor", "decoder"};
    REDCO_CHECK(std::find(std::begin(known), std::end(known), k) != std::end(known),
                "tokenizer.json: unknown top-level key \"{}\"", k);
  }
  normalizer = make_normalizer(j.contains("normalizer") ? j.at("normalizer") : Json());
  pre_tokenizer = make_pre_tokenizer(j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : Json());
  model = make_model(j.at("model"));
  post_processor =
      make_post_processor(j.contains("post_processor") ? j.at("post_processor") : Json());
  decoder = make_decoder(j.contains("decoder") ? j.at("decoder") : Json());
  if (j.contains("normalizer")) normalizer_json = j.at("normalizer");
  if (j.contains("pre_tokenizer")) pre_tokenizer_json = j.at("pre_tokenizer");
  if (j.contains("post_processor")) post_processor_json = j.at("post_processor");
  if (j.contains("decoder")) decoder_json = j.at("decoder");
  if (j.contains("added_tokens")) {
    for (const Json& t : j.at("added_tokens").as_array()) {
      check_keys(t, "added token",
                 {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      added.push_back({int32_t(t.at("id").as_int()), t.at("content").as_string(),
                       get_bool(t, "single_word", false), get_bool(t, "lstrip", false),
                       get_bool(t, "rstrip", false), get_bool(t, "normalized", true),
                       get_bool(t, "special", false)});
    }
  }
  for (int32_t id = 0; id < int32_t(model->vocab_size()) + int32_t(added.size()) + 1; ++id)
    if (const std::string* s = model->id_to_token(id)) {
      if (vocab.size() <= size_t(id)) vocab.resize(size_t(id) + 1);
      vocab[size_t(id)] = *s;
    }
  for (const AddedToken& t : added) {
    REDCO_CHECK(t.id >= 0, "tokenizer.json: added token \"{}\" has a negative id", t.content);
    if (vocab.size() <= size_t(t.id)) vocab.resize(size_t(t.id) + 1);
    vocab[size_t(t.id)] = t.content;
  }
  is_special.assign(vocab.size(), 0);
  for (const AddedToken& t : added) {
    is_special[size_t(t.id)] = t.special;
    // Tokens flagged `normalized` (special or not) match the normalized text.
    if (t.normalized) {
      norm_tokens.push_back(&t);
      Piece p{t.content, std::vector<Span>(t.content.size()), {}, -1};
      if (normalizer) normalizer->normalize(p);
      norm_contents.push_back(p.text);
      if (!p.text.empty()) added_first_byte[uint8_t(p.text[0])] = true;
    } else {
      raw_tokens.push_back(&t);
    }
    if (!t.content.empty()) added_first_byte[uint8_t(t.content[0])] = true;
  }
  if (j.contains("truncation") && !j.at("truncation").is_null())
    truncation = read_truncation(j.at("truncation"));
  if (j.contains("padding") && !j.at("padding").is_null()) padding = read_padding(j.at("padding"));
}

// The reference's AddedVocabulary::find_matches on every piece still to tokenize.
void Tokenizer::Impl::split_added(std::vector<Piece>& pieces, bool normalized_stage) const {
  const auto& tokens = normalized_stage ? norm_tokens : raw_tokens;
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    if (p.added_id >= 0 || tokens.empty()) {
      if (p.added_id >= 0 || !p.text.empty()) out.push_back(std::move(p));
      continue;
    }
    const std::string_view s = p.text;
    size_t start_offset = 0;
    find_added(
        s, tokens, normalized_stage ? &norm_contents : nullptr, added_first_byte,
        [&](const AddedToken* t, size_t start, size_t stop) {
          size_t pos = 0, b = 0, e = 0;
          if (t->single_word) {
            const bool left = start == 0 || !word_end.next(s.substr(0, start), pos = 0, b, e);
            const bool right = stop == s.size() || !word_start.next(s.substr(stop), pos = 0, b, e);
            if (!left || !right) return;
          }
          if (t->lstrip && ws_end.next(s.substr(0, start), pos = 0, b, e))
            start = std::max(b, start_offset);
          if (t->rstrip && ws_start.next(s.substr(stop), pos = 0, b, e)) stop += e;
          if (start_offset < start) out.push_back(p.slice(start_offset, start));
          out.push_back(p.slice(start, stop));
          out.back().added_id = t->id;
          start_offset = stop;
        });
    if (start_offset < s.size())
      out.push_back(start_offset == 0 ? std::move(p) : p.slice(start_offset, s.size()));
  }
  pieces = std::move(out);
}

// The model's tokens for a word, from a per-thread cache of short words: the
// models are pure functions of the word, and text repeats its words.
const std::vector<Token>& Tokenizer::Impl::tokenize_cached(std::string_view word) const {
  struct Cache {
    uint64_t owner = 0;  // the Impl's serial: an address could be reused by a later tokenizer
    std::unordered_map<std::string, std::vector<Token>, tok::StringHash, std::equal_to<>> map;
    std::vector<Token> scratch;
  };
  thread_local Cache cache;
  if (cache.owner != serial) cache.map.clear(), cache.owner = serial;
  if (word.size() > kMaxCachedWord) {
    cache.scratch.clear();
    model->tokenize(word, cache.scratch);
    return cache.scratch;
  }
  if (auto it = cache.map.find(word); it != cache.map.end()) return it->second;
  if (cache.map.size() >= kCacheEntries) cache.map.clear();
  std::vector<Token> toks;
  model->tokenize(word, toks);
  return cache.map.emplace(std::string(word), std::move(toks)).first->second;
}

void Tokenizer::Impl::encode_one(std::string_view text, tok::Encoding& enc) const {
  check_utf8(text, "Tokenizer::encode");
  thread_local std::vector<Piece> pieces;  // reused: its first piece keeps its buffers
  pieces.resize(1);
  Piece& whole = pieces[0];
  whole.added_id = -1;
  whole.text.assign(text);
  whole.align.resize(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t b = i;
    next_char(text, i);
    for (size_t k = b; k < i; ++k) whole.align[k] = {uint32_t(b), uint32_t(i)};
  }
  whole.whole = {0, uint32_t(text.size())};
  split_added(pieces, false);
  if (normalizer)
    for (Piece& p : pieces)
      if (p.added_id < 0) normalizer->normalize(p);
  split_added(pieces, true);
  if (pre_tokenizer) pre_tokenizer->split(pieces);
  enc.clear();
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      enc.ids.push_back(p.added_id);
      enc.offsets.push_back(p.original(0, p.text.size()));
      enc.special.push_back(uint8_t(is_special[size_t(p.added_id)]));
      enc.values.resize(enc.ids.size());
      enc.values.back() = p.text;
      continue;
    }
    const std::vector<Token>& toks = tokenize_cached(p.text);
    for (const Token& t : toks) {
      enc.ids.push_back(t.id);
      enc.offsets.push_back(p.original(t.begin, t.end));
      enc.special.push_back(0);
    }
  }
  enc.type_ids.assign(enc.ids.size(), 0);
}

// How many tokens the post-processor adds to `n_seqs` sequences.
size_t Tokenizer::Impl::added_by_processor(size_t n_seqs) const {
  if (!post_processor) return 0;
  std::vector<tok::Encoding> seqs(n_seqs);
  post_processor->process(seqs, true, vocab);
  size_t n = 0;
  for (const auto& e : seqs) n += e.ids.size();
  return n;
}

namespace {

void truncate(tok::Encoding& e, size_t n, Side side) {
  if (e.ids.size() <= n) return;
  const long cut = long(e.ids.size() - n);
  if (!e.values.empty()) e.values.resize(e.ids.size());  // sparse: give it the full length
  auto drop = [&](auto& v) {
    if (side == Side::right) {
      v.resize(n);
    } else {
      v.erase(v.begin(), v.begin() + cut);
    }
  };
  drop(e.ids), drop(e.type_ids), drop(e.offsets), drop(e.special);
  if (!e.values.empty()) drop(e.values);
}

}  // namespace

void Tokenizer::Impl::finish(std::vector<tok::Encoding>& seqs, bool add_special) const {
  const int64_t added = truncation && add_special ? int64_t(added_by_processor(seqs.size())) : 0;
  // Like the reference, a max_length below the special tokens' count
  // truncates nothing (its unsigned subtraction wraps around).
  if (truncation && truncation->max_length >= added) {
    const size_t max = size_t(truncation->max_length - added);
    size_t total = 0;
    for (const auto& e : seqs) total += e.ids.size();
    if (seqs.size() == 1) {
      truncate(seqs[0], max, truncation->side);
    } else if (total > max) {
      // The reference's LongestFirst for a pair: the shorter keeps what it
      // can, else both get half.
      size_t n1 = seqs[0].ids.size(), n2 = seqs[1].ids.size();
      const bool swap = n1 > n2;
      if (swap) std::swap(n1, n2);
      n2 = n1 > max ? n1 : std::max(n1, max - n1);
      if (n1 + n2 > max) n1 = max / 2, n2 = n1 + max % 2;
      if (swap) std::swap(n1, n2);
      truncate(seqs[0], n1, truncation->side);
      truncate(seqs[1], n2, truncation->side);
    }
  }
  if (post_processor) post_processor->process(seqs, add_special, vocab);
}

// The post-processed sequences, concatenated, into exactly sized vectors.
data::Encoding Tokenizer::Impl::encode_seqs(std::span<const std::string_view> texts,
                                            bool add_special) const {
  thread_local std::vector<tok::Encoding> seqs;
  seqs.resize(texts.size());
  for (size_t k = 0; k < texts.size(); ++k) encode_one(texts[k], seqs[k]);
  // The second sequence's tokens have type 1, as in the reference.
  if (seqs.size() == 2) seqs[1].type_ids.assign(seqs[1].ids.size(), 1);
  finish(seqs, add_special);
  size_t n = 0;
  for (const auto& s : seqs) n += s.ids.size();
  data::Encoding out;
  out.ids.reserve(n), out.type_ids.reserve(n), out.offsets.reserve(n);
  out.special_tokens_mask.reserve(n);
  for (const tok::Encoding& s : seqs) {
    out.ids.insert(out.ids.end(), s.ids.begin(), s.ids.end());
    out.type_ids.insert(out.type_ids.end(), s.type_ids.begin(), s.type_ids.end());
    for (const Span& o : s.offsets) out.offsets.emplace_back(o.begin, o.end);
    out.special_tokens_mask.insert(out.special_tokens_mask.end(), s.special.begin(),
                                   s.special.end());
  }
  out.attention_mask.assign(n, 1);
  return out;
}

// ---- public ----------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json(std::string_view json, std::string_view source) {
  auto impl = std::make_unique<Impl>();
  const Json j = Json::parse(json, source);
  impl->source = std::string(source);
  try {
    impl->load(j);
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return Tokenizer(std::move(impl));
}

Encoding Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const std::string_view one[] = {text};
  Encoding e = impl_->encode_seqs(one, add_special_tokens);
  if (impl_->padding && impl_->padding->length > 0) pad_one(e, *impl_->padding);
  return e;
}

Encoding Tokenizer::encode_pair(std::string_view a, std::string_view b,
                                bool add_special_tokens) const {
  const std::string_view two[] = {a, b};
  Encoding e = impl_->encode_seqs(two, add_special_tokens);
  if (impl_->padding && impl_->padding->length > 0) pad_one(e, *impl_->padding);
  return e;
}

namespace {

// transformers' clean_up_tokenization, in its order.
std::string clean_up_spaces(std::string s) {
  static const std::pair<std::string_view, std::string_view> rules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : rules) {
    std::string out;
    size_t i = 0;
    for (size_t k; (k = s.find(from, i)) != std::string::npos; i = k + from.size())
      out.append(s, i, k - i).append(to);
    s = out.append(s, i, std::string::npos);
  }
  return s;
}

}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              std::optional<bool> clean_up) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    REDCO_CHECK(id >= 0 && size_t(id) < impl_->vocab.size() && !impl_->vocab[size_t(id)].empty(),
                "Tokenizer::decode: id {} is not in the vocabulary (size {})", id, vocab_size());
    if (skip_special_tokens && impl_->is_special[size_t(id)]) continue;
    tokens.push_back(impl_->vocab[size_t(id)]);
  }
  std::string out;
  if (!impl_->decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  } else {
    impl_->decoder->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  }
  return clean_up.value_or(impl_->clean_up_spaces) ? clean_up_spaces(std::move(out)) : out;
}

std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens,
                              std::optional<bool> clean_up) const {
  std::vector<int32_t> narrow(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    REDCO_CHECK(ids[i] >= 0 && ids[i] < INT32_MAX, "Tokenizer::decode: id {} is out of range",
                ids[i]);
    narrow[i] = int32_t(ids[i]);
  }
  return decode(std::span<const int32_t>(narrow), skip_special_tokens, clean_up);
}

void Tokenizer::set_truncation(std::optional<Truncation> t) {
  REDCO_CHECK(!t || t->max_length > 0,
              "Tokenizer::set_truncation: max_length must be positive, not {}",
              t ? t->max_length : 0);
  impl_->truncation = t;
}
void Tokenizer::set_padding(std::optional<Padding> p) { impl_->padding = p; }

int64_t Tokenizer::vocab_size() const { return int64_t(impl_->vocab.size()); }

int32_t Tokenizer::Impl::token_id(std::string_view token) const {
  for (const AddedToken& t : added)
    if (t.content == token) return t.id;
  return model->token_to_id(token);
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->token_id(token); }

std::string Tokenizer::id_to_token(int32_t id) const {
  REDCO_CHECK(id >= 0 && size_t(id) < impl_->vocab.size() && !impl_->vocab[size_t(id)].empty(),
              "Tokenizer::id_to_token: id {} is not in the vocabulary", id);
  return impl_->vocab[size_t(id)];
}

int32_t Tokenizer::special_token_id(std::string_view name) const {
  auto it = impl_->named_specials.find(name);
  return it == impl_->named_specials.end() ? -1 : it->second;
}

// Decodes a short window: the ids since the last emitted text's start
// (prefix_start_), compared with what that window decoded to before the
// new id; a trailing U+FFFD means a character is still incomplete.
std::string Tokenizer::Stream::step(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> window(ids_.data() + prefix_start_, ids_.size() - prefix_start_);
  // Without clean-up: it would rewrite text already emitted (" ," -> ",").
  std::string text = tok_->decode(window, skip_, false);
  if (text.size() <= prefix_.size() || text.ends_with("\xEF\xBF\xBD")) return {};
  REDCO_CHECK(text.starts_with(prefix_), "Tokenizer::Stream: the decoder rewrote earlier text");
  std::string fresh = text.substr(prefix_.size());
  // The next window starts at the ids read before this step, so a decoder
  // that looks at its neighbours (spaces, byte runs) sees context.
  prefix_start_ = read_;
  read_ = ids_.size();
  prefix_ = tok_->decode(
      std::span<const int32_t>(ids_.data() + prefix_start_, ids_.size() - prefix_start_), skip_,
      false);
  return fresh;
}

std::string Tokenizer::Stream::flush() {
  const std::span<const int32_t> window(ids_.data() + prefix_start_, ids_.size() - prefix_start_);
  const std::string text = tok_->decode(window, skip_, false);
  std::string rest = text.size() > prefix_.size() && text.starts_with(prefix_)
                         ? text.substr(prefix_.size())
                         : std::string();
  prefix_start_ = read_ = ids_.size();
  prefix_.clear();
  return rest;
}

}  // namespace redco::data

// Post-processors (TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence) and decoders (ByteLevel, Metaspace, ByteFallback,
// Fuse, Strip, Replace, WordPiece, Sequence) of tokenizer.json.
#include <fmt/format.h>

#include <array>
#include <map>
#include <span>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

namespace {

// ---- post-processors ---------------------------------------------------------

const std::string kSpaceChar = "\xC4\xA0";  // GPT-2's stand-in for the space byte

// The reference's ByteLevel trim_offsets: offsets leave out a token's leading
// and trailing spaces (its stand-in character), except one leading space the
// pre-tokenizer added to the first token.
void trim_offsets(Encoding& e, bool add_prefix_space, const IdToToken& vocab) {
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const std::string* t = i < e.values.size() && !e.values[i].empty() ? &e.values[i] : nullptr;
    if (!t && size_t(e.ids[i]) >= vocab.size()) continue;
    if (!t) t = &vocab[size_t(e.ids[i])];
    // Leading/trailing space characters and the original bytes they stand for.
    size_t lead = 0, lead_bytes = 0, trail = 0, trail_bytes = 0, chars = 0;
    for (size_t k = 0; k < t->size();) {
      const size_t b = k;
      const char32_t c = next_char(*t, k);
      ++chars;
      const bool stand_in = t->compare(b, k - b, kSpaceChar) == 0;
      const bool space = stand_in || is_whitespace(c);
      const size_t bytes = stand_in ? 1 : k - b;
      if (space && lead + 1 == chars) ++lead, lead_bytes += bytes;
      trail = space ? trail + 1 : 0;
      trail_bytes = space ? trail_bytes + bytes : 0;
    }
    Span& o = e.offsets[i];
    if (lead > 0) {
      if ((i == 0 || o.begin == 0) && add_prefix_space && lead == 1) lead_bytes = 0;
      o.begin = std::min(o.begin + uint32_t(lead_bytes), o.end);
    }
    if (trail > 0 && o.end >= trail_bytes) o.end = std::max(o.end - uint32_t(trail_bytes), o.begin);
  }
}

// before + e + after, the added ones special with empty offsets.
void wrap(Encoding& e, std::span<const int32_t> before, std::span<const int32_t> after,
          int32_t type) {
  // Built in place: the tokens shift right by before.size().
  const size_t n = e.ids.size(), k = before.size(), m = n + k + after.size();
  auto place = [&](auto& v, auto fill) {
    v.resize(m);
    std::move_backward(v.begin(), v.begin() + long(n), v.begin() + long(n + k));
    std::fill(v.begin(), v.begin() + long(k), fill);
    std::fill(v.begin() + long(n + k), v.end(), fill);
  };
  place(e.ids, int32_t(0));
  std::copy(before.begin(), before.end(), e.ids.begin());
  std::copy(after.begin(), after.end(), e.ids.begin() + long(n + k));
  e.type_ids.assign(m, type);
  place(e.offsets, Span{});
  place(e.special, uint8_t(1));
  if (!e.values.empty()) e.values.insert(e.values.begin(), k, std::string());
}

std::pair<std::string, int32_t> token_pair(const Json& j, std::string_view what) {
  REDCO_CHECK(j.is_array() && j.size() == 2, "tokenizer.json: {} is not [token, id]", what);
  return {j.at(size_t(0)).as_string(), int32_t(j.at(size_t(1)).as_int())};
}

class ByteLevelProcessor : public PostProcessor {
 public:
  explicit ByteLevelProcessor(const Json& j) {
    check_keys(j, "post_processor ByteLevel", {"add_prefix_space", "trim_offsets", "use_regex"});
    prefix_ = get_bool(j, "add_prefix_space", true);
    trim_ = get_bool(j, "trim_offsets", true);
  }
  void process(std::vector<Encoding>& seqs, bool, const IdToToken& vocab) const override {
    if (trim_)
      for (Encoding& e : seqs) trim_offsets(e, prefix_, vocab);
  }

 private:
  bool prefix_, trim_;
};

// RobertaProcessing and BertProcessing: <cls> A <sep> [<sep> B <sep>] and
// [CLS] A [SEP] [B [SEP]].
class ClsSep : public PostProcessor {
 public:
  ClsSep(const Json& j, bool roberta) : roberta_(roberta) {
    if (roberta) {
      check_keys(j, "post_processor RobertaProcessing",
                 {"sep", "cls", "trim_offsets", "add_prefix_space"});
      trim_ = get_bool(j, "trim_offsets", true);
      prefix_ = get_bool(j, "add_prefix_space", true);
    } else {
      check_keys(j, "post_processor BertProcessing", {"sep", "cls"});
    }
    sep_ = token_pair(j.at("sep"), "sep").second;
    cls_ = token_pair(j.at("cls"), "cls").second;
  }
  void process(std::vector<Encoding>& seqs, bool add_special,
               const IdToToken& vocab) const override {
    if (trim_)
      for (Encoding& e : seqs) trim_offsets(e, prefix_, vocab);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t type = roberta_ ? 0 : int32_t(i);
      if (!add_special) {
        seqs[i].type_ids.assign(seqs[i].ids.size(), type);
        continue;
      }
      const int32_t sep[] = {sep_}, cls[] = {cls_};
      if (i == 0) {
        wrap(seqs[i], cls, sep, type);
      } else {
        wrap(seqs[i], roberta_ ? std::span<const int32_t>(sep) : std::span<const int32_t>(), sep,
             type);
      }
    }
  }

 private:
  bool roberta_, trim_ = false, prefix_ = false;
  int32_t sep_ = 0, cls_ = 0;
};

class Template : public PostProcessor {
 public:
  explicit Template(const Json& j) {
    check_keys(j, "post_processor TemplateProcessing", {"single", "pair", "special_tokens"});
    for (const auto& [name, t] : j.at("special_tokens").as_object()) {
      std::vector<int32_t> ids;
      for (const Json& id : t.at("ids").as_array()) ids.push_back(int32_t(id.as_int()));
      specials_[name] = std::move(ids);
    }
    single_ = read(j.at("single"));
    pair_ = read(j.at("pair"));
  }
  void process(std::vector<Encoding>& seqs, bool add_special, const IdToToken&) const override {
    const auto& tmpl = seqs.size() == 1 ? single_ : pair_;
    std::vector<Encoding> out;
    for (const Item& it : tmpl) {
      Encoding e;
      if (it.seq >= 0) {
        if (size_t(it.seq) >= seqs.size()) continue;
        e = seqs[size_t(it.seq)];
        e.type_ids.assign(e.ids.size(), it.type);
      } else if (add_special) {
        const auto& ids = specials_.at(it.special);
        wrap(e, ids, {}, it.type);
      }
      out.push_back(std::move(e));
    }
    seqs = std::move(out);
  }

 private:
  struct Item {
    int seq = -1;  // 0 for $A, 1 for $B, -1 for a special token
    std::string special;
    int32_t type = 0;
  };
  std::vector<Item> read(const Json& t) {
    std::vector<Item> items;
    for (const Json& p : t.as_array()) {
      Item it;
      if (p.contains("Sequence")) {
        const std::string& id = p.at("Sequence").at("id").as_string();
        it.seq = id == "A" ? 0 : 1;
        it.type = int32_t(p.at("Sequence").at("type_id").as_int());
      } else {
        it.special = p.at("SpecialToken").at("id").as_string();
        it.type = int32_t(p.at("SpecialToken").at("type_id").as_int());
        REDCO_CHECK(specials_.count(it.special),
                    "tokenizer.json: TemplateProcessing uses special "
                    "token \"{}\" missing from its special_tokens",
                    it.special);
      }
      items.push_back(std::move(it));
    }
    return items;
  }
  std::map<std::string, std::vector<int32_t>> specials_;
  std::vector<Item> single_, pair_;
};

class ProcessorSequence : public PostProcessor {
 public:
  explicit ProcessorSequence(const Json& j) {
    check_keys(j, "post_processor Sequence", {"processors"});
    for (const Json& p : j.at("processors").as_array())
      if (auto s = make_post_processor(p)) parts_.push_back(std::move(s));
  }
  void process(std::vector<Encoding>& seqs, bool add_special,
               const IdToToken& vocab) const override {
    for (const auto& p : parts_) p->process(seqs, add_special, vocab);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// ---- decoders ------------------------------------------------------------------

class ByteLevelDecoder : public Decoder {
 public:
  ByteLevelDecoder() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? char32_t(b) : char32_t(256 + n++);
      byte_of_[c] = uint8_t(b);
    }
  }
  // All tokens become one: their characters mapped back to bytes (a token with
  // a character outside the table keeps its own bytes), invalid UTF-8 replaced.
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        const char32_t c = next_char(t, i);
        ok = c < 0x144 && byte_of_[c] >= 0;
        if (ok) bytes += char(byte_of_[c]);
      }
      if (!ok) bytes.replace(mark, std::string::npos, t);
    }
    tokens.assign(1, lossy_utf8(bytes));
  }
  static std::string lossy_utf8(std::string_view b);

 private:
  std::array<int16_t, 0x144> byte_of_ = [] {
    std::array<int16_t, 0x144> a;
    a.fill(-1);
    return a;
  }();
};

// String::from_utf8_lossy: each maximal invalid sequence becomes U+FFFD.
std::string ByteLevelDecoder::lossy_utf8(std::string_view b) {
  std::string out;
  out.reserve(b.size());
  for (size_t i = 0; i < b.size();) {
    const uint8_t c = uint8_t(b[i]);
    size_t n = c < 0x80                   ? 1
               : (c >= 0xC2 && c <= 0xDF) ? 2
               : (c >= 0xE0 && c <= 0xEF) ? 3
               : (c >= 0xF0 && c <= 0xF4) ? 4
                                          : 0;
    size_t k = 1;
    for (; n > 1 && k < n && i + k < b.size(); ++k) {
      const uint8_t d = uint8_t(b[i + k]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1 && c == 0xE0) lo = 0xA0;
      if (k == 1 && c == 0xED) hi = 0x9F;
      if (k == 1 && c == 0xF0) lo = 0x90;
      if (k == 1 && c == 0xF4) hi = 0x8F;
      if (d < lo || d > hi) break;
    }
    if (n >= 1 && k == n) {
      out.append(b.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += std::max<size_t>(k, 1);
    }
  }
  return out;
}

class MetaspaceDecoder : public Decoder {
 public:
  explicit MetaspaceDecoder(const Json& j) {
    check_keys(j, "decoder Metaspace",
               {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    rep_ = get_string(j, "replacement", "\xE2\x96\x81");
    const bool prefix = get_bool(j, "add_prefix_space", true);
    strip_first_ = get_string(j, "prepend_scheme", prefix ? "always" : "never") != "never";
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      for (size_t k = 0; k < tokens[i].size();) {
        if (tokens[i].compare(k, rep_.size(), rep_) == 0) {
          if (!(i == 0 && strip_first_)) out += ' ';
          k += rep_.size();
        } else {
          out += tokens[i][k++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_ = true;
};

class ByteFallbackDecoder : public Decoder {
 public:
  // Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else
  // one U+FFFD per byte.
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t n_bytes = 0;
    auto flush = [&] {
      if (n_bytes == 0) return;
      std::string fixed = ByteLevelDecoder::lossy_utf8(bytes);
      if (fixed == bytes) {
        out.push_back(bytes);
      } else {
        std::string r;
        for (size_t k = 0; k < n_bytes; ++k) r += "\xEF\xBF\xBD";
        out.push_back(r);
      }
      bytes.clear();
      n_bytes = 0;
    };
    for (std::string& t : tokens) {
      unsigned v = 0;
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
          std::sscanf(t.c_str() + 3, "%2x", &v) == 1 && std::isxdigit(uint8_t(t[3])) &&
          std::isxdigit(uint8_t(t[4]))) {
        bytes += char(v);
        ++n_bytes;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder : public Decoder {
 public:
  explicit StripDecoder(const Json& j) {
    check_keys(j, "decoder Strip", {"content", "start", "stop"});
    content_ = j.at("content").as_string();
    start_ = size_t(j.at("start").as_int());
    stop_ = size_t(j.at("stop").as_int());
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_ = 0, stop_ = 0;
};

class ReplaceDecoder : public Decoder {
 public:
  explicit ReplaceDecoder(const Json& j)
      : re_(make_pattern(j.at("pattern"), "decoder Replace")),
        content_(j.at("content").as_string()) {
    check_keys(j, "decoder Replace", {"pattern", "content"});
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t last = 0;
      re_.for_each_match(t, [&](size_t b, size_t e) {
        out.append(t, last, b - last);
        out += content_;
        last = e;
      });
      out.append(t, last);
      t = std::move(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
};

class WordPieceDecoder : public Decoder {
 public:
  explicit WordPieceDecoder(const Json& j) {
    check_keys(j, "decoder WordPiece", {"prefix", "cleanup"});
    prefix_ = get_string(j, "prefix", "##");
    cleanup_ = get_bool(j, "cleanup", true);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.starts_with(prefix_)) {
          t.erase(0, prefix_.size());
        } else {
          t.insert(0, 1, ' ');
        }
      }
      if (cleanup_) t = cleanup(t);
    }
  }
  // The reference's clean-up of tokenization spaces.
  static std::string cleanup(std::string s) {
    static const std::pair<std::string_view, std::string_view> rules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : rules) {
      std::string out;
      size_t last = 0;
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, last)) {
        out.append(s, last, at - last);
        out += to;
        last = at + from.size();
      }
      out.append(s, last);
      s = std::move(out);
    }
    return s;
  }

 private:
  std::string prefix_;
  bool cleanup_ = true;
};

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(const Json& j) {
    check_keys(j, "decoder Sequence", {"decoders"});
    for (const Json& d : j.at("decoders").as_array())
      if (auto s = make_decoder(d)) parts_.push_back(std::move(s));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : parts_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").as_string();
  if (type == "ByteLevel") return std::make_unique<ByteLevelProcessor>(j);
  if (type == "RobertaProcessing") return std::make_unique<ClsSep>(j, true);
  if (type == "BertProcessing") return std::make_unique<ClsSep>(j, false);
  if (type == "TemplateProcessing") return std::make_unique<Template>(j);
  if (type == "Sequence") return std::make_unique<ProcessorSequence>(j);
  unsupported("post_processor", "type \"" + type + "\"");
}

std::unique_ptr<Decoder> make_decoder(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").as_string();
  if (type == "ByteLevel") {
    check_keys(j, "decoder ByteLevel", {"add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(j);
  if (type == "ByteFallback" || type == "Fuse") {
    check_keys(j, "decoder " + type, {});
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    return std::make_unique<ByteFallbackDecoder>();
  }
  if (type == "Strip") return std::make_unique<StripDecoder>(j);
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j);
  if (type == "WordPiece") return std::make_unique<WordPieceDecoder>(j);
  if (type == "Sequence") return std::make_unique<DecoderSequence>(j);
  unsupported("decoder", "type \"" + type + "\"");
}

}  // namespace redco::data::tok

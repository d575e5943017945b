// The Unigram model (Viterbi over the vocabulary's pieces, unknown-character
// penalty, fused unknowns, byte fallback) and the Precompiled normalizer:
// SentencePiece's character map, a darts-clone double-array trie from
// normalized-from strings to normalized-to strings, applied grapheme by
// grapheme as the reference applies it.
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

namespace {

std::string base64_decode(std::string_view s) {
  std::array<int, 256> v;
  v.fill(-1);
  const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) v[uint8_t(abc[i])] = i;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    REDCO_CHECK(v[uint8_t(c)] >= 0, "tokenizer.json: precompiled_charsmap is not base64");
    acc = acc << 6 | uint32_t(v[uint8_t(c)]);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  return out;
}

// Prefix search in a darts-clone double array (SentencePiece's format).
class DoubleArray {
 public:
  DoubleArray() = default;
  explicit DoubleArray(std::vector<uint32_t> units) : units_(std::move(units)) {}
  // The value of the shortest key that is a prefix of s, or -1.
  int64_t first_prefix(std::string_view s) const {
    if (units_.empty()) return -1;
    size_t pos = offset(units_[0]);
    for (unsigned char c : s) {
      pos ^= c;
      if (pos >= units_.size()) return -1;
      const uint32_t u = units_[pos];
      if ((u & ((1u << 31) | 0xFF)) != c) return -1;
      pos ^= offset(u);
      if ((u >> 8) & 1) return pos < units_.size() ? int64_t(units_[pos] & ((1u << 31) - 1)) : -1;
    }
    return -1;
  }

 private:
  static size_t offset(uint32_t u) { return size_t((u >> 10) << ((u & (1u << 9)) >> 6)); }
  std::vector<uint32_t> units_;
};

class Precompiled : public Normalizer {
 public:
  explicit Precompiled(const Json& j) {
    check_keys(j, "normalizer Precompiled", {"precompiled_charsmap"});
    if (j.at("precompiled_charsmap").is_null()) return;
    const std::string blob = base64_decode(j.at("precompiled_charsmap").as_string());
    REDCO_CHECK(blob.size() >= 4, "tokenizer.json: precompiled_charsmap is too short");
    uint32_t trie_bytes = 0;
    std::memcpy(&trie_bytes, blob.data(), 4);
    REDCO_CHECK(trie_bytes % 4 == 0 && 4 + size_t(trie_bytes) <= blob.size(),
                "tokenizer.json: precompiled_charsmap's trie size {} does not fit its {} bytes",
                trie_bytes, blob.size());
    std::vector<uint32_t> units(trie_bytes / 4);
    std::memcpy(units.data(), blob.data() + 4, trie_bytes);
    trie_ = DoubleArray(std::move(units));
    pool_ = blob.substr(4 + trie_bytes);
    for (int c = 0; c < 128; ++c) {
      const char ch = char(c);
      ascii_found_[size_t(c)] = lookup(std::string_view(&ch, 1), ascii_[size_t(c)]);
    }
  }

  void normalize(Piece& p) const override {
    if (pool_.empty()) return;
    // (character, change) pairs as the reference's NormalizedString::transform takes them.
    std::vector<std::pair<char32_t, int>> changes;
    bool modified = false;
    auto replace = [&](std::string_view old_part, std::string_view new_part) {
      const int old_n = count_chars(old_part), new_n = count_chars(new_part);
      for (size_t i = 0; i < new_part.size();) changes.push_back({next_char(new_part, i), 0});
      const int diff = new_n - old_n;
      if (diff > 0) {
        for (size_t k = 0; k < size_t(diff); ++k) changes[changes.size() - 1 - k].second = 1;
      } else if (diff < 0 && !changes.empty()) {
        changes.back().second += diff;
      }
      modified = true;
    };
    const std::string_view s = p.text;
    for (size_t g = 0; g < s.size();) {
      // An ASCII character before another (CR LF aside) is a grapheme of its own.
      const uint8_t c0 = uint8_t(s[g]);
      if (c0 < 0x80 &&
          (g + 1 == s.size() || (uint8_t(s[g + 1]) < 0x80 && !(c0 == '\r' && s[g + 1] == '\n')))) {
        if (ascii_found_[c0]) {
          replace(s.substr(g, 1), ascii_[c0]);
        } else {
          changes.push_back({char32_t(c0), 0});
        }
        ++g;
        continue;
      }
      const size_t end = grapheme_end(s, g);
      const std::string_view grapheme = s.substr(g, end - g);
      std::string_view to;
      if (grapheme.size() < 6 && lookup(grapheme, to)) {
        replace(grapheme, to);
      } else {
        for (size_t i = 0; i < grapheme.size();) {
          const size_t b = i;
          const char32_t c = next_char(grapheme, i);
          if (lookup(grapheme.substr(b, i - b), to)) {
            replace(grapheme.substr(b, i - b), to);
          } else {
            changes.push_back({c, 0});
          }
        }
      }
      g = end;
    }
    if (modified) apply_changes(p, changes);
  }

 private:
  static int count_chars(std::string_view s) {
    int n = 0;
    for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
  }
  static size_t grapheme_end(std::string_view s, size_t i) {
    utf8proc_int32_t state = 0;
    char32_t prev = next_char(s, i);
    while (i < s.size()) {
      size_t k = i;
      const char32_t c = next_char(s, k);
      if (utf8proc_grapheme_break_stateful(utf8proc_int32_t(prev), utf8proc_int32_t(c), &state))
        break;
      prev = c;
      i = k;
    }
    return i;
  }
  // The reference takes the shortest key that prefixes the chunk.
  bool lookup(std::string_view chunk, std::string_view& to) const {
    const int64_t at = trie_.first_prefix(chunk);
    if (at < 0 || size_t(at) >= pool_.size()) return false;
    const size_t end = pool_.find('\0', size_t(at));
    to = std::string_view(pool_).substr(
        size_t(at), (end == std::string::npos ? pool_.size() : end) - size_t(at));
    return true;
  }

  DoubleArray trie_;
  std::string pool_;
  std::array<std::string_view, 128> ascii_{};  // views into pool_
  std::array<bool, 128> ascii_found_{};
};

// Pieces in a byte trie: children in one hash map keyed by (node, byte).
class PieceTrie {
 public:
  void insert(std::string_view s, int32_t id) {
    uint32_t node = 0;
    for (unsigned char c : s) {
      auto [it, fresh] = next_.try_emplace(key(node, c), uint32_t(ids_.size()));
      if (fresh) ids_.push_back(-1);
      node = it->second;
    }
    ids_[node] = id;
  }
  // Calls f(length, id) for every piece that prefixes s, shortest first.
  template <typename F>
  void prefixes(std::string_view s, F&& f) const {
    uint32_t node = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      auto it = next_.find(key(node, uint8_t(s[i])));
      if (it == next_.end()) return;
      node = it->second;
      if (ids_[node] >= 0) f(i + 1, ids_[node]);
    }
  }

 private:
  static uint64_t key(uint32_t node, uint8_t c) { return uint64_t(node) << 8 | c; }
  std::unordered_map<uint64_t, uint32_t> next_;
  std::vector<int32_t> ids_{-1};  // node -> piece id
};

class Unigram : public Model {
 public:
  explicit Unigram(const Json& j) {
    check_keys(j, "model Unigram", {"unk_id", "vocab", "byte_fallback"});
    for (const Json& e : j.at("vocab").as_array()) {
      REDCO_CHECK(e.is_array() && e.size() == 2,
                  "tokenizer.json: Unigram vocab entry is not [piece, score]");
      const int32_t id = int32_t(pieces_.size());
      pieces_.push_back(e.at(size_t(0)).as_string());
      scores_.push_back(e.at(size_t(1)).as_double());
      ids_.emplace(pieces_.back(), id);
      trie_.insert(pieces_.back(), id);
      min_score_ = std::min(min_score_, scores_.back());
    }
    if (j.contains("unk_id") && !j.at("unk_id").is_null())
      unk_id_ = int32_t(j.at("unk_id").as_int());
    REDCO_CHECK(unk_id_ < int32_t(pieces_.size()),
                "tokenizer.json: Unigram unk_id {} is outside the vocab", unk_id_);
    byte_fallback_ = get_bool(j, "byte_fallback", false);
  }

  void tokenize(std::string_view s, std::vector<Token>& out) const override {
    if (s.empty()) return;
    std::vector<std::pair<uint32_t, uint32_t>> parts;  // [begin, end) of each piece, fused unknowns
    viterbi(s, parts);
    for (auto [b, e] : parts) {
      const std::string_view piece = s.substr(b, e - b);
      auto it = ids_.find(std::string(piece));
      if (it != ids_.end()) {
        out.push_back({it->second, b, e});
        continue;
      }
      if (byte_fallback_ && byte_tokens(piece, b, e, out)) continue;
      REDCO_CHECK(unk_id_ >= 0, "tokenizer.json: Unigram needs an unk_id for \"{}\"",
                  std::string(piece));
      out.push_back({unk_id_, b, e});
    }
  }
  int32_t token_to_id(std::string_view t) const override {
    auto it = ids_.find(std::string(t));
    return it == ids_.end() ? -1 : it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && size_t(id) < pieces_.size() ? &pieces_[size_t(id)] : nullptr;
  }
  int64_t vocab_size() const override { return int64_t(pieces_.size()); }

 private:
  bool byte_tokens(std::string_view piece, uint32_t b, uint32_t e, std::vector<Token>& out) const {
    const size_t first = out.size();
    for (unsigned char c : piece) {
      auto it = ids_.find(fmt::format("<0x{:02X}>", c));
      if (it == ids_.end()) {
        out.resize(first);
        return false;
      }
      out.push_back({it->second, b, e});
    }
    return true;
  }

  // The best-scoring segmentation; a character no piece starts with costs
  // min_score - 10 as an unknown, and runs of unknowns fuse into one.
  void viterbi(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& parts) const {
    struct Node {
      double score = 0;
      int64_t start = -1;
      int32_t id = -1;
    };
    std::vector<Node> best(s.size() + 1);
    const double unk_score = min_score_ - 10.0;
    for (size_t at = 0; at < s.size();) {
      size_t next = at;
      next_char(s, next);
      const double here = best[at].score;
      bool single = false;
      trie_.prefixes(s.substr(at), [&](size_t len, int32_t id) {
        Node& n = best[at + len];
        const double cand = here + scores_[size_t(id)];
        if (n.start < 0 || cand > n.score) n = {cand, int64_t(at), id};
        single = single || at + len == next;
      });
      if (!single) {
        REDCO_CHECK(unk_id_ >= 0,
                    "tokenizer.json: Unigram has no unk_id for a character outside its vocab");
        Node& n = best[next];
        if (n.start < 0 || here + unk_score > n.score) n = {here + unk_score, int64_t(at), unk_id_};
      }
      at = next;
    }
    parts.clear();
    bool fusing = false;
    size_t fuse_end = 0;
    for (size_t end = s.size(); end > 0;) {
      const Node& n = best[end];
      const size_t start = size_t(n.start);
      if (n.id == unk_id_) {
        if (!fusing) fusing = true, fuse_end = end;
      } else {
        if (fusing) parts.push_back({uint32_t(end), uint32_t(fuse_end)});
        fusing = false;
        parts.push_back({uint32_t(start), uint32_t(end)});
      }
      end = start;
    }
    if (fusing) parts.push_back({0, uint32_t(fuse_end)});
    std::reverse(parts.begin(), parts.end());
  }

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  std::unordered_map<std::string, int32_t> ids_;
  PieceTrie trie_;
  double min_score_ = std::numeric_limits<double>::max();
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
};

}  // namespace

// The reference's NormalizedString::transform: each (char, change) takes the
// alignment of the original character it replaces (change <= 0, skipping
// -change more), or of the byte before it when inserted (change > 0).
void apply_changes(Piece& p, const std::vector<std::pair<char32_t, int>>& changes) {
  std::string text;
  std::vector<Span> align;
  size_t offset = 0;
  for (const auto& [c, change] : changes) {
    Span a;
    if (change > 0) {
      a = offset < 1 ? Span{p.whole.begin, p.whole.begin} : p.align[offset - 1];
    } else {
      a = offset < p.align.size() ? p.align[offset] : Span{p.whole.end, p.whole.end};
      if (offset < p.text.size()) next_char(p.text, offset);
      for (int k = 0; k < -change && offset < p.text.size(); ++k) next_char(p.text, offset);
    }
    const size_t before = text.size();
    append_utf8(text, c);
    align.insert(align.end(), text.size() - before, a);
  }
  p.text = std::move(text);
  p.align = std::move(align);
}

std::unique_ptr<Model> make_unigram(const Json& j) { return std::make_unique<Unigram>(j); }
std::unique_ptr<Normalizer> make_precompiled(const Json& j) {
  return std::make_unique<Precompiled>(j);
}

}  // namespace redco::data::tok

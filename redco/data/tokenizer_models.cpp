// Models of tokenizer.json: BPE (both merges formats, byte_fallback,
// ignore_merges, continuing_subword_prefix, end_of_word_suffix, unk_token
// with fuse_unk) and WordPiece. Unigram lives in tokenizer_unigram.cpp.
#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

namespace {

using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// vocab object -> (token -> id) and (id -> token); ids must be dense enough to index.
void read_vocab(const Json& j, Vocab& vocab, std::vector<std::string>& by_id,
                std::string_view what) {
  for (const auto& [tok, id] : j.as_object()) {
    const int64_t i = id.as_int();
    REDCO_CHECK(i >= 0 && i < (int64_t(1) << 24),
                "tokenizer.json: {} id {} of token \"{}\" is out of range", what, i, tok);
    vocab.emplace(tok, int32_t(i));
    if (size_t(i) >= by_id.size()) by_id.resize(size_t(i) + 1);
    by_id[size_t(i)] = tok;
  }
}

// (left id, right id) -> (rank, merged id): open addressing, linear probing;
// the merge loop spends most of its time here.
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>>& entries) {
    size_t cap = 16;
    while (cap < entries.size() * 2) cap *= 2;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {});
    for (const auto& [k, v] : entries) {
      size_t i = slot(k);
      while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & (cap - 1);
      if (keys_[i] == k) continue;  // a repeated merge keeps its first (highest) rank
      keys_[i] = k, vals_[i] = v;
    }
  }
  const std::pair<int32_t, int32_t>* find(uint64_t k) const {
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  size_t slot(uint64_t k) const {
    return size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & (keys_.size() - 1);
  }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> vals_;
};

int32_t find(const Vocab& v, std::string_view s) {
  auto it = v.find(s);
  return it == v.end() ? -1 : it->second;
}

class Bpe : public Model {
 public:
  explicit Bpe(const Json& j) {
    check_keys(j, "model BPE",
               {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
    if (j.contains("dropout") && !j.at("dropout").is_null() && j.at("dropout").as_double() != 0.0)
      unsupported("model BPE", "option dropout (redco encodes deterministically)");
    read_vocab(j.at("vocab"), vocab_, by_id_, "BPE vocab");
    unk_ = get_string(j, "unk_token", "");
    prefix_ = get_string(j, "continuing_subword_prefix", "");
    suffix_ = get_string(j, "end_of_word_suffix", "");
    fuse_unk_ = get_bool(j, "fuse_unk", false);
    byte_fallback_ = get_bool(j, "byte_fallback", false);
    ignore_merges_ = get_bool(j, "ignore_merges", false);
    read_merges(j.at("merges"));
    if (byte_fallback_)
      for (int b = 0; b < 256; ++b)
        byte_ids_[size_t(b)] = find(vocab_, fmt::format("<0x{:02X}>", b));
    char_ids_.resize(kCharTable);
    for (char32_t c = 0; c < kCharTable; ++c) {
      std::string u;
      append_utf8(u, c);
      char_ids_[c] = find(vocab_, u);
    }
  }

  void tokenize(std::string_view word, std::vector<Token>& out) const override {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const int32_t id = find(vocab_, word); id >= 0) {
        out.push_back({id, 0, uint32_t(word.size())});
        return;
      }
    }
    merge_word(word, out);
  }

  int32_t token_to_id(std::string_view t) const override { return find(vocab_, t); }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && size_t(id) < by_id_.size() && !by_id_[size_t(id)].empty()
               ? &by_id_[size_t(id)]
               : nullptr;
  }
  int64_t vocab_size() const override { return int64_t(vocab_.size()); }

 private:
  void read_merges(const Json& merges) {
    const auto& list = merges.as_array();
    std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>> entries;
    entries.reserve(list.size());
    for (size_t r = 0; r < list.size(); ++r) {
      std::string a, b;
      if (list[r].is_string()) {  // "a b"
        const std::string& s = list[r].as_string();
        const size_t sp = s.find(' ');
        REDCO_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                    "tokenizer.json: BPE merge {} (\"{}\") is not two tokens separated by a space",
                    r, s);
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {  // ["a", "b"]
        REDCO_CHECK(list[r].size() == 2, "tokenizer.json: BPE merge {} is not a pair", r);
        a = list[r].at(size_t(0)).as_string();
        b = list[r].at(size_t(1)).as_string();
      }
      const int32_t ia = find(vocab_, a), ib = find(vocab_, b);
      const std::string joined = a + b.substr(std::min(prefix_.size(), b.size()));
      const int32_t ij = find(vocab_, joined);
      REDCO_CHECK(
          ia >= 0 && ib >= 0 && ij >= 0,
          "tokenizer.json: BPE merge {} (\"{}\" \"{}\") uses a token missing from the vocab", r, a,
          b);
      entries.push_back({key(ia, ib), {int32_t(r), ij}});
    }
    merges_.build(entries);
  }
  static uint64_t key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t begin, len;
  };

  // The reference's merge_word: characters (with prefix/suffix, byte
  // fallback, unknowns) then merges, lowest rank first, leftmost on ties.
  void merge_word(std::string_view w, std::vector<Token>& out) const {
    std::vector<Symbol> sym;
    sym.reserve(w.size());
    // Offsets are running sums of the lengths, as in the reference's Word
    // (so a dropped character shifts what follows).
    uint32_t pos = 0;
    auto add = [&](int32_t id, uint32_t len) {
      sym.push_back({id, 0, 0, pos, len});
      pos += len;
    };
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    auto flush_unk = [&] {
      if (unk_id >= 0) add(unk_id, unk_len);
      unk_id = -1;
    };
    std::string buf;
    for (size_t i = 0; i < w.size();) {
      const size_t b = i;
      const char32_t cp = next_char(w, i);
      std::string_view s = w.substr(b, i - b);
      if ((b > 0 && !prefix_.empty()) || (i == w.size() && !suffix_.empty())) {
        buf.assign(b > 0 ? prefix_ : std::string());
        buf.append(s);
        if (i == w.size()) buf += suffix_;
        s = buf;
      }
      const int32_t id = s.size() == i - b && cp < kCharTable ? char_ids_[cp] : find(vocab_, s);
      if (id >= 0) {
        flush_unk();
        add(id, uint32_t(i - b));
        continue;
      }
      if (byte_fallback_ &&
          std::all_of(s.begin(), s.end(), [&](char c) { return byte_ids_[uint8_t(c)] >= 0; })) {
        flush_unk();
        for (char c : s) add(byte_ids_[uint8_t(c)], 1);
        continue;
      }
      if (unk_.empty()) continue;  // the reference drops the character
      const int32_t uid = find(vocab_, unk_);
      REDCO_CHECK(uid >= 0, "tokenizer.json: BPE unk_token \"{}\" is not in the vocab", unk_);
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += uint32_t(i - b);
      } else {
        flush_unk();
        unk_id = uid, unk_len = uint32_t(i - b);
      }
    }
    flush_unk();
    merge_all(sym);
    for (const Symbol& x : sym) out.push_back({x.id, x.begin, x.begin + x.len});
  }

  void merge_all(std::vector<Symbol>& sym) const {
    const int32_t n = int32_t(sym.size());
    for (int32_t k = 0; k < n; ++k)
      sym[size_t(k)].prev = k - 1, sym[size_t(k)].next = k + 1 < n ? k + 1 : -1;
    struct Cand {
      int32_t rank, pos, new_id;
      bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand> q;
    auto push = [&](int32_t pos) {
      const Symbol& l = sym[size_t(pos)];
      if (l.next < 0) return;
      if (const auto* m = merges_.find(key(l.id, sym[size_t(l.next)].id)))
        q.push({m->first, pos, m->second});
    };
    for (int32_t k = 0; k + 1 < n; ++k) push(k);
    std::vector<bool> dead(size_t(n), false);
    while (!q.empty()) {
      const Cand c = q.top();
      q.pop();
      Symbol& l = sym[size_t(c.pos)];
      if (dead[size_t(c.pos)] || l.next < 0) continue;
      Symbol& r = sym[size_t(l.next)];
      const auto* m = merges_.find(key(l.id, r.id));
      if (!m || m->second != c.new_id) continue;  // stale
      l.id = c.new_id;
      l.len += r.len;
      dead[size_t(l.next)] = true;
      l.next = r.next;
      if (r.next >= 0) sym[size_t(r.next)].prev = c.pos;
      if (l.prev >= 0) push(l.prev);
      push(c.pos);
    }
    std::vector<Symbol> alive;
    alive.reserve(size_t(n));
    for (int32_t k = 0; k < n; ++k)
      if (!dead[size_t(k)]) alive.push_back(sym[size_t(k)]);
    sym = std::move(alive);
  }

  Vocab vocab_;
  std::vector<std::string> by_id_;
  MergeTable merges_;
  static constexpr char32_t kCharTable = 0x800;  // one- and two-byte characters
  std::vector<int32_t> char_ids_;                // character -> id of its token, or -1
  std::string unk_, prefix_, suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};
};

class WordPiece : public Model {
 public:
  explicit WordPiece(const Json& j) {
    check_keys(j, "model WordPiece",
               {"unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"});
    read_vocab(j.at("vocab"), vocab_, by_id_, "WordPiece vocab");
    unk_ = get_string(j, "unk_token", "[UNK]");
    prefix_ = get_string(j, "continuing_subword_prefix", "##");
    max_chars_ = j.contains("max_input_chars_per_word")
                     ? size_t(j.at("max_input_chars_per_word").as_int())
                     : 100;
  }
  // Greedy longest match first; a word with an unmatched part is one unk.
  void tokenize(std::string_view w, std::vector<Token>& out) const override {
    size_t chars = 0;
    for (char c : w) chars += (uint8_t(c) & 0xC0) != 0x80;
    const size_t first = out.size();
    std::string s;
    for (size_t start = 0; chars <= max_chars_ && start < w.size();) {
      size_t end = w.size();
      int32_t id = -1;
      while (start < end) {
        s.assign(start > 0 ? prefix_ : std::string());
        s.append(w.substr(start, end - start));
        if ((id = find(vocab_, s)) >= 0) break;
        do --end;
        while (end > start && (uint8_t(w[end]) & 0xC0) == 0x80);
      }
      if (id < 0) {
        out.resize(first);
        chars = max_chars_ + 1;
        break;
      }
      out.push_back({id, uint32_t(start), uint32_t(end)});
      start = end;
    }
    if (chars > max_chars_) {
      const int32_t uid = find(vocab_, unk_);
      REDCO_CHECK(uid >= 0, "tokenizer.json: WordPiece unk_token \"{}\" is not in the vocab", unk_);
      out.push_back({uid, 0, uint32_t(w.size())});
    }
  }
  int32_t token_to_id(std::string_view t) const override { return find(vocab_, t); }
  const std::string* id_to_token(int32_t id) const override {
    return id >= 0 && size_t(id) < by_id_.size() ? &by_id_[size_t(id)] : nullptr;
  }
  int64_t vocab_size() const override { return int64_t(vocab_.size()); }

 private:
  Vocab vocab_;
  std::vector<std::string> by_id_;
  std::string unk_, prefix_;
  size_t max_chars_ = 100;
};

}  // namespace

std::unique_ptr<Model> make_unigram(const Json& j);  // tokenizer_unigram.cpp

std::unique_ptr<Model> make_model(const Json& j) {
  REDCO_CHECK(j.is_object() && (j.contains("type") || j.contains("merges")),
              "tokenizer.json: \"model\" has no \"type\"");
  const std::string type = j.contains("type") ? j.at("type").as_string() : "BPE";
  if (type == "BPE") return std::make_unique<Bpe>(j);
  if (type == "WordPiece") return std::make_unique<WordPiece>(j);
  if (type == "Unigram") return make_unigram(j);
  unsupported("model", "type \"" + type + "\"");
}

}  // namespace redco::data::tok

// Byte-level BPE: the pre-tokenizer, training with incremental pair counts,
// encoding by merge rank, and GPT-2's vocab.json / merges.txt files.
#include "redco/data/bpe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/data/utf8.hpp"
#include "redco/data/vocab_json.hpp"
#include "redco/io/json.hpp"

namespace redco::data {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
}

// ---- pre-tokenizer ---------------------------------------------------------------
enum class Cls : uint8_t { space, letter, digit, other };

Cls cls(char ch) {
  const auto c = uint8_t(ch);
  if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::space;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Cls::letter;
  if (c >= 0x80) return Cls::letter;  // UTF-8 lead and continuation bytes
  if (c >= '0' && c <= '9') return Cls::digit;
  return Cls::other;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) that `s` starts with, or 0.
size_t contraction(std::string_view s) {
  for (std::string_view c : {"'s", "'t", "'m", "'d", "'re", "'ve", "'ll"})
    if (s.starts_with(c)) return c.size();
  return 0;
}

// ---- GPT-2's byte-to-unicode alphabet ----------------------------------------------
// Printable bytes stand for themselves; the other 68 are shifted to U+0100..U+0143
// so that every token is a string of visible characters (a space is U+0120 'Ġ').
struct ByteAlphabet {
  std::array<char32_t, 256> cp{};
  std::array<int16_t, 324> byte{};  // code point -> byte, -1 where none
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a = [] {
    ByteAlphabet t;
    t.byte.fill(-1);
    char32_t shifted = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t.cp[size_t(b)] = printable ? char32_t(b) : shifted++;
      t.byte[t.cp[size_t(b)]] = int16_t(b);
    }
    return t;
  }();
  return a;
}

// Token bytes -> their spelling in the alphabet, as code points.
std::u32string to_alphabet(std::string_view bytes) {
  std::u32string out;
  for (char b : bytes) out += alphabet().cp[uint8_t(b)];
  return out;
}

// The reverse; false when a character is outside the alphabet.
bool from_alphabet(std::u32string_view spelled, std::string& bytes) {
  bytes.clear();
  for (char32_t c : spelled) {
    if (c >= alphabet().byte.size() || alphabet().byte[c] < 0) return false;
    bytes += char(alphabet().byte[c]);
  }
  return true;
}

// ---- training ------------------------------------------------------------------
struct Word {
  std::vector<int32_t> ids;
  int64_t count;
};

// Replaces each (a, b), left to right and without overlaps, with c.
bool merge_in_word(std::vector<int32_t>& w, int32_t a, int32_t b, int32_t c) {
  size_t out = 0;
  bool any = false;
  for (size_t i = 0; i < w.size(); ++i) {
    if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
      w[out++] = c;
      ++i;
      any = true;
    } else {
      w[out++] = w[i];
    }
  }
  w.resize(out);
  return any;
}

struct Candidate {  // a pair and its count when queued
  int64_t count;
  uint64_t key;
  // The queue's top is the largest count, then the smallest (left, right).
  bool operator<(const Candidate& o) const {
    return count < o.count || (count == o.count && key > o.key);
  }
};

// Pair counts over the distinct words, weighted by each word's count, kept up
// to date as merges rewrite words: a merge touches only the words that hold
// its pair (found through `where`), not the whole corpus. The queue is lazy:
// a popped candidate whose count is stale is dropped, and every change of a
// count queues the new value.
class PairCounts {
 public:
  explicit PairCounts(std::vector<Word> words) : words_(std::move(words)) {
    for (int32_t i = 0; i < int32_t(words_.size()); ++i) {
      const Word& w = words_[size_t(i)];
      for (size_t j = 0; j + 1 < w.ids.size(); ++j) {
        const uint64_t k = pair_key(w.ids[j], w.ids[j + 1]);
        count_[k] += w.count;
        note(k, i);
      }
    }
    for (const auto& [k, c] : count_) queue_.push({c, k});
  }

  // The most frequent pair, or false when no pair is left.
  bool best(uint64_t& key) {
    while (!queue_.empty()) {
      const Candidate top = queue_.top();
      queue_.pop();
      const auto it = count_.find(top.key);
      if (it != count_.end() && it->second == top.count) {
        key = top.key;
        return true;
      }
    }
    return false;
  }

  // Rewrites every word holding `key`'s pair with `result` in its place.
  void merge(uint64_t key, int32_t result) {
    const auto a = int32_t(key >> 32), b = int32_t(key & 0xFFFFFFFFu);
    const std::vector<int32_t> holders = std::move(where_[key]);
    where_.erase(key);
    std::unordered_map<uint64_t, int64_t> delta;
    for (int32_t i : holders) {
      Word& w = words_[size_t(i)];
      std::vector<int32_t> merged = w.ids;
      if (!merge_in_word(merged, a, b, result)) continue;  // listed twice
      for (size_t j = 0; j + 1 < w.ids.size(); ++j)
        delta[pair_key(w.ids[j], w.ids[j + 1])] -= w.count;
      for (size_t j = 0; j + 1 < merged.size(); ++j) {
        const uint64_t k = pair_key(merged[j], merged[j + 1]);
        delta[k] += w.count;
        // Only pairs with the new token are new to this word.
        if (merged[j] == result || merged[j + 1] == result) note(k, i);
      }
      w.ids = std::move(merged);
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      const int64_t c = count_[k] += d;
      if (c > 0)
        queue_.push({c, k});
      else
        count_.erase(k);
    }
  }

 private:
  void note(uint64_t k, int32_t word) {
    std::vector<int32_t>& list = where_[k];
    if (list.empty() || list.back() != word) list.push_back(word);
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<Candidate> queue_;
};

// ---- files -----------------------------------------------------------------------
std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REDCO_CHECK(in, "Bpe::load: cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

void write_json_key(std::string& out, std::string_view bytes) {
  out += '"';
  for (char32_t c : to_alphabet(bytes)) {
    if (c == '"' || c == '\\') out += '\\';
    if (c < 0x80)
      out += char(c);
    else
      out += fmt::format("\\u{:04x}", uint32_t(c));
  }
  out += '"';
}

}  // namespace

// ---- Bpe -------------------------------------------------------------------------
std::vector<std::string_view> Bpe::split_words(std::string_view s) {
  std::vector<std::string_view> out;
  const size_t n = s.size();
  auto run_end = [&](size_t j, Cls c) {
    while (j < n && cls(s[j]) == c) ++j;
    return j;
  };
  for (size_t i = 0; i < n;) {
    if (const size_t len = s[i] == '\'' ? contraction(s.substr(i)) : 0) {
      out.push_back(s.substr(i, len));
      i += len;
      continue;
    }
    // One leading space joins the word after it.
    const size_t j = i + (s[i] == ' ' && i + 1 < n && cls(s[i + 1]) != Cls::space);
    const Cls c = cls(s[j]);
    size_t end = run_end(j, c);
    // A whitespace run before a word leaves its last character to that word
    // (a space prefixes it; anything else becomes a word of its own).
    if (c == Cls::space && end < n && end - i > 1) --end;
    out.push_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

void Bpe::add_merge(int32_t left, int32_t right, int32_t result) {
  rank_.emplace(pair_key(left, right), int32_t(merges_.size()));
  merges_.push_back({left, right, result});
}

Bpe Bpe::train(std::string_view text, int64_t vocab_size) {
  REDCO_CHECK(vocab_size >= 256 && vocab_size < (int64_t(1) << 31),
              "Bpe::train: vocab_size {} must be at least 256 (the byte tokens)", vocab_size);
  Bpe bpe;
  std::unordered_map<std::string, int32_t> ids;  // token bytes -> id
  for (int b = 0; b < 256; ++b) {
    bpe.tokens_.emplace_back(1, char(b));
    bpe.byte_id_[b] = b;
    ids.emplace(bpe.tokens_.back(), b);
  }
  std::unordered_map<std::string_view, int64_t> counts;
  for (std::string_view w : split_words(text)) ++counts[w];
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [w, c] : counts) {
    if (w.size() < 2) continue;  // nothing to merge
    words.push_back({std::vector<int32_t>(w.begin(), w.end()), c});
    for (int32_t& id : words.back().ids) id = uint8_t(id);
  }
  PairCounts pairs(std::move(words));
  uint64_t key = 0;
  while (bpe.vocab_size() < vocab_size && pairs.best(key)) {
    const auto a = int32_t(key >> 32), b = int32_t(key & 0xFFFFFFFFu);
    std::string bytes = bpe.tokens_[size_t(a)] + bpe.tokens_[size_t(b)];
    // Two merge paths can spell the same bytes ("ab"+"c", "a"+"bc"): they share an id.
    const auto [it, is_new] = ids.emplace(std::move(bytes), int32_t(bpe.tokens_.size()));
    if (is_new) bpe.tokens_.push_back(it->first);
    bpe.add_merge(a, b, it->second);
    pairs.merge(key, it->second);
  }
  return bpe;
}

const std::string& Bpe::token(int64_t id) const {
  REDCO_CHECK(id >= 0 && id < vocab_size(), "Bpe: token id {} is outside the vocabulary [0, {})",
              id, vocab_size());
  return tokens_[size_t(id)];
}

// Merges the adjacent pair of lowest rank first, leftmost first among equal
// ranks (what GPT-2's loop does), with a heap over a linked list of symbols so
// that a long word costs O(n log n) rather than O(n^2).
void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const auto n = int32_t(word.size());
  std::vector<int32_t> id(word.size()), next(word.size()), prev(word.size());
  for (int32_t i = 0; i < n; ++i) {
    id[size_t(i)] = byte_id_[uint8_t(word[size_t(i)])];
    next[size_t(i)] = i + 1;
    prev[size_t(i)] = i - 1;
  }
  struct Site {
    int32_t rank, pos, left, right;
    bool operator>(const Site& o) const { return rank > o.rank || (rank == o.rank && pos > o.pos); }
  };
  std::priority_queue<Site, std::vector<Site>, std::greater<Site>> heap;
  auto push = [&](int32_t i) {
    const int32_t j = next[size_t(i)];
    if (j >= n) return;
    const auto it = rank_.find(pair_key(id[size_t(i)], id[size_t(j)]));
    if (it != rank_.end()) heap.push({it->second, i, id[size_t(i)], id[size_t(j)]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Site s = heap.top();
    heap.pop();
    const int32_t i = s.pos, j = next[size_t(i)];
    if (id[size_t(i)] != s.left || j >= n || id[size_t(j)] != s.right) continue;  // stale
    id[size_t(i)] = merges_[size_t(s.rank)].result;
    id[size_t(j)] = -1;
    next[size_t(i)] = next[size_t(j)];
    if (next[size_t(j)] < n) prev[size_t(next[size_t(j)])] = i;
    if (prev[size_t(i)] >= 0) push(prev[size_t(i)]);
    push(i);
  }
  for (int32_t i = 0; i < n; i = next[size_t(i)]) out.push_back(id[size_t(i)]);
}

std::vector<int32_t> Bpe::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  std::vector<int32_t> scratch;
  for (std::string_view w : split_words(text)) {
    if (w.size() == 1) {
      out.push_back(byte_id_[uint8_t(w[0])]);
      continue;
    }
    auto [it, is_new] = cache.try_emplace(w);
    if (is_new) encode_word(w, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string Bpe::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token(id);
  return out;
}

std::string Bpe::decode(std::span<const int64_t> ids) const {
  std::string out;
  for (int64_t id : ids) out += token(id);
  return out;
}

void Bpe::save(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  std::string vocab = "{\n";
  for (size_t i = 0; i < tokens_.size(); ++i) {
    vocab += "  ";
    write_json_key(vocab, tokens_[i]);
    vocab += fmt::format(": {}{}\n", i, i + 1 < tokens_.size() ? "," : "");
  }
  vocab += "}\n";
  std::string merges = "#version: 0.2\n";
  for (const Merge& m : merges_) {
    for (char32_t c : to_alphabet(tokens_[size_t(m.left)])) append_utf8(merges, c);
    merges += ' ';
    for (char32_t c : to_alphabet(tokens_[size_t(m.right)])) append_utf8(merges, c);
    merges += '\n';
  }
  for (const auto& [name, body] : {std::pair{"vocab.json", &vocab}, {"merges.txt", &merges}}) {
    const std::filesystem::path path = dir / name;
    std::ofstream f(path, std::ios::binary);
    f << *body;
    REDCO_CHECK(f.good(), "Bpe::save: could not write {}", path.string());
  }
}

// split_words as a tokenizer.json Split pattern: the same four classes
// (whitespace is ASCII's six, every non-ASCII character counts as a letter),
// contractions first, one leading space joining a word, and a whitespace run
// leaving its last character to the word after it.
const char* const Bpe::kSplitPattern =
    R"('(?:s|t|re|ve|m|ll|d)| ?[A-Za-z\x{80}-\x{10FFFF}]+| ?[0-9]+)"
    R"(| ?[^ \t\n\x0B\f\rA-Za-z0-9\x{80}-\x{10FFFF}]+)"
    R"(|[ \t\n\x0B\f\r]+(?![^ \t\n\x0B\f\r])|[ \t\n\x0B\f\r]+)";

std::string Bpe::to_tokenizer_json() const {
  using io::Json;
  auto spell = [](std::string_view bytes) {
    std::string s;
    for (char32_t c : to_alphabet(bytes)) append_utf8(s, c);
    return s;
  };
  Json vocab = Json::object(), merges = Json::array();
  for (size_t i = 0; i < tokens_.size(); ++i) vocab[spell(tokens_[i])] = int64_t(i);
  for (const Merge& m : merges_)
    merges.push_back(
        Json(Json::Array{spell(tokens_[size_t(m.left)]), spell(tokens_[size_t(m.right)])}));
  Json model = Json::object();
  model["type"] = "BPE";
  for (const char* k : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"})
    model[k] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);
  Json split = Json::object(), pattern = Json::object(), bytes = Json::object();
  pattern["Regex"] = kSplitPattern;
  split["type"] = "Split";
  split["pattern"] = std::move(pattern);
  split["behavior"] = "Isolated";
  split["invert"] = false;
  bytes["type"] = "ByteLevel";
  bytes["add_prefix_space"] = false;
  bytes["trim_offsets"] = false;
  bytes["use_regex"] = false;
  Json pre = Json::object();
  pre["type"] = "Sequence";
  pre["pretokenizers"] = Json(Json::Array{std::move(split), bytes});
  Json j = Json::object();
  j["version"] = "1.0";
  for (const char* k : {"truncation", "padding", "normalizer", "post_processor"}) j[k] = nullptr;
  j["added_tokens"] = Json::array();
  j["pre_tokenizer"] = std::move(pre);
  j["decoder"] = std::move(bytes);
  j["model"] = std::move(model);
  return j.dump();
}

void Bpe::save_tokenizer_json(const std::filesystem::path& file) const {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::ofstream f(file, std::ios::binary);
  f << to_tokenizer_json();
  REDCO_CHECK(f.good(), "Bpe::save_tokenizer_json: could not write {}", file.string());
}

Bpe Bpe::load(const std::filesystem::path& dir) {
  Bpe bpe;
  std::unordered_map<std::string, int32_t> ids;
  {
    const std::string file = (dir / "vocab.json").string();
    const std::string text = read_file(file);
    const std::vector<VocabEntry> entries = parse_vocab_json(text, file);
    bpe.tokens_.assign(entries.size(), {});
    std::vector<bool> seen(entries.size());
    std::string bytes;
    for (const auto& [spelled, id, line] : entries) {
      REDCO_CHECK(from_alphabet(spelled, bytes),
                  "{}:{}: the token has characters outside GPT-2's byte alphabet", file, line);
      REDCO_CHECK(id < int64_t(entries.size()) && !seen[size_t(id)],
                  "{}:{}: token ids must be 0..{} once each; id {} is out of range or repeated",
                  file, line, entries.size() - 1, id);
      REDCO_CHECK(ids.emplace(bytes, int32_t(id)).second, "{}:{}: the token is listed twice", file,
                  line);
      seen[size_t(id)] = true;
      bpe.tokens_[size_t(id)] = bytes;
    }
    for (int b = 0; b < 256; ++b) {
      const auto it = ids.find(std::string(1, char(b)));
      REDCO_CHECK(it != ids.end(), "{}: byte 0x{:02x} has no token", file, b);
      bpe.byte_id_[b] = it->second;
    }
  }
  const std::string file = (dir / "merges.txt").string();
  std::istringstream in(read_file(file));
  std::string line, bytes[2];
  std::u32string spelled;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    REDCO_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                    line.find(' ', space + 1) == std::string::npos,
                "{}:{}: expected two tokens separated by one space, found \"{}\"", file, n, line);
    int32_t part[2];
    for (int k = 0; k < 2; ++k) {
      const std::string_view s = k == 0 ? std::string_view(line).substr(0, space)
                                        : std::string_view(line).substr(space + 1);
      spelled.clear();
      REDCO_CHECK(decode_utf8(s, spelled) && from_alphabet(spelled, bytes[k]),
                  "{}:{}: \"{}\" is not spelled in GPT-2's byte alphabet", file, n, s);
      const auto it = ids.find(bytes[k]);
      REDCO_CHECK(it != ids.end(), "{}:{}: \"{}\" is not in vocab.json", file, n, s);
      part[k] = it->second;
    }
    const auto it = ids.find(bytes[0] + bytes[1]);
    REDCO_CHECK(it != ids.end(), "{}:{}: the merged token \"{}\" is not in vocab.json", file, n,
                line.substr(0, space) + line.substr(space + 1));
    REDCO_CHECK(!bpe.rank_.contains(pair_key(part[0], part[1])), "{}:{}: merge \"{}\" repeated",
                file, n, line);
    bpe.add_merge(part[0], part[1], it->second);
  }
  return bpe;
}

}  // namespace redco::data

// data::Tokenizer against the `tokenizers` package: ids, offsets and decodes
// on committed goldens (edge cases and seeded random Unicode strings, made by
// tests/python/make_tokenizer_goldens.py), streaming decode, batches, and
// the errors a user can cause. The whole-KJV comparison with the live
// package is tests/test_tokenizer_kjv.cpp.
#include <catch2/catch.hpp>
#include <sstream>

#include "tokenizer_goldens.hpp"

using namespace redco;
using tokenizer_test::fixture;

namespace {

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> offsets;
  std::string decode, decode_skip;
};

std::vector<Case> goldens(const std::string& kind) {
  const io::Json j = io::Json::parse(tokenizer_test::read_gz(fixture(kind) / "goldens.json.gz"));
  std::vector<Case> cases;
  for (const io::Json& c : j.at("cases").as_array()) {
    Case k{c.at("text").as_string(), {}, {}, c.at("decode").as_string(), c.at("decode_skip").as_string()};
    for (const io::Json& id : c.at("ids").as_array()) k.ids.push_back(int32_t(id.as_int()));
    for (const io::Json& o : c.at("offsets").as_array())
      k.offsets.emplace_back(uint32_t(o.at(size_t(0)).as_int()), uint32_t(o.at(size_t(1)).as_int()));
    cases.push_back(std::move(k));
  }
  return cases;
}

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += (c >= 0x20 && c < 0x7F) ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

template <typename T>
std::string str(const std::vector<T>& v) {
  std::ostringstream o;
  for (const auto& x : v) o << x << ' ';
  return o.str();
}
std::string str(const std::vector<std::pair<uint32_t, uint32_t>>& v) {
  std::ostringstream o;
  for (const auto& [a, b] : v) o << a << ':' << b << ' ';
  return o.str();
}

// Every golden case; mismatches are counted and the first few printed.
void check_goldens(const std::string& kind) {
  const auto tok = data::Tokenizer::from_file(fixture(kind));
  const auto cases = goldens(kind);
  size_t bad_ids = 0, bad_offsets = 0, bad_decode = 0, shown = 0;
  for (const Case& c : cases) {
    const data::Encoding e = tok.encode(c.text);
    const auto offsets = tokenizer_test::char_offsets(c.text, e.offsets);
    const bool ids_ok = e.ids == c.ids, offsets_ok = offsets == c.offsets;
    const std::string d = tok.decode(c.ids), ds = tok.decode(c.ids, true);
    const bool dec_ok = d == c.decode && ds == c.decode_skip;
    bad_ids += !ids_ok, bad_offsets += ids_ok && !offsets_ok, bad_decode += !dec_ok;
    if ((!ids_ok || !offsets_ok || !dec_ok) && shown++ < 5) {
      UNSCOPED_INFO(kind << " text \"" << show(c.text) << "\"\n  ids  " << str(e.ids) << "\n  want " << str(c.ids)
                         << "\n  offsets " << str(offsets) << "\n  want    " << str(c.offsets) << "\n  decode \""
                         << show(d) << "\" / \"" << show(ds) << "\"\n  want   \"" << show(c.decode) << "\" / \""
                         << show(c.decode_skip) << "\"");
    }
  }
  INFO(kind << ": " << cases.size() << " cases");
  CHECK(bad_ids == 0);
  CHECK(bad_offsets == 0);
  CHECK(bad_decode == 0);
}

}  // namespace

TEST_CASE("tokenizer: GPT-2-style byte-level BPE equals the reference", "[tokenizer]") { check_goldens("gpt2"); }
TEST_CASE("tokenizer: LLaMA-3-style BPE (split regex, ignore_merges) equals the reference", "[tokenizer]") {
  check_goldens("llama3");
}
TEST_CASE("tokenizer: RoBERTa-style BPE equals the reference", "[tokenizer]") { check_goldens("roberta"); }
TEST_CASE("tokenizer: BERT-style WordPiece equals the reference", "[tokenizer]") { check_goldens("bert"); }
TEST_CASE("tokenizer: LLaMA-2-style BPE with byte fallback equals the reference", "[tokenizer]") {
  check_goldens("llama2");
}
TEST_CASE("tokenizer: T5-style Unigram with a precompiled charsmap equals the reference", "[tokenizer]") {
  check_goldens("t5");
}

// data::Tokenizer against the `tokenizers` package: ids, offsets and decodes
// on committed goldens (edge cases and seeded random Unicode strings, made by
// tests/python/make_tokenizer_goldens.py), streaming decode, batches, and
// the errors a user can cause. The whole-KJV comparison with the live
// package is tests/test_tokenizer_kjv.cpp.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer_goldens.hpp"

using namespace redco;
using Catch::Matchers::Contains;
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
    Case k{c.at("text").as_string(),
           {},
           {},
           c.at("decode").as_string(),
           c.at("decode_skip").as_string()};
    for (const io::Json& id : c.at("ids").as_array()) k.ids.push_back(int32_t(id.as_int()));
    for (const io::Json& o : c.at("offsets").as_array())
      k.offsets.emplace_back(uint32_t(o.at(size_t(0)).as_int()),
                             uint32_t(o.at(size_t(1)).as_int()));
    cases.push_back(std::move(k));
  }
  return cases;
}

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    out += (c >= 0x20 && c < 0x7F) ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
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
      UNSCOPED_INFO(kind << " text \"" << show(c.text) << "\"\n  ids  " << str(e.ids) << "\n  want "
                         << str(c.ids) << "\n  offsets " << str(offsets) << "\n  want    "
                         << str(c.offsets) << "\n  decode \"" << show(d) << "\" / \"" << show(ds)
                         << "\"\n  want   \"" << show(c.decode) << "\" / \"" << show(c.decode_skip)
                         << "\"");
    }
  }
  INFO(kind << ": " << cases.size() << " cases");
  CHECK(bad_ids == 0);
  CHECK(bad_offsets == 0);
  CHECK(bad_decode == 0);
}

}  // namespace

TEST_CASE("tokenizer: GPT-2-style byte-level BPE equals the reference", "[tokenizer]") {
  check_goldens("gpt2");
}
TEST_CASE("tokenizer: LLaMA-3-style BPE (split regex, ignore_merges) equals the reference",
          "[tokenizer]") {
  check_goldens("llama3");
}
TEST_CASE("tokenizer: RoBERTa-style BPE equals the reference", "[tokenizer]") {
  check_goldens("roberta");
}
TEST_CASE("tokenizer: BERT-style WordPiece equals the reference", "[tokenizer]") {
  check_goldens("bert");
}
TEST_CASE("tokenizer: LLaMA-2-style BPE with byte fallback equals the reference", "[tokenizer]") {
  check_goldens("llama2");
}
TEST_CASE("tokenizer: T5-style Unigram with a precompiled charsmap equals the reference",
          "[tokenizer]") {
  check_goldens("t5");
}

namespace {

std::vector<int32_t> ints(const io::Json& a) {
  std::vector<int32_t> v;
  for (const io::Json& x : a.as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}
std::vector<std::pair<uint32_t, uint32_t>> pairs(const io::Json& a) {
  std::vector<std::pair<uint32_t, uint32_t>> v;
  for (const io::Json& o : a.as_array())
    v.emplace_back(uint32_t(o.at(size_t(0)).as_int()), uint32_t(o.at(size_t(1)).as_int()));
  return v;
}

const char* kKinds[] = {"gpt2", "llama3", "roberta", "bert", "llama2", "t5", "misc"};

}  // namespace

TEST_CASE("tokenizer: pairs, with and without truncation, equal the reference", "[tokenizer]") {
  for (const char* kind : kKinds) {
    auto tok = data::Tokenizer::from_file(fixture(kind));
    const io::Json j = io::Json::parse(tokenizer_test::read_gz(fixture(kind) / "goldens.json.gz"));
    for (const io::Json& p : j.at("pairs").as_array()) {
      const int64_t max = p.at("max_length").as_int();
      tok.set_truncation(max > 0 ? std::optional(data::Truncation{max}) : std::nullopt);
      const std::string a = p.at("a").as_string(), b = p.at("b").as_string();
      const data::Encoding e = tok.encode_pair(a, b);
      INFO(kind << " pair \"" << a << "\" / \"" << b << "\" max_length " << max);
      CHECK(e.ids == ints(p.at("ids")));
      CHECK(e.type_ids == ints(p.at("type_ids")));
      // Offsets index the sequence each token came from, which the
      // encoding does not record for every post-processor: count only.
      CHECK(e.offsets.size() == p.at("offsets").size());
    }
  }
}

TEST_CASE("tokenizer: encode_batch with truncation and padding equals the reference",
          "[tokenizer]") {
  const std::vector<std::string> texts = {"In the beginning God created the heaven and the earth.",
                                          "", "Jesus wept.",
                                          "And God said, Let there be light: and there was light.",
                                          "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x91\x8d  x"};
  for (const char* kind : kKinds) {
    auto tok = data::Tokenizer::from_file(fixture(kind));
    const io::Json j = io::Json::parse(tokenizer_test::read_gz(fixture(kind) / "goldens.json.gz"));
    for (const io::Json& b : j.at("batches").as_array()) {
      const data::Side side =
          b.at("side").as_string() == "left" ? data::Side::left : data::Side::right;
      tok.set_truncation(data::Truncation{b.at("max_length").as_int(), side});
      tok.set_padding(data::Padding{0, b.at("multiple_of").as_int(), side, 3, 1});
      const auto encs = tok.encode_batch(texts, true, 2);
      for (size_t i = 0; i < texts.size(); ++i) {
        INFO(kind << " text " << i << " side " << b.at("side").as_string() << " max "
                  << b.at("max_length").as_int());
        const data::Encoding e = encs[i].to_encoding();
        CHECK(e.ids == ints(b.at("ids").at(i)));
        CHECK(e.type_ids == ints(b.at("type_ids").at(i)));
        const auto mask = ints(b.at("attention_mask").at(i));
        CHECK(std::vector<int32_t>(e.attention_mask.begin(), e.attention_mask.end()) == mask);
        CHECK(tokenizer_test::char_offsets(texts[i], e.offsets) == pairs(b.at("offsets").at(i)));
      }
    }
  }
}

TEST_CASE("tokenizer: encode_batch on threads equals encode", "[tokenizer]") {
  for (const char* kind : kKinds) {
    const auto tok = data::Tokenizer::from_file(fixture(kind));
    std::vector<std::string> texts;
    for (const Case& c : goldens(kind)) texts.push_back(c.text);
    const auto batch = tok.encode_batch(texts, true, 2);
    REQUIRE(batch.size() == texts.size());
    INFO(kind);
    size_t bad = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const data::Encoding one = tok.encode(texts[i]), many = batch[i].to_encoding();
      bad += many.ids != one.ids || many.offsets != one.offsets || many.type_ids != one.type_ids ||
             many.special_tokens_mask != one.special_tokens_mask ||
             many.attention_mask != one.attention_mask;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("tokenizer: the stream decoder emits whole characters that add up to decode()",
          "[tokenizer]") {
  for (const char* kind : kKinds) {
    const auto tok = data::Tokenizer::from_file(fixture(kind));
    size_t bad = 0, partial = 0;
    for (const Case& c : goldens(kind)) {
      for (bool skip : {false, true}) {
        data::Tokenizer::Stream stream(tok, skip);
        std::string streamed;
        for (int32_t id : c.ids) {
          const std::string piece = stream.step(id);
          // Each piece is valid UTF-8 on its own.
          try {
            tok.encode(piece, false);
          } catch (const Error&) {
            ++partial;
          }
          streamed += piece;
        }
        const std::string& want = skip ? c.decode_skip : c.decode;
        // A decode ending in U+FFFD is held back (it might still complete).
        if (!want.ends_with("\xEF\xBF\xBD")) bad += streamed != want;
      }
    }
    INFO(kind);
    CHECK(bad == 0);
    CHECK(partial == 0);
  }
}

TEST_CASE("tokenizer: user errors name the problem", "[tokenizer]") {
  const auto tok = data::Tokenizer::from_file(fixture("gpt2"));
  CHECK_THROWS_WITH(tok.encode("ok \xff bad"), Contains("invalid UTF-8 at byte 3"));
  CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{5, 999999}),
                    Contains("id 999999 is not in the vocabulary"));
  CHECK_THROWS_WITH(data::Tokenizer::from_file("/nonexistent/dir"), Contains("no tokenizer at"));
  const std::string base =
      R"({"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":PRE,
    "post_processor":null,"decoder":null,"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}})";
  auto with = [&](const std::string& pre) {
    std::string s = base;
    s.replace(s.find("PRE"), 3, pre);
    return s;
  };
  CHECK(data::Tokenizer::from_json(with("null")).encode("abab").ids == std::vector<int32_t>{2, 2});
  CHECK_THROWS_WITH(data::Tokenizer::from_json(with(R"({"type":"UnicodeScripts"})")),
                    Contains("pre_tokenizer type \"UnicodeScripts\" is not supported"));
  CHECK_THROWS_WITH(data::Tokenizer::from_json(
                        with(R"({"type":"ByteLevel","add_prefix_space":true,"frobnicate":1})")),
                    Contains("option \"frobnicate\""));
  CHECK_THROWS_WITH(
      data::Tokenizer::from_json(with(
          R"({"type":"Split","pattern":{"Regex":"(("},"behavior":"Isolated","invert":false})")),
      Contains("does not compile"));
  std::string dropout = with("null");
  dropout.replace(dropout.find(R"("type":"BPE")"), 12, R"("type":"BPE","dropout":0.1)");
  CHECK_THROWS_WITH(data::Tokenizer::from_json(dropout), Contains("dropout"));
  std::string bad_merge = with("null");
  bad_merge.replace(bad_merge.find(R"("a b")"), 5, R"("a c")");
  CHECK_THROWS_WITH(data::Tokenizer::from_json(bad_merge), Contains("merge 0"));
  CHECK_THROWS_WITH(data::Tokenizer::from_json("{"), Contains("tokenizer.json"));
}
TEST_CASE(
    "tokenizer: the remaining components (Unicode forms, Whitespace, Digits, ...) equal the "
    "reference",
    "[tokenizer]") {
  check_goldens("misc");
}

TEST_CASE(
    "tokenizer: named special tokens come from tokenizer_config.json / special_tokens_map.json",
    "[tokenizer]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("redco_test_tokenizer_config_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture("llama2") / "tokenizer.json", dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}, "unk_token": "<unk>",
            "pad_token": null, "model_max_length": 4096, "add_bos_token": true,
            "tokenizer_class": "LlamaTokenizerFast"})";
  std::ofstream(dir / "special_tokens_map.json")
      << R"({"bos_token": "</s>"})";  // read first: it wins
  const auto tok = data::Tokenizer::from_file(dir);
  CHECK(tok.special_token_id("bos_token") == tok.token_to_id("</s>"));
  CHECK(tok.special_token_id("eos_token") == 2);
  CHECK(tok.special_token_id("unk_token") == 0);
  CHECK(tok.special_token_id("pad_token") == -1);
  CHECK(tok.encode("In the beginning", false).ids.front() != 1);  // no <s> without special tokens
  // LlamaTokenizerFast's post-processor starts with the bos_token, here </s>.
  CHECK(tok.encode("In the beginning").ids.front() == tok.token_to_id("</s>"));
  fs::remove_all(dir);
}

// Byte-level BPE (training, encoding, GPT-2's files) and generation.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "redco/autodiff/functional.hpp"
#include "redco/core/philox.hpp"
#include "redco/data/bpe.hpp"
#include "redco/data/text.hpp"
#include "redco/data/tokenizer.hpp"
#include "redco/models/gpt2.hpp"
#include "reference_generate.hpp"
#include "skip.hpp"

using namespace redco;
using Catch::Matchers::Contains;

namespace {

// The whole KJV, one verse a line; empty (with a warning) without bible-kjv.
// The cases that need it are tagged [kjv] (the bpe_kjv test, which exits 77
// then); the tokenizer.json case trains on a fixed text instead.
const std::string& kjv() {
  static const std::string text = [] {
    try {
      return data::join_verses(data::read_kjv());
    } catch (const Error& e) {
      WARN("no KJV: " << e.what());
      return std::string();
    }
  }();
  return text;
}

// Trained once: the KJV at vocab 2048, timed.
const data::Bpe& kjv_bpe() {
  static const data::Bpe bpe = [] {
    const auto t0 = std::chrono::steady_clock::now();
    data::Bpe b = data::Bpe::train(kjv(), 2048);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WARN("Bpe::train on the KJV (" << kjv().size() << " bytes) at vocab 2048: " << s << " s");
    return b;
  }();
  return bpe;
}

std::string random_bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(philox_bits(seed, 1, i) & 0xFF);
  return s;
}

// Strings that must survive encode -> decode byte for byte.
std::vector<std::string> awkward_strings() {
  return {"",
          "a",
          " ",
          "\n\n\t  x  \r\n",
          "it's we'll they're I'D 'tis '''",
          "h\xc3\xa9llo w\xc3\xb6rld \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82",
          "\xff\xfe\xc3( \x80\x80 \xed\xa0\x80 \xc0\xaf",
          std::string("nul\0byte", 8),
          random_bytes(20000, 3)};
}

std::string bytes_of(const data::Bpe& bpe, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += "[" + bpe.token(id) + "]";
  return s;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("redco_test_bpe_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("the pre-tokenizer splits like GPT-2's regex", "[bpe]") {
  using V = std::vector<std::string_view>;
  CHECK(data::Bpe::split_words("Hello world's  end\n\nok 42x!?") ==
        V{"Hello", " world", "'s", " ", " end", "\n", "\n", "ok", " 42", "x", "!?"});
  CHECK(data::Bpe::split_words("And God said, Let there be light:\n") ==
        V{"And", " God", " said", ",", " Let", " there", " be", " light", ":", "\n"});
  CHECK(data::Bpe::split_words("a  ") == V{"a", "  "});  // trailing whitespace stays whole
  CHECK(data::Bpe::split_words("x\n y") == V{"x", "\n", " y"});
  CHECK(data::Bpe::split_words("").empty());
}

TEST_CASE("merges on tiny corpora are the hand-computed ones", "[bpe]") {
  using M = data::Bpe::Merge;
  auto same = [](const M& a, const M& b) {
    return a.left == b.left && a.right == b.right && a.result == b.result;
  };
  SECTION("aaabdaaabac: aa, then ab (ties go to the smaller pair), then aa+ab") {
    const auto bpe = data::Bpe::train("aaabdaaabac", 259);
    REQUIRE(bpe.vocab_size() == 259);
    REQUIRE(bpe.merges().size() == 3);
    CHECK(same(bpe.merges()[0], M{'a', 'a', 256}));  // 4 (overlapping) occurrences
    CHECK(same(bpe.merges()[1], M{'a', 'b', 257}));  // 2, tied with (aa, a)
    CHECK(same(bpe.merges()[2], M{256, 257, 258}));
    CHECK(bpe.token(258) == "aaab");
    CHECK(bpe.encode("aaabdaaabac") == std::vector<int32_t>{258, 'd', 258, 'a', 'c'});
  }
  SECTION("word counts weight the pairs and merges stay inside words") {
    // hug x10, pug x5, pun x12, bun x4, hugs x5: ug (20), then un (16), then h+ug (15).
    std::string text;
    for (auto [w, n] : {std::pair{"hug", 10}, {"pug", 5}, {"pun", 12}, {"bun", 4}, {"hugs", 5}})
      for (int i = 0; i < n; ++i) text += std::string(w) + "\n";
    const auto bpe = data::Bpe::train(text, 259);
    REQUIRE(bpe.merges().size() == 3);
    CHECK(same(bpe.merges()[0], M{'u', 'g', 256}));
    CHECK(same(bpe.merges()[1], M{'u', 'n', 257}));
    CHECK(same(bpe.merges()[2], M{'h', 256, 258}));
    CHECK(bpe.encode("hugs bun\n") == std::vector<int32_t>{258, 's', ' ', 'b', 257, '\n'});
  }
  SECTION("training stops when every word is one token") {
    const auto bpe = data::Bpe::train("ab ab", 1000);
    CHECK(bpe.vocab_size() == 258);  // "ab", then " ab"
    CHECK(bpe.encode("ab ab") == std::vector<int32_t>{256, 257});
  }
  CHECK_THROWS_WITH(data::Bpe::train("x", 100), Contains("at least 256"));
}

TEST_CASE("encode/decode round-trips any bytes", "[bpe]") {
  const auto tiny = data::Bpe::train("the cat sat on the mat; the end", 280);
  for (const std::string& s : awkward_strings()) {
    INFO("string of " << s.size() << " bytes");
    CHECK(tiny.decode(tiny.encode(s)) == s);
  }
  // A single long word (no spaces) takes the heap path without blowing up.
  const std::string long_word(200000, 'a');
  CHECK(tiny.decode(tiny.encode(long_word)) == long_word);
  CHECK_THROWS_WITH(tiny.decode(std::vector<int32_t>{5, 280}), Contains("token id 280"));
  CHECK_THROWS_WITH(tiny.decode(std::vector<int64_t>{-1}), Contains("outside the vocabulary"));
}

TEST_CASE("BPE on the KJV: round trip and compression", "[bpe][kjv]") {
  const std::string& text = kjv();
  if (text.empty()) test::skip("the KJV is not installed (sudo apt-get install bible-kjv)");
  const data::Bpe& bpe = kjv_bpe();
  CHECK(bpe.vocab_size() == 2048);
  const auto ids = bpe.encode(text);
  CHECK(bpe.decode(ids) == text);
  const double bytes_per_token = double(text.size()) / double(ids.size());
  WARN("KJV at vocab 2048: " << ids.size() << " tokens, " << bytes_per_token << " bytes/token");
  CHECK(bytes_per_token > 3.2);  // measured 3.59
  // Frequent words are single tokens.
  CHECK(bpe.encode(" the").size() == 1);
  CHECK(bpe.encode(" LORD").size() == 1);
  INFO(bytes_of(bpe, bpe.encode("In the beginning God created the heaven and the earth.")));
  CHECK(bpe.encode("In the beginning God created the heaven and the earth.").size() <= 14);
}

namespace {

// Saves `bpe`, loads it back and checks the two agree on `texts`; returns
// the vocab.json written.
std::string check_save_load(const data::Bpe& bpe, const std::string& name,
                            const std::vector<std::string>& texts) {
  const auto dir = temp_dir(name);
  bpe.save(dir);
  const auto back = data::Bpe::load(dir);
  REQUIRE(back.vocab_size() == bpe.vocab_size());
  REQUIRE(back.merges().size() == bpe.merges().size());
  for (int64_t id = 0; id < bpe.vocab_size(); ++id) CHECK(back.token(id) == bpe.token(id));
  for (const std::string& s : texts) CHECK(back.encode(s) == bpe.encode(s));
  std::ifstream vocab(dir / "vocab.json"), merges(dir / "merges.txt");
  std::string first;
  std::getline(merges, first);
  CHECK(first == "#version: 0.2");
  return std::string((std::istreambuf_iterator<char>(vocab)), {});
}

}  // namespace

TEST_CASE("save then load gives the same tokenizer", "[bpe]") {
  const data::Bpe bpe = data::Bpe::train("the cat sat on the mat", 270);
  const std::string json = check_save_load(bpe, "save", awkward_strings());
  // GPT-2's spelling: a space is U+0120, escaped as in GPT-2's encoder.json.
  CHECK_THAT(json, Contains("\"\\u0120\": 32,"));
  CHECK_THAT(json, Contains("\"\\\"\": 34,"));
}

TEST_CASE("the KJV tokenizer: any bytes round-trip, save then load gives it back", "[bpe][kjv]") {
  if (kjv().empty()) test::skip("the KJV is not installed (sudo apt-get install bible-kjv)");
  const data::Bpe& bpe = kjv_bpe();
  std::vector<std::string> texts = awkward_strings();
  for (const std::string& s : texts) {
    INFO("string of " << s.size() << " bytes");
    CHECK(bpe.decode(bpe.encode(s)) == s);
  }
  texts.push_back(kjv().substr(0, 300000));
  const std::string json = check_save_load(bpe, "save_kjv", texts);
  CHECK_THAT(json, Contains("\"\\u0120the\": "));
}

TEST_CASE("GPT-2's own file layout loads", "[bpe]") {
  // GPT-2's encoder.json lists the bytes in its alphabet's order (printable
  // bytes first), on one line; merges.txt spells merges in the same alphabet.
  std::vector<int> order;
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  std::string json = "{";
  int shifted = 256;
  for (size_t id = 0; id < order.size(); ++id) {
    const int b = order[id];
    const bool printable = id < 188;
    std::string key = b == '"' ? "\\\"" : b == '\\' ? "\\\\" : std::string(1, char(b));
    if (b >= 0x80 || !printable) key = fmt::format("\\u{:04x}", printable ? b : shifted++);
    json += fmt::format("\"{}\": {}, ", key, id);
  }
  json += "\"\\u0120t\": 256, \"he\": 257, \"\\u0120the\": 258, \"<|endoftext|>\": 259}";
  const auto dir = temp_dir("gpt2");
  write(dir / "vocab.json", json);
  write(dir / "merges.txt", "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\n");
  const auto bpe = data::Bpe::load(dir);
  CHECK(bpe.vocab_size() == 260);
  CHECK(bpe.encode(" the") == std::vector<int32_t>{258});
  CHECK(bpe.encode("!") == std::vector<int32_t>{0});
  CHECK(bpe.encode(" ") == std::vector<int32_t>{220});  // as in GPT-2
  CHECK(bpe.decode(std::vector<int32_t>{259, 258}) == "<|endoftext|> the");
  CHECK(bpe.decode(bpe.encode("\x01 the\xff")) == "\x01 the\xff");
}

TEST_CASE("malformed tokenizer files: the message names the file and line", "[bpe]") {
  const auto dir = temp_dir("bad");
  data::Bpe::train("abc abc", 260).save(dir);
  const std::string good_vocab = [&] {
    std::ifstream f(dir / "vocab.json");
    return std::string((std::istreambuf_iterator<char>(f)), {});
  }();
  auto load_error = [&](const std::string& vocab, const std::string& merges) {
    write(dir / "vocab.json", vocab);
    write(dir / "merges.txt", merges);
    try {
      data::Bpe::load(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string bad = good_vocab;
  bad.replace(bad.find("\": 2,"), 3, "\" 2");  // line 4: the entry for byte 2
  CHECK_THAT(load_error(bad, "#version: 0.2\n"), Contains("vocab.json:4: expected ':'"));
  CHECK_THAT(load_error("{\"a\": 0,\n \"b\": 0}", ""), Contains("vocab.json:2: token ids"));
  CHECK_THAT(load_error("{\"a\": 0,\n\n\"\\u0000\": 1}", ""),
             Contains("vocab.json:3: the token has characters outside"));
  CHECK_THAT(load_error("{\"a\": 0,\n", ""), Contains("vocab.json:2: unexpected end of file"));
  CHECK_THAT(load_error("{\"a\": 0}", ""), Contains("vocab.json: byte 0x00 has no token"));
  CHECK_THAT(load_error(good_vocab, "#version: 0.2\na b\nab\n"),
             Contains("merges.txt:3: expected two tokens"));
  CHECK_THAT(load_error(good_vocab, "#version: 0.2\na b\nab c\nab zz\n"),
             Contains("merges.txt:4: \"zz\" is not in vocab.json"));
  CHECK_THAT(load_error(good_vocab, "#version: 0.2\nc a\n"),
             Contains("merges.txt:2: the merged token \"ca\" is not in vocab.json"));
  std::filesystem::remove_all(dir);
  CHECK_THROWS_WITH(data::Bpe::load(dir), Contains("cannot open") && Contains("vocab.json"));
}

// ---- generation -------------------------------------------------------------------
namespace {

const auto tiny_gpt =
    models::gpt2({.vocab = 50, .context = 16, .dim = 32, .layers = 2, .heads = 4});

Tensor prompt_ids() {
  const std::vector<int64_t> p = {3, 1, 4, 10, 20, 30};
  return Tensor::from<int64_t>(std::span<const int64_t>(p), {2, 3});
}

}  // namespace

TEST_CASE("greedy generation is the argmax loop, cropped to the context", "[generate]") {
  const auto params = nn::init_params(tiny_gpt, 11);
  const test::GenerateOptions greedy{.max_new = 20, .greedy = true, .context = 16};
  const Tensor out = test::generate(tiny_gpt, params, prompt_ids(), greedy);
  REQUIRE(out.shape() == Shape{2, 23});
  CHECK(test::generate(tiny_gpt, params, prompt_ids(), greedy, 99).values<int64_t>() ==
        out.values<int64_t>());
  // By hand: run the model on the last <= 16 tokens, append the argmax.
  std::vector<std::vector<int64_t>> rows = {{3, 1, 4}, {10, 20, 30}};
  for (int step = 0; step < 20; ++step) {
    const int64_t t = int64_t(rows[0].size()), start = std::max<int64_t>(0, t - 16);
    std::vector<int64_t> window;
    for (const auto& r : rows) window.insert(window.end(), r.begin() + start, r.end());
    const Tensor ids = Tensor::from<int64_t>(std::span<const int64_t>(window), {2, t - start});
    const Tensor logits = nn::apply(tiny_gpt, params, ids);
    const auto next = argmax(slice(logits, 1, t - start - 1, t - start), 2).values<int64_t>();
    rows[0].push_back(next[0]);
    rows[1].push_back(next[1]);
  }
  std::vector<int64_t> expected = rows[0];
  expected.insert(expected.end(), rows[1].begin(), rows[1].end());
  CHECK(out.values<int64_t>() == expected);
  // Without cropping, the learned positions run out.
  CHECK_THROWS_WITH(test::generate(tiny_gpt, params, prompt_ids(), {.max_new = 20, .greedy = true}),
                    Contains("exceeds the model's maximum"));
}

TEST_CASE("sampling: reproducible by seed, top-p -> 0 is greedy", "[generate]") {
  const auto params = nn::init_params(tiny_gpt, 5);
  auto run = [&](test::GenerateOptions o, uint64_t seed) {
    o.max_new = 12;
    o.context = 16;
    return test::generate(tiny_gpt, params, prompt_ids(), o, seed).values<int64_t>();
  };
  const auto greedy = run({.greedy = true}, 0);
  CHECK(run({.top_p = 1e-6f}, 1) == greedy);
  CHECK(run({.top_p = 0.f}, 2) == greedy);
  CHECK(run({.temperature = 1e-6f}, 3) == greedy);
  const auto a = run({.top_p = 0.95f}, 7);
  CHECK(run({.top_p = 0.95f}, 7) == a);
  CHECK(run({.top_p = 0.95f}, 8) != a);
  CHECK(a != greedy);
}

TEST_CASE("nucleus sampling draws from the renormalised top of the distribution", "[generate]") {
  // A fixed next-token distribution {0.5, 0.3, 0.15, 0.05}, whatever the input.
  const std::vector<float> logp = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                   std::log(0.05f)};
  auto fn = [&](const Tensor& ids) {
    CHECK_FALSE(GradMode::enabled());
    Tensor l = Tensor::empty({ids.dim(0), ids.dim(1), 4});
    for (int64_t i = 0; i < ids.numel(); ++i) std::copy_n(logp.begin(), 4, l.data<float>() + i * 4);
    return l;
  };
  const int64_t B = 4000;
  const Tensor prompt = Tensor::zeros({B, 1}, DType::i64);
  auto freq = [&](test::GenerateOptions o) {
    o.max_new = 1;
    const auto out = test::generate(fn, prompt, o, 1).values<int64_t>();
    std::vector<double> f(4);
    for (int64_t b = 0; b < B; ++b) f[size_t(out[size_t(2 * b + 1)])] += 1.0 / double(B);
    return f;
  };
  const auto all = freq({});
  const auto top = freq({.top_p = 0.7f});  // 0.5 + 0.3 >= 0.7: the first two only
  // Binomial standard deviations are <= 0.008 here; allow about four.
  for (size_t v = 0; v < 4; ++v) CHECK(all[v] == Approx(std::exp(logp[v])).margin(0.03));
  CHECK(top[0] == Approx(0.625).margin(0.03));
  CHECK(top[1] == Approx(0.375).margin(0.03));
  CHECK(top[2] + top[3] == 0.0);
}

TEST_CASE("generation stops rows at eos and checks its inputs", "[generate]") {
  const auto params = nn::init_params(tiny_gpt, 11);
  const auto greedy =
      test::generate(tiny_gpt, params, prompt_ids(), {.max_new = 6, .greedy = true, .context = 16})
          .values<int64_t>();
  const int64_t eos = greedy[3];  // row 0's first new token
  const auto out = test::generate(tiny_gpt, params, prompt_ids(),
                                  {.max_new = 6, .greedy = true, .eos = eos, .context = 16})
                       .values<int64_t>();
  for (size_t i = 3; i < 9; ++i) CHECK(out[i] == eos);
  const size_t first_eos =
      size_t(std::find(greedy.begin() + 12, greedy.end(), eos) - greedy.begin());
  for (size_t i = 12; i < 18; ++i) CHECK(out[i] == (i < first_eos ? greedy[i] : eos));
  CHECK_THROWS_WITH(test::generate(tiny_gpt, params, Tensor::zeros({2, 3}), {}),
                    Contains("must be i64"));
  CHECK_THROWS_WITH(test::generate(tiny_gpt, params, prompt_ids(), {.temperature = 0.f}),
                    Contains("temperature"));
  CHECK_THROWS_WITH(test::generate(
                        [](const Tensor& ids) {
                          return Tensor::zeros({ids.dim(0), 4});
                        },
                        prompt_ids(), {.max_new = 1}),
                    Contains("expected logits [2, 3, vocab]"));
}

TEST_CASE("the tokenizer.json it writes gives encode()'s ids through data::Tokenizer",
          "[bpe][tokenizer]") {
  // A small vocabulary from a slice of the KJV when bible-kjv is there, else
  // from a fixed text; the Python package's side is in test_tokenizer_kjv.
  const std::string fallback =
      "In the beginning God created the heaven and the earth. it's they're 1984 ";
  const std::string corpus = kjv().empty() ? fallback + fallback : kjv().substr(0, 400000);
  const data::Bpe bpe = data::Bpe::train(corpus, 700);
  const auto tok = data::Tokenizer::from_json(bpe.to_tokenizer_json());
  CHECK(tok.vocab_size() == bpe.vocab_size());
  std::vector<std::string> texts = {
      "",
      "a",
      " ",
      "\n\n\t  x  \r\n",
      "it's we'll they're I'D 'tis '''",
      "h\xc3\xa9llo w\xc3\xb6rld \xe2\x80\x94 \xe6\x97\xa5 \xf0\x9f\x99\x82",
      std::string("nul\0byte", 8),
      "  a  \t\n b \x0b\x0c c  ",
      "x'sy'S '''s 're've"};
  const std::string rest = kjv().empty() ? corpus : kjv().substr(400000, 300000);
  for (size_t at = 0; at < rest.size();) {  // one verse (or line) at a time
    const size_t nl = std::min(rest.find('\n', at), rest.size());
    texts.push_back(rest.substr(at, nl + 1 - at));
    at = nl + 1;
  }
  size_t bad = 0;
  for (const std::string& t : texts) {
    const auto got = tok.encode(t).ids;
    if (got != bpe.encode(t) && bad++ < 3) UNSCOPED_INFO("ids differ on \"" << t << "\"");
    if (tok.decode(got) != t && bad++ < 3) UNSCOPED_INFO("decode differs on \"" << t << "\"");
  }
  INFO(texts.size() << " texts");
  CHECK(bad == 0);
}

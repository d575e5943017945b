// Text around generation against transformers: stop strings
// (GenerationConfig::stop_strings vs transformers' stop_strings), streamed
// text pieces (whole UTF-8 characters that add up to the decode), and
// redco-generate's text mode end to end, on tests/fixtures/hf/gpt2_text (a
// tiny GPT-2 with the committed tokenizer tests/data/tokenizers/gpt2; goldens
// from tests/python/make_text_generation_goldens.py).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hf_fixtures.hpp"
#include "redco/generation/generate.hpp"
#include "redco/io/json.hpp"
#include "redco/models/hf_generation.hpp"
#include "redco/models/pretrained.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using generation::GenerationConfig;

namespace {

fs::path dir() { return test::hf_fixture("gpt2_text"); }

io::Json goldens() {
  std::ifstream in(dir() / "text_generation.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return io::Json::parse(ss.str(), "text_generation.json");
}

std::vector<int64_t> ints(const io::Json& j) {
  std::vector<int64_t> v;
  for (const io::Json& x : j.as_array()) v.push_back(x.as_int());
  return v;
}

std::vector<int64_t> encode(const data::Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> v;
  for (int32_t id : tok.encode(text).ids) v.push_back(id);
  return v;
}

// Whether s is whole UTF-8 characters (no lead byte without its continuation).
bool whole_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    const size_t n = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if (uint8_t(s[i + k]) >> 6 != 2) return false;
    i += n;
  }
  return true;
}

GenerationConfig greedy(const io::Json& g) {
  return {.max_new_tokens = g.at("max_new_tokens").as_int(),
          .eos_token_ids = {g.at("eos_token_id").as_int()}};
}

}  // namespace

TEST_CASE("text generation: stop strings stop where transformers' stop_strings do",
          "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(dir());
  const auto tok = data::Tokenizer::from_file(dir());
  const io::Json g = goldens();
  REQUIRE(g.at("stop_strings").size() >= 8);
  for (const io::Json& k : g.at("stop_strings").as_array()) {
    GenerationConfig c = greedy(g);
    for (const io::Json& s : k.at("stop_strings").as_array())
      c.stop_strings.push_back(s.as_string());
    INFO(k.at("prompt").as_string() << " stop " << k.at("stop_strings").dump());
    const auto out =
        generation::generate(p.model, p.params, {encode(tok, k.at("prompt").as_string())}, c, {},
                             {}, {.tokenizer = &tok});
    CHECK(out.sequences.at(0) == ints(k.at("tokens")));
  }
  // A batch: each row stops on its own.
  GenerationConfig c = greedy(g);
  c.stop_strings = {"ldl", "od "};
  std::vector<std::vector<int64_t>> prompts;
  for (const io::Json& k : g.at("completions").as_array())
    prompts.push_back(encode(tok, k.at("prompt").as_string()));
  const auto batch =
      generation::generate(p.model, p.params, prompts, c, {}, {}, {.tokenizer = &tok});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone =
        generation::generate(p.model, p.params, {prompts[i]}, c, {}, {}, {.tokenizer = &tok});
    CHECK(batch.sequences[i] == alone.sequences[0]);
  }
  CHECK(batch.sequences[0].size() == 1);  // "...God" + " Jo": "od " spans the prompt's end
}

TEST_CASE("text generation: streamed pieces are whole characters adding up to the decode",
          "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(dir());
  const auto tok = data::Tokenizer::from_file(dir());
  const io::Json g = goldens();
  std::vector<std::vector<int64_t>> prompts;
  for (const io::Json& k : g.at("completions").as_array())
    prompts.push_back(encode(tok, k.at("prompt").as_string()));
  std::vector<std::string> streamed(prompts.size());
  std::vector<int> lasts(prompts.size()), partial(prompts.size());
  size_t bad_pieces = 0;
  const generation::TextOptions text{.tokenizer = &tok,
                                     .on_text = [&](int64_t r, std::string_view piece, bool last) {
                                       bad_pieces += !whole_utf8(piece);
                                       streamed[size_t(r)] += piece;
                                       lasts[size_t(r)] += last;
                                     }};
  const auto out = generation::generate(p.model, p.params, prompts, greedy(g), {}, {}, text);
  CHECK(bad_pieces == 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const io::Json& k = g.at("completions").at(i);
    INFO(k.at("prompt").as_string());
    CHECK(out.sequences[i] == ints(k.at("tokens")));
    CHECK(lasts[i] == 1);
    CHECK(streamed[i] == k.at("text").as_string());  // transformers' decode, specials skipped
    std::vector<int64_t> all = prompts[i];
    all.insert(all.end(), out.sequences[i].begin(), out.sequences[i].end());
    CHECK(tok.decode(all, true) == tok.decode(prompts[i], true) + streamed[i]);
  }
  CHECK(g.at("completions").dump().find("\xEF\xBF\xBD") != std::string::npos);  // bytes held back
}

namespace {
// The index of the first token of `seq` whose text completes `stop` (an
// occurrence ending past the prompt's text), or -1.
int64_t first_stop(const data::Tokenizer& tok, const std::vector<int64_t>& prompt,
                   const std::vector<int64_t>& seq, const std::string& stop) {
  data::Tokenizer::Stream stream(tok, true);
  std::string text;
  for (int64_t t : prompt) text += stream.step(int32_t(t));
  for (size_t i = 0; i < seq.size(); ++i) {
    const size_t before = text.size();
    text += stream.step(int32_t(seq[i]));
    const size_t at = text.find(stop, before + 1 >= stop.size() ? before + 1 - stop.size() : 0);
    if (text.size() > before && at != std::string::npos) return int64_t(i);
  }
  return -1;
}
}  // namespace

TEST_CASE("text generation: beam search closes hypotheses at stop strings", "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(dir());
  const auto tok = data::Tokenizer::from_file(dir());
  const io::Json g = goldens();
  std::vector<std::vector<int64_t>> prompts;
  for (const io::Json& k : g.at("completions").as_array())
    prompts.push_back(encode(tok, k.at("prompt").as_string()));
  GenerationConfig c = greedy(g);
  c.num_beams = 3, c.num_return_sequences = 2;
  const auto plain = generation::generate(p.model, p.params, prompts, c);
  // A stop string that never occurs changes nothing.
  c.stop_strings = {"\xE2\x98\x83never"};
  CHECK(
      generation::generate(p.model, p.params, prompts, c, {}, {}, {.tokenizer = &tok}).sequences ==
      plain.sequences);
  int64_t stopped = 0;
  for (const char* stop : {"ldl", "od ", "go", "d go"}) {
    c.stop_strings = {stop};
    const auto out =
        generation::generate(p.model, p.params, prompts, c, {}, {}, {.tokenizer = &tok});
    REQUIRE(out.sequences.size() == prompts.size() * 2);
    for (size_t i = 0; i < out.sequences.size(); ++i) {
      const auto& seq = out.sequences[i];
      INFO("stop '" << stop << "' sequence " << i);
      const int64_t at = first_stop(tok, prompts[i / 2], seq, stop);
      // No hypothesis runs past its stop string; one cut short ended at it.
      CHECK((at == -1 || at == int64_t(seq.size()) - 1));
      if (int64_t(seq.size()) < c.max_new_tokens && seq.back() != c.eos_token_ids[0])
        CHECK(at == int64_t(seq.size()) - 1);
      stopped += at >= 0;
    }
    // Each prompt searches alone as in the batch.
    const auto alone =
        generation::generate(p.model, p.params, {prompts[2]}, c, {}, {}, {.tokenizer = &tok});
    CHECK(alone.sequences[0] == out.sequences[4]);
    CHECK(alone.sequences[1] == out.sequences[5]);
  }
  CHECK(stopped >= 4);  // the stop strings did end hypotheses
}

TEST_CASE("text generation: beam search streams each prompt's final sequences", "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(dir());
  const auto tok = data::Tokenizer::from_file(dir());
  const io::Json g = goldens();
  std::vector<std::vector<int64_t>> prompts;
  for (const io::Json& k : g.at("completions").as_array())
    prompts.push_back(encode(tok, k.at("prompt").as_string()));
  GenerationConfig c = greedy(g);
  c.num_beams = 3, c.num_return_sequences = 2, c.stop_strings = {"ldl"};
  const size_t R = prompts.size() * 2;
  std::vector<std::string> streamed(R);
  std::vector<int> lasts(R);
  size_t bad_pieces = 0, early = 0;
  const generation::TextOptions text{.tokenizer = &tok,
                                     .on_text = [&](int64_t r, std::string_view piece, bool last) {
                                       bad_pieces += !whole_utf8(piece);
                                       REQUIRE(lasts.at(size_t(r)) == 0);  // nothing after last
                                       streamed[size_t(r)] += piece;
                                       lasts[size_t(r)] += last;
                                     }};
  const auto out = generation::generate(p.model, p.params, prompts, c, {}, {}, text);
  CHECK(bad_pieces == 0);
  for (size_t r = 0; r < R; ++r) {
    INFO("row " << r);
    CHECK(lasts[r] == 1);
    std::vector<int64_t> all = prompts[r / 2];
    all.insert(all.end(), out.sequences[r].begin(), out.sequences[r].end());
    CHECK(tok.decode(all, true) == tok.decode(prompts[r / 2], true) + streamed[r]);
    CHECK(!streamed[r].empty());
    early += out.sequences[r].size() < size_t(c.max_new_tokens);
  }
  CHECK(early > 0);  // some prompts finished (and streamed) before the last step
}

TEST_CASE("text generation: misuse is an error naming the fix", "[generation]") {
  const auto p = models::from_pretrained<models::Gpt2>(dir());
  const auto tok = data::Tokenizer::from_file(dir());
  GenerationConfig c{.max_new_tokens = 2, .stop_strings = {"x"}};
  CHECK_THROWS_WITH(generation::generate(p.model, p.params, {{5, 6}}, c), Contains("tokenizer"));
  c.num_beams = 2;
  CHECK_THROWS_WITH(generation::generate(p.model, p.params, {{5, 6}}, c), Contains("tokenizer"));
  c = {.max_new_tokens = 2, .stop_strings = {""}};
  CHECK_THROWS_WITH(
      generation::generate(p.model, p.params, {{5, 6}}, c, {}, {}, {.tokenizer = &tok}),
      Contains("empty"));
}

namespace {
// A command's stdout; it must succeed.
std::string run(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  CHECK(pclose(pipe) == 0);
  return out;
}
}  // namespace

TEST_CASE("text generation: redco-generate prints transformers' greedy completions",
          "[generation]") {
  const char* exe = std::getenv("REDCO_GENERATE");
  REQUIRE(exe != nullptr);  // set by tests/meson.build
  const io::Json g = goldens();
  const fs::path prompts =
      fs::temp_directory_path() / ("redco_text_prompts_" + std::to_string(getpid()) + ".txt");
  std::string expected;
  {
    std::ofstream f(prompts);
    for (const io::Json& k : g.at("completions").as_array()) {
      f << k.at("prompt").as_string() << "\n";
      expected += k.at("text").as_string() + "\n";
    }
  }
  const std::string base =
      fmt::format("'{}' '{}' --max-new-tokens {} --eos {}", exe, dir().string(),
                  g.at("max_new_tokens").as_int(), g.at("eos_token_id").as_int());
  CHECK(run(base + " --prompts-file '" + prompts.string() + "'") == expected);
  CHECK(run(base + " < '" + prompts.string() + "'") == expected);
  fs::remove(prompts);
  // --prompt and --stop: the text of transformers' tokens with that stop string.
  const auto tok = data::Tokenizer::from_file(dir());
  for (const io::Json& k : g.at("stop_strings").as_array()) {
    if (k.at("stop_strings").size() != 1 ||
        k.at("prompt").as_string().find('\'') != std::string::npos)
      continue;
    const std::string stop = k.at("stop_strings").at(0).as_string();
    if (stop.find('\'') != std::string::npos) continue;
    INFO(k.at("prompt").as_string() << " stop " << stop);
    CHECK(run(base + " --prompt '" + k.at("prompt").as_string() + "' --stop '" + stop + "'") ==
          tok.decode(ints(k.at("tokens")), true) + "\n");
  }
}

// The tiny T5 (tests/fixtures/hf/t5) with a 96-piece tokenizer.json of T5's
// layout (tests/fixtures/hf/t5_text, tests/python/make_t5_text_tokenizer.py):
// redco-generate's text mode prints the decode of what generate_seq2seq
// makes from the tokenised source, greedy, with a stop string and with beams.
TEST_CASE("text generation: redco-generate's text mode for an encoder-decoder", "[generation]") {
  const char* exe = std::getenv("REDCO_GENERATE");
  REQUIRE(exe != nullptr);  // set by tests/meson.build
  test::TempDir folder("t5text");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(test::hf_fixture("t5") / f, folder.path / f);
  fs::copy_file(test::hf_fixture("t5_text") / "tokenizer.json", folder.path / "tokenizer.json");
  const auto p = models::from_pretrained<models::T5>(folder.path);
  const auto tok = data::Tokenizer::from_file(folder.path);
  const std::vector<std::string> prompts{"And the LORD said unto him", "I have a house",
                                         "the children of Israel came"};
  std::vector<std::vector<int64_t>> sources;
  for (const std::string& s : prompts) sources.push_back(encode(tok, s));
  CHECK(sources[0].back() == 1);  // T5's closing </s>
  GenerationConfig c = models::generation_config(folder.path);
  c.max_new_tokens = 10;
  // What the library makes of them, as text.
  auto expected = [&](const GenerationConfig& cfg) {
    const auto out =
        generation::generate_seq2seq(p.model, p.params, sources, cfg, {}, {}, {.tokenizer = &tok});
    std::string all;
    for (const auto& seq : out.sequences) all += tok.decode(seq, true) + "\n";
    return all;
  };
  const std::string greedy_text = expected(c);
  INFO(greedy_text);
  CHECK(greedy_text.size() > 3 * 4);  // the decodes are not empty
  const fs::path file = folder.path / "prompts.txt";
  {
    std::ofstream f(file);
    for (const std::string& s : prompts) f << s << "\n";
  }
  const std::string base = fmt::format("'{}' '{}' --max-new-tokens 10", exe, folder.path.string());
  CHECK(run(base + " --prompts-file '" + file.string() + "'") == greedy_text);
  CHECK(run(base + " < '" + file.string() + "'") == greedy_text);
  // A stop string cut from the first completion's text, and beams.
  const std::string first = greedy_text.substr(0, greedy_text.find('\n'));
  REQUIRE(first.size() >= 4);
  GenerationConfig stop = c;
  size_t at = 1;
  while (at + 3 < first.size() && first.substr(at, 3).find('\'') != std::string::npos) ++at;
  stop.stop_strings = {first.substr(at, 3)};
  CHECK(run(base + " --prompts-file '" + file.string() + "' --stop '" + stop.stop_strings[0] +
            "'") == expected(stop));
  CHECK(expected(stop) != greedy_text);
  GenerationConfig beams = c;
  beams.num_beams = 3, beams.num_return_sequences = 2;
  CHECK(run(base + " --prompts-file '" + file.string() +
            "' --num-beams 3 --num-return-sequences 2") == expected(beams));
}

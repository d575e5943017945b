// data::Tokenizer on folders as transformers' save_pretrained writes them
// (tests/data/tokenizers/saved, made by
// tests/python/make_saved_tokenizer_fixtures.py): the fast folders and
// GPT2Tokenizer's slow ones load with AutoTokenizer's ids and decodes; the
// other slow layouts are refused naming their files and the command that
// writes tokenizer.json; add_prefix_space is refused only where it asks for
// another tokenizer than tokenizer.json.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "tokenizer_goldens.hpp"

using namespace redco;
using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

fs::path saved(const std::string& name) { return tokenizer_test::fixture("saved") / name; }

std::vector<int32_t> ints(const io::Json& a) {
  std::vector<int32_t> v;
  for (const io::Json& x : a.as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}

// The slow layouts redco does not read: no tokenizer.json, and not
// GPT2Tokenizer's vocab.json + merges.txt.
const std::set<std::string> kRefused = {"llama_slow", "t5_slow", "bert_slow", "qwen2_slow",
                                        "bart_slow"};

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void check_answers(const data::Tokenizer& tok, const io::Json& c) {
  for (const io::Json& s : c.at("single").as_array()) {
    INFO("text: " << s.at("text").as_string());
    CHECK(tok.encode(s.at("text").as_string()).ids == ints(s.at("ids")));
    CHECK(tok.encode(s.at("text").as_string(), false).ids == ints(s.at("ids_plain")));
    CHECK(tok.decode(ints(s.at("ids"))) == s.at("decode").at(0).as_string());
    CHECK(tok.decode(ints(s.at("ids")), true) == s.at("decode").at(1).as_string());
  }
  for (const io::Json& p : c.at("pair").as_array())
    CHECK(tok.encode_pair(p.at("a").as_string(), p.at("b").as_string()).ids == ints(p.at("ids")));
}

const io::Json& goldens() {
  static const io::Json j = io::Json::parse(
      read_text(tokenizer_test::fixture("saved") / "goldens.json"), "saved/goldens.json");
  return j;
}

// A scratch copy of a saved folder, with tokenizer_config.json's `key` set.
struct Edited {
  fs::path dir;
  Edited(const std::string& name, const std::string& key, const io::Json& value) {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("redco_saved_tokenizer_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(saved(name)))
      fs::copy_file(e.path(), dir / e.path().filename());
    io::Json cfg = io::Json::parse(read_text(dir / "tokenizer_config.json"));
    cfg[key] = value;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  }
  ~Edited() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("saved tokenizers: folders written by save_pretrained give AutoTokenizer's ids",
          "[tokenizer]") {
  REQUIRE(goldens().at("cases").size() >= 20);
  for (const io::Json& c : goldens().at("cases").as_array()) {
    const std::string name = c.at("name").as_string();
    INFO(name << " (the reference loads it as " << c.at("reference_class").as_string() << ")");
    if (kRefused.count(name)) continue;
    check_answers(data::Tokenizer::from_file(saved(name)), c);
    CHECK(data::Tokenizer::found_in(saved(name)));
    // By the file's path, the sibling tokenizer_config.json still applies.
    if (fs::exists(saved(name) / "tokenizer.json"))
      check_answers(data::Tokenizer::from_file(saved(name) / "tokenizer.json"), c);
  }
}

TEST_CASE("saved tokenizers: slow layouts redco does not read are refused with the fix",
          "[tokenizer]") {
  std::set<std::string> seen;
  for (const io::Json& c : goldens().at("cases").as_array()) {
    const std::string name = c.at("name").as_string();
    if (!kRefused.count(name)) continue;
    INFO(name);
    seen.insert(name);
    const fs::path dir = saved(name);
    // The files it holds, e.g. tokenizer.model, and AutoTokenizer re-saving the folder.
    std::string files;
    for (const io::Json& f : c.at("files").as_array())
      if (f.as_string().ends_with(".model") || f.as_string().starts_with("vocab."))
        files = f.as_string();
    REQUIRE(!files.empty());
    const std::string fix =
        "T.from_pretrained('" + dir.string() + "').save_pretrained('" + dir.string() + "')";
    for (const fs::path& p : {dir, dir / "tokenizer.json"})
      CHECK_THROWS_WITH(data::Tokenizer::from_file(p),
                        Contains(files) && Contains("no tokenizer.json") && Contains(fix));
    CHECK_THROWS_WITH(data::Tokenizer::found_in(dir), Contains(files) && Contains(fix));
  }
  CHECK(seen == kRefused);
  const fs::path empty =
      fs::temp_directory_path() / ("redco_no_tokenizer_" + std::to_string(getpid()));
  fs::create_directories(empty);
  CHECK(!data::Tokenizer::found_in(empty));
  CHECK_THROWS_WITH(data::Tokenizer::from_file(empty), Contains("no tokenizer in"));
  fs::remove_all(empty);
}

TEST_CASE("saved tokenizers: add_prefix_space that asks for another tokenizer is refused",
          "[tokenizer]") {
  // Each makes transformers rebuild the tokenizer from the SentencePiece
  // model into something other than tokenizer.json.
  const std::pair<std::string, std::pair<std::string, io::Json>> edits[] = {
      {"llama_resaved", {"add_prefix_space", io::Json(false)}},  // drops Prepend("▁")
      {"llama_resaved", {"legacy", io::Json(false)}},            // a Metaspace instead
      {"llama_fast_no_prefix_space", {"add_prefix_space", io::Json(true)}},
      {"mistral_fast", {"legacy", io::Json(true)}},
      {"t5_fast", {"legacy", io::Json(false)}},  // prepend_scheme "first", not "always"
      {"t5_fast", {"add_prefix_space", io::Json(false)}}};
  for (const auto& [name, edit] : edits) {
    INFO(name << ": " << edit.first << " = " << edit.second.dump());
    Edited f(name, edit.first, edit.second);
    const std::string model = name.starts_with("t5") ? "spiece.model" : "tokenizer.model";
    for (const fs::path& p : {f.dir, f.dir / "tokenizer.json"})
      CHECK_THROWS_WITH(data::Tokenizer::from_file(p),
                        Contains((f.dir / "tokenizer_config.json").string()) &&
                            Contains("add_prefix_space") && Contains(model) &&
                            Contains("save_pretrained('" + f.dir.string() + "')"));
  }
  // A class that only sets the pre-tokenizer's flag: refused where it differs.
  Edited gpt2("gpt2_fast", "add_prefix_space", io::Json(true));
  CHECK_THROWS_WITH(data::Tokenizer::from_file(gpt2.dir),
                    Contains("add_prefix_space") && Contains("pre-tokenizer"));
}

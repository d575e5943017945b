// data::Tokenizer with tokenizer_config.json / special_tokens_map.json against
// transformers' AutoTokenizer: add_bos_token / add_eos_token, model_max_length,
// padding and truncation sides, pad_token and clean_up_tokenization_spaces on
// committed goldens (tests/python/make_tokenizer_config_goldens.py), and the
// errors for options redco does not apply.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tokenizer_goldens.hpp"

using namespace redco;
using Catch::Matchers::Contains;
using tokenizer_test::fixture;

namespace {

namespace fs = std::filesystem;

std::vector<int32_t> ints(const io::Json& a) {
  std::vector<int32_t> v;
  for (const io::Json& x : a.as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}

// A temporary folder: a committed tokenizer.json and the given config files.
struct Folder {
  fs::path dir;
  Folder(const std::string& kind, const io::Json& config, const io::Json& special_map) {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("redco_tokenizer_config_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    fs::create_directories(dir);
    fs::copy_file(fixture(kind) / "tokenizer.json", dir / "tokenizer.json");
    if (!config.is_null()) std::ofstream(dir / "tokenizer_config.json") << config.dump();
    if (!special_map.is_null())
      std::ofstream(dir / "special_tokens_map.json") << special_map.dump();
  }
  ~Folder() { fs::remove_all(dir); }
};

void check_case(const io::Json& c) {
  const std::string name = c.at("name").as_string();
  INFO(name);
  Folder f(c.at("kind").as_string(), c.at("tokenizer_config"), c.at("special_tokens_map"));
  if (!c.at("error").is_null()) {  // the reference refuses the folder: so does redco
    CHECK_THROWS_AS(data::Tokenizer::from_file(f.dir), Error);
    return;
  }
  auto tok = data::Tokenizer::from_file(f.dir);
  for (const io::Json& s : c.at("single").as_array()) {
    INFO(s.at("text").as_string());
    const data::Encoding e = tok.encode(s.at("text").as_string());
    CHECK(e.ids == ints(s.at("ids")));
    if (!s.at("type_ids").is_null()) CHECK(e.type_ids == ints(s.at("type_ids")));
  }
  for (const io::Json& p : c.at("pair").as_array()) {
    const data::Encoding e = tok.encode_pair(p.at("a").as_string(), p.at("b").as_string());
    CHECK(e.ids == ints(p.at("ids")));
    if (!p.at("type_ids").is_null()) CHECK(e.type_ids == ints(p.at("type_ids")));
  }
  for (const io::Json& d : c.at("decode").as_array())
    CHECK(tok.decode(ints(d.at("ids")), d.at("skip").as_bool()) == d.at("text").as_string());
  // padding=True, truncation=True
  tok.set_truncation(tok.default_truncation());
  tok.set_padding(tok.default_padding());
  std::vector<std::string> texts;
  for (const io::Json& t : c.at("batch").at("texts").as_array()) texts.push_back(t.as_string());
  const auto batch = tok.encode_batch(texts, true, 2);
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("batch row " << i);
    const data::Encoding e = batch[i].to_encoding();
    CHECK(e.ids == ints(c.at("batch").at("ids").at(i)));
    CHECK(std::vector<int32_t>(e.attention_mask.begin(), e.attention_mask.end()) ==
          ints(c.at("batch").at("attention_mask").at(i)));
  }
}

}  // namespace

TEST_CASE(
    "tokenizer_config: ids, pairs, padded and truncated batches and decodes equal "
    "transformers' AutoTokenizer",
    "[tokenizer]") {
  const io::Json j = io::Json::parse(tokenizer_test::read_gz(fixture("config") / "goldens.json"),
                                     "config/goldens.json");
  REQUIRE(j.at("cases").size() >= 8);
  for (const io::Json& c : j.at("cases").as_array()) check_case(c);
}

TEST_CASE("tokenizer_config: clean-up is the reference's rule list and the stream skips it",
          "[tokenizer]") {
  Folder f("gpt2", io::Json::parse(R"({"clean_up_tokenization_spaces": true})"), io::Json());
  const auto tok = data::Tokenizer::from_file(f.dir);
  const auto ids =
      tok.encode("Isn ' t it ? We ' re here , they ' ve gone . n't 'm 's !", false).ids;
  CHECK(tok.decode(ids) == "Isn't it? We're here, they've gone.n't'm's!");
  CHECK(tok.decode(ids, false, false) ==
        "Isn ' t it ? We ' re here , they ' ve gone . n't 'm 's !");
  data::Tokenizer::Stream stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.step(id);
  CHECK(streamed == tok.decode(ids, false, false));
}

TEST_CASE("tokenizer_config: options redco does not apply are rejected, naming them",
          "[tokenizer]") {
  auto load = [](const std::string& kind, const char* config) {
    Folder f(kind, io::Json::parse(config), io::Json());
    return data::Tokenizer::from_file(f.dir);
  };
  // LLaMA's legacy layout prepends "▁" in its normalizer: what add_prefix_space
  // true asks for, and not what false asks for.
  CHECK_NOTHROW(load("llama2", R"({"tokenizer_class": "LlamaTokenizerFast",
                                   "add_prefix_space": true, "bos_token": "<s>"})"));
  CHECK_THROWS_WITH(load("llama2", R"({"tokenizer_class": "LlamaTokenizerFast",
                                       "add_prefix_space": false, "bos_token": "<s>"})"),
                    Contains("add_prefix_space") && Contains("tokenizer.model"));
  CHECK_THROWS_WITH(load("gpt2", R"({"tokenizer_class": "GPT2TokenizerFast",
                                     "add_prefix_space": true})"),
                    Contains("add_prefix_space"));
  CHECK_NOTHROW(load("gpt2", R"({"tokenizer_class": "GPT2TokenizerFast",
                                 "add_prefix_space": false, "trim_offsets": true})"));
  CHECK_THROWS_WITH(load("bert", R"({"tokenizer_class": "BertTokenizerFast",
                                     "do_lower_case": false})"),
                    Contains("do_lower_case"));
  CHECK_THROWS_WITH(load("gpt2", R"({"tokenizer_class": "MyTokenizer", "add_bos_token": true})"),
                    Contains("add_bos_token") && Contains("MyTokenizer"));
  CHECK_THROWS_WITH(load("gpt2", R"({"from_slow": true})"), Contains("from_slow"));
  CHECK_THROWS_WITH(load("gpt2", R"({"pad_token": "<pad>"})"),
                    Contains("pad_token") && Contains("<pad>"));
  CHECK_THROWS_WITH(load("gpt2", R"({"padding_side": "middle"})"), Contains("padding_side"));
  CHECK_THROWS_WITH(load("gpt2", "{}").default_padding(), Contains("pad_token"));
  CHECK(!load("gpt2", R"({"model_max_length": 1e30})").default_truncation());
}

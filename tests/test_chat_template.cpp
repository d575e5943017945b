// data::ChatTemplate against jinja2 as transformers configures it: the real
// chat templates in tests/fixtures/chat_templates (Llama-2, Llama-3/3.1,
// Mistral v0.1/v0.3, Qwen2/2.5, TinyLlama, ChatML) and one small template per
// Jinja feature, each over the conversations in goldens.json (made by
// tests/python/make_chat_template_goldens.py); the templates' own errors
// (raise_exception) and Python's; parse errors naming line and column; and
// reading templates from tokenizer folders.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "redco/data/chat_template.hpp"

using namespace redco;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using data::ChatTemplate;
using data::ChatTemplateException;
using io::Json;
namespace fs = std::filesystem;

namespace {

// From the source path the compiler saw, else upwards from the working
// directory (build folders live inside the repository).
fs::path fixtures() {
  std::error_code ec;
  for (fs::path start : {fs::path(__FILE__).parent_path(), fs::current_path()}) {
    for (fs::path p = fs::absolute(start, ec); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/fixtures/chat_templates/goldens.json", ec))
        return p / "tests/fixtures/chat_templates";
      if (p == p.parent_path()) break;
    }
  }
  throw Error("cannot find tests/fixtures/chat_templates from " + std::string(__FILE__));
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// The exception render() throws, as "", "exception: <what>" or "error: <what>".
std::string outcome(const ChatTemplate& t, const Json& c, std::string& rendered) {
  try {
    rendered = t.render(c.at("messages"), c.at("add_generation_prompt").as_bool(), c.at("extra"));
    return "";
  } catch (const ChatTemplateException& e) {
    return std::string("exception: ") + e.what();
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("redco_chat_template_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("chat templates render what jinja2 renders", "[chat_template]") {
  const Json goldens = Json::parse(read(fixtures() / "goldens.json"), "goldens.json");
  const Json::Array& cases = goldens.at("cases").as_array();
  REQUIRE(cases.size() >= 150);
  std::map<std::string, ChatTemplate> templates;
  std::set<std::string> families;
  size_t rendered_ok = 0, exceptions = 0, errors = 0;
  for (const Json& c : cases) {
    const std::string name = c.at("name").as_string();
    INFO(name);
    std::string source;
    if (c.contains("template")) {
      families.insert(c.at("template").as_string());
      source = read(fixtures() / (c.at("template").as_string() + ".jinja"));
    } else {
      source = c.at("source").as_string();
    }
    auto it = templates.find(source);
    if (it == templates.end()) it = templates.emplace(source, ChatTemplate(source)).first;
    std::string rendered;
    const std::string got = outcome(it->second, c, rendered);
    if (c.contains("expected")) {
      CHECK(got == "");
      CHECK(rendered == c.at("expected").as_string());
      rendered_ok += got.empty() && rendered == c.at("expected").as_string();
    } else if (c.contains("exception")) {
      // raise_exception's message is the whole what(), as transformers' TemplateError's.
      CHECK(got == "exception: " + c.at("exception").as_string());
      ++exceptions;
    } else {
      INFO("Python raised " << c.at("error").as_string());
      CHECK_THAT(got, Contains("error: chat template line"));
      ++errors;
    }
  }
  // Every fixture template has cases, and the goldens hold each kind of outcome.
  for (const auto& entry : fs::directory_iterator(fixtures()))
    if (entry.path().extension() == ".jinja")
      CHECK(families.contains(entry.path().stem().string()));
  CHECK(families.size() == 9);
  CHECK(rendered_ok >= 150);
  CHECK(exceptions >= 10);
  CHECK(errors >= 5);
}

TEST_CASE("chat template parse errors name the line and column", "[chat_template]") {
  CHECK_THROWS_WITH(ChatTemplate("ok\n  {% include 'other.jinja' %}"),
                    Contains("line 2, column 6") && Contains("unsupported tag 'include'"));
  CHECK_THROWS_WITH(
      ChatTemplate("{% for m in messages %}\n{{ m }}"),
      Contains("line 1, column 4") && Contains("unterminated 'for' block") && Contains("endfor"));
  CHECK_THROWS_WITH(ChatTemplate("a\n{% if x %}{% for y in z %}{% endif %}"),
                    Contains("line 2, column 30: unexpected 'endif'") &&
                        Contains("'for' block opened at line 2, column 14") &&
                        Contains("missing '{% endfor %}'"));
  CHECK_THROWS_WITH(ChatTemplate("{{ 'a' }}\n\n  {{ x "),
                    Contains("line 3, column 3") && Contains("never closed"));
  CHECK_THROWS_WITH(ChatTemplate("{# note"), Contains("line 1, column 1") && Contains("comment"));
  CHECK_THROWS_WITH(ChatTemplate("{{ x | wordwrap }}"),
                    Contains("line 1, column 6") && Contains("unsupported filter 'wordwrap'"));
  CHECK_THROWS_WITH(ChatTemplate("{{ x is prime }}"), Contains("unsupported test 'prime'"));
  CHECK_THROWS_WITH(ChatTemplate("{% break %}"), Contains("'break' outside a for loop"));
  CHECK_THROWS_WITH(ChatTemplate("{{ 'abc }}"), Contains("string literal is never closed"));
  CHECK_THROWS_WITH(ChatTemplate("{% endif %}"), Contains("line 1, column 4"));
  // A runtime error names where it happened; raise_exception's message stands alone.
  const ChatTemplate t("line one\n{{ messages[0].content + 1 }}");
  CHECK_THROWS_WITH(t.render(Json::parse(R"([{"content": "x"}])"), false),
                    Contains("line 2") && Contains("'str'") && Contains("'int'"));
  CHECK_THROWS_MATCHES(
      ChatTemplate("{{ raise_exception('no: ' ~ messages|length) }}").render(Json::array(), false),
      ChatTemplateException, Catch::Matchers::Message("no: 0"));
}

TEST_CASE("chat template variables and strftime_now", "[chat_template]") {
  const ChatTemplate t(
      "{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}"
      "{{ bos_token is defined }}{{ x }}");
  CHECK(t.render(Json::array(), true) == "TrueTrueTrueFalse");
  CHECK(t.render(Json::array(), false, Json::parse(R"({"tools": [1], "x": 7})")) ==
        "FalseTrueFalseFalse7");
  char today[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(today, sizeof today, "%d %b %Y", &tm);
  CHECK(ChatTemplate("{{ strftime_now('%d %b %Y') }}").render(Json::array(), false) == today);
}

TEST_CASE("load_chat_template reads tokenizer folders", "[chat_template]") {
  TempDir dir;
  const fs::path d = dir.path;
  CHECK_FALSE(data::load_chat_template(d).has_value());  // no files at all
  write(d / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  CHECK_FALSE(data::load_chat_template(d).has_value());  // a config without a template

  // The string form, with bos/eos as plain strings.
  write(
      d / "tokenizer_config.json",
      R"({"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"})");
  const Json messages = Json::parse(R"([{"role": "user", "content": "hi"}])");
  auto t = data::load_chat_template(d);
  REQUIRE(t.has_value());
  CHECK(t->bos_token() == "<s>");
  CHECK(t->eos_token() == "</s>");
  CHECK(t->render(messages, false) == "<s>hi</s>");
  CHECK(t->render(messages, false, Json::parse(R"({"eos_token": "!"})")) == "<s>hi!");

  // The list form (default taken) with AddedToken objects for bos/eos.
  write(d / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
    "eos_token": {"content": "<|end|>"},
    "unk_token": null,
    "chat_template": [{"name": "tool_use", "template": "T"},
                      {"name": "default", "template": "D{{ bos_token }}{{ eos_token }}{{ unk_token is defined }}"}]})");
  t = data::load_chat_template(d);
  REQUIRE(t.has_value());
  CHECK(t->bos_token() == "<|begin|>");
  CHECK(t->eos_token() == "<|end|>");
  CHECK(t->render(messages, false) == "D<|begin|><|end|>False");

  // A list without "default" is refused, naming the ones it has.
  write(
      d / "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]})");
  CHECK_THROWS_WITH(data::load_chat_template(d), Contains("tool_use, rag"));

  // chat_template.json, then chat_template.jinja, take precedence over the config.
  write(d / "chat_template.json", R"({"chat_template": "json {{ eos_token }}"})");
  t = data::load_chat_template(d);
  REQUIRE(t.has_value());
  CHECK(t->render(messages, false) == "json ");
  write(d / "chat_template.jinja", "jinja {{ messages | length }}\n");
  t = data::load_chat_template(d);
  REQUIRE(t.has_value());
  CHECK(t->render(messages, false) == "jinja 1");

  // A template that does not parse fails at load, not at the first request.
  write(d / "chat_template.jinja", "{% if x %}");
  CHECK_THROWS_WITH(data::load_chat_template(d), Contains("unterminated 'if' block"));
}

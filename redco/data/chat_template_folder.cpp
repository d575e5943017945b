// Chat templates from tokenizer folders: chat_template.jinja, else
// chat_template.json, else tokenizer_config.json's chat_template (a string or
// named templates), with the special tokens transformers passes beside it.
#include <fstream>
#include <sstream>

#include "redco/data/chat_template.hpp"

namespace redco::data {

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REDCO_CHECK(f.good(), "cannot read {}", p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// chat_template as tokenizer_config.json / chat_template.json hold it: a
// string, or [{"name", "template"}, ...] of which "default" is the one
// apply_chat_template takes without a name.
std::optional<std::string> template_text(const io::Json& v, const fs::path& file) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.as_string();
  REDCO_CHECK(v.is_array(), "{}: chat_template must be a string or a list of {{name, template}}",
              file.string());
  std::string names;
  for (const io::Json& t : v.as_array()) {
    REDCO_CHECK(t.is_object() && t.contains("name") && t.contains("template"),
                "{}: each chat_template entry needs \"name\" and \"template\"", file.string());
    if (t.at("name").as_string() == "default") return t.at("template").as_string();
    names += (names.empty() ? "" : ", ") + t.at("name").as_string();
  }
  fail("{}: no \"default\" chat template among [{}]", file.string(), names);
}

std::string token_text(const io::Json& cfg, std::string_view key) {
  if (!cfg.contains(key)) return {};
  const io::Json& v = cfg.at(key);
  if (v.is_string()) return v.as_string();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").as_string();
  return {};
}

}  // namespace

std::string FolderChatTemplate::bos_token() const {
  return special_tokens.contains("bos_token") ? special_tokens.at("bos_token").as_string() : "";
}

std::string FolderChatTemplate::eos_token() const {
  return special_tokens.contains("eos_token") ? special_tokens.at("eos_token").as_string() : "";
}

std::string FolderChatTemplate::render(const io::Json& messages, bool add_generation_prompt,
                                       const io::Json& extra) const {
  io::Json vars = special_tokens;
  if (extra.is_object())
    for (const auto& [k, v] : extra.as_object()) vars[k] = v;
  return chat_template.render(messages, add_generation_prompt, vars);
}

std::optional<FolderChatTemplate> load_chat_template(const fs::path& dir) {
  const fs::path config_file = dir / "tokenizer_config.json";
  io::Json config = io::Json::object();
  if (fs::exists(config_file))
    config = io::Json::parse(read_text(config_file), config_file.string());
  REDCO_CHECK(config.is_object(), "{}: expected a JSON object", config_file.string());
  std::optional<std::string> text;
  if (fs::exists(dir / "chat_template.jinja")) {
    text = read_text(dir / "chat_template.jinja");
  } else if (fs::exists(dir / "chat_template.json")) {
    const fs::path f = dir / "chat_template.json";
    const io::Json j = io::Json::parse(read_text(f), f.string());
    REDCO_CHECK(j.is_object() && j.contains("chat_template"), "{}: no \"chat_template\"",
                f.string());
    text = template_text(j.at("chat_template"), f);
  } else if (config.contains("chat_template")) {
    text = template_text(config.at("chat_template"), config_file);
  }
  if (!text) return std::nullopt;
  FolderChatTemplate out{ChatTemplate(*text)};
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const std::string t = token_text(config, key);
    if (!t.empty()) out.special_tokens[key] = t;
  }
  return out;
}

}  // namespace redco::data

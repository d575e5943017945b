#pragma once
// Chat templates as Hugging Face tokenizer folders carry them: the Jinja2
// `chat_template` of tokenizer_config.json (or chat_template.jinja/.json),
// rendered as transformers' apply_chat_template renders it (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
// loopcontrols extension, globals raise_exception / strftime_now, its own
// tojson). The Jinja subset is what real chat templates use; anything else is
// refused when the template is parsed, naming the line, the column and the
// construct, rather than rendering something the model was not trained on.
//
// One difference from Python is the input: io::Json keeps object keys sorted,
// so a dict from `messages` / `tools` iterates (and prints through tojson) in
// sorted key order, where Python keeps the order the client sent. Dicts the
// template builds itself ({'a': 1, ...}, namespace(...)) keep their order.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/io/json.hpp"

namespace redco::data {

namespace chat_detail {
struct Program;
}

// What a template's raise_exception("...") throws: what() is the template's
// message alone (an OpenAI-compatible server returns it to the client as a
// bad request); other render errors are plain redco::Error naming the line.
class ChatTemplateException : public Error {
 public:
  explicit ChatTemplateException(const std::string& what) : Error(what) {}
};

class ChatTemplate {
 public:
  // Parses once; a syntax error or an unsupported construct throws
  // redco::Error naming the line and column.
  explicit ChatTemplate(std::string_view source);

  // The variables transformers passes: messages, add_generation_prompt,
  // tools and documents (none unless `extra` holds them), then every member
  // of `extra` (bos_token, eos_token, tools, date_string, ...).
  std::string render(const io::Json& messages, bool add_generation_prompt,
                     const io::Json& extra = io::Json::object()) const;

  const std::string& source() const;

 private:
  std::shared_ptr<const chat_detail::Program> program_;
};

// A tokenizer folder's template and the special tokens transformers passes
// to it (its special_tokens_map: bos_token, eos_token, unk_token, pad_token
// where the folder sets them).
struct FolderChatTemplate {
  ChatTemplate chat_template;
  io::Json special_tokens = io::Json::object();

  std::string bos_token() const;  // "" where the folder has none
  std::string eos_token() const;
  // render() with the special tokens first; `extra` overrides them.
  std::string render(const io::Json& messages, bool add_generation_prompt,
                     const io::Json& extra = io::Json::object()) const;
};

// The chat template of a tokenizer folder: chat_template.jinja, else
// chat_template.json's "chat_template", else tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} of which
// "default" is taken). nullopt when the folder has none; a template that does
// not parse throws.
std::optional<FolderChatTemplate> load_chat_template(const std::filesystem::path& tokenizer_dir);

}  // namespace redco::data

// Tokenizer folders: tokenizer.json, or the files of a slow tokenizer. Of the
// slow layouts redco reads GPT-2's vocab.json + merges.txt (GPT2Tokenizer:
// GPT-2, OPT, GPT-J), which transformers' GPT2Converter turns into a
// byte-level BPE with nothing beyond the two files and tokenizer_config.json;
// the others (SentencePiece models, WordPiece's vocab.txt, Qwen2's and
// BART's vocab.json) are refused with the command that writes tokenizer.json.
#include <algorithm>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_impl.hpp"

namespace redco::data {

namespace fs = std::filesystem;
using tok::Json;

namespace {

// The files from which transformers builds a tokenizer, tokenizer.json first.
constexpr std::string_view kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "vocab.json",     "merges.txt",      "vocab.txt"};

std::vector<std::string> tokenizer_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (std::string_view name : kTokenizerFiles)
    if (fs::exists(dir / name)) found.emplace_back(name);
  return found;
}

Json read_json(const fs::path& f) {
  const Json j = Json::parse(read_file(f), f.string());
  REDCO_CHECK(j.is_object(), "{}: expected a JSON object", f.string());
  return j;
}

// A special token's text: "..." or an AddedToken object {"content": ...}.
std::string token_text(const Json& v) {
  if (v.is_string()) return v.as_string();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").as_string();
  return {};
}

// The tokenizer_class of a folder's tokenizer_config.json, without "Fast".
std::string folder_class(const Json& cfg) {
  if (!cfg.contains("tokenizer_class") || !cfg.at("tokenizer_class").is_string()) return {};
  std::string cls = cfg.at("tokenizer_class").as_string();
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  return cls;
}

bool is_gpt2_slow(const fs::path& dir) {
  if (!fs::exists(dir / "vocab.json") || !fs::exists(dir / "merges.txt") ||
      !fs::exists(dir / "tokenizer_config.json"))
    return false;
  return folder_class(read_json(dir / "tokenizer_config.json")) == "GPT2Tokenizer";
}

[[noreturn]] void refuse_folder(const fs::path& dir, const std::vector<std::string>& found) {
  if (found.empty())
    fail(
        "no tokenizer in {}: redco reads tokenizer.json (what transformers' save_pretrained "
        "writes for a fast tokenizer), or GPT-2's vocab.json + merges.txt",
        dir.string());
  std::string names;
  for (const std::string& f : found) {
    if (!names.empty()) names += ", ";
    names += f;
  }
  fail(
      "{} holds no tokenizer.json, only {} (a slow tokenizer's files, which transformers "
      "converts when it loads them); redco reads tokenizer.json, and of the slow layouts "
      "only GPT2Tokenizer's vocab.json + merges.txt. Write tokenizer.json with: {}",
      dir.string(), names, resave_command(dir));
}

// merges.txt as GPT2Tokenizer reads it: the first line (#version) and what
// follows the last newline are dropped, each other line is two tokens.
Json read_merges(const fs::path& f) {
  const std::string text = read_file(f);
  std::vector<std::string_view> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.emplace_back(text.data() + at, nl - at);
  Json merges = Json::array();
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string_view> parts;
    std::string_view s = lines[i];
    constexpr std::string_view kSpace = " \t\r\v\f";
    while (!s.empty()) {
      const size_t b = s.find_first_not_of(kSpace);
      if (b == std::string_view::npos) break;
      s.remove_prefix(b);
      const size_t e = std::min(s.find_first_of(kSpace), s.size());
      parts.push_back(s.substr(0, e));
      s.remove_prefix(e);
    }
    REDCO_CHECK(parts.size() == 2, "{}:{}: expected a merge of two tokens (\"a b\")", f.string(),
                i + 1);
    Json pair = Json::array();
    pair.push_back(parts[0]), pair.push_back(parts[1]);
    merges.push_back(std::move(pair));
  }
  return merges;
}

Json byte_level(bool add_prefix_space, bool trim_offsets) {
  Json j = Json::object();
  j["type"] = "ByteLevel", j["add_prefix_space"] = add_prefix_space;
  j["trim_offsets"] = trim_offsets, j["use_regex"] = true;
  return j;
}

// added_tokens: tokenizer_config.json's added_tokens_decoder, then the named
// special tokens it lacks (as GPT2Tokenizer wraps them: normalized, special).
Json added_tokens(const Json& cfg, const Json& specials_map, const Json& vocab,
                  const fs::path& dir) {
  Json added = Json::array();
  std::vector<std::string> have;
  if (cfg.contains("added_tokens_decoder")) {
    std::vector<std::pair<int64_t, const Json*>> byid;
    for (const auto& [k, v] : cfg.at("added_tokens_decoder").as_object())
      byid.emplace_back(std::stoll(k), &v);
    std::sort(byid.begin(), byid.end());
    for (const auto& [id, v] : byid) {
      Json t = *v;
      t["id"] = id;
      t.as_object().erase("__type");
      have.push_back(token_text(t));
      added.push_back(std::move(t));
    }
  } else {
    REDCO_CHECK(!fs::exists(dir / "added_tokens.json"),
                "{}: added_tokens.json without tokenizer_config.json's added_tokens_decoder is "
                "not implemented; write tokenizer.json with: {}",
                dir.string(), resave_command(dir));
  }
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const Json* v = specials_map.contains(name) ? &specials_map.at(name)
                    : cfg.contains(name)        ? &cfg.at(name)
                                                : nullptr;
    // GPT2Tokenizer's default bos / eos / unk.
    const std::string text = v ? token_text(*v) : name[0] == 'p' ? "" : "<|endoftext|>";
    if (text.empty() || std::find(have.begin(), have.end(), text) != have.end()) continue;
    REDCO_CHECK(vocab.contains(text),
                "{}: {} \"{}\" is not in vocab.json; transformers would add it as a new token, "
                "which redco does not",
                dir.string(), name, text);
    Json t = Json::object();
    t["id"] = vocab.at(text), t["content"] = text, t["single_word"] = false;
    t["lstrip"] = false, t["rstrip"] = false, t["normalized"] = true, t["special"] = true;
    have.push_back(text);
    added.push_back(std::move(t));
  }
  return added;
}

// What GPT2Converter makes of vocab.json, merges.txt and the options
// add_prefix_space (the pre-tokenizer's) and add_bos_token (a
// TemplateProcessing "bos $A" instead of the ByteLevel post-processor).
Json gpt2_tokenizer_json(const fs::path& dir) {
  const Json cfg = read_json(dir / "tokenizer_config.json");
  const Json specials_map = fs::exists(dir / "special_tokens_map.json")
                                ? read_json(dir / "special_tokens_map.json")
                                : Json::object();
  auto flag = [&](std::string_view key) {
    if (!cfg.contains(key) || cfg.at(key).is_null()) return false;
    REDCO_CHECK(cfg.at(key).is_bool(), "{}: {} must be true or false",
                (dir / "tokenizer_config.json").string(), key);
    return cfg.at(key).as_bool();
  };
  Json model = Json::object();
  model["type"] = "BPE", model["dropout"] = Json(), model["unk_token"] = Json();
  model["continuing_subword_prefix"] = "", model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false, model["byte_fallback"] = false, model["ignore_merges"] = false;
  model["vocab"] = read_json(dir / "vocab.json");
  model["merges"] = read_merges(dir / "merges.txt");
  Json j = Json::object();
  j["added_tokens"] = added_tokens(cfg, specials_map, model.at("vocab"), dir);
  j["pre_tokenizer"] = byte_level(flag("add_prefix_space"), true);
  j["decoder"] = byte_level(true, true);
  j["post_processor"] = byte_level(true, false);
  j["model"] = std::move(model);
  if (flag("add_bos_token")) {
    const Json* v = specials_map.contains("bos_token") ? &specials_map.at("bos_token")
                    : cfg.contains("bos_token")        ? &cfg.at("bos_token")
                                                       : nullptr;
    const std::string bos = v ? token_text(*v) : "<|endoftext|>";
    int64_t id = -1;
    for (const Json& t : j.at("added_tokens").as_array())
      if (t.at("content") == Json(bos)) id = t.at("id").as_int();
    REDCO_CHECK(id >= 0, "{}: add_bos_token = true but bos_token \"{}\" is no token", dir.string(),
                bos);
    Json special = Json::object(), ids = Json::array(), tokens = Json::array();
    ids.push_back(id), tokens.push_back(bos);
    special["id"] = bos, special["ids"] = std::move(ids), special["tokens"] = std::move(tokens);
    auto item = [&](std::string_view kind, std::string_view name, int type) {
      Json inner = Json::object(), it = Json::object();
      inner["id"] = name, inner["type_id"] = type;
      it[kind] = std::move(inner);
      return it;
    };
    Json single = Json::array(), pair = Json::array();
    single.push_back(item("SpecialToken", bos, 0)), single.push_back(item("Sequence", "A", 0));
    pair = single, pair.push_back(item("Sequence", "B", 1));
    Json tmpl = Json::object();
    tmpl["type"] = "TemplateProcessing", tmpl["single"] = std::move(single);
    tmpl["pair"] = std::move(pair), tmpl["special_tokens"][bos] = std::move(special);
    j["post_processor"] = std::move(tmpl);
  }
  return j;
}

}  // namespace

std::string resave_command(const fs::path& dir) {
  // Single quotes escaped inside the Python string literal.
  std::string d;
  for (char c : dir.empty() ? std::string(".") : dir.string()) {
    if (c == '\'') d.push_back('\\');
    d.push_back(c);
  }
  return fmt::format(
      "python -c \"from transformers import AutoTokenizer as T; "
      "T.from_pretrained('{}').save_pretrained('{}')\"",
      d, d);
}

Tokenizer Tokenizer::from_file(const fs::path& path) {
  const bool is_dir = fs::is_directory(path);
  const fs::path dir = is_dir ? path : path.parent_path();
  const fs::path file = is_dir ? path / "tokenizer.json" : path;
  if (!fs::exists(file)) {
    REDCO_CHECK(is_dir || file.filename() == "tokenizer.json",
                "no tokenizer at {}: expected a tokenizer.json (the file transformers' "
                "save_pretrained writes) or a folder holding one",
                file.string());
    if (fs::is_directory(dir) && is_gpt2_slow(dir)) {
      const std::string source = (dir / "vocab.json").string() + " + merges.txt";
      Tokenizer t = from_json(gpt2_tokenizer_json(dir).dump(), source);
      t.impl_->load_config(dir);
      return t;
    }
    refuse_folder(dir, fs::is_directory(dir) ? tokenizer_files(dir) : std::vector<std::string>{});
  }
  Tokenizer t = from_json(read_file(file), file.string());
  t.impl_->load_config(dir);
  return t;
}

bool Tokenizer::found_in(const fs::path& dir) {
  if (fs::exists(dir / "tokenizer.json") || is_gpt2_slow(dir)) return true;
  const std::vector<std::string> found = tokenizer_files(dir);
  if (found.empty()) return false;
  refuse_folder(dir, found);
}

}  // namespace redco::data

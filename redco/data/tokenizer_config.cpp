// tokenizer_config.json and special_tokens_map.json: the options transformers'
// AutoTokenizer applies on top of tokenizer.json (named special tokens,
// add_bos_token / add_eos_token, model_max_length, padding and truncation
// sides, clean_up_tokenization_spaces), and the checks that reject options
// redco does not apply.
#include <algorithm>
#include <cmath>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_impl.hpp"

namespace redco::data {

using tok::Json;

namespace {

// The fast tokenizer classes whose __init__ rebuilds the post-processor as
// [bos] $A [eos] ([bos] $B [eos]) from add_bos_token / add_eos_token, with
// their default add_bos_token (add_eos_token defaults to false).
struct Rebuild {
  std::string_view cls;
  bool add_bos;
};
constexpr Rebuild kRebuilds[] = {{"LlamaTokenizer", true},
                                 {"CodeLlamaTokenizer", true},
                                 {"GemmaTokenizer", true},
                                 {"CohereTokenizer", true},
                                 {"GPTNeoXTokenizer", false}};

// Classes whose fast tokenizer ignores add_bos_token / add_eos_token.
constexpr std::string_view kIgnoreBosEos[] = {
    "PreTrainedTokenizer", "GPT2Tokenizer", "Qwen2Tokenizer", "BertTokenizer",
    "RobertaTokenizer",    "T5Tokenizer",   "BartTokenizer",  "DistilBertTokenizer"};

std::string class_base(std::string cls) {
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  return cls;
}

// A special token's text: "..." or an AddedToken object {"content": ...}.
const Json* token_content(const Json& v) {
  if (v.is_string()) return &v;
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return &v.at("content");
  return nullptr;
}

// Classes whose padding_side defaults to "left".
constexpr std::string_view kPadLeft[] = {"LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer",
                                         "CohereTokenizer", "XLNetTokenizer"};

Side read_side(const Json& cfg, std::string_view key, const std::string& file, Side fallback) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return fallback;
  const Json& v = cfg.at(key);
  REDCO_CHECK(v.is_string() && (v.as_string() == "left" || v.as_string() == "right"),
              "{}: {} must be \"left\" or \"right\"", file, key);
  return v.as_string() == "left" ? Side::left : Side::right;
}

// The first value of `key` in a pipeline stage or its Sequence members.
const Json* find_option(const Json& stage, std::string_view key) {
  if (stage.is_object()) {
    if (stage.contains(key)) return &stage.at(key);
    for (const auto& [k, v] : stage.as_object())
      if (v.is_array())
        for (const Json& member : v.as_array())
          if (const Json* found = find_option(member, key)) return found;
  }
  return nullptr;
}

// The first stage of type `type` in a pipeline stage or its Sequence members.
const Json* find_stage(const Json& stage, std::string_view type) {
  if (!stage.is_object()) return nullptr;
  if (stage.contains("type") && stage.at("type") == Json(type)) return &stage;
  for (const auto& [k, v] : stage.as_object())
    if (v.is_array())
      for (const Json& member : v.as_array())
        if (const Json* found = find_stage(member, type)) return found;
  return nullptr;
}

// When a Metaspace stage prepends "▁": its prepend_scheme, or what the older
// add_prefix_space flag meant; "none" without a Metaspace stage.
std::string metaspace_scheme(const Json* m) {
  if (!m) return "none";
  if (m->contains("prepend_scheme") && m->at("prepend_scheme").is_string())
    return m->at("prepend_scheme").as_string();
  const bool add = !m->contains("add_prefix_space") || m->at("add_prefix_space") == Json(true);
  return add ? "always" : "never";
}

// What a tokenizer.json does about the "▁" before the first word, in the
// terms in which transformers' SentencePiece conversion sets it
// (convert_slow_tokenizer.py: LlamaConverter, SpmConverter).
struct PrefixSetting {
  bool prepend = false;   // a Prepend("▁") normalizer (LLaMA's legacy layout)
  std::string metaspace;  // the Metaspace pre-tokenizer's scheme, or "none"
  std::string decoder;    // how decoding drops the prefix space again
  bool operator==(const PrefixSetting&) const = default;
  std::string str() const {
    return fmt::format("Prepend(\"▁\") normalizer: {}; Metaspace pre-tokenizer: {}; decoder: {}",
                       prepend ? "yes" : "no", metaspace, decoder);
  }
};

// LLaMA's converter strips the prefix space with Strip(" ", 1, 0); T5's with
// its Metaspace decoder's scheme.
std::string decoder_prefix(const Json& decoder, bool llama) {
  if (!llama) return "Metaspace " + metaspace_scheme(find_stage(decoder, "Metaspace"));
  const Json* strip = find_stage(decoder, "Strip");
  const bool strips = strip && strip->contains("start") && strip->at("start") == Json(1) &&
                      strip->contains("content") && strip->at("content") == Json(" ");
  return strips ? "Strip(\" \", 1, 0)" : "no Strip";
}

}  // namespace

void Tokenizer::Impl::load_config(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  // Named special tokens: special_tokens_map.json overrides tokenizer_config.json.
  std::map<std::string, std::string, std::less<>> contents;
  Json cfg = Json::object();
  std::string cfg_file;
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path f = folder / name;
    if (!fs::exists(f)) continue;
    const Json j = Json::parse(read_file(f), f.string());
    REDCO_CHECK(j.is_object(), "{}: expected a JSON object", f.string());
    for (const auto& [k, v] : j.as_object()) {
      const Json* content = k.ends_with("_token") ? token_content(v) : nullptr;
      if (!content || contents.count(k)) continue;
      contents[k] = content->as_string();
      const int32_t id = token_id(content->as_string());
      REDCO_CHECK(id >= 0,
                  "{}: {} \"{}\" is not in tokenizer.json's vocabulary; transformers would add "
                  "it as a new token, which redco does not: add it to tokenizer.json's "
                  "added_tokens",
                  f.string(), k, content->as_string());
      named_specials[k] = id;
    }
    if (std::string_view(name) == "tokenizer_config.json") cfg = j, cfg_file = f.string();
  }
  if (cfg_file.empty()) return;
  const std::string cls = cfg.contains("tokenizer_class") && cfg.at("tokenizer_class").is_string()
                              ? class_base(cfg.at("tokenizer_class").as_string())
                              : std::string();
  apply_bos_eos(cfg, cls, contents, cfg_file);
  if (cfg.contains("model_max_length") && cfg.at("model_max_length").is_number()) {
    // transformers stores "no limit" as 1e30 and truncates nothing above 1e20.
    const double m = cfg.at("model_max_length").as_double();
    REDCO_CHECK(m > 0, "{}: model_max_length must be positive, not {}", cfg_file, m);
    if (m < 1e18) model_max_length = int64_t(m);
  }
  const bool left = std::find(std::begin(kPadLeft), std::end(kPadLeft), std::string_view(cls)) !=
                    std::end(kPadLeft);
  padding_side = read_side(cfg, "padding_side", cfg_file, left ? Side::left : Side::right);
  truncation_side = read_side(cfg, "truncation_side", cfg_file, Side::right);
  if (cfg.contains("clean_up_tokenization_spaces")) {
    const Json& v = cfg.at("clean_up_tokenization_spaces");
    REDCO_CHECK(v.is_bool(), "{}: clean_up_tokenization_spaces must be true or false", cfg_file);
    clean_up_spaces = v.as_bool();
  }
  check_unapplied(cfg, cls, cfg_file);
}

// The post-processor the LLaMA-style fast tokenizers build in __init__.
void Tokenizer::Impl::apply_bos_eos(const Json& cfg, const std::string& cls,
                                    const std::map<std::string, std::string, std::less<>>& names,
                                    const std::string& file) {
  const Rebuild* rebuild = nullptr;
  for (const Rebuild& r : kRebuilds)
    if (r.cls == cls) rebuild = &r;
  auto flag = [&](std::string_view key, bool fallback) {
    if (!cfg.contains(key) || cfg.at(key).is_null()) return fallback;
    REDCO_CHECK(cfg.at(key).is_bool(), "{}: {} must be true or false", file, key);
    return cfg.at(key).as_bool();
  };
  if (!rebuild) {
    const bool ignored = std::find(std::begin(kIgnoreBosEos), std::end(kIgnoreBosEos),
                                   std::string_view(cls)) != std::end(kIgnoreBosEos);
    REDCO_CHECK(ignored || (!flag("add_bos_token", false) && !flag("add_eos_token", false)),
                "{}: add_bos_token / add_eos_token with tokenizer_class \"{}\" is not "
                "implemented (redco applies them for {}); put the tokens in tokenizer.json's "
                "post_processor instead",
                file, cls.empty() ? "(none)" : cls,
                "LlamaTokenizer, CodeLlamaTokenizer, GemmaTokenizer, CohereTokenizer, "
                "GPTNeoXTokenizer");
    return;
  }
  const bool bos = flag("add_bos_token", rebuild->add_bos), eos = flag("add_eos_token", false);
  Json single = Json::array(), pair = Json::array(), specials = Json::object();
  auto special = [&](std::string_view name, int type, Json& to) {
    auto it = names.find(name);
    REDCO_CHECK(it != names.end(), "{}: add_{} = true but no {} is named", file, name, name);
    Json item = Json::object(), inner = Json::object();
    inner["id"] = it->second, inner["type_id"] = type;
    item["SpecialToken"] = std::move(inner);
    to.push_back(std::move(item));
    Json entry = Json::object(), ids = Json::array(), tokens = Json::array();
    ids.push_back(named_specials.at(std::string(name))), tokens.push_back(it->second);
    entry["id"] = it->second, entry["ids"] = std::move(ids), entry["tokens"] = std::move(tokens);
    specials[it->second] = std::move(entry);
  };
  auto sequence = [](std::string_view id, int type, Json& to) {
    Json item = Json::object(), inner = Json::object();
    inner["id"] = id, inner["type_id"] = type;
    item["Sequence"] = std::move(inner);
    to.push_back(std::move(item));
  };
  for (int k = 0; k < 2; ++k) {  // single = [bos] $A [eos]; pair = single [bos] $B [eos]
    for (Json* t : k == 0 ? std::vector<Json*>{&single, &pair} : std::vector<Json*>{&pair}) {
      if (bos) special("bos_token", k, *t);
      sequence(k == 0 ? "A" : "B", k, *t);
      if (eos) special("eos_token", k, *t);
    }
  }
  Json tmpl = Json::object();
  tmpl["type"] = "TemplateProcessing", tmpl["single"] = std::move(single);
  tmpl["pair"] = std::move(pair), tmpl["special_tokens"] = std::move(specials);
  post_processor = tok::make_post_processor(tmpl);
  post_processor_json = std::move(tmpl);
}

// Options with which the reference's fast tokenizers rebuild part of
// tokenizer.json (from the slow tokenizer, or a stage with other settings):
// accepted where tokenizer.json already agrees, else an Error.
void Tokenizer::Impl::check_unapplied(const Json& cfg, const std::string& cls,
                                      const std::string& file) const {
  auto fail_option = [&](std::string_view key, std::string_view why) {
    fail(
        "{}: option {} is not implemented by redco ({}); remove it, or change tokenizer.json "
        "to what it asks for",
        file, key, why);
  };
  for (std::string_view key : {"from_slow", "split_special_tokens"})
    if (cfg.contains(key) && cfg.at(key).is_bool() && cfg.at(key).as_bool())
      fail_option(key, "the reference then tokenizes differently from tokenizer.json");
  if (cfg.contains("add_prefix_space") && !cfg.at("add_prefix_space").is_null())
    check_prefix_space(cfg, cls, file);
  if (cfg.contains("trim_offsets") && !cfg.at("trim_offsets").is_null()) {
    const Json* have = find_option(post_processor_json, "trim_offsets");
    if (!have || !(*have == cfg.at("trim_offsets")))
      fail_option("trim_offsets", "tokenizer.json's post-processor has another value");
  }
  if (cls == "BertTokenizer" || cls == "DistilBertTokenizer") {
    // BertTokenizerFast rebuilds the normalizer when these differ from it
    // (its defaults: lowercase, accents stripped when lowercasing, CJK split).
    const Json& n = normalizer_json;
    auto get = [](const Json& j, std::string_view k, const Json& fallback) {
      return j.is_object() && j.contains(k) ? j.at(k) : fallback;
    };
    const Json lower = get(cfg, "do_lower_case", true), strip = get(cfg, "strip_accents", Json());
    const Json chinese = get(cfg, "tokenize_chinese_chars", true);
    const Json n_lower = get(n, "lowercase", lower), n_strip = get(n, "strip_accents", strip);
    const Json n_chinese = get(n, "handle_chinese_chars", chinese);
    // strip_accents null means "as lowercase".
    auto effective = [](const Json& s, const Json& l) { return s.is_null() ? l : s; };
    if (!(n_lower == lower)) fail_option("do_lower_case", "tokenizer.json's normalizer differs");
    if (!(effective(n_strip, n_lower) == effective(strip, lower)))
      fail_option("strip_accents", "tokenizer.json's normalizer differs");
    if (!(n_chinese == chinese))
      fail_option("tokenize_chinese_chars", "tokenizer.json's normalizer differs");
  }
}

// add_prefix_space: LlamaTokenizerFast and T5TokenizerFast rebuild the
// whole tokenizer from the SentencePiece model when it is set; other classes
// set the pre-tokenizer's own flag. Accepted where tokenizer.json already
// is what that gives.
void Tokenizer::Impl::check_prefix_space(const Json& cfg, const std::string& cls,
                                         const std::string& file) const {
  const Json& v = cfg.at("add_prefix_space");
  REDCO_CHECK(v.is_bool(), "{}: add_prefix_space must be true or false", file);
  const bool want = v.as_bool();
  const std::string fix = resave_command(std::filesystem::path(file).parent_path());
  if (cls != "LlamaTokenizer" && cls != "T5Tokenizer") {
    // ByteLevel's flag, or a Metaspace that prepends (always / first) or not (never).
    const Json* flag = find_option(pre_tokenizer_json, "add_prefix_space");
    const Json* meta = find_stage(pre_tokenizer_json, "Metaspace");
    const Json have = flag ? *flag : meta ? Json(metaspace_scheme(meta) != "never") : Json();
    REDCO_CHECK(have == v,
                "{}: add_prefix_space = {} is not what {}'s pre-tokenizer does ({}); redco "
                "does not change tokenizer.json for it: remove the option, or set it in "
                "tokenizer.json",
                file, want, source, have.is_null() ? "no such option" : have.dump());
    return;
  }
  // legacy: null or absent means true (with a warning) in both classes.
  const bool legacy = !(cfg.contains("legacy") && cfg.at("legacy") == Json(false));
  const bool llama = cls == "LlamaTokenizer";
  const std::string scheme = !want ? "never" : legacy ? "always" : "first";
  PrefixSetting expect;
  if (llama) {  // LlamaConverter: normalizer (legacy) or pre-tokenizer, and a Strip
    expect = {legacy && want, legacy ? "none" : (want ? "first" : "never"),
              want ? "Strip(\" \", 1, 0)" : "no Strip"};
  } else {  // SpmConverter: Metaspace pre-tokenizer and decoder
    expect = {false, scheme, "Metaspace " + scheme};
  }
  const PrefixSetting have{find_stage(normalizer_json, "Prepend") &&
                               find_stage(normalizer_json, "Prepend")->at("prepend") == Json("▁"),
                           metaspace_scheme(find_stage(pre_tokenizer_json, "Metaspace")),
                           decoder_prefix(decoder_json, llama)};
  REDCO_CHECK(have == expect,
              "{}: add_prefix_space = {} (legacy = {}) makes transformers rebuild the "
              "tokenizer from the folder's {} as [{}], but {} has [{}]; redco reads "
              "tokenizer.json as it is: remove add_prefix_space from {}, or let transformers "
              "write tokenizer.json with it: {}",
              file, want, legacy, llama ? "tokenizer.model" : "spiece.model", expect.str(), source,
              have.str(), file, fix);
}

// ---- public ----------------------------------------------------------------------

std::optional<int64_t> Tokenizer::model_max_length() const { return impl_->model_max_length; }

std::optional<Truncation> Tokenizer::default_truncation() const {
  if (!impl_->model_max_length) return std::nullopt;
  return Truncation{*impl_->model_max_length, impl_->truncation_side};
}

Padding Tokenizer::default_padding() const {
  const int32_t pad = special_token_id("pad_token");
  REDCO_CHECK(pad >= 0,
              "Tokenizer::default_padding: no pad_token is named (tokenizer_config.json or "
              "special_tokens_map.json); name one there or pass a Padding with pad_id");
  Padding p;
  p.side = impl_->padding_side;
  p.pad_id = pad;
  return p;
}

}  // namespace redco::data

// config.json and model.safetensors.index.json of Hugging Face checkpoint
// folders: the text read, checked and queried with errors that name the file
// and key. No weights are touched here (the fuzz harnesses link this alone).
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/models/hf_checkpoint.hpp"

namespace redco::models::hf {
namespace fs = std::filesystem;

// ---- config.json ----------------------------------------------------------------------------

std::string read_text(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  REDCO_CHECK(in.good(), "{} '{}' cannot be opened: is this a Hugging Face model folder?", what,
              path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Config::Config(const fs::path& dir) : source_((dir / "config.json").string()) {
  REDCO_CHECK(fs::is_directory(dir), "model folder '{}' does not exist (or is not a folder)",
              dir.string());
  json_ = io::Json::parse(read_text(dir / "config.json", "config file"), source_);
  REDCO_CHECK(json_.is_object(), "{}: expected a JSON object", source_);
}

void Config::fail(std::string_view key, std::string_view problem) const {
  throw Error(fmt::format("{}: key '{}' {}", source_, key, problem));
}

const io::Json* Config::find(std::string_view key) const {
  if (!json_.contains(key)) return nullptr;
  const io::Json& v = json_.at(key);
  return v.is_null() ? nullptr : &v;
}

bool Config::has(std::string_view key) const { return find(key) != nullptr; }

int64_t Config::integer(std::string_view key) const {
  const io::Json* v = find(key);
  if (!v) fail(key, "is missing (an integer is required)");
  if (v->is_int()) return v->as_int();
  if (v->is_number()) {  // 2.0 is an integer; 2.5, 1e300 and NaN are not
    const double d = v->as_double();
    if (d >= -0x1p63 && d < 0x1p63 && d == std::floor(d)) return int64_t(d);
  }
  fail(key, fmt::format("must be an integer, got {}", v->dump()));
}
int64_t Config::size(std::string_view key) const {
  const int64_t n = integer(key);
  if (n < 1 || n >= (int64_t(1) << 31))
    fail(key, fmt::format("= {} must be a size of at least 1 (and below 2^31)", n));
  return n;
}
int64_t Config::size(std::string_view key, int64_t fallback) const {
  return has(key) ? size(key) : fallback;
}
int64_t Config::integer(std::string_view key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}
double Config::number(std::string_view key) const {
  const io::Json* v = find(key);
  if (!v) fail(key, "is missing (a number is required)");
  if (!v->is_number()) fail(key, fmt::format("must be a number, got {}", v->dump()));
  return v->as_double();
}
double Config::number(std::string_view key, double fallback) const {
  return has(key) ? number(key) : fallback;
}
bool Config::boolean(std::string_view key, bool fallback) const {
  const io::Json* v = find(key);
  if (!v) return fallback;
  if (!v->is_bool()) fail(key, fmt::format("must be true or false, got {}", v->dump()));
  return v->as_bool();
}
std::string Config::string(std::string_view key) const {
  const io::Json* v = find(key);
  if (!v) fail(key, "is missing (a string is required)");
  if (!v->is_string()) fail(key, fmt::format("must be a string, got {}", v->dump()));
  return v->as_string();
}
std::string Config::string(std::string_view key, std::string fallback) const {
  return has(key) ? string(key) : fallback;
}
const io::Json& Config::object(std::string_view key) const {
  const io::Json* v = find(key);
  if (!v || !v->is_object()) fail(key, "must be an object");
  return *v;
}
std::string Config::model_type() const { return string("model_type"); }

void Config::expect_model_type(std::initializer_list<std::string_view> accepted,
                               std::string_view loader) const {
  const std::string t = model_type();
  for (std::string_view a : accepted)
    if (t == a) return;
  throw Error(fmt::format(
      "{}: the folder holds a '{}' model, which {} does not load (it loads {}); use the loader "
      "for '{}' (models::from_pretrained_any picks it from config.json)",
      source_, t, loader, fmt::join(accepted, ", "), t));
}

// ---- model.safetensors.index.json --------------------------------------------------------------

std::map<std::string, std::vector<std::string>> parse_index(std::string_view text,
                                                            const std::string& source) {
  const io::Json j = io::Json::parse(text, source);
  REDCO_CHECK(j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object(),
              "{}: expected an object with a \"weight_map\" object", source);
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, file] : j.at("weight_map").as_object()) {
    REDCO_CHECK(file.is_string(), "{}: weight_map['{}'] must be a file name", source, name);
    const std::string& f = file.as_string();
    REDCO_CHECK(f.find('/') == std::string::npos && f != ".." && f != "." && !f.empty(),
                "{}: weight file '{}' must be a plain file name in the folder", source, f);
    by_file[f].push_back(name);
  }
  return by_file;
}

}  // namespace redco::models::hf

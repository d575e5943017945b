// config.json of a Hugging Face checkpoint folder: hf::Config's typed getters,
// whose errors name the file and the key (apart from the weights in
// hf_checkpoint.cpp, so that config readers link without the tensor code).
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/models/hf_checkpoint.hpp"

namespace redco::models::hf {
namespace fs = std::filesystem;

TensorSource same(std::string param, std::string hf, Shape shape) {
  return {std::move(param), std::move(hf), std::move(shape), false, {}};
}

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
  if (v->is_number() && v->as_double() == double(int64_t(v->as_double())))
    return int64_t(v->as_double());
  fail(key, fmt::format("must be an integer, got {}", v->dump()));
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

}  // namespace redco::models::hf

// generation_config.json -> generation::GenerationConfig (hf_generation.hpp).
#include "redco/models/hf_generation.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/models/hf_checkpoint.hpp"

namespace redco::models {

namespace fs = std::filesystem;

namespace {

hf::Config read_generation_file(const fs::path& dir) {
  const fs::path file = dir / "generation_config.json";
  if (!fs::exists(file)) return hf::Config(dir);  // config.json holds the settings
  std::ifstream in(file, std::ios::binary);
  REDCO_CHECK(in.good(), "'{}' cannot be opened", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  io::Json j = io::Json::parse(ss.str(), file.string());
  REDCO_CHECK(j.is_object(), "{}: expected a JSON object", file.string());
  return hf::Config(std::move(j), file.string());
}

// eos_token_id: an id or a list of ids.
std::vector<int64_t> eos_ids(const hf::Config& f) {
  if (!f.has("eos_token_id")) return {};
  const io::Json& v = f.json().at("eos_token_id");
  if (!v.is_array()) return {f.integer("eos_token_id")};
  std::vector<int64_t> ids;
  for (const io::Json& x : v.as_array()) {
    if (!x.is_int()) f.fail("eos_token_id", fmt::format("holds {}, not a token id", x.dump()));
    ids.push_back(x.as_int());
  }
  return ids;
}

}  // namespace

generation::GenerationConfig generation_config(const fs::path& dir,
                                               generation::GenerationConfig c) {
  const hf::Config f = read_generation_file(dir);
  if (f.has("eos_token_id")) c.eos_token_ids = eos_ids(f);
  c.pad_token_id =
      f.integer("pad_token_id", c.eos_token_ids.empty() ? c.pad_token_id : c.eos_token_ids[0]);
  c.decoder_start_token_id =
      f.integer("decoder_start_token_id", f.integer("bos_token_id", c.decoder_start_token_id));
  c.forced_bos_token_id = f.integer("forced_bos_token_id", c.forced_bos_token_id);
  c.forced_eos_token_id = f.integer("forced_eos_token_id", c.forced_eos_token_id);
  c.num_beams = f.integer("num_beams", c.num_beams);
  c.num_return_sequences = f.integer("num_return_sequences", c.num_return_sequences);
  c.length_penalty = float(f.number("length_penalty", c.length_penalty));
  if (f.has("early_stopping") && f.json().at("early_stopping").is_string())
    f.fail("early_stopping",
           "= \"never\" is not implemented in redco's beam search (true or false)");
  c.early_stopping = f.boolean("early_stopping", c.early_stopping);
  c.no_repeat_ngram_size = f.integer("no_repeat_ngram_size", c.no_repeat_ngram_size);
  c.repetition_penalty = float(f.number("repetition_penalty", c.repetition_penalty));
  c.do_sample = f.boolean("do_sample", c.do_sample);
  c.temperature = float(f.number("temperature", c.temperature));
  c.top_k = f.integer("top_k", c.top_k == 0 ? 50 : c.top_k);  // transformers' default
  c.top_p = float(f.number("top_p", c.top_p));
  c.min_p = float(f.number("min_p", c.min_p));
  c.max_new_tokens = f.integer("max_new_tokens", c.max_new_tokens);
  c.min_new_tokens = f.integer("min_new_tokens", c.min_new_tokens);
  generation::check(c);
  return c;
}

}  // namespace redco::models

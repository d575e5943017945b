#pragma once
// What the generation tests share: the golden cases of
// tests/fixtures/hf/*/generation.json (tests/python/make_generation_goldens.py)
// read into redco's GenerationConfig.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hf_fixtures.hpp"
#include "redco/generation/generation_config.hpp"
#include "redco/io/json.hpp"

namespace redco::test {

inline std::vector<int64_t> ints(const io::Json& j) {
  std::vector<int64_t> v;
  for (const io::Json& x : j.as_array()) v.push_back(x.as_int());
  return v;
}

inline io::Json generation_cases(const std::string& fixture) {
  std::ifstream in(hf_fixture(fixture) / "generation.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return io::Json::parse(ss.str(), fixture);
}

// A case's config as transformers.generate got it (max_new_tokens 12).
inline generation::GenerationConfig config_of(const io::Json& j) {
  generation::GenerationConfig c{.max_new_tokens = 12};
  const auto& o = j.as_object();
  auto num = [&](const char* k, double d) { return o.count(k) ? o.at(k).as_double() : d; };
  c.eos_token_ids = ints(o.at("eos_token_ids"));
  c.repetition_penalty = float(num("repetition_penalty", 1));
  c.no_repeat_ngram_size = int64_t(num("no_repeat_ngram_size", 0));
  c.min_new_tokens = int64_t(num("min_new_tokens", 0));
  c.num_beams = int64_t(num("num_beams", 1));
  c.length_penalty = float(num("length_penalty", 1));
  c.early_stopping = o.count("early_stopping") && o.at("early_stopping").as_bool();
  c.num_return_sequences = int64_t(num("num_return_sequences", 1));
  c.pad_token_id = int64_t(num("pad_token_id", double(c.pad_token_id)));
  c.decoder_start_token_id = int64_t(num("decoder_start_token_id", -1));
  c.forced_bos_token_id = int64_t(num("forced_bos_token_id", -1));
  c.forced_eos_token_id = int64_t(num("forced_eos_token_id", -1));
  return c;
}

// transformers pads finished beams: cut after the first end-of-sequence id.
inline std::vector<int64_t> until_eos(std::vector<int64_t> t,
                                      const generation::GenerationConfig& c) {
  for (size_t i = 0; i < t.size(); ++i)
    if (std::count(c.eos_token_ids.begin(), c.eos_token_ids.end(), t[i])) {
      t.resize(i + 1);
      break;
    }
  return t;
}

}  // namespace redco::test

// libFuzzer harness: a checkpoint's config.json through hf::Config and every
// model family's reader (models::*_config, what from_pretrained runs first).
// A malformed or inconsistent config must end in redco::Error: no division
// by zero, overflow or other crash on the way.
#include <cstdint>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/io/json.hpp"
#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"

namespace {

template <typename F>
void read(F&& f) {
  try {
    (void)f();
  } catch (const redco::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace m = redco::models;
  redco::io::Json json;
  try {
    json = redco::io::Json::parse(std::string_view(reinterpret_cast<const char*>(data), size),
                                  "config.json");
  } catch (const redco::Error&) {
    return 0;
  }
  const m::hf::Config c(std::move(json), "config.json");
  read([&] { return c.model_type(); });
  read([&] { return m::gpt2_config(c); });
  read([&] { return m::llama_config(c); });
  read([&] { return m::opt_config(c); });
  read([&] { return m::gptj_config(c); });
  read([&] { return m::gpt_neox_config(c); });
  read([&] { return m::t5_config(c); });
  read([&] { return m::bart_config(c); });
  read([&] { return m::bert_config(c); });
  return 0;
}

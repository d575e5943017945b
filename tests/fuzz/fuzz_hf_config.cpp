// libFuzzer harness: a Hugging Face config.json, read as the loaders read it
// (hf::Config, then the typed config of the family its model_type names).
// Malformed or unsupported input must end in redco::Error. What parses must
// survive the save path: the config.json redco writes reads back to the same
// config (compared through the JSON it writes again).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/io/json.hpp"
#include "redco/models/pretrained.hpp"

namespace {
using namespace redco;
using models::HfFamily;

template <typename M>
void round_trip(const models::hf::Config& f) {
  const auto config = HfFamily<M>::config(f);
  const std::string written = HfFamily<M>::to_json(config, f.json()).dump();
  const models::hf::Config back(io::Json::parse(written, "written config.json"), "written");
  const auto again = HfFamily<M>::config(back);
  if (HfFamily<M>::to_json(again, f.json()).dump() != written) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    io::Json json = io::Json::parse(text, "config.json");
    if (!json.is_object()) return 0;
    const models::hf::Config f(std::move(json), "config.json");
    models::with_family(f.model_type(), f.source(), [&]<typename M>() { round_trip<M>(f); });
  } catch (const redco::Error&) {
  }
  return 0;
}

// libFuzzer harness: checkpoint state.json, through the JSON parser every
// redco file uses (io::Json) and the reads FitDriver's resume makes. Malformed
// input must end in redco::Error. A parsed document must also survive a
// round trip: dump() parses back to the same document.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/io/json.hpp"

namespace {

// What resuming reads from state.json (train/trainer.cpp, restore_state).
void read_like_resume(const redco::io::Json& s) {
  const redco::io::Json& c = s.at("config");
  (void)s.at("seed").as_uint();
  (void)c.at("n_examples").as_int();
  (void)c.at("global_batch_size").as_int();
  (void)c.at("shuffle").as_bool();
  (void)s.at("step").as_int();
  (void)s.at("epoch").as_int();
  (void)s.at("step_in_epoch").as_int();
  if (s.contains("skipped_steps")) (void)s.at("skipped_steps").as_int();
  const redco::io::Json& best = s.at("best");
  for (const auto& [name, b] : best.as_object()) {
    (void)b.at("mode").as_string();
    (void)b.at("value").as_double();
    (void)b.at("step").as_int();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  redco::io::Json doc;
  try {
    doc = redco::io::Json::parse(text, "state.json");
  } catch (const redco::Error&) {
    return 0;
  }
  // Compared as text: NaN (which the parser accepts) is not equal to itself.
  const std::string once = doc.dump();
  for (const bool pretty : {false, true})
    if (redco::io::Json::parse(doc.dump(pretty), "dumped").dump() != once) std::abort();
  try {
    read_like_resume(doc);
  } catch (const redco::Error&) {
  }
  return 0;
}

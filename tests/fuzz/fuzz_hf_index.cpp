// libFuzzer harness: model.safetensors.index.json (hf::parse_index). Malformed
// input must end in redco::Error; a parsed index names only plain file names
// (no path can leave the checkpoint folder) and keeps every tensor once.
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "redco/core/error.hpp"
#include "redco/models/hf_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto by_file = redco::models::hf::parse_index(text, "model.safetensors.index.json");
    std::set<std::string> seen;
    for (const auto& [file, names] : by_file) {
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
        std::abort();
      for (const std::string& n : names)
        if (!seen.insert(n).second) std::abort();
    }
  } catch (const redco::Error&) {
  }
  return 0;
}

// libFuzzer harness: the safetensors reader (header JSON, dtypes, shapes,
// offsets) on arbitrary bytes. Malformed input must end in redco::Error;
// any other exception, a crash or a sanitizer report is a bug.
#include <cstdint>

#include "fuzz_file.hpp"
#include "redco/core/error.hpp"
#include "redco/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = redco::fuzz::as_file(data, size);
  try {
    redco::io::SafetensorsReader reader(path);
    for (const redco::io::TensorSpec& s : reader.specs()) (void)reader.read(s.name);
  } catch (const redco::Error&) {
  }
  try {
    redco::io::Metadata meta;
    (void)redco::io::load_safetensors(path, &meta);
  } catch (const redco::Error&) {
  }
  return 0;
}

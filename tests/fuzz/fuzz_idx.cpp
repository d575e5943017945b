// libFuzzer harness: the IDX reader (raw and gzip-compressed) on arbitrary
// bytes. Malformed input must end in redco::Error.
#include <cstdint>

#include "fuzz_file.hpp"
#include "redco/core/error.hpp"
#include "redco/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)redco::data::read_idx(redco::fuzz::as_file(data, size));
  } catch (const redco::Error&) {
  }
  return 0;
}

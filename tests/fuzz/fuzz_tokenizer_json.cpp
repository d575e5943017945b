// libFuzzer harness: tokenizer.json through data::Tokenizer::from_json, and
// a tokenizer that loads must encode, decode and stream without crashing.
// Malformed files must end in redco::Error (any other exception is a
// finding: libFuzzer reports it as a crash).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer.hpp"

namespace {

// Text that reaches every stage: spaces, digits, punctuation, accents,
// CJK, an emoji, and the added tokens the seeds define.
const std::string_view kTexts[] = {
    "", " ", "In the beginning God created the heaven and the earth.",
    "Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC 123 4567 \xF0\x9F\x91\x8D  x\n\ty",
    "<s>a</s>[CLS] [SEP]<unk> ab abc"};

void use(const redco::data::Tokenizer& tok) {
  for (std::string_view text : kTexts) {
    const auto e = tok.encode(text);
    (void)tok.decode(e.ids, false);
    (void)tok.decode(e.ids, true);
    redco::data::Tokenizer::Stream stream(tok);
    for (int32_t id : e.ids) (void)stream.step(id);
    (void)stream.flush();
    (void)tok.encode_pair(text, "and the earth", true);
  }
  const std::vector<std::string> batch(kTexts, kTexts + 5);
  (void)tok.encode_batch(batch, true, 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = redco::data::Tokenizer::from_json(json);
    use(tok);
  } catch (const redco::Error&) {
  }
  return 0;
}

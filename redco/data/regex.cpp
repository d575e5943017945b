// PCRE2 behind data::Regex. The compiled code is shared by all threads; each
// thread keeps its own match data, so matching is lock-free.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "redco/data/regex.hpp"

#include <pcre2.h>

#include "redco/core/error.hpp"

namespace redco::data {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

namespace {

// One match-data block per thread, grown to the largest pattern seen.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(32, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer regex '{}' does not compile at offset {}: {}", pattern, at,
         reinterpret_cast<const char*>(msg));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

bool Regex::next(std::string_view text, size_t& pos, size_t& begin, size_t& end) const {
  if (pos > text.size()) return false;
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Inputs are validated UTF-8 once, when they enter the tokenizer.
  const int rc =
      impl_->jit
          ? pcre2_jit_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
          : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  REDCO_CHECK(rc >= 0, "tokenizer regex '{}': PCRE2 match error {}", pattern_, rc);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  begin = ov[0];
  end = ov[1];
  pos = end;
  if (begin == end) {  // step over one whole UTF-8 character
    if (pos >= text.size()) {
      pos = text.size() + 1;
    } else {
      ++pos;
      while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return true;
}

}  // namespace redco::data

// Unigram model and the Precompiled normalizer (SentencePiece's charsmap).
#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

std::unique_ptr<Model> make_unigram(const Json&) { unsupported("model", "type \"Unigram\""); }
std::unique_ptr<Normalizer> make_precompiled(const Json&) { unsupported("normalizer", "type \"Precompiled\""); }

}  // namespace redco::data::tok

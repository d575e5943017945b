#pragma once
// Verse-aligned Bibles from SWORD modules (Debian's sword-text-kjv,
// sword-text-web, sword-text-sparv, ...), read through libsword: parallel
// text for translation, and plain text in several languages.
//
//   auto verses = data::read_bible("KJV");   // 31102 {book "Gen", chapter, verse, text}
//   auto pairs = data::aligned_verses({"KJV", "WEB"});  // verses in both, texts[0] KJV, [1] WEB
//   auto [train, valid] = data::split_books(pairs, {"Ruth", "Jonah", "Phlm"});
//
// Modules are named by their SWORD name ("engKJV2006eb") or abbreviation
// ("KJV", "WEB", "RV1909"), case-insensitively. Text is plain: the OSIS
// markup goes (Strong's numbers, morphology), and so does everything that is
// not the verse itself: notes, headings and titles (the Psalms' titles too),
// speaker labels, pre-verse material, the KJV's paragraph signs (¶) and the
// glossary WEB appends to Revelation 22:21. Whitespace runs become one space.
// What the source does not mark up stays: RV1909 prints the Psalms' titles
// as part of their first verse. SWORD's own plain rendering agrees with this
// on every KJV verse up to whitespace and pilcrows; on WEB it glues words
// where a note was removed ("only bornSon"), on RV1909 it leaves Strong's
// numbers of multi-word lemmas ("vida <H2416>").
//
// Alignment is by reference (OSIS book id, chapter, verse) in the first
// module's order: a verse is kept when every module has non-empty text for
// it. Modules do not always number alike: WEB follows NRSVA (Rev 12:18 is
// the KJV's 13:1), and RV1909, though it declares the KJV's versification,
// numbers some chapters as Spanish Bibles do (its Jonah 2:1 is the KJV's
// 1:17). Where a chapter ends at another verse in some module than in the
// first, that chapter and the next are left out, so that no pair is
// neighbours rather than translations (KJV + WEB: Romans 16 only; KJV + WEB
// + RV1909: 24 of the 1189 chapters; 30485 verses stay aligned).
//
// libsword is optional: without it (have_sword() false) the readers throw an
// Error saying how to build with it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "redco/data/text.hpp"

namespace redco::data {

// Whether this build of redco reads SWORD modules.
bool have_sword();

struct BibleModule {
  std::string name;           // "engKJV2006eb"
  std::string abbreviation;   // "KJV"
  std::string language;       // "en"
  std::string versification;  // "KJV", "NRSVA"
  std::string description;
};
// The installed Bible text modules (an empty list without libsword).
std::vector<BibleModule> bible_modules();

// Every verse of a module with text, in canonical order; book is the OSIS id
// ("Gen", "1Sam", "Rev"). Throws redco::Error naming the installed modules
// (and the Debian packages) when there is no such module.
std::vector<Verse> read_bible(std::string_view module);

struct AlignedVerse {
  std::string book;  // OSIS id
  int chapter = 0;
  int verse = 0;
  std::vector<std::string> texts;  // one per module, in the order asked for
};
std::vector<AlignedVerse> aligned_verses(const std::vector<std::string>& modules);

// Verses of the `valid_books` (OSIS ids) in `valid`, the rest in `train`;
// throws naming a book id that occurs in none of the verses.
struct AlignedSplit {
  std::vector<AlignedVerse> train, valid;
};
AlignedSplit split_books(const std::vector<AlignedVerse>& verses,
                         const std::vector<std::string>& valid_books);

// The plain text of one verse's OSIS entry (see above); exposed for tests.
std::string osis_to_text(std::string_view osis);

}  // namespace redco::data

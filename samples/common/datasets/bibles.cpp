// SWORD Bible modules through libsword (when built with it): each verse's
// raw OSIS entry, made plain by osis_to_text. Measured on the KJV (2-core
// VM): read_bible takes 1.1-1.5 s (0.5 s of it reading the raw entries);
// libsword's own plain rendering (stripText) takes 7-9 s and
// `diatheke -b KJV -f plain -k Gen-Rev` 7 s, and both keep speaker labels,
// WEB's glossary, or Strong's numbers, or glue words where a note was.
#include "datasets/bibles.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "redco/core/error.hpp"

#ifdef REDCO_HAVE_SWORD
#include <swmgr.h>
#include <swmodule.h>
#include <versekey.h>
#endif

namespace redco::data {
namespace {

constexpr const char* kPackages =
    "Debian packages sword-text-kjv (KJV), sword-text-web (WEB), sword-text-sparv (RV1909)";

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(uint8_t(x)) == std::tolower(uint8_t(y));
         });
}

std::string installed_list() {
  std::string s;
  for (const BibleModule& m : bible_modules())
    s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", m.name, m.abbreviation);
  return s.empty() ? "none" : s;
}

}  // namespace

#ifdef REDCO_HAVE_SWORD

bool have_sword() { return true; }

namespace {

std::string conf(sword::SWModule* m, const char* key) {
  const char* v = m->getConfigEntry(key);
  return v ? v : "";
}

bool is_bible(sword::SWModule* m) { return std::string_view(m->getType()) == "Biblical Texts"; }

}  // namespace

std::vector<BibleModule> bible_modules() {
  sword::SWMgr mgr;
  std::vector<BibleModule> out;
  for (const auto& [name, m] : mgr.getModules())
    if (is_bible(m))
      out.push_back({m->getName(), conf(m, "Abbreviation"), m->getLanguage(),
                     conf(m, "Versification"), m->getDescription()});
  return out;
}

std::vector<Verse> read_bible(std::string_view module) {
  sword::SWMgr mgr;
  sword::SWModule* mod = nullptr;
  for (const auto& [name, m] : mgr.getModules())
    if (is_bible(m) &&
        (same_name(m->getName(), module) || same_name(conf(m, "Abbreviation"), module)))
      mod = m;
  REDCO_CHECK(mod, "read_bible: no SWORD Bible module named '{}'; installed: {} (from the {})",
              module, installed_list(), kPackages);
  // Iterate over verses only: no book or chapter introductions.
  std::unique_ptr<sword::SWKey> key(mod->createKey());
  auto* vk = dynamic_cast<sword::VerseKey*>(key.get());
  REDCO_CHECK(vk, "read_bible: module '{}' is not keyed by verse", module);
  vk->setIntros(false);
  mod->setKey(*vk);
  std::vector<Verse> out;
  std::string previous;  // raw entry
  for ((*mod) = sword::TOP; !mod->popError(); (*mod)++) {
    const auto* at = dynamic_cast<const sword::VerseKey*>(mod->getKey());
    std::string raw = mod->getRawEntry();
    // A verse linked to the previous one (WEB's Sirach 26:20-27) repeats its
    // entry: the text stays under the first reference only.
    if (raw == previous) continue;
    previous = raw;
    std::string text = osis_to_text(raw);
    if (!at || text.empty()) continue;
    out.push_back({at->getOSISBookName(), at->getChapter(), at->getVerse(), std::move(text)});
  }
  REDCO_CHECK(!out.empty(), "read_bible: module '{}' has no verse text", module);
  return out;
}

#else

bool have_sword() { return false; }
std::vector<BibleModule> bible_modules() { return {}; }
std::vector<Verse> read_bible(std::string_view module) {
  fail(
      "read_bible('{}'): this redco was built without libsword; install libsword-dev (and the "
      "{}) and configure again (meson setup --reconfigure build)",
      module, kPackages);
}

#endif

namespace {

using Chapter = std::pair<std::string, int>;  // (book, chapter)

// The last verse number of each chapter.
std::map<Chapter, int> chapter_ends(const std::vector<Verse>& vs) {
  std::map<Chapter, int> end;
  for (const Verse& v : vs) {
    int& e = end[{v.book, v.chapter}];
    e = std::max(e, v.verse);
  }
  return end;
}

// Chapters that end at another verse in some module than in the first, and
// the chapter after each: there the modules number verses differently (a
// verse moved across the chapter boundary, and its neighbours renumbered).
std::set<Chapter> renumbered(const std::vector<std::vector<Verse>>& modules) {
  const std::map<Chapter, int> first = chapter_ends(modules[0]);
  std::set<Chapter> out;
  for (size_t k = 1; k < modules.size(); ++k)
    for (const auto& [ch, end] : chapter_ends(modules[k])) {
      const auto it = first.find(ch);
      if (it == first.end() || it->second == end) continue;
      out.insert(ch);
      out.insert({ch.first, ch.second + 1});
    }
  return out;
}

}  // namespace

std::vector<AlignedVerse> aligned_verses(const std::vector<std::string>& modules) {
  REDCO_CHECK(!modules.empty(), "aligned_verses: no modules given");
  std::vector<std::vector<Verse>> texts;
  for (const std::string& m : modules) texts.push_back(read_bible(m));
  const std::set<Chapter> skip = renumbered(texts);
  auto ref = [](const Verse& v) { return fmt::format("{}.{}.{}", v.book, v.chapter, v.verse); };
  std::vector<AlignedVerse> out;
  out.reserve(texts[0].size());
  for (const Verse& v : texts[0])
    if (!skip.contains({v.book, v.chapter})) out.push_back({v.book, v.chapter, v.verse, {v.text}});
  for (size_t k = 1; k < modules.size(); ++k) {
    std::unordered_map<std::string, std::string> by_ref;  // "Gen.1.1" -> text
    for (Verse& v : texts[k]) by_ref[ref(v)] = std::move(v.text);
    std::erase_if(out, [&](AlignedVerse& a) {
      const auto it = by_ref.find(fmt::format("{}.{}.{}", a.book, a.chapter, a.verse));
      if (it == by_ref.end()) return true;
      a.texts.push_back(std::move(it->second));
      return false;
    });
  }
  REDCO_CHECK(!out.empty(), "aligned_verses: modules {} share no verse references",
              fmt::join(modules, ", "));
  return out;
}

AlignedSplit split_books(const std::vector<AlignedVerse>& verses,
                         const std::vector<std::string>& valid_books) {
  for (const std::string& b : valid_books)
    REDCO_CHECK(std::any_of(verses.begin(), verses.end(),
                            [&](const AlignedVerse& v) { return v.book == b; }),
                "split_books: no verse of book '{}' (books are OSIS ids: Gen, Ruth, Ps, Matt, "
                "Phlm, ...)",
                b);
  AlignedSplit s;
  for (const AlignedVerse& v : verses)
    (std::find(valid_books.begin(), valid_books.end(), v.book) != valid_books.end() ? s.valid
                                                                                    : s.train)
        .push_back(v);
  return s;
}

}  // namespace redco::data

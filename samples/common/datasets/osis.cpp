// OSIS markup of one SWORD verse entry -> the verse's plain text.
#include <charconv>
#include <string>
#include <string_view>

#include "datasets/bibles.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data {
namespace {

struct Tag {
  std::string_view name;
  std::string_view body;  // everything between the name and '>'
  bool closing = false, empty = false;
  std::string_view attr(std::string_view key) const {
    const std::string k = std::string(key) + "=\"";
    for (size_t at = body.find(k); at != std::string_view::npos; at = body.find(k, at + 1)) {
      if (at > 0 && body[at - 1] != ' ') continue;  // "sID" must not match "xsID"
      const size_t b = at + k.size(), e = body.find('"', b);
      return e == std::string_view::npos ? std::string_view{} : body.substr(b, e - b);
    }
    return {};
  }
};

Tag parse_tag(std::string_view t) {  // t: the text inside < >
  Tag tag;
  if (!t.empty() && t.front() == '/') tag.closing = true, t.remove_prefix(1);
  if (!t.empty() && t.back() == '/') tag.empty = true, t.remove_suffix(1);
  const size_t sp = t.find_first_of(" \t\n");
  tag.name = t.substr(0, sp);
  tag.body = sp == std::string_view::npos ? std::string_view{} : t.substr(sp);
  return tag;
}

// Elements whose content is not verse text.
bool dropped(std::string_view name) {
  return name == "note" || name == "title" || name == "speaker";
}
// Milestone pairs (<div sID=.../> ... <div eID=.../>) around non-verse text.
bool dropped_region(const Tag& t) {
  return t.attr("subType") == "x-preverse" || t.attr("type") == "glossary" ||
         t.attr("type") == "introduction";
}
// Elements that separate words (lines, paragraphs, list items).
bool breaks_words(std::string_view name) {
  return name == "l" || name == "lb" || name == "lg" || name == "div" || name == "p" ||
         name == "item" || name == "list" || name == "chapter" || name == "milestone";
}

// "&amp;" and friends, "&#233;", "&#xE9;": appends the character and returns
// the length consumed, or 0 when `s` does not start with an entity.
size_t entity(std::string_view s, std::string& out) {
  const size_t end = s.find(';');
  if (end == std::string_view::npos || end > 10) return 0;
  const std::string_view e = s.substr(1, end - 1);
  static constexpr std::pair<std::string_view, char> kNamed[] = {
      {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  for (const auto& [n, c] : kNamed)
    if (e == n) return out += c, end + 1;
  if (e.size() < 2 || e[0] != '#') return 0;
  const bool hex = e[1] == 'x' || e[1] == 'X';
  uint32_t cp = 0;
  const std::string_view digits = e.substr(hex ? 2 : 1);
  const auto [p, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
  if (ec != std::errc() || p != digits.data() + digits.size() || cp > 0x10FFFF) return 0;
  append_utf8(out, char32_t(cp));
  return end + 1;
}

}  // namespace

std::string osis_to_text(std::string_view osis) {
  std::string out;
  int drop_depth = 0;          // > 0 inside a dropped element
  std::string_view region;     // the sID of the dropped milestone region we are in
  bool pending_space = false;  // whitespace or a word break since the last character
  bool after_drop = false;     // a dropped element since the last character
  // Text right inside <divineName> is printed in capitals ("Lord" -> "LORD"),
  // as SWORD's renderers do; words in nested elements keep their spelling.
  bool divine = false;
  size_t i = 0;
  while (i < osis.size()) {
    if (osis[i] == '<') {
      const size_t end = osis.find('>', i);
      if (end == std::string_view::npos) break;  // a truncated tag ends the text
      const Tag t = parse_tag(osis.substr(i + 1, end - i - 1));
      i = end + 1;
      if (!region.empty()) {
        if (t.empty && t.attr("eID") == region) region = {}, after_drop = true;
        continue;
      }
      // The end of the book: what follows (WEB's glossary) is not this verse.
      if (t.name == "div" && t.attr("type") == "book" && !t.attr("eID").empty()) break;
      if (drop_depth > 0) {
        if (!t.empty) drop_depth += t.closing ? -1 : 1;
        if (drop_depth == 0) after_drop = true;
        continue;
      }
      if (t.empty && !t.attr("sID").empty() && dropped_region(t)) {
        region = t.attr("sID");
        continue;
      }
      if (!t.empty && !t.closing && dropped(t.name)) {
        drop_depth = 1;
        continue;
      }
      divine = t.name == "divineName" && !t.closing && !t.empty;
      if (breaks_words(t.name)) pending_space = true;
      continue;
    }
    if (drop_depth > 0 || !region.empty()) {
      ++i;
      continue;
    }
    const char c = osis[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      pending_space = true;
      ++i;
      continue;
    }
    // The KJV's pilcrows mark paragraphs, as <div type="x-p"> does elsewhere.
    if (osis.substr(i, 2) == "\xc2\xb6") {
      pending_space = true;
      i += 2;
      continue;
    }
    // A note removed from between two words ("only born<note/>Son" in WEB)
    // stands for the space the source lacks there; not before punctuation.
    const bool closes = std::string_view(",.;:?!)]").find(c) != std::string_view::npos;
    if (!out.empty() && (pending_space || (after_drop && !closes))) out += ' ';
    pending_space = after_drop = false;
    const size_t used = c == '&' ? entity(osis.substr(i), out) : 0;
    if (used == 0) out += divine && c >= 'a' && c <= 'z' ? char(c - 'a' + 'A') : c;
    i += used == 0 ? 1 : used;
  }
  return out;
}

}  // namespace redco::data

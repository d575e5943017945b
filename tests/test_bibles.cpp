// OSIS verse markup to plain text, and (tag [sword]) the KJV, WEB and
// RV1909 SWORD modules of Debian's sword-text-* packages: counts, known
// verses as printed, no markup left, alignment and book splits.
#include <catch2/catch.hpp>
#include <map>

#include "redco/core/error.hpp"
#include "datasets/bibles.hpp"
#include "skip.hpp"

using namespace redco;
using Catch::Matchers::Contains;

TEST_CASE("osis_to_text keeps the verse and drops markup, notes and headings", "[osis]") {
  using data::osis_to_text;
  // Strong's numbers and word-level markup go; the words and spacing stay.
  CHECK(
      osis_to_text(R"(<w lemma="strong:H7225">In the beginning</w> <w lemma="strong:H0430">God</w>)"
                   R"( <transChange type="added">is</transChange> good.)") ==
      "In the beginning God is good.");
  // A note between two words stands for a space, not before punctuation.
  CHECK(osis_to_text(R"(<w>only</w> born</q><note placement="foot"><reference>3:16 </reference>)"
                     R"(The phrase <rdg>x</rdg></note><q who="Jesus"><w>Son</w>, that)") ==
        "only born Son, that");
  CHECK(osis_to_text(R"(contempt.<note placement="foot">Literally, made light</note> Among you)") ==
        "contempt. Among you");
  CHECK(osis_to_text(R"(word<note>n</note>, next)") == "word, next");
  // Titles, speakers and pre-verse regions are not the verse.
  CHECK(osis_to_text(
            R"(<div type="x-milestone" subType="x-preverse" sID="pv1"/>)"
            R"(<title canonical="true" type="psalm">David’s Psalm.</title> <lg sID="g1"/>)"
            R"(<div type="x-milestone" subType="x-preverse" eID="pv1"/>I will extol thee)") ==
        "I will extol thee");
  CHECK(osis_to_text(R"(<div subType="x-preverse" sID="a"/><speaker>Beloved</speaker>)"
                     R"(<div subType="x-preverse" eID="a"/>Let him kiss me)") == "Let him kiss me");
  // Line and paragraph milestones separate words; whitespace runs collapse.
  CHECK(osis_to_text("  the stone<l eID=\"x\"/><l sID=\"y\"/>has become\n\t the  cornerstone. ") ==
        "the stone has become the cornerstone.");
  // Divine names in capitals (their direct text), pilcrows dropped, entities decoded.
  CHECK(osis_to_text("\xc2\xb6 the <divineName>Lord</divineName> and the "
                     "<divineName><w>LORD’s</w></divineName> &amp; &lt;x&gt; &#233;&#x263A;") ==
        "the LORD and the LORD’s & <x> \xc3\xa9\xe2\x98\xba");
  // Nothing after the end of the book (WEB appends its glossary to Rev 22:21).
  CHECK(osis_to_text(R"(Amen. <chapter eID="Rev.22"/> <div eID="b" osisID="Rev" type="book"/>)"
                     R"( <div sID="g" type="glossary"/> Abaddon is Hebrew)") == "Amen.");
  CHECK(osis_to_text("").empty());
  CHECK(osis_to_text("<w>unterminated") == "unterminated");
  CHECK(osis_to_text("a <w lemma=\"x\"") == "a");  // a truncated tag ends the text
}

TEST_CASE("the readers say how to get SWORD modules", "[osis]") {
  if (!data::have_sword()) {
    CHECK_THROWS_WITH(data::read_bible("KJV"), Contains("libsword-dev"));
    return;
  }
  CHECK_THROWS_WITH(data::read_bible("NoSuchBible"),
                    Contains("NoSuchBible") && Contains("sword-text-kjv"));
  CHECK_THROWS_WITH(data::aligned_verses({}), Contains("no modules"));
}

namespace {

bool installed(const std::string& abbreviation) {
  for (const data::BibleModule& m : data::bible_modules())
    if (m.abbreviation == abbreviation) return true;
  return false;
}

std::map<std::string, std::string> by_ref(const std::vector<data::Verse>& vs) {
  std::map<std::string, std::string> m;
  for (const data::Verse& v : vs)
    m[v.book + " " + std::to_string(v.chapter) + ":" + std::to_string(v.verse)] = v.text;
  return m;
}

void check_plain(const std::vector<data::Verse>& vs) {
  for (const data::Verse& v : vs) {
    INFO(v.book << " " << v.chapter << ":" << v.verse << " " << v.text);
    REQUIRE(!v.text.empty());
    REQUIRE(v.text.find_first_of("<>\n\t") == std::string::npos);
    REQUIRE(v.text.find("  ") == std::string::npos);
    REQUIRE(v.text.front() != ' ');
    REQUIRE(v.text.back() != ' ');
    REQUIRE(v.text.find("\xc2\xb6") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("KJV, WEB and RV1909 from SWORD: counts, known verses, alignment", "[sword]") {
  if (!data::have_sword())
    test::skip("redco was built without libsword (apt-get install libsword-dev)");
  for (const char* m : {"KJV", "WEB", "RV1909"})
    if (!installed(m))
      test::skip(std::string("SWORD module ") + m +
                 " is not installed (apt-get install sword-text-kjv sword-text-web "
                 "sword-text-sparv)");
  const auto kjv = data::read_bible("kjv");  // abbreviations are case-insensitive
  const auto web = data::read_bible("engWEB2015eb");
  const auto rv = data::read_bible("RV1909");
  CHECK(kjv.size() == 31102);  // every verse of the 66 books
  CHECK(kjv.front().book == "Gen");
  CHECK(kjv.back().book == "Rev");
  check_plain(kjv), check_plain(web), check_plain(rv);
  const auto k = by_ref(kjv), w = by_ref(web), r = by_ref(rv);
  CHECK(k.at("John 3:16") ==
        "For God so loved the world, that he gave his only begotten Son, that whosoever believeth "
        "in him should not perish, but have everlasting life.");
  CHECK(k.at("Ps 145:1") ==  // without the title "David's Psalm of praise."
        "I will extol thee, my God, O king; and I will bless thy name for ever and ever.");
  CHECK(k.at("Num 23:15") ==
        "And he said unto Balak, Stand here by thy burnt offering, while I meet the LORD yonder.");
  CHECK(w.at("John 3:16") ==
        "For God so loved the world, that he gave his only born Son, that whoever believes in him "
        "should not perish, but have eternal life.");
  CHECK(w.at("Song 1:2") ==  // without the speaker label "Beloved"
        "Let him kiss me with the kisses of his mouth; for your love is better than wine.");
  CHECK(w.at("Rev 22:21") == "The grace of the Lord Jesus Christ be with all the saints. Amen.");
  CHECK(w.count("Tob 1:1") == 1);  // WEB has the deuterocanon
  CHECK(r.at("Gen 1:30").find("en que hay vida, toda hierba verde") != std::string::npos);

  const auto all = data::aligned_verses({"KJV", "WEB", "RV1909"});
  CHECK(all.size() == 30485);
  for (const data::AlignedVerse& a : all) REQUIRE(a.texts.size() == 3);
  CHECK(all.front().book == "Gen");
  CHECK(all.front().texts[0] == "In the beginning God created the heaven and the earth.");
  CHECK(all.front().texts[1] == "In the beginning, God created the heavens and the earth.");
  CHECK(all.front().texts[2] == "EN el principio crió Dios los cielos y la tierra.");
  CHECK(all.back().texts[2] ==
        "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén.");

  // RV1909 numbers Jonah as Spanish Bibles do (its 2:1 is the KJV's 1:17):
  // those chapters are left out of its alignment, not paired off by one.
  auto has = [](const std::vector<data::AlignedVerse>& vs, const char* book, int chapter) {
    return std::any_of(vs.begin(), vs.end(),
                       [&](const auto& v) { return v.book == book && v.chapter == chapter; });
  };
  CHECK_FALSE(has(all, "Jonah", 1));
  CHECK_FALSE(has(all, "Jonah", 2));
  CHECK(has(all, "Jonah", 3));
  const auto pairs = data::aligned_verses({"KJV", "WEB"});
  CHECK(has(pairs, "Jonah", 2));
  CHECK(pairs.size() == 31071);  // all but Romans 16, which ends at 16:24 in WEB

  const auto split = data::split_books(all, {"Ruth", "Phlm"});
  CHECK(split.valid.size() == 85 + 25);  // Ruth 85, Philemon 25 verses
  CHECK(split.train.size() + split.valid.size() == all.size());
  for (const data::AlignedVerse& v : split.train) REQUIRE(v.book != "Ruth");
  CHECK_THROWS_WITH(data::split_books(all, {"Tob"}), Contains("'Tob'") && Contains("OSIS"));
}

// The fortune reader: separators, skipped files, Latin-1 files, the
// stratified split, and (tag [fortunes]) Debian's fortunes and fortunes-de
// against the entry counts of their strfile indexes.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>

#include "redco/core/error.hpp"
#include "datasets/fortunes.hpp"
#include "redco/data/utf8.hpp"
#include "skip.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("redco-test-fortunes-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& file, std::string_view bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
}

std::vector<std::string> texts(const data::Fortunes& f, int32_t category) {
  std::vector<std::string> out;
  for (const data::Fortune& e : f.items)
    if (e.category == category) out.push_back(e.text);
  return out;
}

// strfile's index: a big-endian header of version, number of strings, ...
uint32_t strfile_count(const fs::path& dat) {
  std::ifstream in(dat, std::ios::binary);
  unsigned char h[8] = {};
  in.read(reinterpret_cast<char*>(h), 8);
  REQUIRE(in.gcount() == 8);
  return uint32_t(h[4]) << 24 | uint32_t(h[5]) << 16 | uint32_t(h[6]) << 8 | h[7];
}

}  // namespace

TEST_CASE("UTF-8 validation and Latin-1 conversion", "[fortunes_unit]") {
  CHECK(data::is_valid_utf8(""));
  CHECK(data::is_valid_utf8("plain ascii\n"));
  CHECK(
      data::is_valid_utf8("Gr\xc3\xbc\xc3\x9f"
                          "e \xe2\x82\xac \xf0\x9f\x98\x80"));  // Grüße € 😀
  CHECK_FALSE(
      data::is_valid_utf8("Gr\xfc\xdf"
                          "e"));                         // Latin-1
  CHECK_FALSE(data::is_valid_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(data::is_valid_utf8("\xe0\x80\xaf"));      // overlong, 3 bytes
  CHECK_FALSE(data::is_valid_utf8("\xed\xa0\x80"));      // surrogate U+D800
  CHECK_FALSE(data::is_valid_utf8("\xf4\x90\x80\x80"));  // U+110000
  CHECK_FALSE(data::is_valid_utf8("\xe2\x82"));          // truncated
  CHECK_FALSE(data::is_valid_utf8("\x80"));              // stray continuation
  CHECK_FALSE(data::is_valid_utf8("\xe2\x28\xa1"));      // bad continuation
  CHECK(data::latin1_to_utf8("Gr\xfc\xdf"
                             "e \xa9") ==
        "Gr\xc3\xbc\xc3\x9f"
        "e \xc2\xa9");
  CHECK(data::is_valid_utf8(data::latin1_to_utf8(std::string("\x00\x7f\x80\xff", 4))));
}

TEST_CASE("read_fortunes: entries, categories, skipped files, Latin-1", "[fortunes_unit]") {
  TempDir d;
  write(d.path / "zoo", "first\nof zoo\n%\n%\nsecond\r\n%\r\n  \n%\nthird, no final separator");
  write(d.path / "alpha",
        "Gr\xfc\xdf"
        "e aus K\xf6ln\n%\n");  // Latin-1
  write(d.path / "alpha.dat", std::string("\x00\x00\x00\x02\x00\x00\x00\x01", 8));
  fs::create_symlink("alpha", d.path / "alpha.u8");
  fs::create_symlink("zoo", d.path / "zoo-link");
  write(d.path / ".hidden", "never\n%\n");
  write(d.path / "de" / "witze", "Ein Witz.\n%\nNoch einer.\n%\n");
  write(d.path / "off" / "rude", "offensive\n%\n");
  write(d.path / "de" / "off" / "rude", "offensive\n%\n");

  const data::Fortunes flat = data::read_fortunes(d.path);
  REQUIRE(flat.categories == std::vector<std::string>{"alpha", "zoo"});
  CHECK(texts(flat, 0) == std::vector<std::string>{"Gr\xc3\xbc\xc3\x9f"
                                                   "e aus K\xc3\xb6ln"});
  CHECK(texts(flat, 1) ==
        std::vector<std::string>{"first\nof zoo", "second", "third, no final separator"});
  CHECK(flat.latin1_files == std::vector<std::string>{"alpha"});
  CHECK(flat.counts() == std::vector<int64_t>{1, 3});

  const data::Fortunes all = data::read_fortunes(d.path, {.recursive = true});
  CHECK(all.categories == std::vector<std::string>{"alpha", "de/witze", "zoo"});
  CHECK(texts(all, 1) == std::vector<std::string>{"Ein Witz.", "Noch einer."});
  CHECK(all.items.size() == 6);

  // Categories below the minimum are left out, and the labels stay dense.
  const data::Fortunes big =
      data::read_fortunes(d.path, {.recursive = true, .min_per_category = 2});
  CHECK(big.categories == std::vector<std::string>{"de/witze", "zoo"});
  CHECK(big.items.front().category == 0);
  CHECK(big.items.back().category == 1);

  const data::FortuneSplit s = data::holdout(all, 2);
  // Per category: entries 0, 2, ... held out: alpha 1/0, de/witze 1/1, zoo 2/1.
  CHECK(s.valid.size() == 4);
  CHECK(s.train.size() == 2);
  CHECK(s.valid[0].text == all.items[0].text);
  CHECK_THROWS_WITH(data::holdout(all, 1), Contains("every must be >= 2"));
}

TEST_CASE("read_fortunes: errors name the folder and the packages", "[fortunes_unit]") {
  TempDir d;
  CHECK_THROWS_WITH(data::read_fortunes(d.path / "missing"),
                    Contains("missing") && Contains("apt-get install fortunes fortunes-de"));
  write(d.path / "empty", "\n%\n%\n");
  CHECK_THROWS_WITH(data::read_fortunes(d.path), Contains("no fortune files"));
}

TEST_CASE("Debian's fortunes and fortunes-de match their strfile indexes", "[fortunes]") {
  const fs::path dir = data::kFortunesDir;
  if (!fs::exists(dir / "computers") || !fs::exists(dir / "de" / "witze"))
    test::skip("Debian's fortunes are not installed (sudo apt-get install fortunes fortunes-de)");
  const data::Fortunes f = data::read_fortunes(dir, {.recursive = true});
  const std::vector<int64_t> counts = f.counts();
  int checked = 0;
  for (size_t c = 0; c < f.categories.size(); ++c) {
    const fs::path dat = dir / (f.categories[c] + ".dat");
    if (!fs::exists(dat)) continue;  // fortunes-de indexes only some of its files
    INFO(f.categories[c]);
    CHECK(counts[c] == int64_t(strfile_count(dat)));
    ++checked;
  }
  WARN(f.categories.size() << " categories, " << f.items.size() << " fortunes; " << checked
                           << " checked against strfile");
  CHECK(checked >= 60);
  // Debian 12's files are all UTF-8; a Latin-1 one would be converted.
  CHECK(f.latin1_files.empty());
  for (const data::Fortune& e : f.items) REQUIRE(data::is_valid_utf8(e.text));
  // Deterministic: a second read gives the same examples in the same order.
  const data::Fortunes again = data::read_fortunes(dir, {.recursive = true});
  REQUIRE(again.items.size() == f.items.size());
  CHECK(again.items.back().text == f.items.back().text);
  CHECK(std::find(f.categories.begin(), f.categories.end(), "de/zitate") != f.categories.end());
}

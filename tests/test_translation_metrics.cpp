// BLEU, chrF and the 13a tokenisation against sacrebleu 2.6.0: the committed
// goldens (tests/goldens/translation_metrics.json, written by
// tests/python/make_translation_metrics_goldens.py with seed 0), and [sacrebleu]:
// the same script run live on new random corpora (SKIP without a venv that
// has sacrebleu).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "redco/io/json.hpp"
#include "redco/train/translation_metrics.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;
using namespace redco;
using Catch::Contains;

namespace {

// The repository root: above this file (__FILE__ may be relative to the build
// folder) or above the working directory.
fs::path source_root() {
  std::error_code ec;
  for (fs::path start : {fs::path(__FILE__).parent_path().parent_path(), fs::current_path()})
    for (fs::path p = fs::absolute(start, ec); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/goldens/translation_metrics.json", ec)) return p;
      if (p == p.parent_path()) break;
    }
  FAIL("cannot find tests/goldens/translation_metrics.json above " << fs::current_path());
  return {};
}

io::Json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return io::Json::parse(ss.str(), path.string());
}

std::vector<std::string> strings(const io::Json& a) {
  std::vector<std::string> out;
  for (const io::Json& s : a.as_array()) out.push_back(s.as_string());
  return out;
}

// Every tokenisation and corpus score in `goldens` (sacrebleu's) equals redco's.
void check_against(const io::Json& goldens) {
  int64_t n_tokens = 0;
  for (const io::Json& t : goldens.at("tokens").as_array()) {
    INFO("segment: " << t.at(size_t(0)).as_string());
    CHECK(train::tokenize_13a(t.at(size_t(0)).as_string()) == t.at(size_t(1)).as_string());
    ++n_tokens;
  }
  CHECK(n_tokens > 100);
  for (const io::Json& c : goldens.at("corpora").as_array()) {
    INFO("corpus " << c.at("name").as_string());
    const std::vector<std::string> hyps = strings(c.at("hyps")), refs = strings(c.at("refs"));
    // The same operations in the same order as sacrebleu: equal up to the last bits.
    CHECK(std::abs(train::corpus_bleu(hyps, refs) - c.at("bleu").as_double()) < 1e-9);
    CHECK(std::abs(train::corpus_chrf(hyps, refs) - c.at("chrf").as_double()) < 1e-9);
  }
}

}  // namespace

TEST_CASE("BLEU, chrF and 13a tokens equal sacrebleu's committed goldens", "[translation]") {
  const io::Json g = read_json(source_root() / "tests/goldens/translation_metrics.json");
  CHECK(g.at("sacrebleu").as_string() == "2.6.0");
  check_against(g);
}

TEST_CASE("translation metrics: simple cases and bad input", "[translation]") {
  const std::vector<std::string> ref{"the cat sat on the mat ."};
  const io::Metrics same = train::translation_metrics(ref, ref);
  CHECK(same[0].first == "bleu");
  CHECK(std::abs(same[0].second - 100) < 1e-9);
  CHECK(same[1].first == "chrF");
  CHECK(std::abs(same[1].second - 100) < 1e-9);
  // Copying a different sentence scores less than the reference itself.
  const std::vector<std::string> other{"a dog sat on the mat ."};
  CHECK(train::corpus_bleu(other, ref) < 100);
  CHECK(train::corpus_chrf(other, ref) < 100);
  CHECK(train::tokenize_13a("Hello, world!  ") == "Hello , world !");
  CHECK_THROWS_WITH(train::corpus_bleu(std::vector<std::string>{"a", "b"}, ref),
                    Contains("2 hypotheses but 1 references"));
  CHECK_THROWS_WITH(train::corpus_chrf(std::vector<std::string>{}, std::vector<std::string>{}),
                    Contains("at least one"));
  CHECK_THROWS_WITH(train::corpus_chrf(std::vector<std::string>{"ok \xff"}, ref),
                    Contains("hypothesis of segment 0 is not valid UTF-8"));
}

TEST_CASE("BLEU, chrF and 13a tokens equal a live sacrebleu on new random corpora", "[sacrebleu]") {
  const fs::path root = source_root();
  const std::string python = redco::test::python_or_skip(root, "sacrebleu");
  const fs::path out =
      fs::temp_directory_path() / ("redco_mt_metrics_" + std::to_string(getpid()) + ".json");
  const std::string cmd = "'" + python + "' '" +
                          (root / "tests/python/make_translation_metrics_goldens.py").string() +
                          "' --seed 20261125 --out '" + out.string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const io::Json g = read_json(out);
  fs::remove(out);
  CHECK(g.at("seed").as_int() == 20261125);
  check_against(g);
}

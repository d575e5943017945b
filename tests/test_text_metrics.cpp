// Edit distance and character error rate against hand-counted cases.
#include <catch2/catch.hpp>

#include "redco/train/text_metrics.hpp"

using namespace redco;
using Catch::Matchers::Contains;

TEST_CASE("edit_distance counts insertions, deletions and substitutions", "[text_metrics]") {
  using train::edit_distance;
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);  // k->s, e->i, +g
  CHECK(edit_distance("sitting", "kitten") == 3);
  CHECK(edit_distance("flaw", "lawn") == 2);  // -f, +n
  CHECK(edit_distance("the light", "the night") == 1);
  CHECK(edit_distance("abcdef", "badcfe") == 4);  // 3 swaps: 3 with transpositions, 4 without
}

TEST_CASE("text_metrics: CER over all characters, exact match per line", "[text_metrics]") {
  const std::vector<std::string> refs{"In the", "beginning", "God"};
  const std::vector<std::string> preds{"In the", "begining", "Gad!"};
  const io::Metrics m = train::text_metrics(refs, preds);
  REQUIRE(m.size() == 2);
  CHECK(m[0].first == "cer");
  CHECK(m[0].second == Approx(3.0 / 18.0));  // 0 + 1 + 2 errors over 6 + 9 + 3 characters
  CHECK(m[1].first == "exact_match");
  CHECK(m[1].second == Approx(1.0 / 3.0));
  CHECK_THROWS_WITH(train::text_metrics(refs, std::vector<std::string>{"x"}),
                    Contains("3 references and 1 predictions"));
}

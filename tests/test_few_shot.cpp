// data::FewShot: N-way K-shot episodes. Item c * 1000 + i is the i-th item
// of class c, so every draw can be traced back to its class.
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "redco/data/few_shot.hpp"

using redco::data::Episode;
using redco::data::FewShot;

namespace {

std::vector<std::vector<int64_t>> items_by_class(int64_t classes, int64_t per_class) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(classes));
  for (int64_t c = 0; c < classes; ++c)
    for (int64_t i = 0; i < per_class; ++i) out[size_t(c)].push_back(c * 1000 + i);
  return out;
}

}  // namespace

TEST_CASE("few-shot episodes: layout, one class per label, distinct items", "[few_shot]") {
  const FewShot sampler(items_by_class(10, 30), {1, 3, 5, 7, 9, 8},
                        {.ways = 4, .shots = 2, .queries = 3});
  const std::vector<Episode> eps = sampler.sample(200, 7);
  REQUIRE(eps.size() == 200);
  std::map<int64_t, int64_t> class_count;
  for (const Episode& e : eps) {
    REQUIRE(e.n_support == 8);
    REQUIRE(e.items.size() == 20);
    REQUIRE(e.labels.size() == 20);
    std::map<int64_t, int64_t> class_of_label;
    std::map<int64_t, int64_t> support_per_label, query_per_label;
    for (size_t i = 0; i < e.items.size(); ++i) {
      const int64_t c = e.items[i] / 1000, label = e.labels[i];
      CHECK(std::set<int64_t>{1, 3, 5, 7, 9, 8}.count(c) == 1);
      // Class-major: support item i has label i / shots, query item j label j / queries.
      const auto idx = int64_t(i);
      CHECK(label == (idx < 8 ? idx / 2 : (idx - 8) / 3));
      auto [it, fresh] = class_of_label.emplace(label, c);
      CHECK(it->second == c);  // one class per label
      ++(idx < 8 ? support_per_label : query_per_label)[label];
    }
    CHECK(class_of_label.size() == 4);
    std::set<int64_t> classes;
    for (const auto& [label, c] : class_of_label) classes.insert(c), ++class_count[c];
    CHECK(classes.size() == 4);  // distinct classes
    CHECK(std::set<int64_t>(e.items.begin(), e.items.end()).size() == e.items.size());
    for (int64_t k = 0; k < 4; ++k) CHECK((support_per_label[k] == 2 && query_per_label[k] == 3));
  }
  // Every allowed class is drawn about equally often: 200 * 4 / 6 = 133 each.
  REQUIRE(class_count.size() == 6);
  for (const auto& [c, n] : class_count) {
    INFO("class " << c);
    CHECK(std::abs(double(n) - 800.0 / 6) < 40);
  }
}

TEST_CASE("few-shot episodes: the seed alone decides them, and every item gets drawn",
          "[few_shot]") {
  const FewShot sampler(items_by_class(5, 12), {0, 1, 2, 3, 4},
                        {.ways = 5, .shots = 1, .queries = 2});
  const auto a = sampler.sample(50, 3), b = sampler.sample(50, 3), c = sampler.sample(50, 4);
  bool differ = false;
  std::set<int64_t> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].items == b[i].items);
    CHECK(a[i].labels == b[i].labels);
    differ = differ || a[i].items != c[i].items;
    seen.insert(a[i].items.begin(), a[i].items.end());
  }
  CHECK(differ);
  CHECK(seen.size() == 60);  // 50 episodes x 15 draws reach all 5 x 12 items
}

TEST_CASE("few-shot episodes: an impossible shape is one clear error", "[few_shot]") {
  const auto items = items_by_class(10, 20);
  CHECK_THROWS_WITH(FewShot(items, {5, 6, 7}, {.ways = 5, .shots = 1, .queries = 1}),
                    Catch::Contains("5-way episodes need at least 5 classes, but only 3"));
  CHECK_THROWS_WITH(FewShot(items, {0, 1, 2, 3, 4}, {.ways = 5, .shots = 15, .queries = 10}),
                    Catch::Contains("15 shots + 10 queries need 25 items of every class, but "
                                    "class 0 has 20; use fewer shots or queries"));
  CHECK_THROWS_WITH(FewShot(items, {0, 1, 12}, {.ways = 2, .shots = 1, .queries = 1}),
                    Catch::Contains("class 12 is not one of the 10 classes given"));
  CHECK_THROWS_WITH(FewShot(items, {0, 1}, {.ways = 2, .shots = 0, .queries = 1}),
                    Catch::Contains("ways and shots must be >= 1"));
}

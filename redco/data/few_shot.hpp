#pragma once
// N-way K-shot episodes for few-shot learning (MAML, prototypical networks).
// From items grouped by class (image ids, row numbers), an episode picks
// `ways` of the allowed classes at random, gives them the labels 0..ways-1 in
// that random order, and draws `shots` support and `queries` query items of
// each class, all distinct:
//
//   data::FewShot held_out(by_class, {5, 6, 7, 8, 9}, {.ways = 5, .shots = 1, .queries = 15});
//   std::vector<data::Episode> tasks = held_out.sample(500, seed);
//
// Episodes are a function of the seed alone (a 64-bit Mersenne Twister and
// a Fisher-Yates draw written here, so every standard library gives the same
// ones): every data-parallel rank and every rerun sees the same tasks.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"

namespace redco::data {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct EpisodeShape {
  int64_t ways = 5;      // classes per episode
  int64_t shots = 1;     // support items per class
  int64_t queries = 15;  // query items per class
};

struct Episode {
  // ways * shots support items (class-major: label 0's first), then ways *
  // queries query items, laid out the same way.
  std::vector<int64_t> items;
  std::vector<int64_t> labels;  // the episode's labels 0..ways-1, one per item
  int64_t n_support = 0;        // ways * shots
};

class FewShot {
 public:
  // by_class[c]: the items of class c. `classes`: the classes episodes draw
  // from (a meta-training or a held-out split). An impossible shape (more
  // ways than classes, a class with fewer than shots + queries items) is one
  // redco::Error naming the class and the fix.
  FewShot(std::vector<std::vector<int64_t>> by_class, std::vector<int64_t> classes,
          EpisodeShape shape)
      : by_class_(std::move(by_class)), classes_(std::move(classes)), shape_(shape) {
    REDCO_CHECK(shape_.ways >= 1 && shape_.shots >= 1 && shape_.queries >= 0,
                "FewShot: ways and shots must be >= 1 and queries >= 0, got {}-way {}-shot with "
                "{} queries",
                shape_.ways, shape_.shots, shape_.queries);
    REDCO_CHECK(shape_.ways <= int64_t(classes_.size()),
                "FewShot: {}-way episodes need at least {} classes, but only {} are allowed; use "
                "fewer ways or more classes",
                shape_.ways, shape_.ways, classes_.size());
    const int64_t need = shape_.shots + shape_.queries;
    for (int64_t c : classes_) {
      REDCO_CHECK(c >= 0 && c < int64_t(by_class_.size()),
                  "FewShot: class {} is not one of the {} classes given", c, by_class_.size());
      REDCO_CHECK(int64_t(by_class_[size_t(c)].size()) >= need,
                  "FewShot: {} shots + {} queries need {} items of every class, but class {} has "
                  "{}; use fewer shots or queries",
                  shape_.shots, shape_.queries, need, c, by_class_[size_t(c)].size());
    }
  }

  // `n` episodes drawn from `seed` alone.
  std::vector<Episode> sample(int64_t n, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::vector<Episode> out(static_cast<size_t>(n));
    std::vector<int64_t> classes = classes_, pick;
    const int64_t ways = shape_.ways, shots = shape_.shots, per_class = shots + shape_.queries;
    for (Episode& e : out) {
      draw(classes, ways, rng);  // classes[k] gets label k
      e.n_support = ways * shots;
      e.items.resize(size_t(ways * per_class));
      e.labels.resize(e.items.size());
      for (int64_t k = 0; k < ways; ++k) {
        pick = by_class_[size_t(classes[size_t(k)])];
        draw(pick, per_class, rng);
        for (int64_t i = 0; i < per_class; ++i) {
          const int64_t at =
              i < shots ? k * shots + i : e.n_support + k * shape_.queries + (i - shots);
          e.items[size_t(at)] = pick[size_t(i)];
          e.labels[size_t(at)] = k;
        }
      }
    }
    return out;
  }

  const EpisodeShape& shape() const { return shape_; }

 private:
  // The first k elements of v become a uniform random draw without
  // replacement, in random order (a partial Fisher-Yates shuffle).
  static void draw(std::vector<int64_t>& v, int64_t k, std::mt19937_64& rng) {
    for (int64_t i = 0; i < k; ++i) {
      const auto j = i + int64_t(rng() % uint64_t(int64_t(v.size()) - i));
      std::swap(v[size_t(i)], v[size_t(j)]);
    }
  }

  std::vector<std::vector<int64_t>> by_class_;
  std::vector<int64_t> classes_;
  EpisodeShape shape_;
};

}  // namespace redco::data

#pragma once
// Predictions of arbitrary user types back from every data-parallel replica,
// in input order: each replica serialises its outputs with cereal's binary
// archive, the byte strings are all-gathered (their lengths first, then the
// bytes padded to the longest), and every rank deserialises all of them and
// interleaves them in the order of the batches they came from.
#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "redco/comm/bytes.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/pipeline.hpp"

namespace redco::train::detail {

template <typename T>
inline constexpr bool serializable_v =
    cereal::traits::is_output_serializable<T, cereal::BinaryOutputArchive>::value&&
        cereal::traits::is_input_serializable<T, cereal::BinaryInputArchive>::value;

// All outputs in input order, from this replica's (in the order of its
// slices). Collective over `dp`.
template <typename Value>
std::vector<Value> gather_outputs(std::vector<Value> mine, const Slices& slices, comm::Comm& dp) {
  if constexpr (!serializable_v<Value>) {
    fail(
        "Predictor: to gather predictions from {} data-parallel replicas their type must be "
        "serialisable with cereal; give it a `template <class A> void serialize(A& a)` member "
        "(or run with one replica)",
        dp.size());
  } else {
    std::ostringstream os;
    {
      cereal::BinaryOutputArchive ar(os);
      ar(mine);
    }
    const std::vector<std::string> parts = comm::all_gather_bytes(os.str(), dp);
    std::vector<std::vector<Value>> from(parts.size());
    for (size_t r = 0; r < parts.size(); ++r) {
      if (int(r) == dp.rank()) {
        from[r] = std::move(mine);
        continue;
      }
      std::istringstream is(parts[r]);
      cereal::BinaryInputArchive ar(is);
      ar(from[r]);
    }
    // Batch by batch, replica by replica: the input order.
    std::vector<Value> out;
    std::vector<size_t> next(from.size(), 0);
    for (int64_t b = 0; b < slices.count(0); ++b)
      for (int64_t r = 0; r < slices.replicas(); ++r)
        for (int64_t i = 0; i < slices.size(b, r); ++i)
          out.push_back(std::move(from[size_t(r)][next[size_t(r)]++]));
    return out;
  }
}

}  // namespace redco::train::detail

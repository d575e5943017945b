#pragma once
// Mesh: the world as a dp × mp grid of ranks.
//
// mp (model parallel) is the fast axis: rank = dp_rank * mp_size + mp_rank,
// so a model-parallel group is a run of neighbouring ranks — on a real
// cluster those share a host (NVLink, shared memory) and carry the
// per-layer all-reduces, while the data-parallel groups (stride mp_size)
// carry one gradient all-reduce per step across hosts.
//
//   world 4, n_model_shards 2:  mp groups {0,1} {2,3};  dp groups {0,2} {1,3}
#include <memory>
#include <vector>

#include "redco/comm/comm.hpp"
#include "redco/core/error.hpp"

namespace redco::comm {

// The arithmetic of the grid, without communicators.
struct MeshShape {
  int world_size = 1;
  int mp_size = 1;  // n_model_shards

  MeshShape(int world, int n_model_shards) : world_size(world), mp_size(n_model_shards) {
    REDCO_CHECK(world >= 1, "a mesh needs at least one rank, got world size {}", world);
    REDCO_CHECK(n_model_shards >= 1 && world % n_model_shards == 0,
                "n_model_shards = {} does not divide the world size {}: use a divisor of {} "
                "(each model replica needs exactly n_model_shards ranks)",
                n_model_shards, world, world);
  }
  int dp_size() const { return world_size / mp_size; }
  int dp_rank(int rank) const { return rank / mp_size; }
  int mp_rank(int rank) const { return rank % mp_size; }
  int rank_of(int dp, int mp) const { return dp * mp_size + mp; }
  // World ranks of the model-parallel group holding `rank` (neighbours).
  std::vector<int> mp_group(int rank) const {
    std::vector<int> g;
    for (int m = 0; m < mp_size; ++m) g.push_back(rank_of(dp_rank(rank), m));
    return g;
  }
  // World ranks of the data-parallel group holding `rank` (stride mp_size).
  std::vector<int> dp_group(int rank) const {
    std::vector<int> g;
    for (int d = 0; d < dp_size(); ++d) g.push_back(rank_of(d, mp_rank(rank)));
    return g;
  }
};

// One rank's view of the mesh: the world communicator and its two axes.
// Construction creates the subgroups (every rank of `world` must build its
// Mesh, in the same order relative to other subgroup creations).
class Mesh {
 public:
  Mesh(Comm& world, int n_model_shards)
      : shape_(world.size(), n_model_shards),
        world_(&world),
        mp_(world.subgroup(shape_.mp_group(world.rank()))),
        dp_(world.subgroup(shape_.dp_group(world.rank()))) {}

  const MeshShape& shape() const { return shape_; }
  int rank() const { return world_->rank(); }
  int dp_rank() const { return shape_.dp_rank(rank()); }
  int mp_rank() const { return shape_.mp_rank(rank()); }
  int dp_size() const { return shape_.dp_size(); }
  int mp_size() const { return shape_.mp_size; }
  Comm& world() { return *world_; }
  Comm& dp_comm() { return *dp_; }
  Comm& mp_comm() { return *mp_; }

 private:
  MeshShape shape_;
  Comm* world_;
  std::unique_ptr<Comm> mp_, dp_;
};

}  // namespace redco::comm

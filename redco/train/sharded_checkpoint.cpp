#include "redco/train/sharded_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/nn/parallel_ops.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/parallel.hpp"

namespace redco::train {
namespace fs = std::filesystem;

namespace {

using SplitIndex = std::map<std::string, const shard::ParamSplit*, std::less<>>;

SplitIndex index_plan(const ShardPlan& plan) {
  SplitIndex out;
  for (const shard::ParamSplit& s : plan) out.emplace(s.name, &s);
  return out;
}

// The split of a parameter, or of an optimizer buffer "<kind>.<buffer>.<param>"
// (its parameter's); nullptr for a whole tensor.
const shard::ParamSplit* split_of(const SplitIndex& index, const std::string& name, bool opt) {
  std::string_view key = name;
  if (opt) {
    const size_t first = key.find('.');
    const size_t second = first == key.npos ? key.npos : key.find('.', first + 1);
    if (second == key.npos) return nullptr;
    key.remove_prefix(second + 1);
  }
  const auto it = index.find(key);
  return it == index.end() || it->second->split_dim < 0 ? nullptr : it->second;
}

// Specs with whole shapes for the tensors of `tree` (this rank's shards).
std::vector<io::TensorSpec> whole_specs(const ParamTree& tree, const SplitIndex& index, bool opt) {
  std::vector<io::TensorSpec> out;
  for (const auto& [name, t] : tree) {
    const shard::ParamSplit* s = split_of(index, name, opt);
    out.push_back({name, t.dtype(), s ? s->shape : t.shape()});
  }
  return out;
}

// Rank 0 makes the temporary folder and both files, then tells the others
// the folder's name (a u8 [256] broadcast; empty: rank 0 failed).
std::optional<fs::path> open_folder(comm::Comm& world, const fs::path& dir,
                                    const std::string& state_json,
                                    const std::vector<io::TensorSpec> (&specs)[2],
                                    std::optional<io::SharedSafetensorsFile> (&files)[2]) {
  const char* names[2] = {io::kCheckpointParams, io::kCheckpointOptState};
  Tensor name = Tensor::zeros(Shape{256}, DType::u8);  // [256] the folder's file name, NUL-padded
  std::exception_ptr error;
  fs::path tmp;
  if (world.rank() == 0) {
    try {
      tmp = io::begin_checkpoint(dir, state_json);
      for (int f = 0; f < 2; ++f) files[f].emplace(tmp / names[f], specs[f], true);
      const std::string leaf = tmp.filename().string();
      REDCO_CHECK(leaf.size() < 256, "checkpoint folder name '{}' is too long", leaf);
      std::memcpy(name.raw(), leaf.data(), leaf.size());
    } catch (...) {
      error = std::current_exception();
      if (!tmp.empty()) io::abandon_checkpoint(tmp);
    }
  }
  sched::sync_wait(world.broadcast(name, 0));
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      io::fail_checkpoint_write(dir, e.what());  // with what it means and what to do
    }
  }
  const std::string leaf(static_cast<const char*>(name.raw()));
  REDCO_CHECK(!leaf.empty(), "checkpoint '{}': rank 0 could not create it (see rank 0's error)",
              dir.string());
  if (world.rank() != 0) {
    tmp = (dir.has_filename() ? dir : dir.parent_path()).parent_path() / leaf;
    for (int f = 0; f < 2; ++f) files[f].emplace(tmp / names[f], specs[f], false);
  }
  return tmp;
}

// Tensor i goes to world rank i % world; its model-parallel group gathers it.
// A failed write is remembered, not thrown, so this rank still joins every
// gather its group expects; returns the first error ("" if none).
std::string write_tensors(comm::Mesh& mesh, const ParamTree (&trees)[2], const SplitIndex& index,
                          std::optional<io::SharedSafetensorsFile> (&files)[2]) {
  const int world = mesh.shape().world_size, rank = mesh.rank();
  std::string error;
  int64_t i = 0;
  for (int f = 0; f < 2; ++f) {
    for (const auto& [name, local] : trees[f]) {
      const int owner = int(i++ % world);
      if (mesh.shape().dp_rank(owner) != mesh.dp_rank()) continue;
      const shard::ParamSplit* s = split_of(index, name, f == 1);
      const Tensor whole = s ? gather_whole(local, *s, mesh.mp_comm()) : local;
      if (owner != rank || !error.empty()) continue;
      try {
        files[f]->write(name, whole);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  return error;
}

}  // namespace

void agree(comm::Comm& world, bool ok, const std::string& what) {
  if (world.size() == 1) {
    REDCO_CHECK(ok, "{} failed", what);
    return;
  }
  Tensor failed = Tensor::zeros(Shape{world.size()});  // [world] 1 where a rank failed
  failed.data<float>()[world.rank()] = ok ? 0.f : 1.f;
  sched::sync_wait(world.all_reduce(failed));
  std::string ranks;
  for (int r = 0; r < world.size(); ++r)
    if (failed.data<float>()[r] != 0.f) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
  REDCO_CHECK(ranks.empty(), "{} failed on rank(s) {}; see their errors above", what, ranks);
}

Tensor gather_whole(const Tensor& local, const shard::ParamSplit& split, comm::Comm& mp) {
  if (split.split_dim < 0 || mp.size() == 1) return local;
  NoGradGuard no_grad;
  const int d = split.split_dim;
  // [.., mp * local_len, ..]: rank r's shard at [r * local_len, (r + 1) * local_len).
  return nn::gather_from_parallel(local.detach(), mp, d);
}

void save_sharded_checkpoint(comm::Mesh& mesh, const fs::path& dir, const ParamTree& params,
                             const ParamTree& opt_state, const std::string& state_json,
                             const ShardPlan& plan) {
  comm::Comm& world = mesh.world();
  if (world.size() == 1) return io::save_checkpoint(dir, params, opt_state, state_json);
  const SplitIndex index = index_plan(plan);
  const std::vector<io::TensorSpec> specs[2] = {whole_specs(params, index, false),
                                                whole_specs(opt_state, index, true)};
  std::optional<io::SharedSafetensorsFile> files[2];
  const fs::path tmp = *open_folder(world, dir, state_json, specs, files);
  const std::string what = fmt::format(
      "saving checkpoint '{}' (nothing was replaced: the previous checkpoints still load)",
      dir.string());
  std::string error = write_tensors(mesh, {params, opt_state}, index, files);
  try {
    for (auto& f : files) f->close();
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  if (!error.empty()) fmt::print(stderr, "rank {}: {}: {}\n", world.rank(), what, error);
  bool ok = error.empty();
  try {
    agree(world, ok, what);  // every file is complete before rank 0 publishes
  } catch (...) {
    if (world.rank() == 0) io::abandon_checkpoint(tmp);
    throw;
  }
  ok = true;
  if (world.rank() == 0) {
    try {
      io::finish_checkpoint(tmp, dir, state_json);
    } catch (const std::exception& e) {
      io::abandon_checkpoint(tmp);
      fmt::print(stderr, "rank 0: {}: {}\n", what, e.what());
      ok = false;
    }
  }
  agree(world, ok, what);  // nobody reads or prunes before it is published
}

namespace {

// This rank's slices of every tensor of `file`; with `expect`, the file must
// hold exactly those parameters with their whole shapes.
ParamTree read_slices(const io::SafetensorsReader& file, const SplitIndex& index, bool opt,
                      const ShardPlan* expect, int mp_rank, int mp_size) {
  const std::string where = file.path().string();
  if (expect) {
    for (const shard::ParamSplit& s : *expect)
      REDCO_CHECK(file.contains(s.name),
                  "checkpoint file '{}' has no parameter '{}'; was it written for another model?",
                  where, s.name);
  }
  ParamTree out;
  for (const io::TensorSpec& spec : file.specs()) {
    const auto in_plan = index.find(spec.name);
    REDCO_CHECK(!expect || in_plan != index.end(),
                "checkpoint file '{}' has a tensor '{}' that the model does not", where, spec.name);
    REDCO_CHECK(!expect || spec.shape == in_plan->second->shape,
                "checkpoint file '{}': '{}' is {} but the model's is {}", where, spec.name,
                spec.shape, in_plan->second->shape);
    const shard::ParamSplit* s = split_of(index, spec.name, opt);
    REDCO_CHECK(!s || spec.shape == s->shape,
                "checkpoint file '{}': '{}' is {} but its parameter is {}", where, spec.name,
                spec.shape, s ? s->shape : Shape{});
    Tensor whole = file.read(spec.name);
    out.emplace(spec.name, s ? slice_shard(whole, *s, mp_rank, mp_size) : std::move(whole));
  }
  return out;
}

}  // namespace

io::Checkpoint load_sharded_checkpoint(comm::Mesh& mesh, const fs::path& dir,
                                       const ShardPlan& plan) {
  comm::Comm& world = mesh.world();
  // Rank 0 alone may repair an interrupted publish (io::load_checkpoint does);
  // the others read once it has.
  io::Checkpoint c;
  bool ok = true;
  if (world.rank() == 0) {
    try {
      c.state_json = io::read_checkpoint_state(dir);
    } catch (const std::exception& e) {
      if (world.size() == 1) throw;
      fmt::print(stderr, "rank 0: {}\n", e.what());
      ok = false;
    }
  }
  agree(world, ok, fmt::format("opening checkpoint '{}'", dir.string()));
  if (world.rank() != 0) c.state_json = io::read_checkpoint_state(dir);
  const SplitIndex index = index_plan(plan);
  const int mp_rank = mesh.mp_rank(), mp_size = mesh.mp_size();
  c.params = read_slices(io::SafetensorsReader(dir / io::kCheckpointParams), index, false,
                         plan.empty() ? nullptr : &plan, mp_rank, mp_size);
  c.opt_state = read_slices(io::SafetensorsReader(dir / io::kCheckpointOptState), index, true,
                            nullptr, mp_rank, mp_size);
  c.dir = dir;
  return c;
}

}  // namespace redco::train

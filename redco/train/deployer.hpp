#pragma once
// The Deployer is where a run meets its machine: the seed every random
// stream derives from, the work directory (checkpoints, metrics.jsonl,
// TensorBoard events), the device mesh (data-parallel × model-parallel),
// learning-rate schedules counted in the steps the Trainer will take, and
// checkpoint files. Trainer and Predictor take one; samples never see ranks,
// shards or devices.
//
//   Deployer deployer({.n_model_shards = 1, .seed = 42, .workdir = "workdir"});
//   auto opt = optim::adamw(deployer.linear_schedule({.learning_rate = 1e-3f,
//       .n_examples = train.size(), .global_batch_size = 32, .n_epochs = 2,
//       .warmup_fraction = 0.1}));
//
// The mesh. The ranks of a run come from, in order: DeployerConfig::world (a
// communicator the caller built, e.g. ThreadsWorld::comm(r) to run ranks as
// threads of one process); the launch environment (redco-run, Slurm, Open
// MPI: a TCP rendezvous at rank 0, then UCX between the processes); else this
// process alone. They form a comm::Mesh of dp_size() = ranks / n_model_shards
// data-parallel replicas of n_model_shards model shards each, so the same
// program runs on one device, N threads, N processes or N hosts, changed only
// by flags and environment. Collective methods (marked so below) must be
// called by every rank, in the same order.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/io/checkpoint.hpp"
#include "redco/io/events.hpp"
#include "redco/optim/schedule.hpp"
#include "redco/shard/split.hpp"
#include "redco/train/rng.hpp"

namespace redco::comm {
class Comm;
class Mesh;
class ThreadsWorld;
}  // namespace redco::comm

namespace redco::train {

struct AutoMesh;
struct MeshChoice;

// Which dimension of each parameter is split across the model shards (from
// shard::resolve): how checkpoints gather and slice tensors.
using ShardPlan = std::vector<shard::ParamSplit>;

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct DeployerConfig {
  int n_model_shards = 1;
  uint64_t seed = 0;
  std::filesystem::path workdir = {};  // empty: no checkpoints or metric files
  bool quiet = false;                  // no console output (progress bars, evaluation lines)
  std::ostream* console = nullptr;     // where console output goes; nullptr: std::cout
  // The ranks of this run; nullptr: from the launch environment, else this process alone.
  // Not owned: it must outlive the Deployer.
  comm::Comm* world = nullptr;
  // ZeRO over the data-parallel replicas (train/zero.hpp): 0 off, 1 the
  // optimizer's state partitioned by replica, 2 the gradients as well (each
  // averaged into its owner only), 3 the parameters too (each gathered whole
  // as a forward or backward reads it: train/param_gather.hpp). Combines
  // with n_model_shards.
  int zero_stage = 0;
  // Under ZeRO, whether the next step's forward starts while the owners'
  // updated parameters are still on their way, each read waiting for its own
  // (train/param_share.hpp); false: every step waits for all of them first.
  bool zero_overlap = true;
  // Where the parameters, optimizer state and every step's tensors live:
  // "cpu", "cuda" (this rank's GPU: rank modulo the GPUs present), "cuda:N",
  // "test" (the test device: host memory behind an accelerator's rules, for
  // CI) or "auto" (cuda when a GPU is present, else cpu). Empty: the
  // environment's REDCO_DEVICE (the samples' --device flag sets it), else cpu.
  std::string device = {};
  // The data-parallel gradient buckets: each holds at least this many bytes
  // (f32) and is averaged as soon as backward has finalised it. Smaller
  // buckets start communicating earlier and, under ZeRO-2, hold less of
  // another replica's gradients at once.
  size_t grad_bucket_bytes = size_t(25) << 20;
  // n_model_shards = auto: the planner picks the model shards and the ZeRO
  // stage (replacing the two fields above), and the micro-batch and
  // recomputation that Trainer::fit uses when its FitOptions leave them
  // unset (train/auto_mesh.hpp). Not owned: it must outlive the constructor.
  const AutoMesh* auto_mesh = nullptr;
};

// A learning-rate schedule in the units a user thinks in (examples, epochs);
// the Deployer turns it into optimizer steps with the Trainer's arithmetic.
// Designated initialisers name these fields in the order declared below (C++20 rule).
struct ScheduleSpec {
  float learning_rate = 1e-3f;  // the peak rate
  int64_t n_examples = 0;       // training examples per epoch
  int64_t global_batch_size = 0;
  int64_t n_epochs = 1;
  double warmup_fraction = 0.0;  // of all steps: linear ramp from 0 to the peak
  float end_fraction = 0.f;      // the rate at the last step, as a fraction of the peak
};

// A checkpoint as read back: parameters, optimizer state, state.json's text.
using CheckpointData = io::Checkpoint;

class Deployer {
 public:
  explicit Deployer(DeployerConfig config);
  ~Deployer();
  Deployer(const Deployer&) = delete;
  Deployer& operator=(const Deployer&) = delete;

  // ---- the run -----------------------------------------------------------------------------
  uint64_t seed() const { return config_.seed; }
  const std::filesystem::path& workdir() const { return config_.workdir; }
  bool quiet() const { return config_.quiet; }
  // How many times the launcher has restarted this job (redco-run
  // --max-restarts exports REDCO_RESTART); 0 on the first run and when the
  // caller gave the world. A Trainer resumes from its latest checkpoint when
  // it is > 0.
  int restart_count() const { return restart_; }
  // The console on the main rank; elsewhere a stream that discards, so a
  // program prints its results once whatever the number of ranks.
  std::ostream& console() const;

  // ---- the device -----------------------------------------------------------------------------
  // This rank's device, from DeployerConfig::device. The Trainer and
  // Predictor place parameters on it at init and when a checkpoint loads, and
  // move each batch to it (collate builds CPU tensors); checkpoints are
  // written from host copies.
  Device device() const { return device_; }
  // `tree` with every tensor on device() (the long-lived pool: parameters and
  // optimizer state live as long as the run).
  ParamTree place(ParamTree tree) const;

  // ---- the mesh ------------------------------------------------------------------------------
  int n_devices() const;  // ranks in the run (world size)
  int n_model_shards() const { return config_.n_model_shards; }
  int zero_stage() const { return config_.zero_stage; }
  bool zero_overlap() const { return config_.zero_overlap; }
  // DeployerConfig::auto_mesh's choice (nullptr without one). fit() takes its
  // micro-batch when FitOptions::per_device_batch_size is 0 (auto_micro_batch:
  // 0 without a choice) and turns recomputation on when it says so.
  const MeshChoice* mesh_choice() const { return choice_.get(); }
  int64_t auto_micro_batch() const;
  bool auto_recompute() const;
  size_t grad_bucket_bytes() const { return config_.grad_bucket_bytes; }
  int dp_size() const;  // data-parallel replicas: n_devices() / n_model_shards()
  int dp_rank() const;  // this rank's replica
  int mp_rank() const;  // this rank's model shard
  int rank() const;     // in the world
  bool is_main() const { return rank() == 0; }  // the rank that writes logs and prints
  comm::Mesh& mesh() const { return *mesh_; }
  // Collective: returns once every rank has called it.
  void barrier() const;

  // ---- randomness ----------------------------------------------------------------------------
  // The stream for one step of one purpose: train steps, evaluation and
  // prediction batches and shuffling never share numbers.
  Rng rng(Purpose purpose, uint64_t step) const { return {seed(), step, uint64_t(purpose)}; }
  // The epoch's order of n examples: a Fisher-Yates shuffle driven by
  // rng(Purpose::shuffle, epoch), the identity when !shuffle.
  std::vector<int64_t> epoch_order(int64_t epoch, int64_t n, bool shuffle = true) const;

  // ---- schedules -------------------------------------------------------------------------------
  // Optimizer steps the Trainer takes: floor(n_examples / global_batch_size)
  // per epoch (training drops the last partial batch).
  static int64_t steps_per_epoch(int64_t n_examples, int64_t global_batch_size);
  static int64_t total_steps(const ScheduleSpec& spec);
  // Warmup, then a straight line from the peak to peak * end_fraction at the last step.
  optim::Schedule linear_schedule(const ScheduleSpec& spec) const;
  // Warmup, then half-cosine decay to peak * end_fraction at the last step.
  optim::Schedule cosine_schedule(const ScheduleSpec& spec) const;

  // ---- logging --------------------------------------------------------------------------------
  // Appends to workdir/metrics.jsonl and the TensorBoard events (nothing
  // without a workdir, or off the main process).
  void log(int64_t step, std::string_view split, const io::Metrics& metrics);

  // ---- checkpoints ----------------------------------------------------------------------------
  // Periodic checkpoints are workdir/ckpt/step-NNNNNN, the best by a metric
  // workdir/ckpt/best-<metric>; each holds params.safetensors,
  // opt_state.safetensors and state.json, and is replaced atomically (see
  // io/checkpoint.hpp). Tensors are saved whole under their names whatever
  // the mesh, so a checkpoint loads into any mesh.
  std::filesystem::path step_dir(int64_t step) const;
  std::filesystem::path best_dir(std::string_view metric) const;
  // Collective. `params` and `opt_state` are this rank's shards under `plan`
  // (empty: whole tensors); each tensor is gathered on its own and written
  // by one rank into the shared files (see train/sharded_checkpoint.hpp).
  void save_checkpoint(const std::filesystem::path& dir, const ParamTree& params,
                       const ParamTree& opt_state, const std::string& state_json,
                       const ShardPlan& plan = {}) const;
  // Collective. This rank's shards under `plan` (empty: whole tensors).
  CheckpointData load_checkpoint(const std::filesystem::path& dir,
                                 const ShardPlan& plan = {}) const;
  // The complete step checkpoints, oldest first (none without a workdir).
  std::vector<io::CheckpointEntry> list_checkpoints() const;
  // Collective: the newest, as rank 0 sees it.
  std::optional<io::CheckpointEntry> latest_checkpoint() const;
  // Collective: deletes all but the newest k step checkpoints (k <= 0 keeps all).
  void keep_last(int64_t k) const;

 private:
  void choose_mesh_for(comm::Comm& world);  // DeployerConfig::auto_mesh
  DeployerConfig config_;
  Device device_;
  int restart_ = 0;
  std::unique_ptr<io::MetricsLog> log_;
  std::unique_ptr<comm::ThreadsWorld> alone_;  // the world of a single-process run
  std::unique_ptr<comm::Comm> connected_;      // the world from the launch environment
  std::unique_ptr<comm::Mesh> mesh_;
  std::shared_ptr<const MeshChoice> choice_;
};

}  // namespace redco::train

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
// The mesh is one device today: n_model_shards must be 1 (a larger value
// fails with a message until the distributed runtime lands), and the data-
// parallel size is the device count divided by n_model_shards. Everything
// below is already written in terms of dp_size(), so batches, steps and
// schedules will not change meaning when it grows.
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
#include "redco/train/rng.hpp"

namespace redco::train {

struct DeployerConfig {
  int n_model_shards = 1;
  uint64_t seed = 0;
  std::filesystem::path workdir = {};  // empty: no checkpoints or metric files
  bool quiet = false;                  // no console output (progress bars, evaluation lines)
  std::ostream* console = nullptr;     // where console output goes; nullptr: std::cout
};

// A learning-rate schedule in the units a user thinks in (examples, epochs);
// the Deployer turns it into optimizer steps with the Trainer's arithmetic.
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
  std::ostream& console() const;

  // ---- the mesh ------------------------------------------------------------------------------
  int n_devices() const { return 1; }
  int n_model_shards() const { return config_.n_model_shards; }
  int dp_size() const { return n_devices() / config_.n_model_shards; }  // data-parallel replicas
  int dp_rank() const { return 0; }
  bool is_main() const { return dp_rank() == 0; }  // the process that writes files and logs

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
  // io/checkpoint.hpp). Only the main process writes.
  std::filesystem::path step_dir(int64_t step) const;
  std::filesystem::path best_dir(std::string_view metric) const;
  void save_checkpoint(const std::filesystem::path& dir, const ParamTree& params,
                       const ParamTree& opt_state, const std::string& state_json) const;
  CheckpointData load_checkpoint(const std::filesystem::path& dir) const;
  // The complete step checkpoints, oldest first (none without a workdir).
  std::vector<io::CheckpointEntry> list_checkpoints() const;
  std::optional<io::CheckpointEntry> latest_checkpoint() const;
  // Deletes all but the newest k step checkpoints (k <= 0 keeps all).
  void keep_last(int64_t k) const;

 private:
  DeployerConfig config_;
  std::unique_ptr<io::MetricsLog> log_;
};

}  // namespace redco::train

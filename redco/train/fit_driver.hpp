#pragma once
// The part of Trainer::fit that does not depend on the user's types: batch
// arithmetic, the position in the run, when to log, evaluate and save,
// state.json, best and periodic checkpoints, resuming, the progress bar.
// Compiled once in trainer.cpp instead of in every program's fit().
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redco/optim/optimizer.hpp"
#include "redco/train/concepts.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/memory_account.hpp"
#include "redco/train/param_groups.hpp"

namespace redco::io {
class ProgressBar;
class StepTimer;
}  // namespace redco::io

namespace redco::train {

enum class Mode { min, max };

// What fit() does when a step's loss or a gradient is NaN or infinite.
//   stop       one redco::Error naming the step and the first offending tensor
//              (the loss, or the gradient by name, plus the first non-finite
//              parameter if one is), thrown before the update, so parameters,
//              optimizer state and the last checkpoint are those of the step
//              before;
//   skip_step  the update is skipped (parameters, optimizer state and the
//              schedule stay as they were; the batch is consumed), counted,
//              logged to metrics.jsonl ("skipped_steps") and the console.
// The check is the global gradient norm the optimizer computes anyway, so it
// costs nothing on a finite step.
enum class NonFinite { stop, skip_step };

// Keep the checkpoint with the best value of an evaluation metric so far
// ("loss" is the evaluation loss; others come from the metric function).
// {"accuracy"} (max by default) or {"loss", Mode::min}.
struct BestBy {
  BestBy(std::string metric, Mode mode = Mode::max)  // NOLINT(google-explicit-constructor)
      : metric(std::move(metric)), mode(mode) {}
  BestBy(const char* metric, Mode mode = Mode::max)  // NOLINT(google-explicit-constructor)
      : metric(metric), mode(mode) {}
  std::string metric;
  Mode mode;
};

// How to report speed: items are examples unless items_per_example says
// otherwise (tokens for a language model); MFU needs both FLOP figures.
struct Throughput {
  double items_per_example = 0;  // 0: count examples
  const char* item_name = "examples";
  double flops_per_item = 0;  // model FLOPs per item (~6 x parameters per token for training)
  double peak_flops = 0;      // of the hardware in use; 0: MFU is not reported
};

// Where a run is: optimizer steps done, and the epoch and step within it that
// come next. The end of an epoch is (epoch + 1, 0).
struct Position {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
};

struct FitConfig {
  int64_t per_device_batch_size = 8;
  int64_t global_batch_size = 0;
  int64_t n_epochs = 1;
  bool shuffle = true;
  int64_t n_examples = 0;
  bool evaluates = false;
  int64_t eval_every_steps = 0;
  std::vector<BestBy> save_best_by;
  int64_t save_every_steps = 0;
  int64_t save_every_epochs = 0;
  int64_t keep_last = 0;
  bool save_at_end = true;
  int64_t log_every = 10;
  int64_t max_steps = 0;
  Throughput throughput = {};
  // How the parameters the Trainer passes in are split over the model shards
  // (checkpoints gather and slice by it); nullptr: they are whole.
  const ShardPlan* plan = nullptr;
  // Adds tensors to a checkpoint's optimizer state as it is written (at the
  // position it is written at); the Trainer keeps per-epoch state there.
  std::function<void(const Position&, ParamTree&)> extra_state = {};
  NonFinite on_non_finite = NonFinite::stop;
  // The optimizer state a checkpoint saves (collective, called on every
  // rank); empty: the optimizer's own state() (ZeRO gathers the owners' parts).
  std::function<ParamTree(const ParamGroups&)> opt_state = {};
};

class FitDriver {
 public:
  // Checks the options against the data and the mesh; throws redco::Error
  // naming the option and what would be valid.
  FitDriver(Deployer& deployer, FitConfig config);
  ~FitDriver();
  FitDriver(const FitDriver&) = delete;
  FitDriver& operator=(const FitDriver&) = delete;

  int64_t micro_batch() const { return config_.per_device_batch_size; }
  int64_t global_batch() const { return config_.global_batch_size; }
  int64_t accumulation() const { return accumulation_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return steps_per_epoch_ * config_.n_epochs; }
  const Position& position() const { return pos_; }
  // All epochs done, or max_steps reached.
  bool done() const;
  // The optimizer steps this fit() takes in all (from step 0, max_steps included).
  int64_t last_step() const;

  // The latest complete checkpoint in workdir/ckpt, after checking that its
  // state.json describes the same data and batches (the position and best
  // metrics are taken from it); nullopt when there is none.
  std::optional<CheckpointData> resume();

  // After each optimizer step: advances the position, draws the progress bar
  // and logs every log_every steps (split "train": loss, lr, grad_norm, examples_per_s).
  // A skipped step (NonFinite::skip_step) advances the position but leaves
  // its loss out of the logged mean.
  void step_done(double loss, double lr, double grad_norm, bool skipped = false);
  // The step about to be applied has a non-finite loss (`loss`) or gradient
  // (`bad_grad`, a key of `grads`; null when only another model shard has
  // one). Throws under NonFinite::stop; under skip_step counts and reports
  // the step and returns. `params` are searched for a non-finite value to
  // name as the likely cause.
  void non_finite(double loss, const std::string* bad_grad, const ParamTree& grads,
                  const ParamTree& params);
  int64_t skipped_steps() const { return skipped_; }
  // The first step's memory, one account per world rank: logged to
  // metrics.jsonl (split "memory", at the step being taken) and printed.
  void memory_measured(const std::vector<MemoryAccount>& ranks);
  bool epoch_ended() const { return epoch_ended_; }
  // Evaluation is due at the end of an epoch and every eval_every_steps.
  bool eval_due() const;
  // What a checkpoint holds, asked for only when one is written: under
  // ZeRO-3 it gathers the whole model (collective over the replicas), so
  // every rank asks at the same points (a configuration they share decides).
  using SavedParams = std::function<const ParamTree&()>;
  // Logs and prints the metrics and saves best/<metric> for each improved best-by metric.
  void eval_done(const Metrics& metrics, const SavedParams& params, const ParamGroups& opt);
  bool save_due() const;
  // ckpt/step-NNNNNN, then keeps the newest keep_last.
  void save(const SavedParams& params, const ParamGroups& opt);
  // The end-of-fit checkpoint (save_at_end) and the progress bar's last line.
  void finish(const SavedParams& params, const ParamGroups& opt);

  // state.json for the current position (public for tests and tools).
  std::string state_json(const ParamGroups& opt) const;

 private:
  struct Best {
    double value = 0;
    int64_t step = -1;  // -1: nothing recorded yet
  };
  void validate();
  void restore_state(const std::string& state_json, const std::string& where);
  bool can_save() const;
  const ShardPlan& plan() const;
  void say(const std::string& line);  // above the progress bar, unless quiet

  Deployer& deployer_;
  FitConfig config_;
  int64_t accumulation_ = 1;
  int64_t steps_per_epoch_ = 0;
  Position pos_;
  bool epoch_ended_ = false;
  int64_t last_saved_ = -1;
  int64_t skipped_ = 0;     // steps skipped for a non-finite loss or gradient, over the whole run
  std::vector<Best> best_;  // one per config_.save_best_by
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
  int64_t window_losses_ = 0;  // steps in the window that were not skipped
  std::unique_ptr<io::ProgressBar> bar_;
  std::unique_ptr<io::StepTimer> timer_;
  double window_seconds_ = 0;
};

}  // namespace redco::train

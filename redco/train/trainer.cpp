// The type-independent half of Trainer::fit (FitDriver).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <numeric>

#include "redco/core/error.hpp"
#include "redco/core/heartbeat.hpp"
#include "redco/io/console.hpp"
#include "redco/io/json.hpp"
#include "redco/train/fit_driver.hpp"

namespace redco::train {

// ---- FitDriver ------------------------------------------------------------------------------

FitDriver::FitDriver(Deployer& deployer, FitConfig config)
    : deployer_(deployer), config_(std::move(config)), best_(config_.save_best_by.size()) {
  validate();
  timer_ = std::make_unique<io::StepTimer>();
  if (!deployer_.quiet() && deployer_.is_main()) {
    bar_ = std::make_unique<io::ProgressBar>(last_step(), "train",
                                             io::ProgressOptions{.out = &deployer_.console()});
  }
  // From here to the end of fit(), a rank that stops making progress while
  // not waiting for a peer is hung (see core/heartbeat.hpp).
  heartbeat::set_step(1);
  heartbeat::watch_begin();
}

FitDriver::~FitDriver() { heartbeat::watch_end(); }

void FitDriver::validate() {
  FitConfig& c = config_;
  const int64_t dp = deployer_.dp_size();
  if (c.per_device_batch_size == 0 && c.global_batch_size > 0) {
    REDCO_CHECK(c.global_batch_size % dp == 0,
                "fit: global_batch_size {} does not split across {} data-parallel replicas; use a "
                "multiple of {} or set per_device_batch_size",
                c.global_batch_size, dp, dp);
    c.per_device_batch_size = c.global_batch_size / dp;
  }
  REDCO_CHECK(c.per_device_batch_size > 0,
              "fit: per_device_batch_size must be > 0, got {} (give it, or global_batch_size)",
              c.per_device_batch_size);
  if (c.global_batch_size == 0) c.global_batch_size = c.per_device_batch_size * dp;
  REDCO_CHECK(
      c.global_batch_size > 0 && c.global_batch_size % (c.per_device_batch_size * dp) == 0,
      "fit: global_batch_size ({}) must be a positive multiple of per_device_batch_size ({}) "
      "x data-parallel devices ({})",
      c.global_batch_size, c.per_device_batch_size, dp);
  accumulation_ = c.global_batch_size / (c.per_device_batch_size * dp);
  REDCO_CHECK(c.n_epochs >= 0, "fit: n_epochs must be >= 0, got {}", c.n_epochs);
  steps_per_epoch_ = Deployer::steps_per_epoch(c.n_examples, c.global_batch_size);
  REDCO_CHECK(steps_per_epoch_ > 0 || c.n_epochs == 0,
              "fit: {} training examples make no step of global_batch_size {} (an epoch drops the "
              "last partial batch)",
              c.n_examples, c.global_batch_size);
  REDCO_CHECK(c.log_every > 0, "fit: log_every must be > 0, got {}", c.log_every);
  const bool saves = c.save_every_steps > 0 || c.save_every_epochs > 0 || !c.save_best_by.empty();
  REDCO_CHECK(!saves || can_save(),
              "fit: saving checkpoints (save_every_steps, save_every_epochs, save_best_by) needs "
              "a Deployer with a workdir");
  REDCO_CHECK(c.save_best_by.empty() || c.evaluates,
              "fit: save_best_by needs eval_examples to evaluate on");
}

bool FitDriver::can_save() const { return !deployer_.workdir().empty(); }

const ShardPlan& FitDriver::plan() const {
  static const ShardPlan whole;
  return config_.plan ? *config_.plan : whole;
}

int64_t FitDriver::last_step() const {
  return config_.max_steps > 0 ? std::min(config_.max_steps, total_steps()) : total_steps();
}

bool FitDriver::done() const {
  return pos_.epoch >= config_.n_epochs ||
         (config_.max_steps > 0 && pos_.step >= config_.max_steps);
}

void FitDriver::say(const std::string& line) {
  if (deployer_.quiet() || !deployer_.is_main()) return;
  if (bar_) {
    bar_->print_line(line);
  } else {
    deployer_.console() << line << '\n';
  }
}

void FitDriver::step_done(double loss, double lr, double grad_norm, bool skipped) {
  ++pos_.step;
  heartbeat::set_step(pos_.step + 1);
  epoch_ended_ = ++pos_.step_in_epoch == steps_per_epoch_;
  if (epoch_ended_) pos_ = {pos_.step, pos_.epoch + 1, 0};
  ++window_steps_;
  if (!skipped) window_loss_ += loss, ++window_losses_;
  window_seconds_ += timer_->lap();
  if (bar_) bar_->update(pos_.step, {{"loss", loss}, {"lr", lr}}, double(global_batch()), "ex");
  if (pos_.step % config_.log_every != 0 && !epoch_ended_ && !done()) return;
  io::Metrics m{
      {"loss", window_losses_ > 0 ? window_loss_ / double(window_losses_) : std::nan("")},
      {"lr", lr},
      {"grad_norm", grad_norm},
      {"epoch", double(pos_.epoch) + double(pos_.step_in_epoch) / double(steps_per_epoch_)}};
  if (skipped_ > 0) m.emplace_back("skipped_steps", double(skipped_));
  if (window_seconds_ > 0) {
    const Throughput& t = config_.throughput;
    const double examples = double(window_steps_ * global_batch());
    io::StepStats{.seconds = window_seconds_,
                  .items = examples * (t.items_per_example > 0 ? t.items_per_example : 1.0),
                  .flops_per_item = t.flops_per_item,
                  .peak_flops = t.peak_flops}
        .append_to(m, t.item_name);
  }
  deployer_.log(pos_.step, "train", m);
  window_loss_ = 0, window_steps_ = 0, window_losses_ = 0, window_seconds_ = 0;
}

namespace {

// NaN without the sign bit's "-nan" (its sign means nothing), infinities signed.
std::string show(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

// "the parameter 'h.0.w' (shape [4, 8]) holds nan at element 3" for the first
// tensor of `tree` with a NaN or infinity; empty when all are finite.
std::string first_non_finite_in(const ParamTree& tree, const char* what) {
  for (const auto& [name, t] : tree) {
    const int64_t i = optim::first_non_finite(t);
    if (i < 0) continue;
    const float v = t.to(Device::cpu()).to(DType::f32).data<float>()[i];
    return fmt::format("the {} '{}' (shape {}) holds {} at element {}", what, name, t.shape(),
                       show(v), i);
  }
  return {};
}

}  // namespace

void FitDriver::non_finite(double loss, const std::string* bad_grad, const ParamTree& grads,
                           const ParamTree& params) {
  const int64_t step = pos_.step + 1;  // the step being taken, as logged
  std::string what;
  if (!std::isfinite(loss)) {
    what = "the loss is " + show(loss);
  } else if (bad_grad) {
    ParamTree one;
    one.emplace(*bad_grad, grads.at(*bad_grad));
    what = first_non_finite_in(one, "gradient of");
  } else {
    what = "the loss or a gradient on another model shard is not finite (that rank names it)";
  }
  // The usual root cause of a NaN loss: a parameter that already went bad.
  // Searched only here, off the hot path.
  if (const std::string p = first_non_finite_in(params, "parameter"); !p.empty()) what += "; " + p;
  REDCO_CHECK(config_.on_non_finite == NonFinite::skip_step,
              "fit: step {}: {}. Training stopped before this step's update, so the parameters, "
              "optimizer state and checkpoints are those after step {}. Lower the learning rate, "
              "clip gradients (max_grad_norm), look for an overflow in the loss, or pass "
              ".on_non_finite = NonFinite::skip_step to skip such steps",
              step, what, step - 1);
  ++skipped_;
  deployer_.log(step, "train", {{"skipped_steps", double(skipped_)}});
  say(fmt::format("step {}: {}: update skipped ({} step{} skipped so far)", step, what, skipped_,
                  skipped_ == 1 ? "" : "s"));
}

void FitDriver::memory_measured(const std::vector<MemoryAccount>& ranks) {
  deployer_.log(pos_.step + 1, "memory", memory_metrics(ranks));
  for (size_t r = 0; r < ranks.size(); ++r) say(describe(ranks[r], int(r)));
}

bool FitDriver::eval_due() const {
  if (!config_.evaluates) return false;
  return epoch_ended_ ||
         (config_.eval_every_steps > 0 && pos_.step % config_.eval_every_steps == 0);
}

void FitDriver::eval_done(const Metrics& metrics, const SavedParams& params,
                          const ParamGroups& opt) {
  deployer_.log(pos_.step, "eval", metrics);
  std::string line = fmt::format("eval  step {}", pos_.step);
  for (const auto& [name, value] : metrics)
    line += fmt::format("  {} {}", name, io::format_value(value));
  say(line);
  std::vector<std::string> improved;
  for (size_t i = 0; i < best_.size(); ++i) {
    const BestBy& by = config_.save_best_by[i];
    const auto it = std::find_if(metrics.begin(), metrics.end(),
                                 [&](const auto& kv) { return kv.first == by.metric; });
    REDCO_CHECK(it != metrics.end(),
                "fit: save_best_by names \"{}\", which evaluation does not report", by.metric);
    const double v = it->second;
    const bool better = by.mode == Mode::max ? v > best_[i].value : v < best_[i].value;
    if (std::isnan(v) || (best_[i].step >= 0 && !better)) continue;
    best_[i] = {v, pos_.step};
    improved.push_back(by.metric);
  }
  // The state is written after every improvement is recorded, so each best
  // checkpoint's state.json lists the bests as of its own step.
  const ParamTree* saved = improved.empty() ? nullptr : &params();
  for (const std::string& name : improved) {
    deployer_.save_checkpoint(deployer_.best_dir(name), *saved, {}, state_json(opt), plan());
    say(fmt::format("best {} so far: saved {}", name, deployer_.best_dir(name).string()));
  }
}

bool FitDriver::save_due() const {
  if (!can_save()) return false;
  const bool by_steps = config_.save_every_steps > 0 && pos_.step % config_.save_every_steps == 0;
  const bool by_epochs =
      epoch_ended_ && config_.save_every_epochs > 0 && pos_.epoch % config_.save_every_epochs == 0;
  return by_steps || by_epochs;
}

void FitDriver::save(const SavedParams& params, const ParamGroups& opt) {
  if (!can_save() || last_saved_ == pos_.step) return;
  ParamTree state = config_.opt_state ? config_.opt_state(opt) : opt.state();
  if (config_.extra_state) config_.extra_state(pos_, state);
  deployer_.save_checkpoint(deployer_.step_dir(pos_.step), params(), state, state_json(opt),
                            plan());
  last_saved_ = pos_.step;
  deployer_.keep_last(config_.keep_last);
}

void FitDriver::finish(const SavedParams& params, const ParamGroups& opt) {
  if (config_.save_at_end && pos_.step > 0) save(params, opt);
  if (bar_) bar_->finish();
}

std::string FitDriver::state_json(const ParamGroups& opt) const {
  io::Json s = io::Json::object();
  s["version"] = 1;
  s["step"] = pos_.step;
  s["epoch"] = pos_.epoch;
  s["step_in_epoch"] = pos_.step_in_epoch;
  s["optimizer_step"] = opt.steps();
  s["next_lr"] = opt.lr();
  s["skipped_steps"] = skipped_;
  s["seed"] = deployer_.seed();
  io::Json& best = s["best"] = io::Json::object();
  for (size_t i = 0; i < best_.size(); ++i) {
    if (best_[i].step < 0) continue;
    const BestBy& by = config_.save_best_by[i];
    best[by.metric] = io::Json::Object{{"value", best_[i].value},
                                       {"step", best_[i].step},
                                       {"mode", by.mode == Mode::max ? "max" : "min"}};
  }
  io::Json& c = s["config"] = io::Json::object();
  c["n_examples"] = config_.n_examples;
  c["per_device_batch_size"] = config_.per_device_batch_size;
  c["global_batch_size"] = config_.global_batch_size;
  c["accumulation_steps"] = accumulation_;
  c["steps_per_epoch"] = steps_per_epoch_;
  c["n_epochs"] = config_.n_epochs;
  c["shuffle"] = config_.shuffle;
  c["dp_size"] = deployer_.dp_size();  // the mesh it was written with; any mesh can load it
  c["n_model_shards"] = deployer_.n_model_shards();
  c["data_order"] = "philox fisher-yates of (seed, epoch)";
  return s.dump(true);
}

std::optional<CheckpointData> FitDriver::resume() {
  const std::optional<io::CheckpointEntry> latest = deployer_.latest_checkpoint();
  if (!latest) {
    say(fmt::format("resume: no checkpoint in {}, starting at step 0",
                    (deployer_.workdir() / "ckpt").string()));
    return std::nullopt;
  }
  CheckpointData ck = deployer_.load_checkpoint(latest->dir, plan());
  restore_state(ck.state_json, latest->dir.string());
  last_saved_ = pos_.step;
  heartbeat::set_step(pos_.step + 1);
  say(fmt::format("resume: {} at step {} (epoch {}, step {} of {})", latest->dir.string(),
                  pos_.step, pos_.epoch, pos_.step_in_epoch, steps_per_epoch_));
  return ck;
}

void FitDriver::restore_state(const std::string& text, const std::string& where) {
  const io::Json s = io::Json::parse(text, where + "/state.json");
  const io::Json& c = s.at("config");
  // What decides which examples each step sees must match, or the resumed
  // run would silently train on a different sequence of batches.
  auto same = [&](const char* what, int64_t saved, int64_t now) {
    REDCO_CHECK(saved == now, "resume: {} was written with {} = {}, this run has {}", where, what,
                saved, now);
  };
  REDCO_CHECK(s.at("seed").as_uint() == deployer_.seed(),
              "resume: {} was written with seed {}, this run has seed {}", where,
              s.at("seed").as_uint(), deployer_.seed());
  same("n_examples", c.at("n_examples").as_int(), config_.n_examples);
  same("global_batch_size", c.at("global_batch_size").as_int(), config_.global_batch_size);
  same("shuffle", c.at("shuffle").as_bool(), config_.shuffle);
  pos_ = {s.at("step").as_int(), s.at("epoch").as_int(), s.at("step_in_epoch").as_int()};
  if (s.contains("skipped_steps")) skipped_ = s.at("skipped_steps").as_int();
  REDCO_CHECK(pos_.step_in_epoch >= 0 && pos_.step_in_epoch < steps_per_epoch_,
              "resume: {}: step_in_epoch {} is outside an epoch of {} steps", where,
              pos_.step_in_epoch, steps_per_epoch_);
  const io::Json& best = s.at("best");
  for (size_t i = 0; i < best_.size(); ++i) {
    const BestBy& by = config_.save_best_by[i];
    if (!best.contains(by.metric)) continue;
    const io::Json& b = best.at(by.metric);
    if (b.at("mode").as_string() != (by.mode == Mode::max ? "max" : "min")) continue;
    best_[i] = {b.at("value").as_double(), b.at("step").as_int()};
  }
}

}  // namespace redco::train

#pragma once
// The examples each epoch of Trainer::fit visits, and in which order: a fixed
// range, or per_epoch(n, fn) made afresh at the start of every epoch (see
// per_epoch.hpp). A function that reads the model sees the parameters the
// epoch started with; they are kept (and written into checkpoints inside the
// epoch) so that a run resumed in the middle of an epoch makes the same
// examples as the uninterrupted one.
#include <cstdint>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redco/train/bound_model.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/param_groups.hpp"
#include "redco/train/per_epoch.hpp"

namespace redco::train {

template <nn::Layer L>
class EpochExamples {
 public:
  EpochExamples(Deployer& deployer, const L& model) : deployer_(&deployer), model_(&model) {}

  // Examples an epoch visits: with per_epoch, n per pass.
  template <typename Source>
  static int64_t size(const Source& s) {
    if constexpr (is_per_epoch<Source>::value) {
      REDCO_CHECK(s.n > 0, "fit: per_epoch(n, ...) needs n > 0 examples per epoch, got {}", s.n);
      REDCO_CHECK(s.passes >= 1, "fit: per_epoch(n, fn, {{.passes = {}}}) needs passes >= 1",
                  s.passes);
      return s.n * s.passes;
    } else {
      return int64_t(std::ranges::size(s));
    }
  }

  // Each data-parallel replica makes its own share of the epoch's examples.
  template <typename Source>
  static bool per_replica(const Source& s) {
    if constexpr (is_per_epoch<Source>::value) {
      return s.per_replica;
    } else {
      return false;
    }
  }

  // The epoch's order: the passes' orders one after the other (indices into
  // the epoch's examples).
  template <typename Source>
  std::vector<int64_t> order(const Source& s, int64_t epoch, bool shuffle) const {
    if constexpr (is_per_epoch<Source>::value) {
      if (s.passes > 1 || s.per_replica) {
        const int64_t n = local_size(s);
        std::vector<int64_t> out;
        out.reserve(size_t(n * s.passes));
        for (int64_t p = 0; p < s.passes; ++p) {
          const std::vector<int64_t> pass =
              deployer_->epoch_order(epoch * s.passes + p, n, shuffle);
          out.insert(out.end(), pass.begin(), pass.end());
        }
        return out;
      }
    }
    return deployer_->epoch_order(epoch, size(s), shuffle);
  }

  // The examples of the epoch at `at`: the range itself, or the per-epoch
  // function's result, made at the start of the epoch (and again after a
  // resume inside it, from the parameters the epoch started with). `params`:
  // the current parameters, which an epoch's start keeps.
  template <typename Source, typename Store>
  const auto& at(const Source& source, const Position& at, std::optional<Store>& fresh,
                 const ParamTree& params) {
    if constexpr (!is_per_epoch<Source>::value) {
      return source;
    } else {
      if (at.step_in_epoch != 0 && fresh) return *fresh;
      auto& fn = const_cast<Source&>(source).fn;  // stateful functions are the user's business
      using Fn = decltype(source.fn);
      REDCO_CHECK(!source.per_replica || (EpochCountFn<Fn, L>),
                  "fit: per_epoch(n, fn, {{.per_replica = true}}) needs fn(int64_t epoch, model&, "
                  "Rng, int64_t count) returning this replica's count examples");
      if constexpr (EpochOnlyFn<Fn>) {
        fresh.emplace(fn(at.epoch));
      } else {
        make_with_model(source, fn, at, fresh, params);
      }
      check_count(source, at, std::ranges::size(*fresh));
      return *fresh;
    }
  }

  // Into a checkpoint's optimizer state: the parameters the epoch started
  // with, while inside an epoch of examples made from the model.
  void save_into(const Position& at, const ParamGroups& groups, ParamTree& state) const {
    if (!keep_start_ || at.step_in_epoch == 0) return;
    for (const auto& [name, t] : groups.saved_of(start_))
      state.emplace(std::string(kStart) + name, t);
  }

  // Out of a loaded checkpoint's optimizer state (removed from it): the
  // parameters its epoch started with; `params` (already restored) fill in
  // those the checkpoint leaves out.
  void restore_from(ParamTree& opt_state, const ParamTree& params) {
    start_.clear();
    for (auto it = opt_state.begin(); it != opt_state.end();) {
      if (!it->first.starts_with(kStart)) {
        ++it;
        continue;
      }
      start_.emplace(it->first.substr(kStart.size()), it->second);
      it = opt_state.erase(it);
    }
    if (!start_.empty()) {
      for (const auto& [name, t] : params) start_.emplace(name, t);  // kept as given
    }
  }

 private:
  static constexpr std::string_view kStart = "epoch_start.params.";

  // The examples this replica holds in an epoch (per pass).
  template <typename Source>
  int64_t local_size(const Source& s) const {
    if constexpr (is_per_epoch<Source>::value) {
      if (s.per_replica) {
        REDCO_CHECK(s.n % deployer_->dp_size() == 0,
                    "fit: per_epoch(n = {}, fn, {{.per_replica = true}}) on {} data-parallel "
                    "replicas: n must be a multiple of the replicas",
                    s.n, deployer_->dp_size());
        return s.n / deployer_->dp_size();
      }
      return s.n;
    } else {
      return int64_t(std::ranges::size(s));
    }
  }

  // fn(epoch, model, rng[, count]) on the model bound to the epoch's starting parameters.
  template <typename Source, typename Fn, typename Store>
  void make_with_model(const Source& source, Fn& fn, const Position& at,
                       std::optional<Store>& fresh, const ParamTree& params) {
    keep_start_ = true;
    if (at.step_in_epoch == 0) {
      start_.clear();
      for (const auto& [name, t] : params) start_.emplace(name, t.clone());
    }
    REDCO_CHECK(!start_.empty(),
                "fit: resuming inside epoch {} of per-epoch examples needs the parameters "
                "the epoch started with, which the checkpoint does not hold; resume from a "
                "checkpoint written by a per_epoch fit",
                at.epoch);
    NoGradGuard no_grad;
    comm::Comm* mp = deployer_->n_model_shards() > 1 ? &deployer_->mesh().mp_comm() : nullptr;
    const nn::Ctx ctx{
        .train = false, .seed = deployer_->seed(), .step = uint64_t(at.epoch), .mp = mp};
    BoundModel<L> bound(*model_, start_, ctx);
    const Rng rng = deployer_->rng(Purpose::examples, uint64_t(at.epoch));
    if constexpr (EpochCountFn<Fn, L>) {
      fresh.emplace(fn(at.epoch, bound,
                       source.per_replica ? rng.split(uint64_t(deployer_->dp_rank())) : rng,
                       local_size(source)));
    } else {
      fresh.emplace(fn(at.epoch, bound, rng));
    }
  }

  template <typename Source>
  void check_count(const Source& source, const Position& at, size_t got) const {
    REDCO_CHECK(int64_t(got) == local_size(source),
                "fit: the per-epoch examples of epoch {} are {}, but per_epoch(n, ...) said n = "
                "{}{}; return the same number every epoch",
                at.epoch, got, source.n,
                source.per_replica ? fmt::format(" (each of {} replicas: {})", deployer_->dp_size(),
                                                 local_size(source))
                                   : "");
  }

  Deployer* deployer_;
  const L* model_;
  // The parameters at the start of the current epoch, when its examples are
  // made from the model (checkpoints inside the epoch keep them).
  bool keep_start_ = false;
  ParamTree start_;
};

}  // namespace redco::train

#pragma once
// ParamShare: ZeRO's updated parameters on their way from their owners to
// every replica, overlapped with the next forward.
//
// After the optimizer step each replica holds fresh values only for the
// parameters it owns (zero.hpp). Waiting for every broadcast before the next
// step would leave the compute idle for the whole exchange; instead all
// buckets (ZeroPartition::share_buckets) are started at once and the object
// installs itself as this thread's nn::ParamReadHook: when the next forward
// first looks up a parameter, the read waits for the buckets that carry it
// (and only those), so the first layers compute while the later ones'
// parameters are still arriving. settle() waits for the rest; the Trainer
// calls it before the next optimizer step and before anything but a
// training forward reads the parameters (evaluation, checkpoints, a user's
// callback, the end of fit).
//
// Every replica starts the same buckets in the same order, so the k-th
// broadcast pairs with the k-th everywhere whatever order they complete in.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redco/nn/param_read_hook.hpp"
#include "redco/train/zero.hpp"

namespace redco::sched {
class Background;
}

namespace redco::train {

class ParamShare final : public nn::ParamReadHook {
 public:
  // Starts every bucket's broadcast over `dp` and installs the hook on the
  // calling thread.
  ParamShare(std::vector<ZeroPartition::ShareBucket> buckets, comm::Comm& dp);
  ~ParamShare();
  ParamShare(const ParamShare&) = delete;
  ParamShare& operator=(const ParamShare&) = delete;

  // Waits for the buckets that carry `name` (a read of the parameter).
  void before_read(std::string_view name) override;
  // Waits for every bucket and takes the hook away. Rethrows the first
  // failure (a dead peer) once.
  void settle();

 private:
  struct InFlight;
  void wait(InFlight& b);

  std::unique_ptr<sched::Background> background_;  // the broadcasts
  std::vector<std::unique_ptr<InFlight>> buckets_;
  // Parameters not read yet -> the buckets that carry them.
  std::map<std::string, std::vector<InFlight*>, std::less<>> carriers_;
  nn::ParamReadHook* outer_ = nullptr;  // the hook this one replaced
  bool installed_ = false;
};

}  // namespace redco::train

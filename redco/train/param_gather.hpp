#pragma once
// ParamGather: ZeRO-3's parameters, gathered whole as a forward pass reads
// them and let go after.
//
// Under ZeRO-3 (Deployer zero_stage 3) a replica keeps only its part of each
// trained parameter (zero.hpp: a row range of a large one, a small one whole
// at its owner and as an empty [0, ...] tensor elsewhere). While a step
// runs, this object is the thread's nn::ParamReadHook: the trained
// parameters are missing from the tree the model reads, so each read asks
// provide(name), which broadcasts the parts from their owners into one whole
// tensor of the rank's shape. The next parameter read is gathered meanwhile
// (prefetch: in `order` on the first step, then as that step's reads went),
// so the wire works while the layer computes. A layer asking only a
// parameter's shape (nn::Params::shape) gathers nothing.
//
// Where the whole tensor lives: the layer holds it while it computes; an
// op that needs it in backward (a linear's dx) saves a recipe instead of
// its values (autodiff SavedInput: the tensor carries AutogradMeta::recompute),
// so backward gathers it again when it gets there. A replica therefore holds
// its parts plus the parameters of the layer running, not the model. The
// order of backward's gathers is recorded on the first step (GatherTrace)
// and the next steps gather each one's successor meanwhile.
//
// Gradients: the whole tensor is the output of a recorded "zero3_gather" op
// on this replica's part (a leaf). Its backward hands the gradient to
// `sink` (DataParallel's ZeRO-2 buckets, which average each gradient into
// its owner) and returns none to the part. A parameter read again in the
// same forward (a tied embedding, at the bottom and at the head) is
// gathered again and joined to the same node (autodiff rejoin), so the
// engine sums its gradients exactly as it sums those of the unpartitioned
// run's one tensor: training equals ZeRO-2's, and the plain run's where
// ZeRO-2 does, bit for bit. Replays of checkpointed blocks make nodes of
// their own; their gradients are summed here and handed over when the last
// has arrived.
//
// Recomputation (nn::checkpoint, FitOptions::recompute): a checkpointed
// block's first run records nothing; the part leaves it reads are noted as
// the block's inputs (autodiff's CaptureScope), and its replay in backward
// reads the parameters again, making the nodes there (with a stand-in for
// the part); a replay's whole tensors are held for the block's backward
// rather than gathered a third time.
//
// Every replica runs the same forward and backward, so each issues the same
// broadcasts in the same order and the k-th pairs with the k-th everywhere.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/nn/param_read_hook.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/zero.hpp"

namespace redco::comm {
class Comm;
}

namespace redco::train {

// The order in which a training step's forward read the parameters (a tied
// one twice; the q/k/v projections' weights before their biases) and
// backward gathered them again (for linear layers' dX), recorded on one step
// and followed by the next ones: each gather starts the next one's. Every
// replica records the same order. The Trainer keeps one across steps.
struct GatherTrace {
  std::vector<std::string> forward, backward;
  bool recorded = false;
};

class ParamGather final : public nn::ParamReadHook {
 public:
  // Where a parameter's complete gradient goes (whole, of the rank's shape).
  using Sink = std::function<void(const std::string& name, const Tensor& grad)>;

  // `parts`: this replica's part of every partitioned parameter (leaves that
  // require a gradient while training, plain tensors for evaluation);
  // `order`: the partitioned parameters in forward order (prefetch);
  // `sink`: null when no gradient is taken; `trace`: backward's order of
  // gathers, recorded by this step or followed (null: none). Installs the
  // hook on this thread.
  ParamGather(const ZeroPartition& zero, ParamTree parts, std::vector<std::string> order,
              comm::Comm& dp, Sink sink = {}, GatherTrace* trace = nullptr);
  ~ParamGather();
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  void before_read(std::string_view) override {}
  // The whole parameter (recorded as computed from this replica's part);
  // undefined for a name that is not partitioned. Collective over dp.
  Tensor provide(std::string_view name) override;
  std::optional<Shape> shape_of(std::string_view name) override;

  // The forward pass has returned: reads from now on are recomputations in
  // backward (not counted as uses, no prefetch). Waits for a prefetch the
  // forward did not take.
  void end_forward();
  // After backward: hands over the gradients of parameters that backward
  // reached by fewer than all their reads (the sum of those it reached);
  // the trace is recorded from now on.
  void flush();

  // A parameter whole, now: its parts broadcast from their owners into one
  // tensor (an owner of a whole parameter uses its own). Collective over dp.
  static Tensor gather(const ZeroPartition& zero, const std::string& name, const Tensor& part,
                       comm::Comm& dp);

  struct State;  // shared with the recorded nodes' rules, which may outlive a step's scope

 private:
  std::shared_ptr<State> state_;
  nn::ParamReadHook* outer_ = nullptr;
};

// `kept` (a rank's tree under ZeRO-3) cut into the parameters outside the
// partition (frozen ones, whole) and this replica's parts of the others.
std::pair<ParamTree, ParamTree> split_partitioned(const ZeroPartition& zero, const ParamTree& kept);

// ZeRO-3's DataParallel::value_and_grad: the loss f(frozen) of a model that
// reads the frozen parameters from `frozen` and the trained ones from a
// ParamGather over this replica's parts (leaves), each gradient handed to
// `dp`'s buckets (ZeRO-2's, averaged into the owner). Returns the loss and
// this replica's own gradients. `order`: the trained parameters in forward
// order. Collective over `dp_comm`.
template <typename F>
std::pair<Tensor, ParamTree> zero3_value_and_grad(F&& f, const ZeroPartition& zero,
                                                  const ParamTree& kept,
                                                  const std::vector<std::string>& order,
                                                  DataParallel& dp, comm::Comm& dp_comm,
                                                  GatherTrace& trace) {
  auto [frozen, parts] = split_partitioned(zero, kept);
  ParamTree leaves;
  TensorList inputs;
  std::map<std::string, Shape> shapes;  // of the gradients: this rank's whole shards
  Device device = Device::cpu();
  for (const auto& [name, t] : parts) {
    Tensor leaf = t.detach().set_requires_grad(true).set_name(name);
    leaves.emplace(name, leaf);
    inputs.push_back(leaf);
    shapes.emplace(name, zero.local_shape(name));
    device = t.device();
  }
  dp.start(shapes, device, order);
  Tensor loss;
  {
    ParamGather gather(
        zero, std::move(leaves), order, dp_comm,
        [&dp](const std::string& n, const Tensor& g) { dp.hand_over(n, g); }, &trace);
    loss = Tensor(f(frozen));
    REDCO_CHECK(loss.defined() && loss.numel() == 1,
                "fit: the loss function must return a scalar, got shape {}",
                loss.defined() ? loss.shape() : Shape{});
    gather.end_forward();
    grad({loss}, inputs, {}, {.allow_unused = true});  // the gather's nodes take every gradient
    gather.flush();
  }
  ParamTree grads;
  dp.finish(grads);
  return {loss, std::move(grads)};
}

}  // namespace redco::train

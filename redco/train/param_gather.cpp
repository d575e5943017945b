// ZeRO-3's parameters gathered as a forward pass reads them (param_gather.hpp).
#include "redco/train/param_gather.hpp"

#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "redco/autodiff/autograd_meta.hpp"
#include "redco/autodiff/checkpoint.hpp"
#include "redco/comm/comm.hpp"
#include "redco/core/error.hpp"
#include "redco/core/profile.hpp"
#include "redco/ops/backend.hpp"
#include "redco/sched/background.hpp"
#include "redco/sched/task.hpp"

namespace redco::train {
namespace {

// The broadcasts that make `name` whole on every replica, each handed to
// `run` (waited for now, or started in the background). Returns the whole
// tensor, which holds the values once they have all ended.
template <typename Run>
Tensor start_gather(const ZeroPartition& zero, const std::string& name, const Tensor& part,
                    comm::Comm& dp, Run&& run) {
  const std::vector<int>& owners = zero.part_owners(name);
  const int me = dp.rank();
  if (owners.size() == 1) {  // owned whole: the owner sends its own tensor
    Tensor whole = owners[0] == me
                       ? part.detach()
                       : Tensor::empty(zero.local_shape(name), DType::f32, part.device());
    run(dp.broadcast(whole, owners[0]));
    return whole;
  }
  // [rows, ...] this rank's shape; part k holds rows part_rows(rows, k, dp)
  Tensor whole = Tensor::empty(zero.local_shape(name), DType::f32, part.device());
  for (int k = 0; k < int(owners.size()); ++k) {
    const auto [a, b] = ZeroPartition::part_rows(whole.dim(0), k, int(owners.size()));
    Tensor rows = whole.slice0(a, b);
    if (owners[size_t(k)] == me) rows.copy_from(part);
    run(dp.broadcast(rows, owners[size_t(k)]));
  }
  return whole;
}

}  // namespace

struct ParamGather::State {
  const ZeroPartition* zero = nullptr;
  ParamTree parts;
  std::vector<std::string> order;
  std::map<std::string, size_t> position;  // in `order`
  comm::Comm* dp = nullptr;
  Sink sink;
  bool forward = true;
  // Each parameter's nodes made by this forward (the last one joined by a
  // later read while alive, so that the engine sums its gradients as it sums
  // the unpartitioned run's), and the checkpointed blocks whose first runs
  // read it (each replay makes one node of its own, joined likewise).
  std::map<std::string, std::vector<std::weak_ptr<Node>>> nodes;
  std::map<std::string, std::weak_ptr<Node>> replay_node;
  std::map<std::string, int> captured;
  std::map<std::string, uint64_t> last_capture;  // the block that counted last
  // From end_forward: the gradients each parameter will receive (its live
  // nodes and its checkpointed reads, whose replays make theirs), and those
  // received so far, summed until the last.
  std::map<std::string, int> uses, reported;
  std::map<std::string, Tensor> pending;
  std::set<std::string> read;  // read in this forward (not prefetched again)
  // Gathers on their way, in the order the reads will take them: the next
  // parameter in forward order on the first step; on later steps as many of
  // the recorded trace's next reads as fit kAheadBytes (at least one), so
  // that a run of small parameters (biases, norms) does not leave the wire
  // idle for a round trip each.
  struct Ahead {
    std::string name;
    Tensor whole;
    std::vector<size_t> tasks;
  };
  static constexpr uint64_t kAheadBytes = uint64_t(16) << 20;
  std::deque<Ahead> ahead;
  uint64_t ahead_bytes = 0;
  size_t forward_started = 0, backward_started = 0;  // trace positions set going
  sched::Background background;
  GatherTrace* trace = nullptr;
  size_t forward_at = 0, backward_at = 0;  // the next read the trace expects

  // Waits for every gather on its way and lets them go (a read out of the
  // expected order; the end of a pass).
  void drop_ahead() {
    const profile::Scope scope("zero3.gather_wait");
    for (Ahead& a : ahead)
      for (const size_t t : a.tasks) background.wait(t);
    ahead.clear();
    ahead_bytes = 0;
  }

  Tensor take_or_gather(const std::string& name) {
    if (!ahead.empty() && ahead.front().name == name) {
      const profile::Scope scope("zero3.gather_wait");  // what the layer before could not hide
      for (const size_t t : ahead.front().tasks) background.wait(t);
      Tensor whole = std::move(ahead.front().whole);
      ahead_bytes -= uint64_t(whole.nbytes());
      ahead.pop_front();
      return whole;
    }
    // Not expected (a recomputed block's reads; the first step's reads out of
    // forward order): gathered now, its parts' broadcasts all at once; the
    // gathers on their way stay for the reads they were started for.
    const profile::Scope scope("zero3.gather");
    std::vector<size_t> tasks;
    Tensor whole = start_gather(*zero, name, parts.at(name), *dp, [&](sched::Task<void> t) {
      tasks.push_back(background.start(std::move(t)));
    });
    for (const size_t t : tasks) background.wait(t);
    return whole;
  }

  // Starts gathering the parameter read after `name`: as the recorded trace
  // says, else the next in forward order unless this forward has read it
  // already.
  void prefetch_after(const std::string& name) {
    if (trace && trace->recorded) return follow(trace->forward, forward_at, forward_started, name);
    if (trace) trace->forward.push_back(name);
    read.insert(name);
    const auto at = position.find(name);
    if (at == position.end() || at->second + 1 >= order.size()) return;
    const std::string& next = order[at->second + 1];
    if (read.count(next) || (!ahead.empty() && ahead.front().name == next)) return;
    drop_ahead();  // one on its way at a time: a read out of order left it unused
    start_ahead(next);
  }

  // Backward gathers `name` again for an op that kept its recipe; on a
  // recorded trace, the gathers after it are started meanwhile.
  Tensor regather(const std::string& name) {
    const profile::Scope scope("zero3.regather");
    if (!trace) return take_or_gather(name);
    if (!trace->recorded) {
      trace->backward.push_back(name);
      return take_or_gather(name);
    }
    Tensor whole = take_or_gather(name);
    follow(trace->backward, backward_at, backward_started, name);
    return whole;
  }

  // `name` was just read at `at` of the recorded `order`: starts the reads
  // after it up to the budget. Resynchronised on a read out of the recorded
  // order (none expected: every step runs the same code).
  void follow(const std::vector<std::string>& order, size_t& at, size_t& started,
              const std::string& name) {
    const auto it = std::find(order.begin() + long(std::min(at, order.size())), order.end(), name);
    if (it == order.end()) return;
    at = size_t(it - order.begin()) + 1;
    started = std::max(started, at);
    fill(order, started);
  }
  void fill(const std::vector<std::string>& order, size_t& started) {
    while (started < order.size() && (ahead.empty() || ahead_bytes < kAheadBytes))
      start_ahead(order[started++]);
  }

  void start_ahead(const std::string& next) {
    Ahead a{next, Tensor(), {}};
    a.whole = start_gather(*zero, next, parts.at(next), *dp, [&](sched::Task<void> t) {
      a.tasks.push_back(background.start(std::move(t)));
    });
    ahead_bytes += uint64_t(a.whole.nbytes());
    ahead.push_back(std::move(a));
  }

  void arrived(const std::string& name, const Tensor& g) {
    Tensor& sum = pending[name];
    sum = sum.defined() ? kernels::binary(BinaryOp::add, sum, g) : g;
    if (++reported[name] < std::max(uses[name], 1)) return;
    const Tensor whole = std::move(sum);
    pending.erase(name);
    sink(name, whole);
  }
};

ParamGather::ParamGather(const ZeroPartition& zero, ParamTree parts, std::vector<std::string> order,
                         comm::Comm& dp, Sink sink, GatherTrace* trace)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.trace = trace;
  s.zero = &zero;
  s.parts = std::move(parts);
  s.order = std::move(order);
  for (size_t i = 0; i < s.order.size(); ++i) s.position.emplace(s.order[i], i);
  s.dp = &dp;
  s.sink = std::move(sink);
  outer_ = std::exchange(nn::param_read_hook(), this);
  // A recorded step's first reads are set going before the model asks.
  if (trace && trace->recorded) s.fill(trace->forward, s.forward_started);
}

ParamGather::~ParamGather() {
  if (nn::param_read_hook() == this) nn::param_read_hook() = outer_;
  try {
    state_->drop_ahead();
  } catch (...) {  // a failure nobody waited for: the step is being abandoned anyway
  }
}

std::optional<Shape> ParamGather::shape_of(std::string_view name) {
  State& s = *state_;
  if (s.parts.count(std::string(name))) return s.zero->local_shape(std::string(name));
  return outer_ ? outer_->shape_of(name) : std::nullopt;
}

Tensor ParamGather::provide(std::string_view name_view) {
  State& s = *state_;
  const std::string name(name_view);
  const auto part = s.parts.find(name);
  if (part == s.parts.end()) return outer_ ? outer_->provide(name_view) : Tensor();
  Tensor whole = s.take_or_gather(name);
  const Tensor& leaf = part->second;
  const bool training = s.sink && leaf.requires_grad();
  if (s.forward) s.prefetch_after(name);
  if (!training) return whole;
  // A handle of its own: a broadcast still finishing may hold `whole`'s, and
  // what keeps a node alive must be its consumers only.
  Tensor values = whole.detach();
  std::vector<std::weak_ptr<Node>>& made = s.nodes[name];
  std::shared_ptr<Node> node;
  if (GradMode::enabled())
    node = !s.forward ? s.replay_node[name].lock() : made.empty() ? nullptr : made.back().lock();
  Tensor w;
  if (node) {
    w = rejoin(std::move(values), std::move(node), 0);
  } else {
    w = record("zero3_gather", {leaf}, std::move(values),
               [state = state_, name](const Node&, const TensorList& g) -> TensorList {
                 state->arrived(name, g[0]);
                 return {Tensor()};  // the part's gradient is the owner's bucket
               });
    if (w.requires_grad()) (s.forward ? made.emplace_back() : s.replay_node[name]) = grad_fn_of(w);
  }
  // Not recorded in a checkpointed block's first run: its replay records it.
  const uint64_t block = detail::capture_id();
  if (s.forward && !GradMode::enabled() && block && s.last_capture[name] != block) {
    s.last_capture[name] = block;
    ++s.captured[name];
  }
  // Read in the forward: an op keeping it for backward keeps this recipe
  // instead (SavedInput). A replay's reads stay whole through its block's backward.
  if (s.forward && w.requires_grad())
    autograd_meta(w)->recompute = [state = state_, name] { return state->regather(name); };
  return w;
}

void ParamGather::end_forward() {
  State& s = *state_;
  s.forward = false;
  // A node nothing consumed (a read for a shape) is gone and never reports.
  for (const auto& [name, made] : s.nodes)
    for (const std::weak_ptr<Node>& n : made) s.uses[name] += n.expired() ? 0 : 1;
  for (const auto& [name, k] : s.captured) s.uses[name] += k;
  s.drop_ahead();
  // Backward's first gathers again, on their way while the loss's backward runs.
  if (s.trace && s.trace->recorded) s.fill(s.trace->backward, s.backward_started);
}

void ParamGather::flush() {
  State& s = *state_;
  if (s.trace) s.trace->recorded = true;
  s.drop_ahead();  // a prefetch the trace expected in vain
  std::map<std::string, Tensor> pending = std::move(s.pending);
  s.pending.clear();
  for (const auto& [name, g] : pending) s.sink(name, g);
}

std::pair<ParamTree, ParamTree> split_partitioned(const ZeroPartition& zero,
                                                  const ParamTree& kept) {
  std::pair<ParamTree, ParamTree> out;
  for (const auto& [name, t] : kept) (zero.has(name) ? out.second : out.first).emplace(name, t);
  return out;
}

Tensor ParamGather::gather(const ZeroPartition& zero, const std::string& name, const Tensor& part,
                           comm::Comm& dp) {
  return start_gather(zero, name, part, dp,
                      [](sched::Task<void> t) { sched::sync_wait(std::move(t)); });
}

}  // namespace redco::train

// The Deployer: the run's world and mesh, randomness, schedules, logging and
// checkpoints.
#include "redco/train/deployer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <streambuf>

#include "redco/comm/device_comm.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/core/error.hpp"
#include "redco/core/heartbeat.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/auto_mesh.hpp"
#include "redco/train/sharded_checkpoint.hpp"

// UCX is optional: without it the Deployer runs one process (or threads).
#if __has_include(<ucp/api/ucp.h>)
#define REDCO_HAS_UCX 1
#include "redco/comm/ucx_comm.hpp"
#else
#define REDCO_HAS_UCX 0
#endif

namespace redco::train {

// ---- Deployer ------------------------------------------------------------------------------

namespace {

// The world of a process started by a launcher: a rendezvous at rank 0, then UCX.
std::unique_ptr<comm::Comm> connect(const comm::LaunchEnv& env) {
#if REDCO_HAS_UCX
  return comm::connect_ucx(comm::ucx_options(env));
#else
  fail(
      "this process is rank {} of {} (started by {}), but redco was built without UCX, which "
      "runs ranks as processes: install UCX (libucx-dev) and rebuild, or run one process",
      env.rank, env.world_size, env.source);
#endif
}

// Where console() goes off the main rank.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// DeployerConfig::device as a Device for world rank `rank`.
Device choose_device(const std::string& spec, int rank) {
  const bool cuda_built = has_device_memory(DeviceKind::cuda);
  const int gpus = cuda_built ? device_memory(Device::cuda()).device_count() : 0;
  if (spec == "cpu") return Device::cpu();
  if (spec == "test") return Device::test();
  if (spec == "auto") return gpus > 0 ? Device::cuda(rank % gpus) : Device::cpu();
  if (spec == "cuda" || spec.starts_with("cuda:")) {
    REDCO_CHECK(cuda_built,
                "Deployer: device \"{}\" asked for, but this build of redco has no CUDA support; "
                "reconfigure with -Dcuda=enabled on a machine with the CUDA toolkit, or use "
                "--device cpu",
                spec);
    REDCO_CHECK(gpus > 0,
                "Deployer: device \"{}\" asked for, but no GPU is visible (check "
                "nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu",
                spec);
    if (spec == "cuda") return Device::cuda(rank % gpus);
    int i = -1;
    try {
      size_t used = 0;
      i = std::stoi(spec.substr(5), &used);
      if (used != spec.size() - 5) i = -1;
    } catch (const std::exception&) {
      i = -1;
    }
    REDCO_CHECK(i >= 0 && i < gpus, "Deployer: device \"{}\": the GPU index must be 0 to {}", spec,
                gpus - 1);
    return Device::cuda(i);
  }
  fail("Deployer: unknown device \"{}\"; use cpu, cuda, cuda:N, test or auto", spec);
}

}  // namespace

Deployer::Deployer(DeployerConfig config) : config_(std::move(config)) {
  REDCO_CHECK(config_.n_model_shards >= 1, "Deployer: n_model_shards must be >= 1, got {}",
              config_.n_model_shards);
  heartbeat::start();  // a launcher watching for hangs hears from this rank from now on
  REDCO_CHECK(config_.zero_stage >= 0 && config_.zero_stage <= 3,
              "Deployer: zero_stage must be 0 (off), 1 (optimizer state partitioned over the "
              "data-parallel replicas), 2 (gradients too) or 3 (parameters too), got {}",
              config_.zero_stage);
  REDCO_CHECK(config_.grad_bucket_bytes > 0,
              "Deployer: grad_bucket_bytes must be > 0 (the default is 25 MiB)");
  const char* env_device = std::getenv("REDCO_DEVICE");
  const std::string spec = !config_.device.empty()     ? config_.device
                           : env_device && *env_device ? std::string(env_device)
                                                       : "cpu";
  comm::Comm* world = config_.world;
  if (!world) {
    const comm::LaunchEnv env = comm::detect_launch_env();
    restart_ = env.restart;
    if (env.world_size > 1) {
      connected_ = connect(env);
      device_ = choose_device(spec, connected_->rank());
      // Device tensors over the device's own transport (NCCL), when every rank has it.
      const auto timeout = std::chrono::milliseconds(int64_t(env.timeout_s * 1000));
      connected_ = comm::comm_for_device(std::move(connected_), device_, timeout);
      world = connected_.get();
    } else {
      alone_ = std::make_unique<comm::ThreadsWorld>(1);
      world = &alone_->comm(0);
    }
  }
  if (!connected_) device_ = choose_device(spec, world->rank());
  if (config_.auto_mesh) choose_mesh_for(*world);
  REDCO_CHECK(world->size() % config_.n_model_shards == 0,
              "Deployer: n_model_shards = {} does not divide the {} ranks of this run; start a "
              "multiple of {} ranks (redco-run -n) or pass --n_model_shards with a divisor of {}",
              config_.n_model_shards, world->size(), config_.n_model_shards, world->size());
  mesh_ = std::make_unique<comm::Mesh>(*world, config_.n_model_shards);
}

void Deployer::choose_mesh_for(comm::Comm& world) {
  AutoMeshOptions o = config_.auto_mesh->options;
  o.world_size = world.size();
  REDCO_CHECK(o.memory_per_device > 0 || device_.is_cpu(),
              "Deployer: auto_mesh on {} needs the memory each device may use "
              "(AutoMeshOptions::memory_per_device, e.g. 80e9 for an 80 GB GPU)",
              device_.str());
  auto choice = std::make_shared<MeshChoice>(choose_mesh(config_.auto_mesh->model, o));
  config_.n_model_shards = choice->n_model_shards;
  config_.zero_stage = choice->zero_stage;
  if (!config_.quiet && world.rank() == 0)
    (config_.console ? *config_.console : std::cout) << choice->why << '\n';
  choice_ = std::move(choice);
}

int64_t Deployer::auto_micro_batch() const { return choice_ ? choice_->micro_batch : 0; }
bool Deployer::auto_recompute() const { return choice_ && choice_->recompute; }

ParamTree Deployer::place(ParamTree tree) const {
  CachingAllocator::LongLivedScope long_lived;  // parameters and optimizer state stay
  for (auto& [name, t] : tree)
    if (t.defined() && t.device() != device_) t = t.to(device_);
  return tree;
}

Deployer::~Deployer() = default;

int Deployer::n_devices() const { return mesh_->shape().world_size; }
int Deployer::dp_size() const { return mesh_->dp_size(); }
int Deployer::dp_rank() const { return mesh_->dp_rank(); }
int Deployer::mp_rank() const { return mesh_->mp_rank(); }
int Deployer::rank() const { return mesh_->rank(); }

void Deployer::barrier() const {
  if (n_devices() > 1) sched::sync_wait(mesh_->world().barrier());
}

std::ostream& Deployer::console() const {
  static NullBuffer discard;
  static std::ostream nowhere(&discard);
  if (!is_main()) return nowhere;
  return config_.console ? *config_.console : std::cout;
}

std::vector<int64_t> Deployer::epoch_order(int64_t epoch, int64_t n, bool shuffle) const {
  std::vector<int64_t> order(size_t(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!shuffle) return order;
  // Fisher-Yates with j drawn from index i of the epoch's stream, scaled to
  // [0, i] by a 64x64 -> 128-bit multiply (bias below 2^-40 for any n we see).
  const Rng rng = this->rng(Purpose::shuffle, uint64_t(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t r = (uint64_t(rng.bits(2 * uint64_t(i))) << 32) | rng.bits(2 * uint64_t(i) + 1);
    const auto j = int64_t((unsigned __int128)r * uint64_t(i + 1) >> 64);
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

int64_t Deployer::steps_per_epoch(int64_t n_examples, int64_t global_batch_size) {
  REDCO_CHECK(global_batch_size > 0, "global_batch_size must be > 0, got {}", global_batch_size);
  return n_examples / global_batch_size;
}

int64_t Deployer::total_steps(const ScheduleSpec& spec) {
  return steps_per_epoch(spec.n_examples, spec.global_batch_size) * spec.n_epochs;
}

namespace {
// Splits spec into (warmup steps, decay steps), at least one decay step.
std::pair<int64_t, int64_t> schedule_steps(const ScheduleSpec& spec) {
  REDCO_CHECK(spec.warmup_fraction >= 0 && spec.warmup_fraction <= 1,
              "schedule: warmup_fraction must be in [0, 1], got {}", spec.warmup_fraction);
  const int64_t total = Deployer::total_steps(spec);
  const auto warm = int64_t(std::llround(double(total) * spec.warmup_fraction));
  return {warm, std::max<int64_t>(total - warm, 1)};
}
}  // namespace

optim::Schedule Deployer::linear_schedule(const ScheduleSpec& spec) const {
  const auto [warm, decay] = schedule_steps(spec);
  const float peak = spec.learning_rate;
  optim::Schedule after = optim::linear(peak, peak * spec.end_fraction, decay);
  return warm > 0 ? optim::warmup(warm, after) : after;
}

optim::Schedule Deployer::cosine_schedule(const ScheduleSpec& spec) const {
  const auto [warm, decay] = schedule_steps(spec);
  optim::Schedule after = optim::cosine(spec.learning_rate, decay, spec.end_fraction);
  return warm > 0 ? optim::warmup(warm, after) : after;
}

void Deployer::log(int64_t step, std::string_view split, const io::Metrics& metrics) {
  if (config_.workdir.empty() || !is_main()) return;
  if (!log_) log_ = std::make_unique<io::MetricsLog>(config_.workdir);
  log_->log(step, split, metrics);
}

std::filesystem::path Deployer::step_dir(int64_t step) const {
  return io::checkpoint_dir(config_.workdir, step);
}

std::filesystem::path Deployer::best_dir(std::string_view metric) const {
  // Metric names are the user's: keep them readable but a single path component.
  std::string name(metric);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') c = '_';
  return config_.workdir / "ckpt" / ("best-" + name);
}

void Deployer::save_checkpoint(const std::filesystem::path& dir, const ParamTree& params,
                               const ParamTree& opt_state, const std::string& state_json,
                               const ShardPlan& plan) const {
  if (device_.is_cpu())
    return save_sharded_checkpoint(*mesh_, dir, params, opt_state, state_json, plan);
  // Files are written from host memory: one explicit copy of each tensor.
  auto host = [](const ParamTree& tree) {
    ParamTree out;
    for (const auto& [name, t] : tree) out.emplace(name, t.defined() ? t.to(Device::cpu()) : t);
    return out;
  };
  save_sharded_checkpoint(*mesh_, dir, host(params), host(opt_state), state_json, plan);
}

CheckpointData Deployer::load_checkpoint(const std::filesystem::path& dir,
                                         const ShardPlan& plan) const {
  CheckpointData ck = load_sharded_checkpoint(*mesh_, dir, plan);
  if (!device_.is_cpu()) {
    ck.params = place(std::move(ck.params));
    ck.opt_state = place(std::move(ck.opt_state));
  }
  return ck;
}

std::vector<io::CheckpointEntry> Deployer::list_checkpoints() const {
  if (config_.workdir.empty()) return {};
  return io::list_checkpoints(config_.workdir);
}

std::optional<io::CheckpointEntry> Deployer::latest_checkpoint() const {
  if (config_.workdir.empty()) return std::nullopt;
  if (n_devices() == 1) return io::latest_checkpoint(config_.workdir);
  // Rank 0 looks (it alone may repair an interrupted save) and tells the
  // others, so every rank resumes from the same one. -1: none or an error.
  Tensor step = Tensor::full(Shape{1}, -1.f).to(DType::i64);  // [1]
  std::exception_ptr error;
  if (is_main()) {
    try {
      if (auto latest = io::latest_checkpoint(config_.workdir))
        step.data<int64_t>()[0] = latest->step;
    } catch (...) {
      error = std::current_exception();
    }
  }
  sched::sync_wait(mesh_->world().broadcast(step, 0));
  if (error) std::rethrow_exception(error);
  const int64_t s = step.data<int64_t>()[0];
  if (s < 0) return std::nullopt;
  return io::CheckpointEntry{s, step_dir(s)};
}

void Deployer::keep_last(int64_t k) const {
  if (k <= 0 || config_.workdir.empty()) return;
  bool ok = true;
  if (is_main()) {
    try {
      io::prune_checkpoints(config_.workdir, size_t(k));
    } catch (const std::exception& e) {
      if (n_devices() == 1) throw;
      fmt::print(stderr, "rank 0: {}\n", e.what());
      ok = false;
    }
  }
  agree(mesh_->world(), ok, "deleting old checkpoints");
}

}  // namespace redco::train

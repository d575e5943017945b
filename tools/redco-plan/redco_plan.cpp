// redco-plan: which ways of training a model fit a cluster, and how fast
// each would go, before anything runs.
//
//   redco-plan path/to/hf-folder --device a100-40gb --devices 4 --seq-len 1024
//   redco-plan config.json --memory 10GB --devices 2 --seq-len 1024 --global-batch 8 --json
//   redco-plan config.json --device h100 --devices 16 --hosts 2 --inter-link ib-ndr --max-zero 3
//
// MODEL is a Hugging Face folder (its config.json is read, no weights) or a
// config.json itself; tools/redco-plan/configs holds the published configs of
// the models in RedCoast's Table 1. Every configuration the flags allow
// (model shards x replicas, ZeRO stage, recomputation, micro-batch and
// accumulation) is modelled (docs/planning.md): the ones that fit are
// printed fastest first, each with its memory per rank and the longest
// sequence it fits; when none fits, the nearest misses and what they lack.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli11_conventions.hpp"
#include "redco/io/json.hpp"
#include "redco/plan/planner.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string model;
  std::string device = "a100-40gb";
  std::string memory;  // overrides the device's
  double flops = 0;    // overrides the device's sustained rate
  int devices = 1, hosts = 1;
  std::string link = "", inter_link = "ib-hdr";
  int64_t seq_len = 512, source_len = 0, global_batch = 0;
  std::string precision = "f32", optimizer = "adamw";
  int shards = 0, zero = -1, max_zero = 3;
  std::string recompute = "auto";
  int64_t micro_batch = 0;
  int top = 8;
  bool json = false;
};

models::hf::Config read_config(const std::string& model) {
  const fs::path p(model);
  REDCO_CHECK(fs::exists(p),
              "redco-plan: '{}' does not exist; give a Hugging Face folder or a config.json",
              model);
  if (fs::is_directory(p)) return models::hf::Config(p);
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  REDCO_CHECK(in.good() || in.eof(), "redco-plan: cannot read '{}'", model);
  return models::hf::Config(io::Json::parse(text.str(), p.string()), p.string());
}

plan::Cluster cluster_of(const Options& o) {
  plan::Cluster c;
  c.device = plan::device_preset(o.device);
  if (!o.memory.empty()) c.device.memory = plan::parse_size(o.memory, "redco-plan: --memory");
  if (o.flops > 0) c.device.f32_flops = c.device.bf16_flops = o.flops;
  c.devices = o.devices, c.hosts = o.hosts;
  const bool gpu = o.device != "cpu";
  c.intra = plan::link_preset(!o.link.empty()                            ? o.link
                              : o.device == "h100" || o.device == "h200" ? "nvlink4"
                              : o.device.starts_with("a100")             ? "nvlink3"
                              : o.device == "tpu-v4"                     ? "ici"
                              : gpu                                      ? "pcie3"
                                                                         : "shm");
  c.inter = plan::link_preset(o.inter_link);
  c.overlap = plan::overlap_of(gpu, c.hosts);
  return c;
}

plan::Request request_of(const Options& o) {
  plan::Request r{.model = plan::model_shape(read_config(o.model)), .cluster = cluster_of(o)};
  r.seq_len = o.seq_len, r.source_len = o.source_len, r.global_batch = o.global_batch;
  r.precision = o.precision == "bf16" ? Precision::bf16 : Precision::f32;
  r.optimizer = o.optimizer == "sgd"            ? plan::Optimizer::sgd
                : o.optimizer == "sgd-momentum" ? plan::Optimizer::sgd_momentum
                                                : plan::Optimizer::adamw;
  if (o.shards > 0) r.mp = o.shards;
  if (o.zero >= 0) r.zero = o.zero;
  if (o.recompute != "auto") r.recompute = o.recompute == "on";
  if (o.micro_batch > 0) r.micro_batch = o.micro_batch;
  r.max_zero = std::max(o.max_zero, o.zero);
  REDCO_CHECK(o.global_batch == 0 || o.micro_batch == 0 || o.global_batch % o.micro_batch == 0,
              "redco-plan: --micro-batch {} does not divide --global-batch {}", o.micro_batch,
              o.global_batch);
  return r;
}

// The longest sequence this candidate's mesh, stage and recomputation fit.
int64_t longest(plan::Request r, const plan::Candidate& k) {
  r.mp = k.par.mp, r.zero = k.par.zero, r.recompute = k.par.recompute;
  return plan::max_seq_len(r);
}

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

io::Json to_json(const plan::Candidate& k, int64_t max_len) {
  io::Json j = io::Json::object();
  j["fits"] = k.fits;
  j["n_model_shards"] = k.par.mp;
  j["data_parallel"] = k.par.dp;
  j["zero_stage"] = k.par.zero;
  j["recompute"] = k.par.recompute;
  j["micro_batch"] = k.work.micro_batch;
  j["accumulation"] = k.work.accumulation;
  io::Json m = io::Json::object();
  const plan::MemoryBreakdown& b = k.memory;
  m["params"] = b.params + b.gathered;
  m["grads"] = b.grads + b.buckets + b.accumulated;
  m["opt_state"] = b.opt_state;
  m["activations"] = b.activations;
  m["peak"] = b.peak();
  m["needed"] = k.needed;
  j["memory_bytes"] = m;
  j["step_seconds"] = k.time.seconds;
  j["tokens_per_s"] = k.time.tokens_per_s;
  j["compute_seconds"] = k.time.compute;
  j["tp_comm_seconds"] = k.time.tp_comm;
  j["dp_comm_seconds"] = k.time.dp_comm;
  j["max_seq_len"] = max_len;
  return j;
}

// GiB/rank = what lives across steps (parameters, optimizer state) + the
// step's own high-water mark (the larger of its activation and gradient
// phases, with the head's and backward's buffers and the margin); the
// activations and gradients are shown beside it, not summed: they are not
// all held at once.
void print_row(const plan::Candidate& k, int64_t max_len, int64_t context) {
  const plan::MemoryBreakdown& b = k.memory;
  const uint64_t params = b.params + b.gathered, lasting = params + b.opt_state;
  std::cout << fmt::format(
      "{:>3}x{:<3} {:>4} {:>9} {:>5}x{:<4} {:>7.2f} = {:>6.2f} + {:>6.2f} + {:>6.2f}  {:>7.2f} "
      "{:>6.2f} {:>11.0f} {:>8}{}\n",
      k.par.mp, k.par.dp, k.par.zero, k.par.recompute ? "on" : "off", k.work.micro_batch,
      k.work.accumulation, gib(k.needed), gib(params), gib(b.opt_state), gib(k.needed - lasting),
      gib(b.activations), gib(b.grads + b.buckets + b.accumulated), k.time.tokens_per_s, max_len,
      max_len == context ? "*" : "");
}

void add_options(CLI::App& app, Options& o) {
  using cli11::at_least;
  app.add_option("model", o.model, "a Hugging Face folder or a config.json")->required();
  app.add_option("--device", o.device,
                 "device preset: " + fmt::format("{}", fmt::join(plan::device_names(), ", ")));
  app.add_option("--memory", o.memory, "memory per device (40GB, 40GiB): overrides the preset's");
  app.add_option("--flops", o.flops, "sustained FLOP/s per device: overrides the preset's");
  app.add_option("--devices", o.devices, "devices in all")->check(at_least(1));
  app.add_option("--hosts", o.hosts, "hosts the devices are on")->check(at_least(1));
  app.add_option("--link", o.link,
                 "link inside a host: " + fmt::format("{}", fmt::join(plan::link_names(), ", ")));
  app.add_option("--inter-link", o.inter_link, "link between hosts");
  app.add_option("--seq-len", o.seq_len, "tokens per row (an encoder-decoder's target)")
      ->check(at_least(1));
  app.add_option("--source-len", o.source_len, "an encoder-decoder's source tokens; 0: --seq-len");
  app.add_option("--global-batch", o.global_batch, "rows per optimizer step; 0: one per replica");
  app.add_option("--precision", o.precision, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--optimizer", o.optimizer, "adamw, sgd-momentum or sgd")
      ->check(CLI::IsMember({"adamw", "sgd-momentum", "sgd"}));
  app.add_option("--n-model-shards", o.shards, "pin the model shards (0: search)");
  app.add_option("--zero", o.zero, "pin the ZeRO stage (-1: search)")->check(CLI::Range(-1, 3));
  app.add_option("--max-zero", o.max_zero, "highest ZeRO stage to search")->check(CLI::Range(0, 3));
  app.add_option("--recompute", o.recompute, "on, off or auto")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--micro-batch", o.micro_batch, "pin the micro-batch (0: search)");
  app.add_option("--top", o.top, "plans to print")->check(at_least(1));
  app.add_flag("--json", o.json, "one JSON object: the model, the cluster and the plans");
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "redco-plan: the configurations that fit a model's training on a cluster, fastest "
      "first, with their memory per rank (docs/planning.md)"};
  Options o;
  add_options(app, o);
  REDCO_CLI11_PARSE(app, argc, argv);
  const plan::Request r = request_of(o);
  const std::vector<plan::Candidate> all = plan::search(r);
  REDCO_CHECK(!all.empty(),
              "redco-plan: no configuration divides --global-batch {} over the replicas of {} "
              "devices; give a global batch that a replica count divides",
              o.global_batch, o.devices);
  const size_t shown = std::min(all.size(), size_t(o.top));
  std::vector<int64_t> longest_len;
  for (size_t i = 0; i < shown; ++i) longest_len.push_back(longest(r, all[i]));
  const bool any = all.front().fits;
  if (o.json) {
    io::Json j = io::Json::object();
    j["model_type"] = r.model.family;
    j["parameters"] = r.model.n_params();
    j["device"] = r.cluster.device.name;
    j["memory_per_device"] = r.cluster.device.memory;
    j["devices"] = o.devices;
    j["seq_len"] = o.seq_len;
    j["fits"] = any;
    // The longest sequence any configuration the flags allow fits (one row per replica).
    j["longest_seq_len"] = plan::max_seq_len(r);
    io::Json plans = io::Json::array();
    for (size_t i = 0; i < shown; ++i) plans.push_back(to_json(all[i], longest_len[i]));
    j["plans"] = plans;
    std::cout << j.dump(true) << '\n';
    return any ? 0 : 2;
  }
  std::cout << fmt::format(
      "{} ({:.2f}B parameters), {} x {} ({:.1f} GiB each) on {} host(s), {} tokens, {}, {}\n",
      r.model.family, double(r.model.n_params()) / 1e9, o.devices, r.cluster.device.name,
      gib(r.cluster.device.memory), o.hosts, o.seq_len, o.precision, o.optimizer);
  std::cout << (any ? "plans that fit, fastest first:\n"
                    : "nothing fits; the nearest misses (need per rank):\n");
  std::cout << " mp x dp  zero recompute micro x acc  GiB/rank = params +  optim +   step   "
               "activ.  grads    tokens/s  max len\n";
  bool capped = false;
  for (size_t i = 0; i < shown; ++i) {
    if (any && !all[i].fits) break;
    print_row(all[i], longest_len[i], r.model.context);
    capped = capped || longest_len[i] == r.model.context;
  }
  std::cout << "(step: the step's high-water mark beyond parameters and optimizer state, with a "
               "5% fragmentation margin; activations and gradients are its two phases)\n";
  if (capped)
    std::cout << fmt::format("* the model's position table ends at {} tokens\n", r.model.context);
  return any ? 0 : 2;
} catch (const std::exception& e) {
  const std::string_view m = e.what();
  std::cerr << (m.starts_with("redco-plan:") ? "" : "redco-plan: ") << m << '\n';
  return 1;
}

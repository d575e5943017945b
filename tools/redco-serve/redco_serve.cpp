// redco-serve: an OpenAI-compatible HTTP server for a Hugging Face causal LM
// folder, with continuous batching (generation/batcher.hpp).
//
//   redco-serve MODEL_DIR --port 8000 --slots 8 --context 2048 --dtype bf16
//   curl localhost:8000/v1/completions -d '{"prompt": "In the beginning", "max_tokens": 16}'
//   # or any OpenAI client: base_url="http://localhost:8000/v1"
//
// Routes: POST /v1/completions and /v1/chat/completions (whole or streamed
// as server-sent events; chat through the folder's chat template), GET
// /v1/models, /health, /metrics (Prometheus text). Requests join the running
// batch at the next decode step and leave it when they end; at most --slots
// run at once and --max-queue wait, beyond which a request gets 429.
// Sampling, stop strings and lengths are per request; end ids come from the
// folder's generation_config.json (else config.json).
//
// One model replica: one process, or the N processes of a tensor-parallel
// mesh (redco-run -n N redco-serve MODEL_DIR --n-model-shards N), each
// holding 1/N of the model; rank 0 serves HTTP and hands each step's new
// requests to the others (Batcher::lockstep). It prints "redco-serve:
// listening on http://HOST:PORT" once it accepts connections (with --port 0,
// a free port).
#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli11_conventions.hpp"
#include "redco/comm/bytes.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/core/threads.hpp"
#include "redco/models/causal_lm.hpp"
#include "redco/models/hf_generation.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/ops/cpu/skinny_panels.hpp"
#include "redco/train/deployer.hpp"
#include "server.hpp"

using namespace redco;

namespace {

struct Options {
  std::string dir, host = "127.0.0.1", name, dtype = "f32", chat_template;
  int port = 8000, threads = 0, http_threads = 64, shards = 1;
  int64_t slots = 8, context = 0, max_queue = 256, prefix_cache = 4, kv_block = 64, kv_tokens = 0,
          prefill_chunk = 512;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("model", o.dir,
                 "Hugging Face causal LM folder (config.json, safetensors, "
                 "tokenizer.json)")
      ->required();
  app.add_option("--host", o.host, "address to listen on (0.0.0.0: every interface)");
  app.add_option("--port", o.port, "port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  app.add_option("--served-model-name", o.name,
                 "the name clients give as \"model\" (default: "
                 "the folder's name)");
  app.add_option("--slots", o.slots, "requests decoded together (KV cache rows)")
      ->check(redco::cli11::at_least(1));
  app.add_option("--context", o.context,
                 "tokens per request, prompt and output (default: the "
                 "model's maximum, at most 4096)")
      ->check(redco::cli11::at_least(0));
  app.add_option("--max-queue", o.max_queue, "requests waiting for a row before 429")
      ->check(redco::cli11::at_least(0));
  app.add_option("--prefix-cache", o.prefix_cache,
                 "recent prompts whose keys and values a new request with the same "
                 "beginning reuses (0: off)")
      ->check(redco::cli11::at_least(0));
  app.add_option("--kv-block", o.kv_block, "tokens per block of the paged KV cache")
      ->check(redco::cli11::at_least(1));
  app.add_option("--kv-cache-tokens", o.kv_tokens,
                 "tokens the KV cache holds, all requests together (default: (slots + "
                 "prefix-cache) x context, whole blocks per row); a request waits until the "
                 "tokens it may fill are free")
      ->check(redco::cli11::at_least(0));
  app.add_option("--prefill-chunk", o.prefill_chunk,
                 "prompt tokens prefilled between two decode steps at most: a long prompt is "
                 "prefilled over several steps while the others decode (0: whole prompts)")
      ->check(redco::cli11::at_least(0));
  app.add_option("--n-model-shards", o.shards,
                 "tensor-parallel shards: the processes redco-run started (one replica)")
      ->check(redco::cli11::at_least(1));
  app.add_option("--dtype", o.dtype, "weights in memory")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  app.add_option("--chat-template", o.chat_template,
                 "a Jinja chat template file (default: the folder's)");
  app.add_option("--threads", o.threads, "CPU threads to compute with (0: every core)")
      ->check(redco::cli11::at_least(0));
  app.add_option("--http-threads", o.http_threads, "connections served at once")
      ->check(redco::cli11::at_least(1));
}

std::optional<data::FolderChatTemplate> chat_template(const Options& o) {
  auto folder = data::load_chat_template(o.dir);
  if (o.chat_template.empty()) return folder;
  std::ifstream in(o.chat_template);
  REDCO_CHECK(in, "redco-serve: cannot read --chat-template {}", o.chat_template);
  std::stringstream text;
  text << in.rdbuf();
  data::FolderChatTemplate t{data::ChatTemplate(text.str())};
  if (folder) t.special_tokens = folder->special_tokens;
  return t;
}

// SIGINT / SIGTERM stop the server from a thread of their own (sigwait), so
// nothing runs inside a signal handler.
std::thread stop_on_signal(serve::Server& server) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return std::thread([set, &server] {
    int sig = 0;
    sigwait(&set, &sig);
    std::cerr << "redco-serve: stopping (signal " << sig << ")\n";
    server.stop();
  });
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "redco-serve: an OpenAI-compatible server (completions, chat completions, "
      "streaming) with continuous batching, for a Hugging Face causal LM folder"};
  Options o;
  add_options(app, o);
  REDCO_CLI11_PARSE(app, argc, argv);
  // Every thread started from here on leaves SIGINT/SIGTERM to stop_on_signal;
  // a client that closes its socket is a failed write, not SIGPIPE.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  set_num_threads(o.threads);

  train::Deployer deployer({.n_model_shards = o.shards, .quiet = true});
  REDCO_CHECK(deployer.dp_size() == 1,
              "redco-serve: {} processes for {} model shard(s): a server is one replica; start "
              "as many processes as --n-model-shards (one server per replica, behind a load "
              "balancer, for more)",
              deployer.n_devices(), o.shards);
  const bool leader = deployer.mp_rank() == 0;
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : o.dtype == "int8" ? DType::i8 : DType::f32;
  const models::hf::LoadOptions load{.dtype = dtype,
                                     .n_shards = o.shards,
                                     .rank = deployer.mp_rank(),
                                     .decode_panels = dtype != DType::f32 && cpu::panels_pay()};
  const auto lm = models::from_pretrained<models::CausalLM>(o.dir, load);
  std::optional<data::Tokenizer> tok;
  if (data::Tokenizer::found_in(o.dir)) tok.emplace(data::Tokenizer::from_file(o.dir));

  serve::ServerOptions so;
  so.http_threads = o.http_threads;
  so.limits.model_name = o.name.empty() ? std::filesystem::path(o.dir).filename().string() : o.name;
  if (so.limits.model_name.empty())  // a folder given with a trailing slash
    so.limits.model_name = std::filesystem::path(o.dir).parent_path().filename().string();
  const int64_t longest = lm.model.max_positions() > 0 ? lm.model.max_positions() : 4096;
  so.limits.context = o.context > 0 ? o.context : std::min<int64_t>(longest, 4096);
  REDCO_CHECK(so.limits.context <= longest,
              "redco-serve: --context {} is longer than the model's {} positions", o.context,
              longest);
  so.limits.vocab_size = lm.model.vocab_size();
  so.limits.defaults = models::generation_config(o.dir);

  nn::Ctx ctx;
  ctx.mp = &deployer.mesh().mp_comm();
  const generation::StepFn step = [&lm](const Tensor& ids, nn::Ctx& ctx) {
    return nn::apply(lm.model, lm.params, ids, ctx);
  };
  generation::Batcher batcher(step,
                              {.slots = o.slots,
                               .context = so.limits.context,
                               .max_queue = o.max_queue,
                               .vocab_size = so.limits.vocab_size,
                               .prefix_rows = o.prefix_cache,
                               .kv_block = o.kv_block,
                               .kv_tokens = o.kv_tokens,
                               .prefill_chunk = o.prefill_chunk},
                              tok ? &*tok : nullptr, ctx);
  if (o.shards > 1) {
    comm::Comm& mp = deployer.mesh().mp_comm();
    batcher.lockstep([&mp](std::string& bytes) { comm::broadcast_bytes(bytes, mp); }, leader);
  }
  if (!leader) {  // a follower: the leader's steps, until it stops
    while (!batcher.stopped()) batcher.step();
    return 0;
  }
  serve::Server server(batcher, tok ? &*tok : nullptr, chat_template(o), so);
  const int port = server.bind(o.host, o.port);
  std::thread signals = stop_on_signal(server);
  signals.detach();
  std::cerr << "redco-serve: listening on http://" << o.host << ":" << port << " (model '"
            << so.limits.model_name << "', " << o.slots << " slots, context " << so.limits.context
            << (o.shards > 1 ? fmt::format(", {} model shards", o.shards) : std::string()) << ")"
            << std::endl;
  server.listen();
  return 0;
} catch (const std::exception& e) {
  const std::string_view m = e.what();
  std::cerr << (m.starts_with("redco-serve:") ? "" : "redco-serve: ") << m << '\n';
  return 1;
}

// redco-serve's routes and the batcher's thread (server.hpp); one request's
// way through is stream.cpp.
#include "server.hpp"

#include <fmt/format.h>

#include <chrono>

namespace redco::serve {
namespace {

void json_reply(httplib::Response& res, int status, const io::Json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

}  // namespace

Server::Server(generation::Batcher& batcher, const data::Tokenizer* tokenizer,
               std::optional<data::FolderChatTemplate> chat, ServerOptions options)
    : batcher_(batcher), tokenizer_(tokenizer), chat_(std::move(chat)), options_(options) {
  const int threads = options_.http_threads;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_.set_payload_max_length(16 << 20);
  // A streamed token is a small write after the headers' write: without
  // TCP_NODELAY, Nagle's algorithm holds it until the client's delayed ACK
  // (40 ms on Linux), which was most of the time to first token.
  http_.set_tcp_nodelay(true);
  routes();
  engine_ = std::thread([this] { engine(); });
}

Server::~Server() {
  stop();
  if (engine_.joinable()) engine_.join();
}

int Server::bind(const std::string& host, int port) {
  if (port == 0) return http_.bind_to_any_port(host);
  REDCO_CHECK(http_.bind_to_port(host, port),
              "redco-serve: cannot listen on {}:{} (in use, or not this machine's address): "
              "give another --port or --host",
              host, port);
  return port;
}

void Server::listen() { http_.listen_after_bind(); }

void Server::stop() {
  running_ = false;
  batcher_.stop_waiting();
  http_.stop();
}

// The batcher's thread: a step whenever there is work.
void Server::engine() {
  while (running_) {
    batcher_.wait_for_work(std::chrono::milliseconds(100));
    if (!running_) break;
    if (batcher_.step() && batcher_.running() > 0) metrics_.batch_size(batcher_.running());
  }
  batcher_.release_followers();  // tensor parallelism: the other ranks stop too
}

void Server::routes() {
  http_.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
    handle(q, r, Endpoint::completions);
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
    handle(q, r, Endpoint::chat);
  });
  http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    io::Json m = io::Json::object();
    m["id"] = io::Json(options_.limits.model_name);
    m["object"] = io::Json("model");
    m["created"] = io::Json(int64_t(0));
    m["owned_by"] = io::Json("redco");
    m["max_model_len"] = io::Json(options_.limits.context);
    io::Json out = io::Json::object();
    out["object"] = io::Json("list");
    out["data"] = io::Json(io::Json::Array{std::move(m)});
    json_reply(res, 200, out);
  });
  http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    io::Json out = io::Json::object();
    out["status"] = io::Json("ok");
    json_reply(res, 200, out);
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const Metrics::Gauges g{
        batcher_.running(),       batcher_.queued(),           batcher_.free_rows(),
        batcher_.prompt_tokens(), batcher_.generated_tokens(), batcher_.reused_tokens(),
        batcher_.kv_blocks(),     batcher_.kv_blocks_free(),   batcher_.kv_blocks_stored()};
    res.set_content(metrics_.text(g), "text/plain; version=0.0.4");
  });
  http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route's own error
    const std::string why = res.status == 404
                                ? fmt::format(
                                      "no route {} {}: the routes are POST "
                                      "/v1/completions, POST /v1/chat/completions, GET "
                                      "/v1/models, /health, /metrics",
                                      req.method, req.path)
                                : fmt::format("HTTP {}", res.status);
    json_reply(res, res.status, error_body(why, res.status == 404 ? "not_found_error" : "error"));
  });
}

std::vector<int64_t> Server::prompt_ids(const Request& r) const {
  if (r.endpoint == Endpoint::completions && !r.prompt_text) return r.prompt_ids;
  if (!tokenizer_)
    throw ApiError(400, "invalid_request_error",
                   r.endpoint == Endpoint::chat ? "messages" : "prompt",
                   "this model folder has no tokenizer.json: send the prompt as token ids");
  std::string text;
  bool add_special = true;
  if (r.endpoint == Endpoint::chat) {
    if (!chat_)
      throw ApiError(400, "invalid_request_error", "messages",
                     "this model has no chat template (tokenizer_config.json's chat_template): "
                     "use /v1/completions, or start redco-serve with --chat-template FILE");
    try {
      text = chat_->render(r.messages, /*add_generation_prompt=*/true);
    } catch (const data::ChatTemplateException& e) {  // the template refuses this conversation
      throw ApiError(400, "invalid_request_error", "messages", e.what());
    }
    add_special = false;  // the template wrote them, as apply_chat_template's tokenize
  } else {
    text = *r.prompt_text;
  }
  std::vector<int64_t> ids;
  for (int32_t id : tokenizer_->encode(text, add_special).ids) ids.push_back(id);
  if (ids.empty())
    throw ApiError(400, "invalid_request_error", "prompt", "the prompt has no tokens");
  return ids;
}

}  // namespace redco::serve

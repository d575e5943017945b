#pragma once
// redco-serve's HTTP side: the routes, each request's stream of tokens from
// the batcher to its connection, and the thread that runs the batcher.
#include <httplib.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "openai_api.hpp"
#include "redco/data/chat_template.hpp"
#include "redco/data/tokenizer.hpp"
#include "redco/generation/batcher.hpp"
#include "serve_metrics.hpp"

namespace redco::serve {

struct ServerOptions {
  Limits limits;
  int http_threads = 64;           // connections served at once (others wait to be accepted)
  double heartbeat_seconds = 1.0;  // a silent stream writes this often: finds a client gone
};

class Server {
 public:
  // The batcher runs on its own thread from here until stop().
  Server(generation::Batcher& batcher, const data::Tokenizer* tokenizer,
         std::optional<data::FolderChatTemplate> chat, ServerOptions options);
  ~Server();
  // Binds host:port (0: any free port) and returns the port; listen() serves
  // until stop().
  int bind(const std::string& host, int port);
  void listen();
  void stop();

 private:
  void routes();
  void handle(const httplib::Request& req, httplib::Response& res, Endpoint e);
  std::vector<int64_t> prompt_ids(const Request& r) const;
  void engine();

  generation::Batcher& batcher_;
  const data::Tokenizer* tokenizer_;
  std::optional<data::FolderChatTemplate> chat_;
  ServerOptions options_;
  Metrics metrics_;
  httplib::Server http_;
  std::atomic<bool> running_{true};
  std::atomic<int64_t> next_id_{0};
  std::thread engine_;
};

}  // namespace redco::serve

// Prometheus text for /metrics (serve_metrics.hpp).
#include "serve_metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace redco::serve {

void Metrics::Window::add(double v) {
  if (values.size() < kWindow) {
    values.push_back(v);
  } else {
    values[next] = v;
    next = (next + 1) % kWindow;
  }
}

double Metrics::Window::quantile(double q) const {
  if (values.empty()) return 0;
  std::vector<double> sorted = values;
  const auto k = size_t(q * double(sorted.size() - 1) + 0.5);
  std::nth_element(sorted.begin(), sorted.begin() + int64_t(k), sorted.end());
  return sorted[k];
}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::latency(double first_token_s, double total_s, int64_t tokens) {
  std::lock_guard lock(mutex_);
  ttft_.add(first_token_s);
  total_.add(total_s);
  if (tokens > 1) per_token_.add((total_s - first_token_s) / double(tokens - 1));
}

void Metrics::batch_size(int64_t running) {
  std::lock_guard lock(mutex_);
  batch_.add(double(running));
  ++steps_;
}

std::string Metrics::text(const Gauges& g) const {
  std::lock_guard lock(mutex_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("redco_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("redco_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  metric("redco_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
  out += fmt::format("redco_prompt_tokens_total {}\n", g.prompt_tokens);
  metric("redco_prompt_tokens_reused_total", "counter",
         "Prompt tokens whose keys and values came from a shared prefix (not prefilled).");
  out += fmt::format("redco_prompt_tokens_reused_total {}\n", g.reused_tokens);
  metric("redco_generation_tokens_total", "counter", "Tokens generated.");
  out += fmt::format("redco_generation_tokens_total {}\n", g.generated_tokens);
  metric("redco_requests_running", "gauge", "Requests in the running batch.");
  out += fmt::format("redco_requests_running {}\n", g.running);
  metric("redco_requests_waiting", "gauge", "Requests queued for a free row.");
  out += fmt::format("redco_requests_waiting {}\n", g.waiting);
  metric("redco_kv_rows_free", "gauge", "KV cache rows free for new requests.");
  out += fmt::format("redco_kv_rows_free {}\n", g.free_rows);
  metric("redco_kv_blocks", "gauge", "Blocks in the paged KV cache's pool.");
  out += fmt::format("redco_kv_blocks {}\n", g.kv_blocks);
  metric("redco_kv_blocks_free", "gauge", "KV cache blocks no request or stored prompt holds.");
  out += fmt::format("redco_kv_blocks_free {}\n", g.kv_blocks_free);
  metric("redco_kv_blocks_stored", "gauge",
         "KV cache blocks held by stored prompts alone (given back when a request needs them).");
  out += fmt::format("redco_kv_blocks_stored {}\n", g.kv_blocks_stored);
  metric("redco_decode_steps_total", "counter", "Decode steps run.");
  out += fmt::format("redco_decode_steps_total {}\n", steps_);
  auto summary = [&](const char* name, const char* help, const Window& w) {
    metric(name, "summary", help);
    for (double q : {0.5, 0.9, 0.99})
      out += fmt::format("{}{{quantile=\"{}\"}} {:.6f}\n", name, q, w.quantile(q));
    out += fmt::format("{}_count {}\n", name, w.values.size());
  };
  summary("redco_time_to_first_token_seconds",
          "From a request's arrival to its first token (last 1024).", ttft_);
  summary("redco_request_latency_seconds", "From arrival to the last token (last 1024).", total_);
  summary("redco_time_per_output_token_seconds",
          "Between a request's tokens after the first (last 1024).", per_token_);
  summary("redco_batch_size", "Requests per decode step (last 1024 steps).", batch_);
  return out;
}

}  // namespace redco::serve

#pragma once
// What /metrics reports, in Prometheus' text format: request counts by
// endpoint and status, tokens in and out, the queue and the running batch,
// and latency quantiles (time to first token, whole request, per output
// token) over the last kWindow requests. Safe from any thread.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace redco::serve {

class Metrics {
 public:
  static constexpr size_t kWindow = 1024;

  void request_done(const std::string& endpoint, int status);
  // Seconds from arrival to the first token, to the end; tokens generated.
  void latency(double first_token_s, double total_s, int64_t tokens);
  void batch_size(int64_t running);  // once per decode step

  struct Gauges {
    int64_t running = 0, waiting = 0, free_rows = 0, prompt_tokens = 0, generated_tokens = 0,
            reused_tokens = 0, kv_blocks = 0, kv_blocks_free = 0, kv_blocks_stored = 0;
  };
  std::string text(const Gauges& g) const;

 private:
  struct Window {
    std::vector<double> values;
    size_t next = 0;
    void add(double v);
    double quantile(double q) const;  // over the window; 0 when empty
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  Window ttft_, total_, per_token_, batch_;
  int64_t steps_ = 0;
};

}  // namespace redco::serve

#pragma once
// Training logs on disk: `metrics.jsonl` (one JSON object per line, easy to
// load with pandas / jq) and TensorBoard event files, so `tensorboard
// --logdir workdir` shows the same curves.
//
//   io::MetricsLog log(workdir);
//   log.log(step, "train", {{"loss", 1.23}, {"lr", 3e-4}, {"tokens_per_s", 5.1e4}});
//   // metrics.jsonl: {"step": 12, "split": "train", "loss": 1.23, "lr": 0.0003, ...}
//   // events file:   scalars "train/loss", "train/lr", "train/tokens_per_s" at step 12
//
// Event files are TFRecord files of serialized tensorflow.Event protobufs.
// The few protobuf fields they need are encoded by hand here (see events.cpp
// for why), and the encoders are public so tests can check them byte for byte.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace redco::io {

// Named numbers in the order they are logged / printed.
using Metrics = std::vector<std::pair<std::string, double>>;

// Seconds since the Unix epoch, with sub-second resolution.
double unix_time();

// CRC-32C (Castagnoli), continuing from `crc` (0 to start): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The TFRecord checksum: crc32c rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// One TFRecord: uint64 length (LE), uint32 masked crc of those 8 bytes, the
// payload, uint32 masked crc of the payload.
std::string tfrecord_frame(std::string_view payload);

// Serialized tensorflow.Event messages. Zero-valued wall_time / step are left
// out, as a protobuf encoder does for proto3 scalars.
std::string encode_file_version_event(double wall_time);  // file_version "brain.Event:2"
std::string encode_scalar_event(std::string_view tag, int64_t step, float value, double wall_time);

// Writes `dir/events.out.tfevents.<unix-time>.<hostname>.redco`. Records are
// buffered in memory and written by flush() (and the destructor) with one
// write(2) each time, so a reader never sees half a record.
class EventWriter {
 public:
  explicit EventWriter(const std::filesystem::path& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Stored as a float32 simple_value, TensorBoard's scalar format.
  void scalar(std::string_view tag, int64_t step, double value, double wall_time);
  void scalar(std::string_view tag, int64_t step, double value) {
    scalar(tag, step, value, unix_time());
  }
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void append_record(std::string_view payload);

  std::filesystem::path path_;
  int fd_ = -1;
  std::string pending_;
};

// One metrics.jsonl line (without the newline): step, split, the metrics in
// order, then time. Numbers are written in the shortest form that reads back
// to the same double; NaN and infinities, which JSON cannot express, become
// null. Names and split are JSON-escaped.
std::string format_metrics_line(int64_t step, std::string_view split, const Metrics& metrics,
                                double time);

// Appends to `workdir/metrics.jsonl` (created with its directory if missing;
// an existing file is continued, so a resumed run keeps one history) and
// mirrors each metric to an EventWriter in `workdir` as "<split>/<name>".
// Every log() reaches the OS before it returns (one write(2) per file), so a
// crash loses at most the line being written.
class MetricsLog {
 public:
  explicit MetricsLog(const std::filesystem::path& workdir, bool tensorboard = true);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // `metrics` names must not be "step", "split" or "time" (those keys are the
  // line's own) and must be unique.
  void log(int64_t step, std::string_view split, const Metrics& metrics, double time);
  void log(int64_t step, std::string_view split, const Metrics& metrics) {
    log(step, split, metrics, unix_time());
  }

  const std::filesystem::path& path() const { return path_; }
  // nullptr when constructed with tensorboard = false.
  EventWriter* events() { return events_.get(); }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::unique_ptr<EventWriter> events_;
};

}  // namespace redco::io

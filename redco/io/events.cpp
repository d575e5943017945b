// Event files and metrics.jsonl.
//
// Why the protobuf is encoded by hand: an event file needs five fields of two
// messages (Event.wall_time/step/file_version/summary, Summary.Value.tag/
// simple_value), about forty lines below. Debian's libprotobuf-dev plus
// protoc would add a build dependency and a code-generation step to every
// project that builds redco as a subproject, for no extra capability; the
// test reads our files back with the real tensorboard package, which guards
// the encoding against drift.
//
// Why CRC-32C is written here: zlib only has the IEEE CRC-32, and Debian has
// no standard development package for the Castagnoli polynomial; the
// table-driven version is a dozen lines and runs far faster than we write.
#include "redco/io/events.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <type_traits>

#include "redco/core/error.hpp"

namespace redco::io {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  constexpr uint32_t kPoly = 0x82F63B78;  // Castagnoli polynomial, bit-reversed
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire format pieces (little-endian fixed, base-128 varints).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  static_assert(std::endian::native == std::endian::little, "event encoding assumes LE host");
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

// Field key: (field number << 3) | wire type.
enum Wire : uint8_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };
void put_key(std::string& out, int field, Wire w) { put_varint(out, (field << 3) | w); }

void put_bytes(std::string& out, int field, std::string_view s) {
  put_key(out, field, kBytes);
  put_varint(out, s.size());
  out.append(s);
}

// Event fields shared by every event kind.
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  if (wall_time != 0.0) {
    put_key(e, 1, kFixed64);
    put_fixed(e, wall_time);
  }
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // int64: negatives take ten bytes
  }
  return e;
}

void write_all(int fd, std::string_view data, const std::filesystem::path& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    REDCO_CHECK(n > 0, "writing {}: {}", path.string(), std::strerror(errno));
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);  // other control characters
    } else {
      out.push_back(c);  // UTF-8 passes through unchanged
    }
  }
  out.push_back('"');
}

int open_append(const std::filesystem::path& path, int extra_flags) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | extra_flags, 0644);
}

}  // namespace

double unix_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_fixed(out, static_cast<uint64_t>(payload.size()));
  put_fixed(out, masked_crc32c(out.data(), 8));
  out.append(payload);
  put_fixed(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

std::string encode_file_version_event(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string encode_scalar_event(std::string_view tag, int64_t step, float value, double wall_time) {
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);  // simple_value sits in a oneof, so 0.0 is written too
  put_fixed(v, value);
  std::string summary;
  put_bytes(summary, 1, v);  // Summary.value (repeated, one entry)
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

EventWriter::EventWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  REDCO_CHECK(!ec, "cannot create event directory {}: {}", dir.string(), ec.message());
  double now = unix_time();
  path_ =
      dir / fmt::format("events.out.tfevents.{}.{}.redco", static_cast<int64_t>(now), host_name());
  // A second writer in the same directory within the same second shares the
  // file instead of truncating it; whole-record appends keep it readable.
  fd_ = open_append(path_, O_EXCL);
  bool fresh = fd_ >= 0;
  if (!fresh && errno == EEXIST) fd_ = open_append(path_, 0);
  REDCO_CHECK(fd_ >= 0, "cannot open event file {}: {}", path_.string(), std::strerror(errno));
  if (fresh) {
    append_record(encode_file_version_event(now));
    flush();
  }
}

EventWriter::~EventWriter() {
  try {
    flush();
  } catch (const Error&) {
    // A destructor must not throw; the failure was already unrecoverable.
  }
  ::close(fd_);
}

void EventWriter::append_record(std::string_view payload) { pending_ += tfrecord_frame(payload); }

void EventWriter::scalar(std::string_view tag, int64_t step, double value, double wall_time) {
  append_record(encode_scalar_event(tag, step, static_cast<float>(value), wall_time));
}

void EventWriter::flush() {
  if (pending_.empty()) return;
  std::string data;
  data.swap(pending_);
  write_all(fd_, data, path_);
}

std::string format_metrics_line(int64_t step, std::string_view split, const Metrics& metrics,
                                double time) {
  std::string out = fmt::format("{{\"step\": {}, \"split\": ", step);
  append_json_string(out, split);
  for (const auto& [name, value] : metrics) {
    out += ", ";
    append_json_string(out, name);
    // fmt's default is the shortest round-trip form: 0.0003, 1e-05, 1.23.
    out += std::isfinite(value) ? fmt::format(": {}", value) : std::string(": null");
  }
  out += fmt::format(", \"time\": {:.3f}}}", time);
  return out;
}

MetricsLog::MetricsLog(const std::filesystem::path& workdir, bool tensorboard) {
  std::error_code ec;
  std::filesystem::create_directories(workdir, ec);
  REDCO_CHECK(!ec, "cannot create workdir {}: {}", workdir.string(), ec.message());
  path_ = workdir / "metrics.jsonl";
  fd_ = open_append(path_, 0);
  REDCO_CHECK(fd_ >= 0, "cannot open {}: {}", path_.string(), std::strerror(errno));
  if (tensorboard) events_ = std::make_unique<EventWriter>(workdir);
}

MetricsLog::~MetricsLog() { ::close(fd_); }

void MetricsLog::log(int64_t step, std::string_view split, const Metrics& metrics, double time) {
  std::set<std::string_view> seen;
  for (const auto& m : metrics) {
    REDCO_CHECK(m.first != "step" && m.first != "split" && m.first != "time",
                "metric name '{}' is reserved in metrics.jsonl; rename it", m.first);
    REDCO_CHECK(seen.insert(m.first).second, "metric '{}' logged twice in one line", m.first);
  }
  write_all(fd_, format_metrics_line(step, split, metrics, time) + "\n", path_);
  if (!events_) return;
  for (const auto& [name, value] : metrics) {
    events_->scalar(fmt::format("{}/{}", split, name), step, value, time);
  }
  events_->flush();
}

}  // namespace redco::io

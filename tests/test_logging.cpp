// Event files, metrics.jsonl and the console progress bar. The event encoding
// is checked three ways: golden bytes derived by hand from the protobuf wire
// format, a small TFRecord reader here that verifies both CRCs, and the real
// tensorboard package reading the files (tests/python/read_events.py).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "redco/core/allocator.hpp"
#include "redco/core/error.hpp"
#include "redco/io/console.hpp"
#include "redco/io/events.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;
using namespace redco;

namespace {

// A fresh directory under the system temp dir, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("redco_test_logging_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string bytes(std::initializer_list<unsigned> b) {
  std::string s;
  for (unsigned x : b) s.push_back(static_cast<char>(x));
  return s;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

uint64_t load_le(const std::string& s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// An independent TFRecord reader: payloads, after checking both masked CRCs.
std::vector<std::string> read_tfrecords(const fs::path& p) {
  std::string data = slurp(p);
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < data.size()) {
    REQUIRE(data.size() - pos >= 12);
    uint64_t len = load_le(data, pos, 8);
    REQUIRE(load_le(data, pos + 8, 4) == io::masked_crc32c(data.data() + pos, 8));
    REQUIRE(data.size() - pos - 12 >= len + 4);
    std::string payload = data.substr(pos + 12, len);
    REQUIRE(load_le(data, pos + 12 + len, 4) == io::masked_crc32c(payload.data(), len));
    out.push_back(payload);
    pos += 12 + len + 4;
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A flat JSON object of numbers, nulls and strings, as metrics.jsonl holds:
// values are kept as their source text, strings unescaped.
std::map<std::string, std::string> parse_flat_json(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < line.size() && line[i] == ' ') ++i;
  };
  auto parse_string = [&] {
    REQUIRE(line.at(i) == '"');
    std::string s;
    for (++i; line.at(i) != '"'; ++i) {
      if (line[i] != '\\') {
        s.push_back(line[i]);
        continue;
      }
      char e = line.at(++i);
      if (e == 'u') {
        s.push_back(static_cast<char>(std::stoi(line.substr(i + 1, 4), nullptr, 16)));
        i += 4;
      } else {
        s.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
      }
    }
    ++i;
    return s;
  };
  REQUIRE(line.at(i++) == '{');
  while (true) {
    skip_ws();
    std::string key = parse_string();
    REQUIRE(line.at(i++) == ':');
    skip_ws();
    std::string value;
    if (line.at(i) == '"') {
      value = parse_string();
    } else {
      while (line.at(i) != ',' && line.at(i) != '}') value.push_back(line[i++]);
    }
    REQUIRE(out.emplace(key, value).second);
    if (line.at(i++) == '}') break;
  }
  REQUIRE(i == line.size());
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The checkout this test was built from: REDCO_ROOT, else derived from
// __FILE__, which Meson passes relative to the build directory.
fs::path repo_root() {
  if (const char* r = std::getenv("REDCO_ROOT")) return r;
  fs::path file = __FILE__;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe").parent_path();
  for (const fs::path& base : {fs::current_path(), exe_dir, exe_dir.parent_path()}) {
    fs::path candidate = file.is_absolute() ? file : base / file;
    if (fs::exists(candidate)) return fs::canonical(candidate).parent_path().parent_path();
  }
  FAIL("cannot locate the redco checkout from " << file << "; set REDCO_ROOT");
  return {};
}

// Runs a command, returning its stdout and exit status.
std::pair<std::string, int> run_command(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli test vectors", "[logging][crc]") {
  std::string digits = "123456789";
  std::string zeros(32, '\0'), ones(32, '\xff');
  CHECK(io::crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(io::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(io::crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(io::crc32c(nullptr, 0) == 0u);
  // Continuing from a previous value equals checksumming the concatenation.
  CHECK(io::crc32c(digits.data() + 4, 5, io::crc32c(digits.data(), 4)) == 0xE3069283u);
  // Masked: rotate right by 15, add 0xa282ead8 (values from TensorFlow's formula).
  CHECK(io::masked_crc32c(digits.data(), digits.size()) == 0xC78AB0E5u);
  CHECK(io::masked_crc32c(zeros.data(), zeros.size()) == 0x0FD7FFFAu);
  CHECK(io::masked_crc32c(ones.data(), ones.size()) == 0xF909B029u);
}

TEST_CASE("Event protobufs are encoded byte for byte", "[logging][events]") {
  // Event{wall_time: 2.0, step: 300, summary{value{tag: "loss", simple_value: 1.5}}}
  // One protobuf field per line:
  // clang-format off
  std::string want = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40,  // 1: double 2.0
                            0x10, 0xac, 0x02,                  // 2: varint 300
                            0x2a, 0x0d,                        // 5: Summary, 13 bytes
                            0x0a, 0x0b,                        //   1: Value, 11 bytes
                            0x0a, 0x04, 'l', 'o', 's', 's',    //     1: tag
                            0x15, 0x00, 0x00, 0xc0, 0x3f});    //     2: float 1.5
  // clang-format on
  CHECK(io::encode_scalar_event("loss", 300, 1.5f, 2.0) == want);

  // Zero wall_time is omitted like any proto3 default; a negative int64 step
  // takes ten varint bytes; simple_value 0 is still written (it is in a oneof).
  std::string neg =
      bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x2a, 0x0c,
             0x0a, 0x0a, 0x0a, 0x03, 'a',  '/',  'b',  0x15, 0,    0,    0,    0});
  CHECK(io::encode_scalar_event("a/b", -1, 0.f, 0.0) == neg);

  std::string version = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 0x0d}) + "brain.Event:2";
  CHECK(io::encode_file_version_event(1.5) == version);
}

TEST_CASE("tfrecord_frame lays out length, masked CRCs and payload", "[logging][events]") {
  std::string payload = io::encode_scalar_event("loss", 300, 1.5f, 2.0);
  std::string framed = io::tfrecord_frame(payload);
  REQUIRE(framed.size() == 8 + 4 + 27 + 4);
  CHECK(framed.substr(0, 8) == bytes({27, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(load_le(framed, 8, 4) == 0x139E0D1Au);  // masked crc32c of the length bytes
  CHECK(framed.substr(12, 27) == payload);
  CHECK(load_le(framed, 39, 4) == io::masked_crc32c(payload.data(), payload.size()));
}

TEST_CASE("EventWriter writes a TensorBoard-named TFRecord file", "[logging][events]") {
  TempDir tmp;
  fs::path dir = tmp.path / "run";  // created by the writer
  double before = io::unix_time();
  fs::path path;
  {
    io::EventWriter w(dir);
    path = w.path();
    w.scalar("train/loss", 1, 2.5, 100.0);
    w.scalar("train/loss", 2, 2.25, 101.0);
    w.flush();
    w.scalar("eval/acc", 2, 0.75, 102.0);  // written by the destructor
  }
  double after = io::unix_time();
  std::string name = path.filename().string();
  CHECK(path.parent_path() == dir);
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > 6);
  CHECK(name.substr(name.size() - 6) == ".redco");

  std::vector<std::string> records = read_tfrecords(path);
  REQUIRE(records.size() == 4);
  // file_version event: 0x09 + wall_time + field 3.
  REQUIRE(records[0].size() == 9 + 2 + 13);
  CHECK(records[0][0] == '\x09');
  CHECK(records[0].substr(9) == bytes({0x1a, 0x0d}) + "brain.Event:2");
  double wall;
  std::memcpy(&wall, records[0].data() + 1, 8);
  CHECK(wall >= std::floor(before));
  CHECK(wall <= after);
  CHECK(records[1] == io::encode_scalar_event("train/loss", 1, 2.5f, 100.0));
  CHECK(records[2] == io::encode_scalar_event("train/loss", 2, 2.25f, 101.0));
  CHECK(records[3] == io::encode_scalar_event("eval/acc", 2, 0.75f, 102.0));

  // Two writers opened within one second share the file name: the second
  // appends to the first's file (without a second header) instead of truncating it.
  fs::path shared = tmp.path / "shared";
  {
    io::EventWriter a(shared), b(shared);
    a.scalar("x", 1, 1.0, 1.0);
    b.scalar("x", 2, 2.0, 2.0);
  }
  std::vector<fs::path> files = event_files(shared);
  size_t total = 0;
  for (const auto& f : files) {
    std::vector<std::string> r = read_tfrecords(f);
    CHECK(r.at(0).find("brain.Event:2") != std::string::npos);
    total += r.size();
  }
  CHECK(total == files.size() + 2);
}

TEST_CASE("format_metrics_line writes exact numbers and escaped strings", "[logging][metrics]") {
  io::Metrics m = {{"loss", 1.23}, {"lr", 3e-4}, {"tokens_per_s", 51234.5}, {"n", 7}};
  CHECK(io::format_metrics_line(12, "train", m, 1700000000.25) ==
        R"({"step": 12, "split": "train", "loss": 1.23, "lr": 0.0003, )"
        R"("tokens_per_s": 51234.5, "n": 7, "time": 1700000000.250})");
  // Shortest round-trip form: the text reads back to the identical double.
  double third = 1.0 / 3.0;
  auto parsed = parse_flat_json(io::format_metrics_line(-3, "x", {{"v", third}}, 0));
  CHECK(std::stod(parsed.at("v")) == third);
  CHECK(parsed.at("step") == "-3");

  std::string odd = io::format_metrics_line(
      1, "a\"b\\c\n", {{"tab\tname\x01", 1e-5}, {"bad", NAN}, {"inf", -INFINITY}}, 2.0);
  CHECK(odd ==
        "{\"step\": 1, \"split\": \"a\\\"b\\\\c\\n\", \"tab\\tname\\u0001\": 1e-05, "
        "\"bad\": null, \"inf\": null, \"time\": 2.000}");
  auto back = parse_flat_json(odd);
  CHECK(back.at("split") == "a\"b\\c\n");
  CHECK(back.count("tab\tname\x01") == 1);
}

TEST_CASE("MetricsLog appends lines, resumes and mirrors to TensorBoard", "[logging][metrics]") {
  TempDir tmp;
  {
    io::MetricsLog log(tmp.path);
    log.log(1, "train", {{"loss", 2.5}, {"lr", 3e-4}}, 1000.0);
    // Visible on disk before the log is closed: a crash loses nothing written.
    CHECK(lines_of(slurp(tmp.path / "metrics.jsonl")).size() == 1);
    log.log(2, "train", {{"loss", 2.25}, {"lr", 2.5e-4}}, 1001.0);
    CHECK_THROWS_AS(log.log(3, "train", {{"step", 1.0}}), Error);
    CHECK_THROWS_AS(log.log(3, "train", {{"loss", 1.0}, {"loss", 2.0}}), Error);
  }
  {
    io::MetricsLog resumed(tmp.path);
    resumed.log(2, "eval", {{"loss", 2.125}}, 1002.0);
  }
  std::vector<std::string> lines = lines_of(slurp(tmp.path / "metrics.jsonl"));
  REQUIRE(lines.size() == 3);  // the rejected calls wrote nothing
  auto l0 = parse_flat_json(lines[0]);
  CHECK(l0.at("step") == "1");
  CHECK(l0.at("split") == "train");
  CHECK(std::stod(l0.at("loss")) == 2.5);
  CHECK(std::stod(l0.at("lr")) == 3e-4);
  CHECK(std::stod(l0.at("time")) == 1000.0);
  auto l2 = parse_flat_json(lines[2]);
  CHECK(l2.at("split") == "eval");
  CHECK(std::stod(l2.at("loss")) == 2.125);

  // Every numeric field became a "<split>/<name>" scalar at its step.
  std::multiset<std::string> got, want;
  for (const auto& f : event_files(tmp.path)) {
    for (const auto& r : read_tfrecords(f)) got.insert(r);
  }
  using Scalar = std::tuple<const char*, int64_t, double, double>;  // tag, step, value, time
  for (auto [tag, step, v, t] : std::vector<Scalar>{{"train/loss", 1, 2.5, 1000.0},
                                                    {"train/lr", 1, 3e-4, 1000.0},
                                                    {"train/loss", 2, 2.25, 1001.0},
                                                    {"train/lr", 2, 2.5e-4, 1001.0},
                                                    {"eval/loss", 2, 2.125, 1002.0}}) {
    std::string e = io::encode_scalar_event(tag, step, static_cast<float>(v), t);
    CHECK(got.count(e) == 1);
    want.insert(e);
  }
  CHECK(got.size() == want.size() + event_files(tmp.path).size());  // plus file_version events

  io::MetricsLog plain(tmp.path / "no_tb", false);
  CHECK(plain.events() == nullptr);
  plain.log(1, "train", {{"loss", 1.0}});
  CHECK(event_files(tmp.path / "no_tb").empty());
}

TEST_CASE("the tensorboard package reads our event files", "[logging][python]") {
  fs::path root = repo_root();
  const fs::path python = test::python_or_skip(root, "tensorboard");
  TempDir tmp;
  {
    io::MetricsLog log(tmp.path);
    log.log(1, "train", {{"loss", 2.5}, {"lr", 3e-4}});
    log.log(2, "train", {{"loss", 2.25}, {"lr", 2.5e-4}, {"grad_norm", NAN}});
    log.log(2, "eval", {{"loss", 2.125}, {"accuracy", 0.75}});
    log.events()->scalar("custom/zero", 7, 0.0);
  }
  auto [out, rc] =
      run_command(python.string() + " " + (root / "tests" / "python" / "read_events.py").string() +
                  " " + tmp.path.string());
  INFO("read_events.py output:\n" << out);
  REQUIRE(rc == 0);
  std::vector<std::string> lines = lines_of(out);
  std::set<std::string> set(lines.begin(), lines.end());
  CHECK(set.count("file_version 2") == 1);
  CHECK(set.count("metrics_lines 3") == 1);
  for (const char* want :
       {"scalar train/loss 1 2.5", "scalar train/loss 2 2.25", "scalar train/lr 1 0.000300000014",
        "scalar train/lr 2 0.000250000012", "scalar eval/loss 2 2.125",
        "scalar eval/accuracy 2 0.75", "scalar train/grad_norm 2 nan", "scalar custom/zero 7 0"}) {
    CHECK(set.count(want) == 1);
  }
  int records = 0;
  for (const auto& l : lines) {
    if (l.rfind("records ", 0) == 0) records += std::stoi(l.substr(l.rfind(' ') + 1));
  }
  CHECK(records == 8 + static_cast<int>(event_files(tmp.path).size()));
}

TEST_CASE("console number formats", "[logging][console]") {
  CHECK(io::format_value(1.23456) == "1.235");
  CHECK(io::format_value(0.012345) == "0.01235");
  CHECK(io::format_value(123.456) == "123.5");
  CHECK(io::format_value(123456.7) == "123457");
  CHECK(io::format_value(3e-4) == "3.0e-04");
  CHECK(io::format_value(2.5e7) == "2.5e+07");
  CHECK(io::format_value(-2.5) == "-2.500");
  CHECK(io::format_value(0.5) == "0.5000");
  CHECK(io::format_value(0) == "0");
  CHECK(io::format_value(NAN) == "nan");
  CHECK(io::format_value(-INFINITY) == "-inf");

  CHECK(io::format_si(950) == "950");
  CHECK(io::format_si(999.7) == "1.00k");
  CHECK(io::format_si(12345) == "12.3k");
  CHECK(io::format_si(1.2e6) == "1.20M");
  CHECK(io::format_si(3.5e9) == "3.50G");
  CHECK(io::format_si(0.5) == "0.50");

  CHECK(io::format_duration(83) == "1:23");
  CHECK(io::format_duration(0.4) == "0:00");
  CHECK(io::format_duration(3600 + 62) == "1:01:02");
  CHECK(io::format_duration(-1) == "?");
  CHECK(io::format_duration(INFINITY) == "?");
}

TEST_CASE("ProgressBar prints plain lines every N steps off a terminal", "[logging][console]") {
  std::ostringstream out;
  double now = 0;
  io::ProgressOptions opt;
  opt.out = &out;
  opt.interactive = false;
  opt.plain_every = 25;
  opt.bar_width = 10;
  opt.clock = [&] { return now; };
  {
    io::ProgressBar bar(100, "train", opt);
    for (int64_t step = 1; step <= 60; ++step) {
      now = static_cast<double>(step);  // one step per second, 1000 tokens each
      bar.update(step, {{"loss", 3.0 - step / 40.0}, {"lr", 3e-4}}, 1000, "tok");
      if (step == 30) bar.print_line("eval  loss 2.100");
    }
    bar.finish();
    bar.update(61, {});  // ignored after finish
  }
  std::vector<std::string> lines = lines_of(out.str());
  REQUIRE(lines.size() == 5);
  // The first update is printed (so a log shows the run started) but has no rate yet.
  CHECK(lines[0] == "train  1/100 [..........] loss 2.975 lr 3.0e-04");
  CHECK(lines[1] == "train  25/100 [##........] loss 2.375 lr 3.0e-04 1.00k tok/s ETA 1:15");
  CHECK(lines[2] == "eval  loss 2.100");
  CHECK(lines[3] == "train  50/100 [#####.....] loss 1.750 lr 3.0e-04 1.00k tok/s ETA 0:50");
  CHECK(lines[4] == "train  60/100 [######....] loss 1.500 lr 3.0e-04 1.00k tok/s ETA 0:40");
  CHECK(out.str().find('\r') == std::string::npos);
}

TEST_CASE("ProgressBar shows elapsed time at the end and steps/s without items",
          "[logging][console]") {
  std::ostringstream out;
  double now = 5;
  io::ProgressOptions opt;
  opt.out = &out;
  opt.interactive = false;
  opt.bar_width = 4;
  opt.clock = [&] { return now; };
  io::ProgressBar bar(40, "", opt);  // auto interval: 40 / 20 = every 2 steps
  for (int64_t step = 1; step <= 40; ++step) {
    now = 5 + 0.5 * static_cast<double>(step);
    bar.update(step);
  }
  bar.finish();  // the last step was already printed: nothing more
  std::vector<std::string> lines = lines_of(out.str());
  REQUIRE(lines.size() == 21);
  CHECK(lines[1] == "2/40 [....] 2.00 it/s ETA 0:19");
  CHECK(lines[20] == "40/40 [####] 2.00 it/s elapsed 0:20");

  std::ostringstream unknown_out;
  opt.out = &unknown_out;
  opt.plain_every = 3;
  io::ProgressBar unknown(0, "data", opt);
  now = 0;
  unknown.update(3, {{"shards", 2}});
  now = 1;
  unknown.update(6, {{"shards", 4}}, 10, "ex");
  unknown.finish();
  CHECK(unknown_out.str() == "data  3 shards 2.000\ndata  6 shards 4.000 30.0 ex/s\n");
}

TEST_CASE("ProgressBar redraws in place at most every min_redraw_s", "[logging][console]") {
  std::ostringstream out;
  double now = 0;
  io::ProgressOptions opt;
  opt.out = &out;
  opt.interactive = true;
  opt.bar_width = 5;
  opt.clock = [&] { return now; };
  io::ProgressBar bar(10, "fit", opt);
  bar.update(1, {{"loss", 2.0}});
  now = 0.05;
  bar.update(2, {{"loss", 1.5}});  // too soon after the last draw: skipped
  now = 0.2;
  bar.update(3, {{"loss", 1.0}});
  bar.print_line("eval  loss 0.900");
  now = 0.25;
  bar.update(4, {{"loss", 0.5}});  // skipped, but finish() shows it
  bar.finish();
  std::string clear = "\x1b[K";
  std::string want = "\rfit  1/10 [.....] loss 2.000" + clear +
                     "\rfit  3/10 [#....] loss 1.000 10.0 it/s ETA 0:01" + clear + "\r" + clear +
                     "eval  loss 0.900\n" +  // the bar is cleared, then redrawn
                     "\rfit  3/10 [#....] loss 1.000 10.0 it/s ETA 0:01" + clear +
                     "\rfit  4/10 [##...] loss 0.5000 12.0 it/s ETA 0:01" + clear + "\n";
  CHECK(out.str() == want);
  bar.print_line("after");  // no bar on screen any more: printed as is
  CHECK(out.str() == want + "after\n");
}

TEST_CASE("StepStats reports throughput, MFU and peak memory", "[logging][console]") {
  io::StepStats s;
  s.seconds = 0.5;
  s.items = 4096;
  CHECK(s.items_per_s() == 8192.0);
  s.flops_per_item = 6e6;
  CHECK_FALSE(s.mfu().has_value());  // no peak given: no MFU
  s.peak_flops = 1e11;
  REQUIRE(s.mfu().has_value());
  CHECK(*s.mfu() == Approx(8192.0 * 6e6 / 1e11));

  size_t cap = 0;
  void* block = CachingAllocator::cpu().allocate(8 << 20, &cap);
  io::Metrics m;
  s.append_to(m, "tokens");
  CachingAllocator::cpu().deallocate(block, cap);
  REQUIRE(m.size() == 4);
  CHECK(m[0].first == "tokens_per_s");
  CHECK(m[0].second == 8192.0);
  CHECK(m[1].first == "mfu");
  CHECK(m[2].first == "alloc_peak_mib");
  CHECK(m[2].second >= 8.0);  // the 8 MiB block above was in use
  CHECK(m[3].first == "max_rss_mib");
  CHECK(m[3].second > 1.0);

  io::MemoryStats mem = io::memory_stats();
  CHECK(mem.allocator_peak_bytes >= cap);
  CHECK(mem.max_rss_bytes > 0);

  io::Metrics quiet;
  io::StepStats{1.0, 10, 0, 0}.append_to(quiet, "examples", false);
  REQUIRE(quiet.size() == 1);
  CHECK(quiet[0] == std::pair<std::string, double>{"examples_per_s", 10.0});

  io::StepTimer timer;
  CHECK(timer.lap() >= 0.0);
}

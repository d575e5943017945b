#include "redco/io/checkpoint.hpp"

#include <fcntl.h>
#include <rapidjson/document.h>
#include <rapidjson/encodedstream.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "redco/io/json.hpp"

// rapidjson's member iterators predate C++20's reversed comparison operators;
// clang warns on every loop over them although the call is unambiguous.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wambiguous-reversed-operator"
#endif

namespace redco::io {
namespace fs = std::filesystem;

// ---- io::Json (declared in json.hpp) ------------------------------------------
// Defined here, next to state.json, its reason to exist, so that rapidjson is
// included by .cpp files only.

namespace {

constexpr int kMaxJsonDepth = 256;

template <typename Writer>
void write_json(Writer& w, const Json& j) {
  switch (j.kind()) {
    case Json::Kind::null:
      w.Null();
      return;
    case Json::Kind::boolean:
      w.Bool(j.as_bool());
      return;
    case Json::Kind::integer:
      if (j.as_double() < 0) {
        w.Int64(j.as_int());
      } else {
        w.Uint64(j.as_uint());
      }
      return;
    case Json::Kind::real:
      w.Double(j.as_double());
      return;
    case Json::Kind::string: {
      const std::string& s = j.as_string();
      if (!w.String(s.data(), rapidjson::SizeType(s.size())))
        fail("JSON string '{}' is not valid UTF-8", s);
      return;
    }
    case Json::Kind::array:
      w.StartArray();
      for (const Json& x : j.as_array()) write_json(w, x);
      w.EndArray();
      return;
    case Json::Kind::object:
      w.StartObject();
      for (const auto& [k, v] : j.as_object()) {
        if (!w.Key(k.data(), rapidjson::SizeType(k.size())))
          fail("JSON key '{}' is not valid UTF-8", k);
        write_json(w, v);
      }
      w.EndObject();
      return;
  }
}

// NaN and infinities are written (as NaN, Infinity, -Infinity); invalid UTF-8 is refused.
using CompactWriter =
    rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                      rapidjson::CrtAllocator,
                      rapidjson::kWriteValidateEncodingFlag | rapidjson::kWriteNanAndInfFlag>;

std::string compact(const Json& j) {
  rapidjson::StringBuffer buf;
  CompactWriter w(buf);
  write_json(w, j);
  return std::string(buf.GetString(), buf.GetSize());
}

// rapidjson 1.1's PrettyWriter drops the writer flags (so it would refuse
// NaN), hence this small indenting printer over compact leaves.
void dump_pretty(const Json& j, int depth, std::string& out) {
  if (j.size() == 0) {
    out += compact(j);
    return;
  }
  const std::string inner(2 * (depth + 1), ' ');
  bool first = true;
  auto next = [&] {
    out += first ? "\n" : ",\n";
    out += inner;
    first = false;
  };
  if (j.is_array()) {
    out += '[';
    for (const Json& x : j.as_array()) {
      next();
      dump_pretty(x, depth + 1, out);
    }
  } else {
    out += '{';
    for (const auto& [k, v] : j.as_object()) {
      next();
      out += compact(Json(k)) + ": ";
      dump_pretty(v, depth + 1, out);
    }
  }
  out += '\n' + std::string(2 * depth, ' ') + (j.is_array() ? ']' : '}');
}

}  // namespace

namespace {

// A JSON number from its text: an integer when it is one and fits 64 bits,
// else the correctly rounded double (std::from_chars). rapidjson 1.1's own
// full-precision conversion has undefined behaviour on inputs such as 0e92
// (clz of 0, then a shift by a garbage amount; found by
// tests/fuzz/fuzz_state_json.cpp), so numbers reach us as text.
Json json_number(std::string_view t, std::string_view source) {
  const char *b = t.data(), *e = b + t.size();
  if (t.find_first_of(".eEnNIi") == std::string_view::npos) {
    int64_t i = 0;
    if (auto [p, ec] = std::from_chars(b, e, i); ec == std::errc() && p == e) return i;
    uint64_t u = 0;
    if (auto [p, ec] = std::from_chars(b, e, u); ec == std::errc() && p == e) return u;
  }
  double d = 0;
  const auto [p, ec] = std::from_chars(b, e, d);
  if (ec == std::errc::result_out_of_range && p == e) {
    // Too small for a double rounds to zero; too large is an error, as in rapidjson.
    const size_t x = t.find_first_of("eE");
    if (x != std::string_view::npos && x + 1 < t.size() && t[x + 1] == '-')
      return t.front() == '-' ? -0.0 : 0.0;
    fail("{}: the JSON number {} is too large for a double", source, t);
  }
  if (ec != std::errc() || p != e) fail("{}: '{}' is not a JSON number", source, t);
  return d;
}

// Whether a decoded string is valid UTF-8. The parser checks the raw bytes,
// but a \u escape of a lone UTF-16 surrogate (\udc00) decodes to bytes that
// are not a character; such a document could not be written back (found by
// tests/fuzz/fuzz_state_json.cpp).
bool valid_utf8(const char* s, size_t n) {
  rapidjson::MemoryStream in(s, n);
  rapidjson::GenericStringBuffer<rapidjson::UTF8<>> copy;  // Validate copies what it reads
  while (in.Tell() < n)
    if (!rapidjson::UTF8<>::Validate(in, copy)) return false;
  return true;
}

// Builds a Json from rapidjson's SAX events (numbers as text, see json_number).
struct JsonBuilder {
  std::string_view source;
  std::vector<Json> open;         // containers not yet closed, innermost last
  std::vector<std::string> keys;  // the pending key of each open container
  Json root;

  bool add(Json v) {
    if (open.empty()) return root = std::move(v), true;
    Json& top = open.back();
    if (top.is_array()) return top.push_back(std::move(v)), true;
    Json::Object& o = top.as_object();
    if (o.count(keys.back())) fail("{}: JSON object has the key '{}' twice", source, keys.back());
    o.emplace(std::move(keys.back()), std::move(v));
    return true;
  }
  bool start(Json container) {
    if (int(open.size()) >= kMaxJsonDepth)
      fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    open.push_back(std::move(container));
    keys.emplace_back();
    return true;
  }
  bool end() {
    Json v = std::move(open.back());
    open.pop_back();
    keys.pop_back();
    return add(std::move(v));
  }
  bool Null() { return add(nullptr); }
  bool Bool(bool b) { return add(b); }
  bool Int(int i) { return add(i); }
  bool Uint(unsigned u) { return add(u); }
  bool Int64(int64_t i) { return add(i); }
  bool Uint64(uint64_t u) { return add(u); }
  bool Double(double d) { return add(d); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    return add(json_number({s, n}, source));
  }
  void check_text(const char* s, rapidjson::SizeType n) const {
    if (!valid_utf8(s, n))
      fail(
          "{}: the JSON string '{}' holds a \\u escape that is no character (a lone UTF-16 "
          "surrogate)",
          source, std::string_view(s, n));
  }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    check_text(s, n);
    return add(std::string(s, n));
  }
  bool StartObject() { return start(Json::object()); }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    check_text(s, n);
    return keys.back().assign(s, n), true;
  }
  bool EndObject(rapidjson::SizeType) { return end(); }
  bool StartArray() { return start(Json::array()); }
  bool EndArray(rapidjson::SizeType) { return end(); }
};

}  // namespace

Json Json::parse(std::string_view text, std::string_view source) {
  constexpr unsigned kFlags = rapidjson::kParseValidateEncodingFlag |
                              rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                              rapidjson::kParseNumbersAsStringsFlag;
  rapidjson::Reader reader;
  rapidjson::MemoryStream bytes(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(bytes);
  JsonBuilder builder{source, {}, {}, {}};
  const rapidjson::ParseResult ok = reader.Parse<kFlags>(in, builder);
  if (!ok)
    fail("{}: invalid JSON at byte {}: {}", source, ok.Offset(),
         rapidjson::GetParseError_En(ok.Code()));
  return std::move(builder.root);
}

std::string Json::dump(bool pretty) const {
  if (!pretty) return compact(*this);
  std::string out;
  dump_pretty(*this, 0, out);
  return out;
}

const char* Json::kind_name(Kind k) {
  constexpr const char* kNames[] = {"null",   "bool",  "integer", "number",
                                    "string", "array", "object"};
  return kNames[int(k)];
}

void Json::wrong_kind(const char* wanted) const {
  fail("JSON: expected {}, got {}", wanted, kind_name(kind()));
}

bool Json::as_bool() const {
  if (!is_bool()) wrong_kind("a bool");
  return std::get<bool>(v_);
}

int64_t Json::as_int() const {
  if (const auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v_)) fail("JSON: {} does not fit an int64", *u);
  wrong_kind("an integer");
}

uint64_t Json::as_uint() const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v_)) {
    if (*i < 0) fail("JSON: expected a non-negative integer, got {}", *i);
    return uint64_t(*i);
  }
  wrong_kind("an integer");
}

double Json::as_double() const {
  if (const auto* d = std::get_if<double>(&v_)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v_)) return double(*i);
  if (const auto* u = std::get_if<uint64_t>(&v_)) return double(*u);
  wrong_kind("a number");
}

const std::string& Json::as_string() const {
  if (!is_string()) wrong_kind("a string");
  return std::get<std::string>(v_);
}

const Json::Array& Json::as_array() const {
  if (!is_array()) wrong_kind("an array");
  return std::get<Array>(v_);
}

Json::Array& Json::as_array() {
  if (!is_array()) wrong_kind("an array");
  return std::get<Array>(v_);
}

const Json::Object& Json::as_object() const {
  if (!is_object()) wrong_kind("an object");
  return std::get<Object>(v_);
}

Json::Object& Json::as_object() {
  if (!is_object()) wrong_kind("an object");
  return std::get<Object>(v_);
}

bool Json::contains(std::string_view key) const {
  return is_object() && as_object().find(key) != as_object().end();
}

const Json& Json::at(std::string_view key) const {
  const auto it = as_object().find(key);
  if (it == as_object().end()) fail("JSON: the object has no key '{}'", key);
  return it->second;
}

Json& Json::operator[](std::string_view key) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  auto it = o.find(key);
  if (it == o.end()) it = o.emplace(std::string(key), Json()).first;
  return it->second;
}

const Json& Json::at(size_t i) const {
  const Array& a = as_array();
  if (i >= a.size()) fail("JSON: index {} is out of range for an array of {}", i, a.size());
  return a[i];
}

void Json::push_back(Json v) {
  if (is_null()) v_ = Array{};
  as_array().push_back(std::move(v));
}

size_t Json::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  return 0;
}

// ---- checkpoints --------------------------------------------------------------

namespace {

constexpr const char* kParams = kCheckpointParams;
constexpr const char* kOptState = kCheckpointOptState;
constexpr const char* kState = kCheckpointState;
constexpr size_t kSuffixLen = 12;  // hex digits after ".tmp-" / ".old-"

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ uint64_t(::getpid()) << 32};
  return fmt::format("{:012x}", rng() & 0xffffffffffffull);
}

fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : "."; }

fs::path with_suffix(const fs::path& p, std::string_view tag) {
  fs::path out = p;
  out += fmt::format("{}{}", tag, random_suffix());
  return out;
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", from.string(), to.string(), std::strerror(errno));
}

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {kParams, kOptState, kState})
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

// Deletes a folder so that no crash can leave a half-deleted folder under
// its original name: rename to a ".tmp-" name first, then delete.
void discard(const fs::path& dir) {
  const fs::path doomed = with_suffix(dir, ".tmp-");
  rename_or_fail(dir, doomed);
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (ec) fail("cannot delete '{}': {}", doomed.string(), ec.message());
}

fs::path make_temp_dir(const fs::path& dir) {
  for (int attempt = 0;; ++attempt) {
    const fs::path tmp = with_suffix(dir, ".tmp-");
    if (::mkdir(tmp.c_str(), 0777) == 0) return tmp;
    if (errno != EEXIST || attempt > 100)
      fail("cannot create folder '{}': {}", tmp.string(), std::strerror(errno));
  }
}

// Makes the finished folder `tmp` the checkpoint `dir` (see the header).
void publish(const fs::path& tmp, const fs::path& dir) {
  const fs::path parent = parent_of(dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    rename_or_fail(tmp, dir);
    fsync_directory(parent);
    return;
  }
  if (!fs::is_directory(dir, ec)) fail("'{}' exists and is not a folder", dir.string());
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_directory(parent);
    fs::remove_all(tmp, ec);  // the previous checkpoint, now under the temporary name
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    fail("cannot swap '{}' and '{}': {}", tmp.string(), dir.string(), std::strerror(errno));
  // No atomic swap here: move the old one aside (recoverable, see the header).
  const fs::path old = with_suffix(dir, ".old-");
  rename_or_fail(dir, old);
  fsync_directory(parent);
  rename_or_fail(tmp, dir);
  fsync_directory(parent);
  discard(old);
}

bool is_hex_suffix(std::string_view s) {
  return s.size() == kSuffixLen &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(uint8_t(c)); });
}

// A crash between the two renames of publish()'s fallback leaves no `dir`
// and a complete "<dir>.old-<12 random characters>": put it back.
void recover(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) || !fs::is_directory(parent_of(dir), ec)) return;
  const std::string prefix = dir.filename().string() + ".old-";
  for (const auto& entry : fs::directory_iterator(parent_of(dir), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix) && is_hex_suffix(std::string_view(name).substr(prefix.size())) &&
        is_complete(entry.path())) {
      rename_or_fail(entry.path(), dir);
      fsync_directory(parent_of(dir));
      return;
    }
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("cannot read '{}'", path.string());
  return std::move(s).str();
}

// Checks that `dir` holds a checkpoint and returns its state.json, validated.
std::string open_checkpoint(const fs::path& dir) {
  recover(dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("checkpoint '{}' does not exist", dir.string());
  for (const char* f : {kParams, kOptState, kState})
    if (!fs::is_regular_file(dir / f, ec))
      fail("checkpoint '{}' is incomplete: it has no {}", dir.string(), f);
  std::string state = read_text(dir / kState);
  Json::parse(state, (dir / kState).string());
  return state;
}

// "step-000123" -> 123; anything else (including ".tmp-" names) -> nullopt.
std::optional<int64_t> parse_step(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  name.remove_prefix(5);
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (name.empty() || ec != std::errc() || end != name.data() + name.size() || name[0] == '-')
    return std::nullopt;
  return step;
}

std::vector<fs::path> folder_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) out.push_back(entry.path());
  if (ec) fail("cannot list '{}': {}", dir.string(), ec.message());
  return out;
}

}  // namespace

namespace {
fs::path folder_of(const fs::path& dir) { return dir.has_filename() ? dir : dir.parent_path(); }
}  // namespace

fs::path begin_checkpoint(const fs::path& dir_in, const std::string& state_json) {
  const fs::path dir = folder_of(dir_in);
  Json::parse(state_json, fmt::format("state.json for checkpoint '{}'", dir.string()));
  std::error_code ec;
  fs::create_directories(parent_of(dir), ec);
  if (ec) fail("cannot create folder '{}': {}", parent_of(dir).string(), ec.message());
  return make_temp_dir(dir);
}

void finish_checkpoint(const fs::path& tmp, const fs::path& dir, const std::string& state_json) {
  AtomicFile state(tmp / kState);
  state.write(state_json.data(), state_json.size());
  state.commit();  // also fsyncs `tmp`, making all three entries durable
  publish(tmp, folder_of(dir));
}

void abandon_checkpoint(const fs::path& tmp) noexcept {
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

void save_checkpoint(const fs::path& dir, const ParamTree& params, const ParamTree& opt_state,
                     const std::string& state_json) {
  fs::path tmp;
  try {
    tmp = begin_checkpoint(dir, state_json);
    save_safetensors(tmp / kParams, params);
    save_safetensors(tmp / kOptState, opt_state);
    finish_checkpoint(tmp, dir, state_json);
  } catch (const Error& e) {
    if (!tmp.empty()) abandon_checkpoint(tmp);
    fail_checkpoint_write(dir, e.what());
  } catch (...) {
    if (!tmp.empty()) abandon_checkpoint(tmp);
    throw;
  }
}

void fail_checkpoint_write(const fs::path& dir, const std::string& why) {
  // Everything is written beside `dir` and published by one rename, so a
  // failure before the rename leaves `dir` and its siblings as they were.
  const fs::path where = folder_of(dir);
  fail(
      "cannot save checkpoint '{}': {}. Nothing was replaced: the checkpoints in '{}' (an "
      "earlier '{}' included) are as before and still load. Free disk space or make that folder "
      "writable, then save again (a Trainer resumes from the newest complete checkpoint)",
      where.string(), why, parent_of(where).string(), where.filename().string());
}

std::string read_checkpoint_state(const fs::path& dir) { return open_checkpoint(dir); }

Checkpoint load_checkpoint(const fs::path& dir) {
  Checkpoint c;
  c.state_json = open_checkpoint(dir);
  c.params = load_safetensors(dir / kParams);
  c.opt_state = load_safetensors(dir / kOptState);
  c.dir = dir;
  return c;
}

std::string load_checkpoint_into(const fs::path& dir, ParamTree& params, ParamTree& opt_state) {
  std::string state = open_checkpoint(dir);
  load_safetensors_into(dir / kParams, params);
  load_safetensors_into(dir / kOptState, opt_state);
  return state;
}

fs::path checkpoint_dir(const fs::path& workdir, int64_t step) {
  REDCO_CHECK(step >= 0, "checkpoint step must be non-negative, got {}", step);
  return workdir / "ckpt" / fmt::format("step-{:06d}", step);
}

std::vector<CheckpointEntry> list_checkpoints(const fs::path& workdir) {
  const fs::path root = workdir / "ckpt";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const fs::path& p : folder_entries(root)) {
    const std::string name = p.filename().string();
    const size_t old = name.find(".old-");
    if (old != std::string::npos && parse_step(std::string_view(name).substr(0, old)))
      recover(root / name.substr(0, old));
  }
  std::vector<CheckpointEntry> out;
  for (const fs::path& p : folder_entries(root)) {
    const auto step = parse_step(p.filename().string());
    if (step && is_complete(p)) out.push_back({*step, p});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointEntry> latest_checkpoint(const fs::path& workdir) {
  auto all = list_checkpoints(workdir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<Checkpoint> load_latest_checkpoint(const fs::path& workdir) {
  const auto latest = latest_checkpoint(workdir);
  if (!latest) return std::nullopt;
  return load_checkpoint(latest->dir);
}

std::vector<fs::path> prune_checkpoints(const fs::path& workdir, size_t keep_last,
                                        const std::set<int64_t>& keep_steps) {
  REDCO_CHECK(keep_last >= 1, "prune_checkpoints: keep_last must be at least 1");
  const auto all = list_checkpoints(workdir);  // also recovers interrupted swaps
  std::vector<fs::path> deleted;
  for (size_t i = 0; i + keep_last < all.size(); ++i) {
    if (keep_steps.count(all[i].step)) continue;
    discard(all[i].dir);
    deleted.push_back(all[i].dir);
  }
  // What is left with a ".tmp-" or ".old-" name belongs to no checkpoint.
  const fs::path root = workdir / "ckpt";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return deleted;
  for (const fs::path& p : folder_entries(root)) {
    const std::string name = p.filename().string();
    if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos)
      fs::remove_all(p, ec);
  }
  return deleted;
}

}  // namespace redco::io

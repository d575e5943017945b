#include "redco/io/checkpoint.hpp"

#include <fcntl.h>
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

namespace redco::io {
namespace fs = std::filesystem;

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

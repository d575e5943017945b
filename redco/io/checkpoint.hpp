#pragma once
// Checkpoints: a folder holding
//   params.safetensors     the parameters, full tensors under their dotted names
//   opt_state.safetensors  the optimizer's state() (its i64 "step" included)
//   state.json             step, epoch, RNG, schedule, data order, metrics, config
// The safetensors files are plain safetensors (see safetensors.hpp), so
// Python reads a checkpoint with no redco installed.
//
// Crash safety. save_checkpoint writes everything into a fresh sibling
// "<dir>.tmp-<12 random characters>", fsyncs every file and the folder, then publishes
// it with one rename. If <dir> already exists, the new folder and the old one
// are swapped atomically (renameat2 RENAME_EXCHANGE) and the old one, now
// under the temporary name, is deleted. So at every instant <dir> is either
// absent, the complete previous checkpoint or the complete new one.
//
// Recovery rules, applied by list_checkpoints and load_checkpoint:
//   * "*.tmp-*" folders are never read: they are saves or deletions that did
//     not finish. prune_checkpoints deletes them.
//   * Where the filesystem cannot swap atomically, the old <dir> is first
//     renamed to "<dir>.old-<12 random characters>"; a crash between the two renames
//     leaves no <dir> and a complete ".old-" folder, which is renamed back.
//   * Deletion renames a checkpoint to a ".tmp-" name first, so a half-deleted
//     checkpoint is never mistaken for a complete one.
// One process writes to a workdir at a time.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "redco/io/safetensors.hpp"

namespace redco::io {

struct Checkpoint {
  ParamTree params;
  ParamTree opt_state;
  std::string state_json;
  std::filesystem::path dir;  // where it was loaded from
};

// `state_json` must be valid JSON (see io::Json); it is checked before
// anything is written. Creates dir's parent folders as needed.
void save_checkpoint(const std::filesystem::path& dir, const ParamTree& params,
                     const ParamTree& opt_state, const std::string& state_json);

// ---- a checkpoint written by several processes -------------------------------
// One process calls begin_checkpoint, all write their tensors into the
// temporary folder it returns (SharedSafetensorsFile), and once every writer
// has closed its files the same process calls finish_checkpoint, which writes
// state.json and publishes the folder exactly as save_checkpoint does.
// save_checkpoint is begin + two whole-file writes + finish.
inline constexpr const char* kCheckpointParams = "params.safetensors";
inline constexpr const char* kCheckpointOptState = "opt_state.safetensors";
inline constexpr const char* kCheckpointState = "state.json";

// Checks `state_json`, creates dir's parent folders and a fresh
// "<dir>.tmp-<12 random characters>" folder, and returns it.
std::filesystem::path begin_checkpoint(const std::filesystem::path& dir,
                                       const std::string& state_json);
// Writes state.json into `tmp` and makes `tmp` the checkpoint `dir`.
void finish_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& dir,
                       const std::string& state_json);
// Deletes an unfinished temporary folder (after a failed write).
void abandon_checkpoint(const std::filesystem::path& tmp) noexcept;
// The error of a failed save of `dir` (disk full, permission denied, ...):
// names the folder and the cause (`why`), says the previous checkpoints are
// untouched and what to do.
[[noreturn]] void fail_checkpoint_write(const std::filesystem::path& dir, const std::string& why);

// Checks that `dir` is a complete checkpoint (repairing an interrupted
// publish, see above) and returns its state.json, validated as JSON.
std::string read_checkpoint_state(const std::filesystem::path& dir);

// Loads and validates all three files; errors name the file (and tensor).
Checkpoint load_checkpoint(const std::filesystem::path& dir);

// Loads into existing trees (the model's parameters, an optimizer's state()
// as a template): names, shapes and dtypes must match exactly. Returns
// state.json's text.
std::string load_checkpoint_into(const std::filesystem::path& dir, ParamTree& params,
                                 ParamTree& opt_state);

// ---- checkpoints of a run: <workdir>/ckpt/step-000123/ ----------------------

struct CheckpointEntry {
  int64_t step = 0;
  std::filesystem::path dir;
};

// <workdir>/ckpt/step-NNNNNN (at least six digits).
std::filesystem::path checkpoint_dir(const std::filesystem::path& workdir, int64_t step);

// The complete checkpoints (all three files present), oldest step first.
// Other names in ckpt/ are ignored; a missing ckpt/ means none.
std::vector<CheckpointEntry> list_checkpoints(const std::filesystem::path& workdir);
std::optional<CheckpointEntry> latest_checkpoint(const std::filesystem::path& workdir);
// The newest complete checkpoint, loaded; nullopt if there is none. A newest
// checkpoint that fails validation throws rather than falling back silently.
std::optional<Checkpoint> load_latest_checkpoint(const std::filesystem::path& workdir);

// Deletes all but the newest `keep_last` (>= 1) checkpoints, sparing the steps
// in `keep_steps` (e.g. the best ones so far), and deletes leftover ".tmp-"
// folders. Returns the deleted checkpoints' folders.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& workdir,
                                                     size_t keep_last,
                                                     const std::set<int64_t>& keep_steps = {});

}  // namespace redco::io

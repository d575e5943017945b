// Checkpoint writes that fail: permission denied (a folder the writer may not
// write to) and a full disk (a 1 MiB tmpfs, mounted by the test when it runs
// as root; SKIP otherwise). Each ends in one redco::Error naming the
// checkpoint and the cause, leaves no temporary folder behind, and leaves the
// previous checkpoint — also one being overwritten in place — loadable with
// its exact contents. The disk-full case also runs through Trainer::fit.
#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "redco/io/checkpoint.hpp"
#include "redco/train/trainer.hpp"
#include "skip.hpp"

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / fmt::format("redco-ckpt-fail-{}", std::random_device{}());
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path / "ckpt", fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

// A tree of `n` f32 values in two tensors, filled from `seed`.
ParamTree tree(int64_t n, uint64_t seed) {
  ParamTree t;
  t.emplace("a.weight", Tensor::uniform(Shape{n / 2}, seed, 1, -1.f, 1.f));
  t.emplace("b.weight", Tensor::uniform(Shape{n - n / 2}, seed, 2, -1.f, 1.f));
  return t;
}
ParamTree opt_state(int64_t n, uint64_t seed) {
  ParamTree t = tree(n, seed + 100);
  const int64_t step = int64_t(seed);
  t.emplace("step", Tensor::from<int64_t>(std::span(&step, 1), Shape{}));
  return t;
}
std::string state(int64_t step) { return fmt::format("{{\"step\": {}}}", step); }

bool bitwise_equal(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a)
    if (t.shape() != b.at(name).shape() || std::memcmp(t.raw(), b.at(name).raw(), t.nbytes()))
      return false;
  return true;
}

// The checkpoint at `dir` loads and holds exactly what step `seed` wrote.
void check_intact(const fs::path& dir, int64_t n, uint64_t seed) {
  INFO("checkpoint " << dir);
  const io::Checkpoint c = io::load_checkpoint(dir);
  CHECK(bitwise_equal(c.params, tree(n, seed)));
  CHECK(bitwise_equal(c.opt_state, opt_state(n, seed)));
  CHECK(c.state_json == state(int64_t(seed)));
}

// Entries of ckpt/ (to see that no temporary folder was left behind).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs `fn` unable to write into `dir`: as an ordinary user the folder loses
// its write permission; root ignores that, so root also takes the effective
// user id of "nobody" for the call (restored after).
template <typename F>
void without_write_access(const fs::path& dir, F&& fn) {
  fs::permissions(dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  const bool root = ::geteuid() == 0;
  if (root) REQUIRE(::seteuid(65534) == 0);
  try {
    fn();
  } catch (...) {
    if (root) REQUIRE(::seteuid(0) == 0);
    fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
    throw;
  }
  if (root) REQUIRE(::seteuid(0) == 0);
  fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
}

// A tmpfs of `bytes` at `dir`, unmounted on destruction; skips the test where
// it cannot be mounted (not root, or no CAP_SYS_ADMIN in a container).
struct SmallDisk {
  fs::path dir;
  SmallDisk(const fs::path& at, int64_t bytes) : dir(at) {
    if (::geteuid() != 0) test::skip("mounting a small tmpfs to fill needs root");
    fs::create_directories(dir);
    const std::string opts = fmt::format("size={},mode=0755", bytes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      test::skip(fmt::format("cannot mount a tmpfs at {}: {}", dir.string(), std::strerror(errno)));
  }
  ~SmallDisk() { ::umount2(dir.c_str(), MNT_DETACH); }
};

}  // namespace

TEST_CASE("permission denied: a clear error, the previous checkpoint still loads", "[ckpt_fail]") {
  TempDir w;
  constexpr int64_t n = 1000;
  io::save_checkpoint(io::checkpoint_dir(w.path, 1), tree(n, 1), opt_state(n, 1), state(1));
  const fs::path ckpt = w.path / "ckpt";
  without_write_access(ckpt, [&] {
    // A new checkpoint beside it, and the same one overwritten in place.
    for (const int64_t step : {2, 1}) {
      const fs::path dir = io::checkpoint_dir(w.path, step);
      INFO(dir);
      CHECK_THROWS_WITH(io::save_checkpoint(dir, tree(n, 2), opt_state(n, 2), state(2)),
                        Contains(fmt::format("cannot save checkpoint '{}'", dir.string())) &&
                            Contains("Permission denied") && Contains("Nothing was replaced") &&
                            Contains("make that folder writable"));
    }
  });
  CHECK(entries(ckpt) == std::vector<std::string>{"step-000001"});
  REQUIRE(io::latest_checkpoint(w.path));
  CHECK(io::latest_checkpoint(w.path)->step == 1);
  check_intact(io::checkpoint_dir(w.path, 1), n, 1);
}

TEST_CASE("disk full: a clear error, the previous checkpoint still loads", "[diskfull]") {
  TempDir w;
  // One checkpoint of 2 x 320 KB fits in 1 MiB, a second beside it does not.
  SmallDisk disk(w.path / "ckpt", int64_t(1) << 20);
  constexpr int64_t n = 80000;
  io::save_checkpoint(io::checkpoint_dir(w.path, 1), tree(n, 1), opt_state(n, 1), state(1));
  for (const int64_t step : {2, 1}) {
    const fs::path dir = io::checkpoint_dir(w.path, step);
    INFO(dir);
    CHECK_THROWS_WITH(io::save_checkpoint(dir, tree(n, 2), opt_state(n, 2), state(2)),
                      Contains(fmt::format("cannot save checkpoint '{}'", dir.string())) &&
                          Contains("No space left on device") && Contains("Free disk space"));
    CHECK(entries(w.path / "ckpt") == std::vector<std::string>{"step-000001"});
  }
  CHECK(io::latest_checkpoint(w.path)->step == 1);
  check_intact(io::checkpoint_dir(w.path, 1), n, 1);
}

TEST_CASE("disk full during fit: the error names the checkpoint, the last one resumes",
          "[diskfull]") {
  TempDir w;
  SmallDisk disk(w.path / "ckpt", int64_t(1) << 20);
  // ~50k parameters: params + AdamW's two buffers ~600 KB per checkpoint.
  const auto model = nn::linear(8, 4096) | nn::relu() | nn::linear(4096, 4);
  struct Ex {
    float x[8];
    int64_t y;
  };
  std::vector<Ex> data(64);
  for (size_t i = 0; i < data.size(); ++i) {
    for (int k = 0; k < 8; ++k) data[i].x[k] = float((i * 7 + size_t(k) * 3) % 11) - 5.f;
    data[i].y = int64_t(i % 4);
  }
  auto collate = [](std::span<const Ex> ex) {
    const auto b = int64_t(ex.size());
    std::pair<Tensor, Tensor> out{Tensor::empty({b, 8}), Tensor::empty({b}, DType::i64)};
    for (int64_t i = 0; i < b; ++i) {
      std::copy_n(ex[size_t(i)].x, 8, out.first.data<float>() + i * 8);
      out.second.data<int64_t>()[i] = ex[size_t(i)].y;
    }
    return out;
  };
  auto loss = [](auto& m, const std::pair<Tensor, Tensor>& b, Rng) {
    return cross_entropy(m(b.first), b.second);
  };
  Deployer d({.seed = 1, .workdir = w.path, .quiet = true});
  Trainer t(d, model, collate, loss, optim::adamw(optim::constant(1e-3f)));
  std::vector<ParamTree> after;  // parameters after each step
  auto run = [&] {
    t.fit(data, {.global_batch_size = 8,
                 .save_every_steps = 2,
                 .max_steps = 4,
                 .on_step = [&](const StepInfo&) {
                   ParamTree p;
                   for (const auto& [k, v] : t.params()) p.emplace(k, v.clone());
                   after.push_back(std::move(p));
                 }});
  };
  CHECK_THROWS_WITH(run(), Contains("cannot save checkpoint '" +
                                    (w.path / "ckpt" / "step-000004").string() + "'") &&
                               Contains("No space left on device"));
  REQUIRE(after.size() == 4);
  const auto latest = d.latest_checkpoint();
  REQUIRE(latest);
  CHECK(latest->step == 2);
  CHECK(entries(w.path / "ckpt") == std::vector<std::string>{"step-000002"});
  CHECK(bitwise_equal(io::load_checkpoint(latest->dir).params, after[1]));
}

#pragma once
// What the Hugging Face checkpoint tests share: the committed fixtures
// (tests/fixtures/hf, from tests/python/make_hf_fixtures.py) and scratch folders.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace redco::test {

// tests/fixtures/hf/<name> of the source tree (REDCO_ROOT, set by meson).
inline std::filesystem::path hf_fixture(const std::string& name = "") {
  const char* root = std::getenv("REDCO_ROOT");
  const std::filesystem::path base =
      root ? std::filesystem::path(root)
           : std::filesystem::path(__FILE__).parent_path().parent_path();
  const std::filesystem::path dir = base / "tests" / "fixtures" / "hf";
  return name.empty() ? dir : dir / name;
}

// A fresh folder under the temporary directory, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "hf") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           fmt::format("redco-test-{}-{}-{}", tag, ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace redco::test

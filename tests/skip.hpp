// Meson's convention for a test that cannot run here: exit status 77, which
// it reports as SKIP. A test that lacks what it needs (a GPU, the Python venv,
// an installed dataset) calls skip() with the reason, so the run says
// "skipped: no GPU" instead of a pass it did not earn. tools/setup test lists
// each skipped test with the reason printed here.
//
// Exiting ends the whole executable, so a group whose cases need something
// optional is registered twice in tests/meson.build (the optional cases by
// their Catch tag, the rest without it): the skip then covers only them.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace redco::test {

[[noreturn]] inline void skip(const std::string& why) {
  std::cout.flush();
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(nullptr);
  std::_Exit(77);
}

// The venv's Python (REDCO_VENV, else <root>/.venv) when it exists and
// imports `modules` (e.g. "numpy, safetensors"); skips otherwise.
inline std::string python_or_skip(const std::filesystem::path& root, const std::string& modules) {
  const char* env = std::getenv("REDCO_VENV");
  const std::filesystem::path venv = env && *env ? std::filesystem::path(env) : root / ".venv";
  const std::filesystem::path python = venv / "bin" / "python";
  std::error_code ec;
  if (!std::filesystem::exists(python, ec))
    skip("no Python venv at " + venv.string() + " (run `tools/setup test`, or set REDCO_VENV)");
  // Appended piecewise: GCC 12 reports a false -Wrestrict on "'" + std::string.
  std::string cmd = "'";
  cmd += python.string();
  cmd += "' -c 'import " + modules + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0)
    skip(python.string() + " cannot import " + modules + " (run `tools/setup test`)");
  return python.string();
}

}  // namespace redco::test

#pragma once
// Command-line conventions shared by the samples and tools, on CLI11 (the
// tools use it directly; the samples through redco_cli.hpp, which compiles
// CLI11 once, in redco_cli.cpp):
//   * every flag is spelled with dashes (--n-model-shards); the underscore
//     spelling (--n_model_shards) is accepted as an alias, without
//     cluttering --help: parse() rewrites it to the dashed name first;
//   * every app takes --device cpu|cuda|cuda:N|test|auto (unless it defines
//     its own): parse() exports it as REDCO_DEVICE, which a Deployer whose
//     config names no device reads, so no sample mentions devices;
//   * bounds checks say what is allowed in plain numbers
//     ("--context: must be an integer >= 1, got 0") instead of CLI11's
//     "Value 0 not in range 0.000000 to 1797693134862315708...".
//
//   CLI::App app{"..."};
//   app.add_option("--n-model-shards", n, "tensor-parallel shards")
//       ->check(redco::cli11::at_least(1));
//   REDCO_CLI11_PARSE(app, argc, argv);
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "exit_status.hpp"

namespace redco::cli11 {

namespace detail {

inline std::string number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  return s;
}

// A validator for a number in [lo, hi] (either side may be open: +-inf);
// `integer` also rejects fractions.
// The description (shown by --help after the type) is the bound alone: ">= 1".
inline CLI::Validator bounds(double lo, double hi, bool integer) {
  std::string range;
  if (std::isfinite(lo) && std::isfinite(hi))
    range = "in [" + number(lo) + ", " + number(hi) + "]";
  else if (std::isfinite(lo))
    range = ">= " + number(lo);
  else if (std::isfinite(hi))
    range = "<= " + number(hi);
  const std::string want = std::string(integer ? "an integer " : "a number ") + range;
  auto check = [=](const std::string& text) -> std::string {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const bool parsed = !text.empty() && end && *end == '\0' && !std::isnan(v);
    if (!parsed || (integer && v != std::floor(v)) || v < lo || v > hi)
      return "must be " + want + ", got " + text;
    return {};
  };
  return CLI::Validator(check, range);
}

}  // namespace detail

inline CLI::Validator at_least(int64_t lo) {
  return detail::bounds(double(lo), std::numeric_limits<double>::infinity(), true);
}
inline CLI::Validator between(int64_t lo, int64_t hi) {
  return detail::bounds(double(lo), double(hi), true);
}
// Real numbers: > 0 (a learning rate) and >= 0 (a timeout).
inline CLI::Validator positive() {
  CLI::Validator v = detail::bounds(std::numeric_limits<double>::min(),
                                    std::numeric_limits<double>::infinity(), false);
  return CLI::Validator(
      [v](std::string& s) { return v(s).empty() ? std::string() : "must be > 0, got " + s; },
      "> 0");
}
inline CLI::Validator non_negative() {
  return detail::bounds(0, std::numeric_limits<double>::infinity(), false);
}
// Real numbers in [lo, hi] (a discount, a probability).
inline CLI::Validator in_range(double lo, double hi) { return detail::bounds(lo, hi, false); }

// argv with "--foo_bar" / "--foo_bar=x" rewritten to "--foo-bar" where that
// names an option of `app`. Stops at "--", and, for an app in prefix-command
// mode (redco-run), at the first positional argument: the program after it
// keeps its own flags untouched. Other apps take positionals between flags.
inline std::vector<std::string> dashed_args(const CLI::App& app, int argc,
                                            const char* const* argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;
    if (a.empty() || a[0] != '-') {
      if (app.get_prefix_command()) break;
      continue;
    }
    const size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    if (name.starts_with("--") && name.find('_') != std::string::npos) {
      std::string dashed = name;
      for (size_t k = 2; k < dashed.size(); ++k)
        if (dashed[k] == '_') dashed[k] = '-';
      if (app.get_option_no_throw(dashed)) {
        a = dashed + (eq == std::string::npos ? "" : a.substr(eq));
        name = dashed;
      }
    }
    // An option that takes a value, given without '=': the next token is its value.
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt && eq == std::string::npos && opt->get_type_size() != 0) ++i;
  }
  return out;
}

// The values --device accepts (train::DeployerConfig::device).
inline CLI::Validator device_name() {
  auto check = [](const std::string& s) -> std::string {
    if (s == "cpu" || s == "cuda" || s == "test" || s == "auto") return {};
    if (s.size() > 5 && s.starts_with("cuda:") &&
        s.find_first_not_of("0123456789", 5) == std::string::npos)
      return {};
    return "must be cpu, cuda, cuda:N, test or auto, got " + s;
  };
  return CLI::Validator(check, "cpu|cuda|cuda:N|test|auto");
}

// The program's name for its messages: argv[0] without the directories.
inline std::string program_name(const char* argv0) {
  std::string name = argv0 ? argv0 : "";
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

// Parses with the underscore aliases. 0: parsed; -1: --help was printed (exit
// 0); exit_status::usage_error (2) for any other ParseError, after one line
// on stderr: "language_modeling: error: --context: must be ...". CLI11's own
// codes (105 for a bad value, 109 for an unknown flag) do not leak out.
inline int parse(CLI::App& app, int argc, const char* const* argv) {
  std::string device;
  if (!app.get_option_no_throw("--device"))
    app.add_option("--device", device,
                   "where parameters and computation live: cpu (default), cuda, cuda:N, test "
                   "(CI's stand-in for a GPU) or auto (cuda when a GPU is present)")
        ->check(device_name());
  std::vector<std::string> args = dashed_args(app, argc, argv);
  std::vector<const char*> ptrs;
  for (const std::string& s : args) ptrs.push_back(s.c_str());
  try {
    app.parse(int(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help: printed, and not an error
      app.exit(e);
      return -1;
    }
    std::fprintf(stderr, "%s: error: %s (--help lists the options)\n",
                 program_name(argc > 0 ? argv[0] : nullptr).c_str(), e.what());
    return exit_status::usage_error;
  }
  if (!device.empty()) setenv("REDCO_DEVICE", device.c_str(), 1);  // read by the Deployer
  return 0;
}

}  // namespace redco::cli11

// Drop-in for CLI11_PARSE(app, argc, argv) with the underscore aliases,
// returning from main with 0 after --help and 2 after a command-line error.
#define REDCO_CLI11_PARSE(app, argc, argv)                                 \
  do {                                                                     \
    const int redco_cli_rc = ::redco::cli11::parse((app), (argc), (argv)); \
    if (redco_cli_rc != 0) return redco_cli_rc < 0 ? 0 : redco_cli_rc;     \
  } while (false)

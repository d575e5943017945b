#pragma once
// The samples' command line: the conventions of cli11_conventions.hpp
// (dashed flags with underscore aliases, readable bounds, --device) behind a
// small interface, so CLI11 is compiled once (redco_cli.cpp) instead of into
// every sample: its headers and code were 7 of a sample's ~18 s of compile.
//
//   cli::App app{"Train a GPT on the KJV"};
//   app.add_option("--steps", steps)->check(cli::at_least(1));
//   app.add_flag("--resume", resume, "continue from the latest checkpoint");
//   REDCO_CLI_PARSE(app, argc, argv);  // returns from main on --help or a bad flag
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exit_status.hpp"

namespace redco::cli {

// What a value must be (shown by --help after the option's type).
struct Check {
  enum class Kind : uint8_t { bounds, positive, one_of } kind = Kind::bounds;
  double lo = 0, hi = 0;  // bounds: [lo, hi], either side may be infinite
  bool integer = false;
  std::vector<std::string> names;  // one_of
};
Check at_least(int64_t lo);             // an integer >= lo
Check between(int64_t lo, int64_t hi);  // an integer in [lo, hi]
Check positive();                       // a number > 0 (a learning rate)
Check non_negative();                   // a number >= 0 (a timeout)
Check in_range(double lo, double hi);   // a number in [lo, hi] (a probability)
Check one_of(std::vector<std::string> names);
Check at_least_or(int64_t lo, std::string word);  // an integer >= lo, or `word` ("auto")

class App;
// An option just added: app.add_option(...)->check(...)->delimiter(',').
class Option {
 public:
  Option* check(const Check& c);
  Option* delimiter(char separator);  // a list option: "a,b,c"

 private:
  friend class App;
  explicit Option(void* impl) : impl_(impl) {}
  void* impl_;  // the CLI::Option
};

class App {
 public:
  explicit App(const std::string& description);
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // `value` keeps its default unless the flag is given (--help shows it).
  Option* add_option(const std::string& name, int& value, const std::string& help = "");
  Option* add_option(const std::string& name, int64_t& value, const std::string& help = "");
  Option* add_option(const std::string& name, uint64_t& value, const std::string& help = "");
  Option* add_option(const std::string& name, float& value, const std::string& help = "");
  Option* add_option(const std::string& name, double& value, const std::string& help = "");
  Option* add_option(const std::string& name, std::string& value, const std::string& help = "");
  Option* add_option(const std::string& name, std::vector<std::string>& value,
                     const std::string& help = "");
  Option* add_option(const std::string& name, std::vector<int64_t>& value,
                     const std::string& help = "");
  Option* add_option(const std::string& name, std::vector<int>& value,
                     const std::string& help = "");
  // Unset unless the flag is given (the program picks a default that depends on others).
  Option* add_option(const std::string& name, std::optional<int64_t>& value,
                     const std::string& help = "");
  Option* add_option(const std::string& name, std::optional<float>& value,
                     const std::string& help = "");
  Option* add_option(const std::string& name, std::optional<double>& value,
                     const std::string& help = "");
  Option* add_flag(const std::string& name, bool& value, const std::string& help = "");

  // 0: parsed; -1: --help was printed (exit 0); exit_status::usage_error (2):
  // a command-line error was printed on one line, exit with it.
  int parse(int argc, const char* const* argv);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --dim, --layers and --heads of a transformer built from flags (a config with those fields).
template <typename Config>
void add_size_options(App& app, Config& c) {
  app.add_option("--dim", c.dim, "model width")->check(at_least(1));
  app.add_option("--layers", c.layers, "blocks")->check(at_least(1));
  app.add_option("--heads", c.heads, "attention heads")->check(at_least(1));
}

}  // namespace redco::cli

// Parses, returning from main when --help (0) or a command-line error (2) was
// printed (the exit statuses: exit_status.hpp).
#define REDCO_CLI_PARSE(app, argc, argv)                               \
  do {                                                                 \
    const int redco_cli_rc = (app).parse((argc), (argv));              \
    if (redco_cli_rc != 0) return redco_cli_rc < 0 ? 0 : redco_cli_rc; \
  } while (false)

// libFuzzer harness: the launch environment. The input is lines of
// NAME=VALUE. The first line's value also goes to the Slurm nodelist
// expander, the tasks-per-node parser and the ADDR:PORT parser on their own;
// then the whole set is read as the environment of a process started by
// redco-run, Slurm or Open MPI. Malformed values must end in redco::Error.
// REDCO_HOST0 is pinned to a numeric address, so host0 resolves without DNS.
#include <cstdint>
#include <string>
#include <string_view>

#include "redco/comm/launch_env.hpp"
#include "redco/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  redco::comm::Environ env;
  std::string_view first;
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    const size_t eq = line.find('=');
    const std::string_view value = eq == std::string_view::npos ? line : line.substr(eq + 1);
    if (at == 0) first = value;
    if (eq != std::string_view::npos) env[std::string(line.substr(0, eq))] = std::string(value);
    at = end + 1;
  }
  try {
    (void)redco::comm::expand_slurm_nodelist(first);
  } catch (const redco::Error&) {
  }
  try {
    (void)redco::comm::slurm_tasks_on_node(first, int(size % 7));
  } catch (const redco::Error&) {
  }
  try {
    (void)redco::comm::parse_host_port(first, "REDCO_HOST0");
  } catch (const redco::Error&) {
  }
  env["REDCO_HOST0"] = "127.0.0.1:29500";
  try {
    (void)redco::comm::detect_launch_env(env);
  } catch (const redco::Error&) {
  }
  return 0;
}

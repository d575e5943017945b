// redco-run's command line on the shared conventions (cli11_conventions.hpp).
#include "options.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "cli11_conventions.hpp"
#include "exit_status.hpp"

namespace redco::run {

namespace {

void add_options(CLI::App& app, Options& o) {
  app.add_option("-n,--nproc-per-node", o.nprocs, "processes to start on this node")->required();
  // From here on --help shows each option's default.
  app.option_defaults()->always_capture_default();
  app.add_option("--nnodes", o.nnodes, "number of nodes (one redco-run on each)");
  app.add_option("--node-rank", o.node_rank, "this node's index in [0, nnodes)");
  app.add_option("--host0", o.host0, "ADDR:PORT of node 0, where rank 0 listens");
  app.add_option("--job-id", o.job_id, "job name shared by all nodes; makes the job token");
  app.add_option("--output", o.output, "whose output to show: every rank's, or rank 0's alone")
      ->check(CLI::IsMember({"all", "rank0"}));
  app.add_option("--prefix", o.prefix,
                 "start each line with '[rank r] ': always, never, or auto (when more than one "
                 "rank's output is shown)")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  app.add_option("--timeout", o.timeout_s, "seconds the ranks wait for each other to connect")
      ->check(cli11::positive());
  app.add_option("--grace", o.grace_s, "seconds between SIGTERM and SIGKILL when stopping")
      ->check(cli11::non_negative());
  app.add_option("--max-restarts", o.max_restarts,
                 "restart the whole job up to this many times after a rank fails or hangs "
                 "(it resumes from its latest checkpoint)")
      ->check(cli11::at_least(0));
  app.add_option("--hang-timeout", o.hang_timeout_s,
                 "seconds a rank may go without progress in its training loop (or without "
                 "running at all) before it is called hung and the job is stopped; 0: off")
      ->check(cli11::non_negative());
  app.add_flag("--from-env", o.from_env,
               "take nnodes, node rank and host0 from Slurm/Open MPI (one redco-run per node)");
  // Everything from the program name on belongs to the program.
  app.prefix_command();
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "redco-run: error: %s\n", what.c_str());
  return exit_status::usage_error;
}

}  // namespace

int parse_options(Options& o, int argc, char** argv) {
  CLI::App app{"redco-run: start and supervise the ranks of a redco job"};
  add_options(app, o);
  app.footer(
      "usage: redco-run -n N [options] [--] program [args...]\n"
      "exit status: 0 when every rank succeeded; a failed rank's status (128 + N for signal N, "
      "124 for a hang); 1 for an error of redco-run's own; 2 for a command-line error; 130 "
      "when interrupted (Ctrl-C)");
  if (const int rc = cli11::parse(app, argc, argv); rc != 0) return rc < 0 ? exit_status::ok : rc;
  o.command = app.remaining();
  const bool after_dashes = !o.command.empty() && o.command.front() == "--";
  if (after_dashes) o.command.erase(o.command.begin());
  if (o.command.empty()) return usage_error("no program given: redco-run -n N -- program args");
  // In prefix-command mode CLI11 hands an unknown flag over as the program.
  if (!after_dashes && o.command.front().starts_with("-"))
    return usage_error(fmt::format(
        "unknown option {} (--help lists the options; the program comes after them, or after --)",
        o.command.front()));
  // Ten heartbeat ticks must fit in the timeout, and they come at most every 10 ms.
  if (o.hang_timeout_s != 0 && o.hang_timeout_s < 0.1)
    return usage_error(fmt::format(
        "--hang-timeout {:g}: give at least 0.1 seconds, or 0 to turn hang detection off",
        o.hang_timeout_s));
  return -1;
}

bool prefixed(const Options& o, int world_size) {
  if (o.prefix != "auto") return o.prefix == "always";
  return o.output == "all" && world_size > 1;
}

}  // namespace redco::run

#pragma once
// redco-run's command line: what redco_run.cpp starts and how it shows it.
#include <string>
#include <vector>

namespace redco::run {

struct Options {
  int nprocs = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string host0;
  std::string job_id = "default";
  std::string output = "all";   // all | rank0
  std::string prefix = "auto";  // always | never | auto: "[rank r] " before each line
  double timeout_s = 300;
  double grace_s = 10;
  double hang_timeout_s = 60;
  int max_restarts = 0;
  bool from_env = false;
  std::vector<std::string> command;  // the program and its arguments
};

// Parses argv into `o`: -1 when the job is to run; otherwise the status to
// exit with: 0 after --help, exit_status::usage_error (2) after a
// command-line error, reported on one line of stderr.
int parse_options(Options& o, int argc, char** argv);

// Whether a rank's lines get a "[rank r] " prefix: --prefix always, or auto
// when every rank is shown (--output all) and the job has more than one.
bool prefixed(const Options& o, int world_size);

}  // namespace redco::run

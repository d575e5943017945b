#pragma once
// Where this process sits in a job, read from whatever started it.
//
// The same binary runs unchanged under `redco-run`, under `srun` (Slurm), under
// `mpirun` (Open MPI) or on its own; detect_launch_env() turns the starter's
// environment variables into one LaunchEnv that the rendezvous (connect_ucx)
// consumes. The environment is passed in as a map so every source can be
// simulated in tests; the no-argument overload reads the real environ.
//
// Precedence, most explicit first: REDCO_RANK (redco-run, or a user exporting
// the variables by hand) > OMPI_COMM_WORLD_RANK (mpirun, which may itself run
// inside a Slurm allocation whose SLURM_PROCID is the batch step's, not ours)
// > SLURM_PROCID (srun) > single process.
//
// Variables redco-run sets for each child (also accepted from a user):
//   REDCO_RANK, REDCO_WORLD_SIZE, REDCO_LOCAL_RANK, REDCO_LOCAL_WORLD_SIZE,
//   REDCO_NODE_RANK, REDCO_NNODES, REDCO_HOST0 (ADDR:PORT), REDCO_JOB_TOKEN,
//   REDCO_TIMEOUT (rendezvous timeout in seconds), REDCO_RESTART (how many
//   times the job has been restarted; 0 for the first run), REDCO_MAX_RESTARTS,
//   and for hang detection REDCO_HEARTBEAT_FD, REDCO_HEARTBEAT_SLOT and
//   REDCO_HANG_TIMEOUT (read by core/heartbeat.hpp, not here).
// Overrides accepted under every source: REDCO_HOST0, REDCO_PORT,
// REDCO_JOB_TOKEN, REDCO_TIMEOUT.
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace redco::comm {

using Environ = std::map<std::string, std::string>;

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string host0 = "127.0.0.1";  // rank 0's address, without the port
  int port = 0;                     // rank 0's rendezvous port; 0 for "single"
  std::string job_token;            // the same on every rank of one job, else differs
  double timeout_s = 300;           // how long the rendezvous waits for the other ranks
  int restart = 0;                  // restart count, so a restarted job can resume
  std::string source = "single";    // "redco-run" | "slurm" | "openmpi" | "single"
};

// Reads the environment of this process.
Environ current_environ();

LaunchEnv detect_launch_env(const Environ& env);
LaunchEnv detect_launch_env();

// Expands a Slurm hostlist such as `node[01-03,07],gpu-a[1-2]x,login5` into
// host names, in order: ranges keep their zero padding, several bracket groups
// in one name multiply out. Throws redco::Error on malformed input.
std::vector<std::string> expand_slurm_nodelist(std::string_view list);

// Tasks on node `node` from a Slurm tasks-per-node list such as `2(x3),1`.
int slurm_tasks_on_node(std::string_view tasks_per_node, int node);

struct HostPort {
  std::string host;
  int port = 0;
};

// Parses `ADDR:PORT` (or `[v6addr]:PORT`); `what` names the variable or flag
// that held the value, so the error can say what to fix.
HostPort parse_host_port(std::string_view value, std::string_view what);

// Throws redco::Error naming `what` when `host` does not resolve.
void check_resolvable(const std::string& host, std::string_view what);

// A fresh random token (hex), for jobs started by one redco-run.
std::string random_job_token();

}  // namespace redco::comm

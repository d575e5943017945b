#include "redco/comm/launch_env.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <random>

#include "redco/core/error.hpp"

extern char** environ;

namespace redco::comm {
namespace {

// The variable names one source uses, so every error names what to fix.
struct VarNames {
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
  const char* node_rank;
  const char* nnodes;
};

constexpr VarNames kRedcoVars{"REDCO_RANK",       "REDCO_WORLD_SIZE",
                              "REDCO_LOCAL_RANK", "REDCO_LOCAL_WORLD_SIZE",
                              "REDCO_NODE_RANK",  "REDCO_NNODES"};
constexpr VarNames kSlurmVars{"SLURM_PROCID",  "SLURM_NTASKS",
                              "SLURM_LOCALID", "tasks per node (SLURM_STEP_TASKS_PER_NODE)",
                              "SLURM_NODEID",  "SLURM_NNODES"};
constexpr VarNames kOmpiVars{"OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "node index (rank / OMPI_COMM_WORLD_LOCAL_SIZE)",
                             "node count (OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE)"};

const std::string* find(const Environ& env, std::string_view name) {
  auto it = env.find(std::string(name));
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The first of `names` that is set and non-empty, with the name that held it.
std::pair<const char*, const std::string*> first_of(const Environ& env,
                                                    std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const std::string* v = find(env, n)) return {n, v};
  return {nullptr, nullptr};
}

long long parse_integer(std::string_view value, std::string_view what) {
  long long out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  REDCO_CHECK(ec == std::errc() && end == value.data() + value.size() && !value.empty(),
              "{}='{}' is not an integer: set it to a whole number (e.g. {}=0)", what, value, what);
  return out;
}

int parse_int(std::string_view value, std::string_view what) {
  long long v = parse_integer(value, what);
  REDCO_CHECK(v >= INT32_MIN && v <= INT32_MAX, "{}={} is out of range", what, value);
  return static_cast<int>(v);
}

int env_int(const Environ& env, const char* name, const char* because) {
  const std::string* v = find(env, name);
  REDCO_CHECK(v != nullptr, "{} is set but {} is not: set both ({})", because, name,
              "they describe the same job");
  return parse_int(*v, name);
}

int env_int_or(const Environ& env, const char* name, int fallback) {
  const std::string* v = find(env, name);
  return v ? parse_int(*v, name) : fallback;
}

void check_in_range(int value, const char* value_name, int bound, const char* bound_name) {
  REDCO_CHECK(value >= 0 && value < bound,
              "{}={} is outside [0, {}={}): every process needs an index below the count; "
              "check how the job was started",
              value_name, value, bound_name, bound);
}

void validate(const LaunchEnv& le, const VarNames& n) {
  REDCO_CHECK(le.world_size >= 1, "{}={} must be at least 1", n.world, le.world_size);
  REDCO_CHECK(le.local_world_size >= 1, "{}={} must be at least 1", n.local_world,
              le.local_world_size);
  REDCO_CHECK(le.nnodes >= 1, "{}={} must be at least 1", n.nnodes, le.nnodes);
  check_in_range(le.rank, n.rank, le.world_size, n.world);
  check_in_range(le.local_rank, n.local_rank, le.local_world_size, n.local_world);
  check_in_range(le.node_rank, n.node_rank, le.nnodes, n.nnodes);
}

// REDCO_HOST0 as given; `required` says why it must be there when it is not.
void read_host0(const Environ& env, LaunchEnv& le, const char* required) {
  if (const std::string* v = find(env, "REDCO_HOST0")) {
    HostPort hp = parse_host_port(*v, "REDCO_HOST0");
    le.host0 = hp.host;
    le.port = hp.port;
    return;
  }
  REDCO_CHECK(required == nullptr, "{}", required ? required : "");
}

LaunchEnv from_redco(const Environ& env) {
  LaunchEnv le;
  le.source = "redco-run";
  le.rank = parse_int(*find(env, "REDCO_RANK"), "REDCO_RANK");
  le.world_size = env_int(env, "REDCO_WORLD_SIZE", "REDCO_RANK");
  le.local_rank = env_int_or(env, "REDCO_LOCAL_RANK", le.rank);
  le.local_world_size = env_int_or(env, "REDCO_LOCAL_WORLD_SIZE", le.world_size);
  le.node_rank = env_int_or(env, "REDCO_NODE_RANK", 0);
  le.nnodes = env_int_or(env, "REDCO_NNODES", 1);
  if (le.world_size > 1)
    read_host0(env, le,
               "REDCO_RANK is set but REDCO_HOST0 is not: set REDCO_HOST0=ADDR:PORT to rank 0's "
               "address (redco-run does this for you)");
  validate(le, kRedcoVars);
  return le;
}

LaunchEnv from_openmpi(const Environ& env) {
  LaunchEnv le;
  le.source = "openmpi";
  le.rank = parse_int(*find(env, "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK");
  le.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
  le.local_rank = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
  le.local_world_size = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  // Open MPI does not export a node index; mpirun's default by-slot mapping
  // fills nodes in rank order, so the node is rank / ranks-per-node.
  le.node_rank = le.local_world_size >= 1 ? le.rank / le.local_world_size : 0;
  le.nnodes = le.local_world_size >= 1
                  ? (le.world_size + le.local_world_size - 1) / le.local_world_size
                  : 1;
  if (le.world_size > 1)
    read_host0(env, le,
               "started by mpirun (OMPI_COMM_WORLD_RANK is set) but REDCO_HOST0 is not: Open MPI "
               "does not say where rank 0 runs, so pass it, e.g. "
               "`mpirun -x REDCO_HOST0=node01:29500 ...` (any free port on rank 0's host)");
  if (const std::string* id = find(env, "OMPI_MCA_ess_base_jobid")) le.job_token = "openmpi-" + *id;
  validate(le, kOmpiVars);
  return le;
}

void slurm_host0(const Environ& env, LaunchEnv& le) {
  if (find(env, "REDCO_HOST0")) return read_host0(env, le, nullptr);
  auto [name, list] =
      first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  REDCO_CHECK(list != nullptr,
              "started by Slurm (SLURM_PROCID is set) but neither SLURM_STEP_NODELIST nor "
              "SLURM_JOB_NODELIST is: run under srun, or set REDCO_HOST0=ADDR:PORT");
  std::vector<std::string> hosts = expand_slurm_nodelist(*list);
  REDCO_CHECK(!hosts.empty(), "{}='{}' lists no host", name, *list);
  le.host0 = hosts.front();
  // Every rank derives the same port from the job id, so none has to be told.
  le.port =
      20000 + static_cast<int>(parse_integer(*find(env, "SLURM_JOB_ID"), "SLURM_JOB_ID") % 20000);
}

LaunchEnv from_slurm(const Environ& env) {
  LaunchEnv le;
  le.source = "slurm";
  le.rank = parse_int(*find(env, "SLURM_PROCID"), "SLURM_PROCID");
  auto [world_name, world] = first_of(env, {"SLURM_NTASKS", "SLURM_NPROCS"});
  REDCO_CHECK(world != nullptr,
              "SLURM_PROCID is set but SLURM_NTASKS is not: start the job with srun (sbatch "
              "alone starts one process), or set REDCO_RANK/REDCO_WORLD_SIZE yourself");
  le.world_size = parse_int(*world, world_name);
  le.local_rank = env_int_or(env, "SLURM_LOCALID", 0);
  le.node_rank = env_int_or(env, "SLURM_NODEID", 0);
  auto [nn_name, nn] =
      first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  le.nnodes = nn ? parse_int(*nn, nn_name) : 1;
  auto [tpn_name, tpn] = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  le.local_world_size = tpn ? slurm_tasks_on_node(*tpn, le.node_rank)
                            : (le.world_size + le.nnodes - 1) / std::max(le.nnodes, 1);
  REDCO_CHECK(find(env, "SLURM_JOB_ID") != nullptr,
              "SLURM_PROCID is set but SLURM_JOB_ID is not: start the job with srun");
  parse_integer(*find(env, "SLURM_JOB_ID"), "SLURM_JOB_ID");
  if (le.world_size > 1) slurm_host0(env, le);
  const std::string* step = find(env, "SLURM_STEP_ID");
  le.job_token = "slurm-" + *find(env, "SLURM_JOB_ID") + "." + (step ? *step : "0");
  validate(le, kSlurmVars);
  return le;
}

// Settings any source may override: the rendezvous port, token, timeout, and
// the restart count a supervising launcher passes on.
void apply_overrides(const Environ& env, LaunchEnv& le) {
  if (const std::string* p = find(env, "REDCO_PORT")) {
    long long port = parse_integer(*p, "REDCO_PORT");
    REDCO_CHECK(port >= 1 && port <= 65535,
                "REDCO_PORT={} is not a TCP port: use a free port in 1-65535 (e.g. 29500)", port);
    le.port = static_cast<int>(port);
  }
  if (const std::string* t = find(env, "REDCO_JOB_TOKEN")) le.job_token = *t;
  if (le.job_token.empty() && le.world_size > 1)
    le.job_token = le.source + "-" + le.host0 + ":" + std::to_string(le.port);
  if (const std::string* t = find(env, "REDCO_TIMEOUT")) {
    double s = 0;
    auto [end, ec] = std::from_chars(t->data(), t->data() + t->size(), s);
    REDCO_CHECK(ec == std::errc() && end == t->data() + t->size() && s > 0,
                "REDCO_TIMEOUT='{}' is not a positive number of seconds (e.g. REDCO_TIMEOUT=300)",
                *t);
    le.timeout_s = s;
  }
  le.restart = env_int_or(env, "REDCO_RESTART", 0);
}

// Splits a hostlist at the commas between host expressions, not those
// inside a bracket group.
std::vector<std::string_view> split_hosts(std::string_view list) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      REDCO_CHECK(depth == 0, "Slurm nodelist '{}': nested '[' at offset {}", list, i);
      ++depth;
    } else if (c == ']') {
      REDCO_CHECK(depth == 1, "Slurm nodelist '{}': ']' without '[' at offset {}", list, i);
      --depth;
    } else if (c == ',' && depth == 0) {
      REDCO_CHECK(i > start, "Slurm nodelist '{}': empty host name at offset {}", list, start);
      out.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  REDCO_CHECK(depth == 0, "Slurm nodelist '{}': '[' is never closed", list);
  return out;
}

// More hosts than any Slurm cluster has: a nodelist that expands further is
// malformed, and is refused before it is materialised (a[0-999999]b[0-999999]
// would be 10^12 names).
constexpr std::size_t kMaxHosts = 1000000;

// `01-03,07` -> 01 02 03 07; the lower bound's width sets the zero padding.
void expand_ranges(std::string_view ranges, std::string_view list, std::vector<std::string>& out) {
  for (std::string_view part : split_hosts(ranges)) {
    auto dash = part.find('-');
    std::string_view lo = part.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : part.substr(dash + 1);
    auto number = [&](std::string_view d) {
      std::uint64_t v = 0;
      auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
      REDCO_CHECK(!d.empty() && ec == std::errc() && end == d.data() + d.size(),
                  "Slurm nodelist '{}': '{}' is not a number or a range like 01-04", list, part);
      return v;
    };
    std::uint64_t a = number(lo), b = number(hi);
    REDCO_CHECK(a <= b && b - a < kMaxHosts - out.size(),
                "Slurm nodelist '{}': range '{}' is empty or too large", list, part);
    // Counted, not `v <= b`: with b = 2^64 - 1 that loop would never end.
    for (std::uint64_t i = 0; i <= b - a; ++i)
      out.push_back(fmt::format("{:0{}}", a + i, lo.size()));
  }
}

// One host expression, possibly with several bracket groups: `a[1-2]b[3-4]`
// gives a1b3 a1b4 a2b3 a2b4 (the leftmost group varies slowest, as in Slurm).
void expand_host(std::string_view expr, std::string_view list, std::vector<std::string>& out) {
  auto open = expr.find('[');
  if (open == std::string_view::npos) {
    out.emplace_back(expr);
    return;
  }
  auto close = expr.find(']', open);
  std::vector<std::string> middles, tails;
  expand_ranges(expr.substr(open + 1, close - open - 1), list, middles);
  expand_host(expr.substr(close + 1), list, tails);
  REDCO_CHECK(middles.size() <= (kMaxHosts - out.size()) / std::max<std::size_t>(tails.size(), 1),
              "Slurm nodelist '{}' expands to more than {} hosts", list, kMaxHosts);
  for (const std::string& m : middles)
    for (const std::string& t : tails) out.push_back(std::string(expr.substr(0, open)) + m + t);
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  REDCO_CHECK(!list.empty(), "Slurm nodelist is empty");
  std::vector<std::string> hosts;
  for (std::string_view expr : split_hosts(list)) {
    REDCO_CHECK(hosts.size() < kMaxHosts, "Slurm nodelist '{}' expands to more than {} hosts", list,
                kMaxHosts);
    expand_host(expr, list, hosts);
  }
  return hosts;
}

int slurm_tasks_on_node(std::string_view tasks_per_node, int node) {
  int64_t first = 0;  // index of the first node the current entry covers (64 bits: no overflow)
  for (std::string_view entry : split_hosts(tasks_per_node)) {
    auto paren = entry.find("(x");
    int tasks = parse_int(entry.substr(0, paren), "SLURM_STEP_TASKS_PER_NODE");
    int repeat = 1;
    if (paren != std::string_view::npos) {
      REDCO_CHECK(entry.back() == ')', "SLURM_STEP_TASKS_PER_NODE='{}': expected N(xM) in '{}'",
                  tasks_per_node, entry);
      repeat =
          parse_int(entry.substr(paren + 2, entry.size() - paren - 3), "SLURM_STEP_TASKS_PER_NODE");
    }
    REDCO_CHECK(tasks >= 0 && repeat >= 1,
                "SLURM_STEP_TASKS_PER_NODE='{}': '{}' needs N >= 0 tasks on M >= 1 nodes",
                tasks_per_node, entry);
    if (node < first + repeat) return tasks;
    first += repeat;
  }
  fail("SLURM_STEP_TASKS_PER_NODE='{}' covers {} nodes, but this is node {} (SLURM_NODEID)",
       tasks_per_node, first, node);
}

Environ current_environ() {
  Environ env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) env[std::string(kv.substr(0, eq))] = kv.substr(eq + 1);
  }
  return env;
}

LaunchEnv detect_launch_env(const Environ& env) {
  LaunchEnv le;
  if (find(env, "REDCO_RANK"))
    le = from_redco(env);
  else if (find(env, "OMPI_COMM_WORLD_RANK"))
    le = from_openmpi(env);
  else if (find(env, "SLURM_PROCID"))
    le = from_slurm(env);
  apply_overrides(env, le);
  if (le.world_size > 1) {
    std::string what = le.source == "slurm" && !find(env, "REDCO_HOST0")
                           ? "host0 (first host of the Slurm nodelist; set REDCO_HOST0 to override)"
                           : "REDCO_HOST0";
    check_resolvable(le.host0, what);
  }
  return le;
}

LaunchEnv detect_launch_env() { return detect_launch_env(current_environ()); }

HostPort parse_host_port(std::string_view value, std::string_view what) {
  HostPort hp;
  std::string_view port;
  if (!value.empty() && value.front() == '[') {
    auto close = value.find(']');
    REDCO_CHECK(close != std::string_view::npos,
                "{}='{}' opens '[' without ']': write an IPv6 host as [ADDR]:PORT", what, value);
    hp.host = value.substr(1, close - 1);
    REDCO_CHECK(close + 1 < value.size() && value[close + 1] == ':',
                "{}='{}' has no port: write it as [ADDR]:PORT, e.g. [::1]:29500", what, value);
    port = value.substr(close + 2);
  } else {
    auto colon = value.rfind(':');
    REDCO_CHECK(colon != std::string_view::npos,
                "{}='{}' has no port: write it as ADDR:PORT, e.g. {}:29500", what, value, value);
    hp.host = value.substr(0, colon);
    REDCO_CHECK(hp.host.find(':') == std::string::npos,
                "{}='{}' is ambiguous: write an IPv6 host in brackets, [ADDR]:PORT", what, value);
    port = value.substr(colon + 1);
  }
  REDCO_CHECK(!hp.host.empty(), "{}='{}' has no host: write it as ADDR:PORT", what, value);
  long long p = -1;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  REDCO_CHECK(ec == std::errc() && end == port.data() + port.size() && p >= 1 && p <= 65535,
              "{}='{}': port '{}' is not a TCP port; use a free port in 1-65535, e.g. {}:29500",
              what, value, port, hp.host);
  hp.port = static_cast<int>(p);
  return hp;
}

void check_resolvable(const std::string& host, std::string_view what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res) freeaddrinfo(res);
  REDCO_CHECK(rc == 0,
              "{}: host '{}' does not resolve ({}); give rank 0's address as an IP or a name "
              "every node can resolve",
              what, host, gai_strerror(rc));
}

std::string random_job_token() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint64_t> dist;
  return fmt::format("{:016x}{:016x}", dist(rd), dist(rd));
}

}  // namespace redco::comm

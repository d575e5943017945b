// Launch environment detection (redco-run, Slurm, Open MPI simulated through
// their variables), the Slurm nodelist parser, and the redco-run launcher end
// to end.
//
// The launcher binary is taken from the REDCO_RUN environment variable when it
// is set, else looked up relative to this test executable (build/tests/):
// ../tools/redco-run, then ../tools/redco-run/redco-run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "redco/comm/launch_env.hpp"
#include "redco/core/error.hpp"

using namespace redco::comm;
using Catch::Contains;
using Strings = std::vector<std::string>;

TEST_CASE("no launcher variables: a single process", "[launch]") {
  LaunchEnv le = detect_launch_env(Environ{{"HOME", "/root"}});
  CHECK(le.source == "single");
  CHECK(le.rank == 0);
  CHECK(le.world_size == 1);
  CHECK(le.local_world_size == 1);
  CHECK(le.nnodes == 1);
}

TEST_CASE("redco-run variables", "[launch]") {
  Environ env{{"REDCO_RANK", "5"},
              {"REDCO_WORLD_SIZE", "8"},
              {"REDCO_LOCAL_RANK", "1"},
              {"REDCO_LOCAL_WORLD_SIZE", "4"},
              {"REDCO_NODE_RANK", "1"},
              {"REDCO_NNODES", "2"},
              {"REDCO_HOST0", "127.0.0.1:29500"},
              {"REDCO_JOB_TOKEN", "abc"},
              {"REDCO_TIMEOUT", "12.5"},
              {"REDCO_RESTART", "2"},
              {"SLURM_PROCID", "0"}};  // redco-run's own variables win
  LaunchEnv le = detect_launch_env(env);
  CHECK(le.source == "redco-run");
  CHECK(le.rank == 5);
  CHECK(le.world_size == 8);
  CHECK(le.local_rank == 1);
  CHECK(le.local_world_size == 4);
  CHECK(le.node_rank == 1);
  CHECK(le.nnodes == 2);
  CHECK(le.host0 == "127.0.0.1");
  CHECK(le.port == 29500);
  CHECK(le.job_token == "abc");
  CHECK(le.timeout_s == 12.5);
  CHECK(le.restart == 2);

  env["REDCO_PORT"] = "30001";
  CHECK(detect_launch_env(env).port == 30001);
  env.erase("REDCO_JOB_TOKEN");
  CHECK(detect_launch_env(env).job_token == "redco-run-127.0.0.1:30001");
}

Environ slurm_env() {
  return {{"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},
          {"SLURM_NNODES", "4"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "localhost,node[02-04]"},
          {"SLURM_JOB_NODELIST", "nosuchhost[1-4].invalid"},
          {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2),1"}};
}

TEST_CASE("Slurm: everything, host0 included, from Slurm's variables", "[launch]") {
  Environ env = slurm_env();
  LaunchEnv le = detect_launch_env(env);
  CHECK(le.source == "slurm");
  CHECK(le.rank == 5);
  CHECK(le.world_size == 8);
  CHECK(le.local_rank == 1);
  CHECK(le.local_world_size == 2);
  CHECK(le.node_rank == 2);
  CHECK(le.nnodes == 4);
  CHECK(le.host0 == "localhost");            // first host of the step's nodelist
  CHECK(le.port == 20000 + 123456 % 20000);  // same on every rank of the job
  CHECK(le.job_token == "slurm-123456.3");

  SECTION("the job nodelist when the step's is absent; unresolvable host0 names the fix") {
    env.erase("SLURM_STEP_NODELIST");
    REQUIRE_THROWS_WITH(detect_launch_env(env),
                        Contains("nosuchhost1.invalid") && Contains("does not resolve") &&
                            Contains("Slurm nodelist") && Contains("REDCO_HOST0"));
  }
  SECTION("REDCO_HOST0 and REDCO_PORT override") {
    env["REDCO_HOST0"] = "127.0.0.1:29400";
    CHECK(detect_launch_env(env).port == 29400);
    CHECK(detect_launch_env(env).host0 == "127.0.0.1");
    env["REDCO_PORT"] = "29401";
    CHECK(detect_launch_env(env).port == 29401);
  }
  SECTION("missing SLURM_NTASKS") {
    env.erase("SLURM_NTASKS");
    REQUIRE_THROWS_WITH(detect_launch_env(env), Contains("SLURM_NTASKS") && Contains("srun"));
  }
  SECTION("rank outside the task count") {
    env["SLURM_PROCID"] = "8";
    REQUIRE_THROWS_WITH(detect_launch_env(env),
                        Contains("SLURM_PROCID=8 is outside [0, SLURM_NTASKS=8)"));
  }
  SECTION("non-numeric values") {
    env["SLURM_LOCALID"] = "one";
    REQUIRE_THROWS_WITH(detect_launch_env(env), Contains("SLURM_LOCALID='one' is not an integer"));
  }
}

TEST_CASE("Open MPI: ranks from OMPI_COMM_WORLD_*, host0 from REDCO_HOST0", "[launch]") {
  Environ env{{"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
              {"REDCO_HOST0", "localhost:29500"},  {"SLURM_PROCID", "0"}};
  LaunchEnv le = detect_launch_env(env);
  CHECK(le.source == "openmpi");  // mpirun inside a Slurm allocation
  CHECK(le.rank == 3);
  CHECK(le.world_size == 4);
  CHECK(le.local_rank == 1);
  CHECK(le.local_world_size == 2);
  CHECK(le.node_rank == 1);
  CHECK(le.nnodes == 2);
  CHECK(le.host0 == "localhost");
  CHECK(le.port == 29500);
  CHECK(le.job_token == "openmpi-localhost:29500");

  env.erase("REDCO_HOST0");
  REQUIRE_THROWS_WITH(detect_launch_env(env),
                      Contains("REDCO_HOST0") && Contains("mpirun -x REDCO_HOST0="));
}

TEST_CASE("launch variable errors name the variable and the fix", "[launch]") {
  Environ env{{"REDCO_RANK", "0"}, {"REDCO_WORLD_SIZE", "2"}, {"REDCO_HOST0", "localhost:29500"}};
  auto with = [&](std::string k, std::string v) {
    Environ e = env;
    e[k] = v;
    return e;
  };
  REQUIRE_NOTHROW(detect_launch_env(env));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_RANK", "2")),
                      Contains("REDCO_RANK=2 is outside [0, REDCO_WORLD_SIZE=2)"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_RANK", "-1")), Contains("REDCO_RANK=-1"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_RANK", "1x")),
                      Contains("REDCO_RANK='1x' is not an integer"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_WORLD_SIZE", "0")),
                      Contains("REDCO_WORLD_SIZE=0 must be at least 1"));
  REQUIRE_THROWS_WITH(
      detect_launch_env(with("REDCO_HOST0", "localhost")),
      Contains("REDCO_HOST0='localhost' has no port") && Contains("localhost:29500"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_HOST0", "localhost:0")),
                      Contains("port '0' is not a TCP port"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_HOST0", "localhost:65536")),
                      Contains("port '65536' is not a TCP port"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_HOST0", "localhost:http")),
                      Contains("port 'http' is not a TCP port"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_HOST0", ":29500")), Contains("has no host"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_HOST0", "nosuchhost.invalid:29500")),
                      Contains("REDCO_HOST0: host 'nosuchhost.invalid' does not resolve"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_PORT", "99999")),
                      Contains("REDCO_PORT=99999 is not a TCP port"));
  REQUIRE_THROWS_WITH(detect_launch_env(with("REDCO_TIMEOUT", "soon")),
                      Contains("REDCO_TIMEOUT='soon'"));
  Environ no_host0{{"REDCO_RANK", "0"}, {"REDCO_WORLD_SIZE", "2"}};
  REQUIRE_THROWS_WITH(detect_launch_env(no_host0), Contains("REDCO_HOST0=ADDR:PORT"));
  Environ no_world{{"REDCO_RANK", "0"}};
  REQUIRE_THROWS_WITH(detect_launch_env(no_world), Contains("REDCO_WORLD_SIZE is not"));
}

TEST_CASE("host:port parsing", "[launch]") {
  CHECK(parse_host_port("node01:29500", "X").host == "node01");
  CHECK(parse_host_port("10.0.0.1:1", "X").port == 1);
  HostPort v6 = parse_host_port("[::1]:29500", "X");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 29500);
  REQUIRE_THROWS_WITH(parse_host_port("::1:29500", "--host0"), Contains("[ADDR]:PORT"));
  REQUIRE_THROWS_WITH(parse_host_port("[::1]", "--host0"), Contains("has no port"));
  REQUIRE_THROWS_WITH(parse_host_port("[::1:29500", "--host0"), Contains("without ']'"));
}

TEST_CASE("Slurm nodelist expansion", "[launch]") {
  CHECK(expand_slurm_nodelist("login5") == Strings{"login5"});
  CHECK(expand_slurm_nodelist("a,b,c") == Strings{"a", "b", "c"});
  CHECK(expand_slurm_nodelist("node[1-3]") == Strings{"node1", "node2", "node3"});
  CHECK(expand_slurm_nodelist("node[01-03,07]") == Strings{"node01", "node02", "node03", "node07"});
  CHECK(expand_slurm_nodelist("n[098-101]") == Strings{"n098", "n099", "n100", "n101"});
  CHECK(expand_slurm_nodelist("node[01-03,07],gpu-a[1-2]x,login5") ==
        Strings{"node01", "node02", "node03", "node07", "gpu-a1x", "gpu-a2x", "login5"});
  CHECK(expand_slurm_nodelist("r[1-2]n[08-09]") == Strings{"r1n08", "r1n09", "r2n08", "r2n09"});
  CHECK(expand_slurm_nodelist("[1-2]") == Strings{"1", "2"});
  CHECK(expand_slurm_nodelist("host-1.cluster,h[5]") == Strings{"host-1.cluster", "h5"});
  CHECK(expand_slurm_nodelist("c[9-10]") == Strings{"c9", "c10"});
  // The largest 64-bit number ends its range (the fuzzer's find: a loop that never ended).
  CHECK(expand_slurm_nodelist("a[18446744073709551614-18446744073709551615]") ==
        Strings{"a18446744073709551614", "a18446744073709551615"});
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("node[1-3"), Contains("never closed"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("node1-3]"), Contains("']' without '['"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("node[3-1]"), Contains("range '3-1'"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("node[a-b]"), Contains("'a-b' is not a number"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("a,,b"), Contains("empty host name"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("n[1,[2]]"), Contains("nested"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist(""), Contains("empty"));
  // More hosts than any cluster: refused before they are made (1 million at most).
  CHECK(expand_slurm_nodelist("n[000000-999999]").size() == 1000000);
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("a[0-999999]b[0-999999]"),
                      Contains("expands to more than 1000000 hosts"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("a[0-999999],b[0-1]"),
                      Contains("expands to more than 1000000 hosts"));
  REQUIRE_THROWS_WITH(expand_slurm_nodelist("n[0-1000000]"), Contains("too large"));
}

TEST_CASE("Slurm tasks per node", "[launch]") {
  CHECK(slurm_tasks_on_node("4", 0) == 4);
  CHECK(slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
  REQUIRE_THROWS_WITH(slurm_tasks_on_node("2(x3),1", 4), Contains("covers 4 nodes"));
  // Counts that used to overflow an int or walk backwards.
  CHECK(slurm_tasks_on_node("1(x2147483647),3(x2147483647)", 2147483647) == 3);
  REQUIRE_THROWS_WITH(slurm_tasks_on_node("2(x-5),1", 0), Contains("'2(x-5)' needs"));
  REQUIRE_THROWS_WITH(slurm_tasks_on_node("-2", 0), Contains("N >= 0"));
}

TEST_CASE("random job tokens differ", "[launch]") {
  CHECK(random_job_token().size() == 32);
  CHECK(random_job_token() != random_job_token());
}

// ---- the launcher, end to end ----

namespace {

std::string redco_run_path() {
  if (const char* p = std::getenv("REDCO_RUN")) return p;
  namespace fs = std::filesystem;
  fs::path tools = fs::read_symlink("/proc/self/exe").parent_path() / ".." / "tools";
  for (fs::path p : {tools / "redco-run", tools / "redco-run" / "redco-run"})
    if (fs::is_regular_file(p)) return p.string();
  FAIL("redco-run not found: build it, or set REDCO_RUN to its path");
  return {};
}

struct Result {
  int code = -1;
  std::string output;
  double seconds = 0;
};

// Runs a shell command line, capturing stdout and stderr together.
Result run(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(f != nullptr);
  Result r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.output.append(buf, n);
  int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Gone means no such process, or a zombie nobody has reaped yet.
bool alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
}

}  // namespace

TEST_CASE("redco-run starts the ranks and prefixes their output", "[launch][redco-run]") {
  std::string launcher = redco_run_path();
  Result r = run(launcher +
                 " -n 3 -- /bin/sh -c 'echo rank $REDCO_RANK of $REDCO_WORLD_SIZE; "
                 "echo token=$REDCO_JOB_TOKEN host0=$REDCO_HOST0 >&2'");
  INFO(r.output);
  CHECK(r.code == 0);
  for (int i = 0; i < 3; ++i)
    CHECK_THAT(r.output, Contains(fmt::format("[rank {}] rank {} of 3\n", i, i)));
  // Every rank got the same token and rendezvous address.
  std::size_t at = r.output.find("[rank 0] token=");
  REQUIRE(at != std::string::npos);
  std::string tail = r.output.substr(at + 9, r.output.find('\n', at) - at - 9);
  CHECK_THAT(tail, Contains("host0=127.0.0.1:"));
  CHECK_THAT(r.output, Contains("[rank 1] " + tail));
  CHECK_THAT(r.output, Contains("[rank 2] " + tail));

  Result only0 = run(launcher + " -n 2 --output rank0 /bin/sh -c 'echo hello from $REDCO_RANK'");
  CHECK(only0.code == 0);
  CHECK(only0.output == "hello from 0\n");
  // One rank: its output as the program wrote it, unless --prefix always.
  Result one = run(launcher + " -n 1 /bin/sh -c 'echo alone'");
  CHECK(one.code == 0);
  CHECK(one.output == "alone\n");
  Result forced = run(launcher + " -n 1 --prefix always /bin/sh -c 'echo alone'");
  CHECK(forced.output == "[rank 0] alone\n");
  Result never = run(launcher + " -n 2 --output all --prefix never /bin/sh -c 'echo same'");
  CHECK(never.output == "same\nsame\n");
}

TEST_CASE("redco-run stops every rank when one fails", "[launch][redco-run]") {
  std::string launcher = redco_run_path();
  auto dir = std::filesystem::temp_directory_path() / fmt::format("redco_launch_{}", getpid());
  std::filesystem::create_directories(dir);
  // Ranks 0 and 2 sleep, rank 2 in a background child; rank 1 fails.
  std::string script = fmt::format(
      "echo $$ > {0}/sh.$REDCO_RANK; "
      "if [ $REDCO_RANK = 1 ]; then sleep 0.5; echo failing; exit 3; fi; "
      "sleep 60 & echo $! > {0}/bg.$REDCO_RANK; wait",
      dir.string());
  Result r = run(launcher + " -n 3 --grace 5 -- /bin/sh -c '" + script + "'");
  INFO(r.output);
  CHECK(r.code == 3);
  CHECK(r.seconds < 4);
  CHECK_THAT(r.output, Contains("[rank 1] failing"));
  CHECK_THAT(r.output, Contains("redco-run: rank 1 exited with status 3"));
  for (const char* kind : {"sh", "bg"})
    for (int rank : {0, 2}) {
      std::ifstream f(dir / fmt::format("{}.{}", kind, rank));
      int pid = 0;
      REQUIRE(f >> pid);
      for (int i = 0; i < 40 && alive(pid); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK_FALSE(alive(pid));
    }
  std::filesystem::remove_all(dir);

  Result sig = run(launcher + " -n 2 -- /bin/sh -c '[ $REDCO_RANK = 1 ] && kill -9 $$; sleep 60'");
  CHECK(sig.code == 128 + SIGKILL);
  CHECK_THAT(sig.output, Contains("rank 1 was killed by signal 9"));

  // The launcher stopped by the user (once both ranks run): the ranks are
  // stopped, none is blamed, and the status is 128 + SIGTERM.
  std::filesystem::create_directories(dir);
  {
    std::ofstream sh(dir / "term.sh");
    sh << launcher << " -n 2 -- /bin/sh -c 'touch " << dir.string()
       << "/up.$REDCO_RANK; exec sleep 60' &\n"
       << "while [ ! -e " << dir.string() << "/up.0 ] || [ ! -e " << dir.string()
       << "/up.1 ]; do sleep 0.05; done\n"
       << "kill -TERM $!; wait $!; echo status $?\n";
  }
  Result term = run("/bin/sh " + (dir / "term.sh").string());
  INFO(term.output);
  CHECK_THAT(term.output, Contains("redco-run: received signal 15 (Terminated): stopped 2 ranks"));
  CHECK_THAT(term.output, Contains("status 143"));
  CHECK_THAT(term.output, !Contains("killed by signal"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("redco-run rejects a bad host0 with a clear error", "[launch][redco-run]") {
  std::string launcher = redco_run_path();
  Result unresolvable = run(launcher + " -n 2 --nnodes 2 --host0 nosuchhost.invalid:29500 -- true");
  CHECK(unresolvable.code == 2);
  CHECK_THAT(unresolvable.output, Contains("--host0: host 'nosuchhost.invalid' does not resolve"));
  Result no_port = run(launcher + " -n 2 --nnodes 2 --host0 localhost -- true");
  CHECK(no_port.code == 2);
  CHECK_THAT(no_port.output, Contains("--host0='localhost' has no port"));
  Result bad_port = run(launcher + " -n 2 --nnodes 2 --host0 localhost:70000 -- true");
  CHECK_THAT(bad_port.output, Contains("port '70000' is not a TCP port"));
  Result missing = run(launcher + " -n 2 --nnodes 2 -- true");
  CHECK_THAT(missing.output, Contains("--nnodes 2 needs --host0 ADDR:PORT"));
  Result bad_node = run(launcher + " -n 2 --nnodes 2 --node-rank 2 --host0 localhost:1 -- true");
  CHECK_THAT(bad_node.output, Contains("--node-rank 2 is outside [0, --nnodes 2)"));
  Result no_prog = run(launcher + " -n 1 -- /nonexistent/program");
  CHECK(no_prog.code == 2);
  CHECK_THAT(no_prog.output, Contains("cannot start '/nonexistent/program'"));
}

TEST_CASE("redco-run on two nodes numbers ranks globally", "[launch][redco-run]") {
  std::string launcher = redco_run_path();
  Result r = run(launcher +
                 " -n 2 --nnodes 3 --node-rank 1 --host0 127.0.0.1:29511 --job-id exp7 -- "
                 "/bin/sh -c 'echo $REDCO_RANK/$REDCO_WORLD_SIZE $REDCO_LOCAL_RANK "
                 "$REDCO_NODE_RANK $REDCO_HOST0 $REDCO_JOB_TOKEN'");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Contains("[rank 2] 2/6 0 1 127.0.0.1:29511 job-exp7@127.0.0.1:29511"));
  CHECK_THAT(r.output, Contains("[rank 3] 3/6 1 1 127.0.0.1:29511 job-exp7@127.0.0.1:29511"));
}

// bench_tokenizer: encoding the whole KJV (31102 verses, one encode per
// verse) with each committed tokenizer kind, redco single-thread and
// encode_batch on N threads, next to the `tokenizers` package timed by
// tools/bench/bench_tokenizer.py in the same run (when a Python is given).
// Single-thread numbers are CPU time (this thread; the package's whole
// process), so a busy machine disturbs them less; batch numbers are wall time,
// next to the CPU seconds of all of redco's threads for the batch (which a busy
// machine does not inflate: its excess over the single-thread CPU is the
// batch's own overhead).
//
//   bench_tokenizer [--python .venv/bin/python] [--threads 2] [--reps 3] [kind...]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "redco/data/text.hpp"
#include "redco/data/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace redco;

namespace {

fs::path repo_root() {
  std::error_code ec;
  for (fs::path p = fs::absolute(fs::read_symlink("/proc/self/exe", ec).parent_path()); !p.empty();
       p = p.parent_path()) {
    if (fs::exists(p / "tests/data/tokenizers")) return p;
    if (p == p.parent_path()) break;
  }
  return fs::current_path();
}

double cpu_seconds(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

enum class Clock { thread_cpu, process_cpu, wall };

// Best of `reps` in seconds of `clock`: CPU seconds of this thread or of the
// whole process (steadier than wall time on a shared machine), or wall.
template <typename F>
double best_seconds(int reps, Clock clock, F&& f) {
  double best = 1e30;
  const clockid_t id =
      clock == Clock::thread_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds(id);
    f();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, clock == Clock::wall ? wall : cpu_seconds(id) - c0);
  }
  return best;
}

// kind -> {single-thread s, batch s} from bench_tokenizer.py's "kind single batch" lines.
std::map<std::string, std::pair<double, double>> run_python(const std::string& python,
                                                            const fs::path& root,
                                                            const fs::path& text, int threads,
                                                            int reps,
                                                            const std::vector<std::string>& kinds) {
  std::string cmd = "'" + python + "' '" + (root / "tools/bench/bench_tokenizer.py").string() +
                    "' '" + text.string() + "' " + std::to_string(threads) + " " +
                    std::to_string(reps);
  for (const auto& k : kinds)
    cmd += " '" + (root / "tests/data/tokenizers" / k / "tokenizer.json").string() + "'";
  std::map<std::string, std::pair<double, double>> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[512];
  size_t i = 0;
  while (fgets(line, sizeof line, p) && i < kinds.size()) {
    double s = 0, b = 0;
    if (std::sscanf(line, "%lf %lf", &s, &b) == 2) out[kinds[i++]] = {s, b};
  }
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string python;
  int threads = 2, reps = 3;
  std::vector<std::string> kinds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--python" && i + 1 < argc) {
      python = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else {
      kinds.push_back(a);
    }
  }
  if (kinds.empty()) kinds = {"gpt2", "llama3", "roberta", "bert", "llama2", "t5"};
  const fs::path root = repo_root();
  std::vector<std::string> verses;
  size_t bytes = 0;
  for (auto& v : data::read_kjv()) bytes += v.text.size(), verses.push_back(std::move(v.text));
  const fs::path text = fs::temp_directory_path() / "redco_bench_kjv.txt";
  {
    std::ofstream f(text, std::ios::binary);
    for (size_t i = 0; i < verses.size(); ++i) f << (i ? "\n" : "") << verses[i];
  }
  const auto py = python.empty() ? decltype(run_python("", root, text, 1, 1, kinds)){}
                                 : run_python(python, root, text, threads, reps, kinds);
  std::printf(
      "KJV: %zu verses, %.2f MB; best of %d; 1 thread: CPU seconds, %d threads: wall seconds "
      "(MB/s)\n",
      verses.size(), bytes / 1e6, reps, threads);
  std::printf(
      "| kind | tokens | redco 1 thr | redco %d thr | redco %d thr CPU | tokenizers 1 thr | "
      "tokenizers %d thr | redco/tokenizers 1 thr | redco 1 thr CPU / %d thr wall |\n",
      threads, threads, threads, threads);
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& kind : kinds) {
    const auto tok =
        data::Tokenizer::from_file(root / "tests/data/tokenizers" / kind / "tokenizer.json");
    size_t tokens = 0;
    const double one = best_seconds(reps, Clock::thread_cpu, [&] {
      tokens = 0;
      for (const auto& v : verses) tokens += tok.encode(v).size();
    });
    auto batch = [&] { tok.encode_batch(std::span<const std::string>(verses), true, threads); };
    const double many = best_seconds(reps, Clock::wall, batch);
    const double many_cpu = best_seconds(reps, Clock::process_cpu, batch);
    auto mbs = [&](double s) { return bytes / 1e6 / s; };
    std::string ref1 = "-", refn = "-", ratio = "-";
    if (auto it = py.find(kind); it != py.end()) {
      ref1 = fmt::format("{:.3f} ({:.1f})", it->second.first, mbs(it->second.first));
      refn = fmt::format("{:.3f} ({:.1f})", it->second.second, mbs(it->second.second));
      ratio = fmt::format("{:.2f}x", it->second.first / one);
    }
    std::printf("| %s | %zu | %.3f (%.1f) | %.3f (%.1f) | %.3f | %s | %s | %s | %.2fx |\n",
                kind.c_str(), tokens, one, mbs(one), many, mbs(many), many_cpu, ref1.c_str(),
                refn.c_str(), ratio.c_str(), one / many);
    std::fflush(stdout);
  }
  fs::remove(text);
}

#!/usr/bin/env python3
"""The `tokenizers` package's side of bench_tokenizer: times encoding every
line of TEXT with each tokenizer.json, single-thread and on THREADS threads.

  bench_tokenizer.py TEXT THREADS REPS TOKENIZER_JSON...

Prints one line per tokenizer: "single_thread_cpu_seconds batch_wall_seconds"
(best of REPS). Single-thread is encode_batch under RAYON_RS_NUM_THREADS=1 in a child
process (the package fixes its thread pool once per process), so neither
number pays a Python call per verse.
"""
import os
import subprocess
import sys
import time


def best(reps, f, clock):
    out = float("inf")
    for _ in range(reps):
        t0 = clock()
        f()
        out = min(out, clock() - t0)
    return out


def time_batch(text, reps, path, cpu):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    with open(text, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    tok.encode_batch(lines[:1000])  # warm-up
    # CPU time of the whole process (all its threads) for the 1-thread run.
    return best(reps, lambda: tok.encode_batch(lines), time.process_time if cpu else time.perf_counter)


def main():
    if sys.argv[1] == "--child":
        print(time_batch(sys.argv[2], int(sys.argv[3]), sys.argv[4], os.environ["RAYON_RS_NUM_THREADS"] == "1"))
        return
    text, threads, reps, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    for path in paths:
        times = []
        for n in ("1", threads):
            env = dict(os.environ, RAYON_RS_NUM_THREADS=n, TOKENIZERS_PARALLELISM="true")
            out = subprocess.run([sys.executable, __file__, "--child", text, str(reps), path],
                                 env=env, check=True, capture_output=True, text=True).stdout
            times.append(float(out))
        print(f"{times[0]} {times[1]}", flush=True)


if __name__ == "__main__":
    main()

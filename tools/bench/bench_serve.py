"""Serving speed: redco-serve and llama.cpp's llama-server under the same load.

A load generator for any OpenAI-compatible server: C concurrent clients, each
sending R streamed /v1/completions requests back to back, every request a
fixed random prompt of P token ids (the same ids for every server) asking for
N new tokens, greedy, end-of-sequence ignored (so every request makes exactly
N). Per run: aggregate generated tokens/s (all tokens / wall time of the run),
time to first token (p50, p99) and time per output token after the first
(p50). Servers take turns in rotating order, --rounds (3) alternating rounds,
median and best reported; before each timed run the 1-minute load average
must fall to --max-load (0.75 a core) or the script refuses to time, as
bench_generate.py does. llama-server runs in the environment given and with
OMP_WAIT_POLICY=PASSIVE, the faster kept.

  .venv/bin/python tools/bench/bench_serve.py --redco-serve build/tools/redco-serve \\
      --model gpt2 --clients 1,4,16 --prompt 128 --new 64 --dtype f32 \\
      [--llama-server $LLAMACPP_BUILD/bin/llama-server --llamacpp-src $LLAMACPP_SRC/vendor/llama.cpp]

--model gpt2 / llama1b: random-weight checkpoints at GPT-2 124M's and
TinyLlama 1.1B's shapes made once under --root (bench_generate.py's), and
their GGUFs made with llama.cpp's converter; or --model-dir a Hugging Face
folder (and --gguf its GGUF for llama-server). Both servers get --slots
max(clients) rows and --threads threads.
"""
import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_generate as bg  # noqa: E402  (checkpoints, GGUFs, the load gate)


def prompts(n, length, vocab, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


async def one_request(client, url, model, ids, new):
    body = {"model": model, "prompt": ids, "max_tokens": new, "temperature": 0, "stream": True,
            "ignore_eos": True}
    start = time.perf_counter()
    first, events = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:]).get("choices") or [{}]
            if choice[0].get("finish_reason") and not choice[0].get("text"):
                continue  # the closing event carries no token
            events += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url}: a request streamed no token")
    return {"ttft": first - start, "tpot": (end - first) / max(new - 1, 1), "total": end - start}


async def load(url, model, clients, per_client, ids, new):
    """C clients, each R requests back to back; returns the run's numbers."""
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def client_loop(c):
            return [await one_request(client, url, model, ids[(c * per_client + i) % len(ids)], new)
                    for i in range(per_client)]

        start = time.perf_counter()
        runs = await asyncio.gather(*(client_loop(c) for c in range(clients)))
        wall = time.perf_counter() - start
    reqs = [r for rs in runs for r in rs]
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]
    return {"tok_s": len(reqs) * new / wall, "ttft_p50": q([r["ttft"] for r in reqs], 0.5),
            "ttft_p99": q([r["ttft"] for r in reqs], 0.99),
            "tpot_p50": q([r["tpot"] for r in reqs], 0.5), "requests": len(reqs)}


def start_server(cmd, env=None):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    return p


def wait_ready(p, url, seconds=600):
    end = time.time() + seconds
    while time.time() < end:
        if p.poll() is not None:
            raise RuntimeError(f"the server exited: {p.stderr.read()[-500:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {seconds} s")


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def server_cmd(a, name, port, slots, extra=()):
    if name in ("redco", "baseline"):
        return [a.redco_serve if name == "redco" else a.baseline, a.dir, "--port", str(port), "--slots", str(slots), "--dtype", a.dtype,
                "--threads", str(a.threads), "--context", str(a.prompt + a.new + 8),
                "--max-queue", "1024", "--served-model-name", "bench"]
    return [a.llama_server, "-m", a.gguf, "--port", str(port), "-np", str(slots),
            "-c", str(slots * (a.prompt + a.new + 8)), "-t", str(a.threads), "-tb", str(a.threads),
            "--alias", "bench", "-cb", *extra]


def run(a, name, clients, env, extra=()):
    port = a.port + {"redco": 0, "llama.cpp": 1, "baseline": 2}[name]
    url = f"http://127.0.0.1:{port}"
    p = start_server(server_cmd(a, name, port, max(a.clients), extra), env)
    try:
        wait_ready(p, url)
        ids = prompts(max(a.clients) * a.requests, a.prompt, a.vocab)
        # Warm-up (buffers, caches) on a prompt outside the timed set: a
        # timed prompt seen before would be served from either server's
        # prompt cache.
        asyncio.run(load(url, "bench", 1, 1, prompts(1, a.prompt, a.vocab, seed=1), 4))
        load_before = bg.wait_until_quiet(a)
        x = asyncio.run(load(url, "bench", clients, a.requests, ids, a.new))
        x["load"] = load_before
        return x
    finally:
        stop_server(p)


def run_best(a, name, clients):
    if name in ("redco", "baseline"):
        return run(a, name, clients, None)
    best, failures = None, []
    # Each environment as llama-server starts by default, then, if that failed, with weight
    # repacking off: on a Xeon with AMX, llama.cpp 0.3.36's q8_0 repacking (its AMX path)
    # crashes, and repacking off is then its best working setting.
    for policy, extra in [(p, x) for p in bg.WAIT_POLICIES for x in ((), ("--no-repack",))]:
        label = f"OMP_WAIT_POLICY={policy}" + (" " + " ".join(extra) if extra else "")
        if extra and not any(f.startswith(f"OMP_WAIT_POLICY={policy}:") for f in failures):
            continue  # the default setting worked in this environment
        try:
            x = run(a, name, clients, bg.wait_policy_env(policy), extra)
        except (httpx.HTTPError, RuntimeError) as e:
            # A failed request ends that environment's run, said here; the
            # other environment's result (if it finished) stands.
            failures.append(f"{label}: {type(e).__name__}: {e}")
            print(f"{name}, {clients} clients, {label}: failed ({e!r})", flush=True)
            continue
        x["env"] = label
        if best is None or x["tok_s"] > best["tok_s"]:
            best = x
    if best is None:
        raise RuntimeError(f"{name} failed in every environment: {failures}")
    if failures:
        best["failed"] = failures
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    csv = lambda s: [int(x) for x in s.split(",") if x]
    ap.add_argument("--redco-serve", default="build/tools/redco-serve")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server (omit: redco-serve alone)")
    ap.add_argument("--baseline", help="another redco-serve build, timed in turn as 'baseline' "
                    "(an A/B of a change; instead of --llama-server)")
    ap.add_argument("--llamacpp-src", default=os.environ.get("LLAMACPP_SRC"),
                    help="llama.cpp's source, for its GGUF converter")
    ap.add_argument("--model", default="gpt2", help="gpt2 or llama1b (random weights, made once)")
    ap.add_argument("--model-dir", help="a Hugging Face folder instead of --model")
    ap.add_argument("--gguf", help="llama-server's model (default: converted from the folder)")
    ap.add_argument("--root", default="/tmp/redco-bench-generate")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "int8"])
    ap.add_argument("--clients", type=csv, default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=4, help="requests per client, back to back")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--max-load", type=float, default=0.75 * (os.cpu_count() or 1))
    ap.add_argument("--settle", type=int, default=300)
    a = ap.parse_args()
    a.dir = a.model_dir or bg.checkpoint(a.model, a.root)
    a.vocab = json.load(open(os.path.join(a.dir, "config.json")))["vocab_size"]
    names = ["redco"] + (["llama.cpp"] if a.llama_server else []) + (
        ["baseline"] if a.baseline else [])
    if a.llama_server and not a.gguf:
        a.gguf = bg.gguf_path(argparse.Namespace(root=a.root, llamacpp_src=a.llamacpp_src),
                              a.model_dir and os.path.basename(a.dir) or a.model, a.dir, a.dtype)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {a.dir} ({a.dtype}); prompt {a.prompt}, "
          f"new {a.new}, {a.requests} requests per client, {a.threads} threads", flush=True)
    for clients in a.clients:
        results = {n: [] for n in names}
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                x = run_best(a, name, clients)
                results[name].append(x)
                print(json.dumps({"server": name, "clients": clients, "round": r, **x}), flush=True)
        for name in names:
            xs = results[name]
            med = lambda f: statistics.median(x[f] for x in xs)
            print(f"{clients:3d} clients  {name:9s}  {med('tok_s'):8.1f} tok/s (best "
                  f"{max(x['tok_s'] for x in xs):.1f})  TTFT p50 {med('ttft_p50') * 1e3:7.1f} ms  "
                  f"p99 {med('ttft_p99') * 1e3:7.1f} ms  TPOT p50 {med('tpot_p50') * 1e3:6.1f} ms", flush=True)
        for peer in names[1:]:
            ratio = statistics.median(x["tok_s"] for x in results["redco"]) / statistics.median(
                x["tok_s"] for x in results[peer])
            print(f"{clients:3d} clients  redco / {peer} aggregate tok/s: {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Generation speed: redco, transformers and llama.cpp side by side in one run.

One command builds (once) random-weight checkpoints with transformers'
save_pretrained, makes llama.cpp's GGUFs from them with llama.cpp's own
converter (llamacpp_gguf.py), measures the machine's read bandwidth
(bench_bandwidth), then lets the contenders take turns, in rotating order:

  transformers  model.generate (PyTorch CPU, its KV cache), fp32
  redco         redco-generate --bench, --dtype f32, bf16 and int8
  llama.cpp     llama-cpp-python's bindings (llamacpp_decode.py, llama-batched-bench's
                method; or llama-batched-bench itself), GGUF f32, bf16 and q8_0

Greedy, batch B rows of P random prompt tokens, N new tokens, --threads (2)
threads each, --rounds (3) alternating rounds, median and best reported. Before
each timed run the 1-minute load average must fall to --max-load (0.75 a
core), or the script refuses to time; llama.cpp runs in the environment given
and with OMP_WAIT_POLICY=PASSIVE, the faster kept.
Prefill tokens/s = B*P / time to the first new token; decode tokens/s =
B*(N-1) / time from the first to the last new token (llama.cpp: B*P / its
prefill, B*N / its decode loop). Decode at small batch is memory-bound: each step reads every
weight once, so the table also gives the weight bytes streamed per second and
their share of the measured read bandwidth.

  # LLAMACPP_SRC: the unpacked llama-cpp-python 0.3.36 sdist; LLAMACPP_BUILD: its CMake build
  .venv-ref/bin/python tools/bench/bench_generate.py --redco build/tools/redco-generate \\
      --models gpt2,llama1b --batch 1,8 --dtypes f32,bf16 --prompt 512 --new 128 --rounds 1 \\
      --bandwidth build/tools/bench/bench_bandwidth \\
      --llamacpp-py $LLAMACPP_SRC --llamacpp-lib $LLAMACPP_BUILD/bin \\
      --llamacpp-src $LLAMACPP_SRC/vendor/llama.cpp

A contender that is missing keeps its rows, with the reason. Encoder-decoders
(--models t5-small or bart-base, random weights at those sizes) run redco and
transformers only: the prompt is the encoder's source, prefill the encoder
plus the first decoder step.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

# On a shared machine (more runnable threads than cores) libgomp's spinning
# barriers make PyTorch 10-20x slower (measured: GPT-2 prefill 3.3 vs 77.6
# tok/s at load 16); passive waiting is the peer's best setting there. Must be
# set before torch loads libgomp, so the in-process transformers contender
# gets it; llama.cpp, a child process, runs both with the environment this
# script was given and with PASSIVE, and keeps the faster (WAIT_POLICIES).
USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import transformers as tf  # noqa: E402
import transformers.generation.utils as gen_utils  # noqa: E402

gen_utils.is_fsdp_managed_module = lambda module: False  # torch 1.13's FSDP import fails on Python 3.11

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ2SEQ = ("t5-small", "bart-base")


def hf_config(kind):
    if kind == "gpt2":  # n_ctx: llama.cpp's converter reads the old GPT-2 name
        return tf.GPT2Config(n_ctx=1024)
    if kind == "t5-small":  # t5-small's sizes (60M)
        return tf.T5Config(decoder_start_token_id=0)
    if kind == "bart-base":  # bart-base's sizes (140M)
        return tf.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                             decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
    # llama1b: TinyLlama's shape, 1.1B parameters (untied LM head)
    return tf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048)


def checkpoint(kind, root):
    d = os.path.join(root, kind)
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    torch.manual_seed(0)
    cls = {"gpt2": tf.GPT2LMHeadModel, "t5-small": tf.T5ForConditionalGeneration,
           "bart-base": tf.BartForConditionalGeneration}.get(kind, tf.LlamaForCausalLM)
    cls(hf_config(kind)).save_pretrained(d, safe_serialization=True)
    return d


def streamed_weights(d):
    """Parameters a decode step reads in full, from the safetensors headers (no load): all but the
    gathered position/input embeddings. A tied LM head (GPT-2's wte) counts once."""
    shapes = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
            shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    gathered = {"transformer.wpe.weight"}
    if "lm_head.weight" in shapes:
        gathered.add("model.embed_tokens.weight")
    return sum(math.prod(s) for k, s in shapes.items() if k not in gathered)


class Stamps(tf.StoppingCriteria):
    """Timestamps each generated token, as redco's on_token does: one generate call, no re-prefill."""

    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores, **kwargs):
        self.t.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def hf_run(model, batch, prompt, new):
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        warm = torch.randint(0, vocab, (batch, 8), generator=g)
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=2, min_new_tokens=2, **kw)
        ids = torch.randint(0, vocab, (batch, prompt), generator=g)
        stamps = Stamps()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       stopping_criteria=tf.StoppingCriteriaList([stamps]), **kw)
    t = stamps.t
    return {"prefill_tok_s": batch * prompt / (t[0] - t0),
            "decode_tok_s": batch * (len(t) - 1) / (t[-1] - t[0])}


def redco_run(a, d, batch, dtype):
    out = subprocess.run([a.redco, d, "--bench", "--batch", str(batch), "--prompt-length", str(a.prompt),
                          "--max-new-tokens", str(a.new), "--dtype", dtype, "--threads", str(a.threads)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"redco-generate failed: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# redco's weight dtypes and the GGUF type of the same precision (int8: llama.cpp's
# q8_0, one scale per 32 weights, against redco's one per row).
GGUF_TYPE = {"f32": "f32", "bf16": "bf16", "int8": "q8_0"}
WEIGHT_BYTES = {"f32": 4, "bf16": 2, "int8": 1}


def gguf_path(a, kind, d, dtype):
    dtype = GGUF_TYPE[dtype]
    path = os.path.join(a.root, f"{kind}-{dtype}.gguf")
    if os.path.exists(path):
        return path
    if not a.llamacpp_src:
        raise RuntimeError(f"{path} missing and no --llamacpp-src to make it with llama.cpp's converter")
    subprocess.run([sys.executable, os.path.join(HERE, "llamacpp_gguf.py"), "--llamacpp", a.llamacpp_src,
                    d, path, "--outtype", dtype], check=True, capture_output=True)
    return path


# llama.cpp's environments: the caller's own (its default) and passive OpenMP
# waiting. Spinning waits win on a quiet machine and lose badly on a busy one.
WAIT_POLICIES = ("default", "PASSIVE")


def wait_policy_env(policy):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy == "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif USER_OMP_WAIT_POLICY is not None:
        env["OMP_WAIT_POLICY"] = USER_OMP_WAIT_POLICY
    return env


def llamacpp_best(a, kind, d, batch, dtype):
    """llama.cpp in each of WAIT_POLICIES; its faster prefill and its faster decode are kept,
    each with the environment that gave it (the run says which)."""
    runs = []
    for policy in WAIT_POLICIES:
        x = llamacpp_run(a, kind, d, batch, dtype, wait_policy_env(policy))
        runs.append((f"OMP_WAIT_POLICY={policy}{x.pop('note', '')}", x))
    env_p, best_p = max(runs, key=lambda r: r[1]["prefill_tok_s"])
    env_d, best_d = max(runs, key=lambda r: r[1]["decode_tok_s"])
    env = env_d if env_p == env_d else f"prefill {env_p}, decode {env_d}"
    return {"prefill_tok_s": best_p["prefill_tok_s"], "decode_tok_s": best_d["decode_tok_s"], "env": env}


def llamacpp_run(a, kind, d, batch, dtype, env):
    """llama.cpp through llama-cpp-python's bindings (llamacpp_decode.py) or llama-batched-bench."""
    if a.llamacpp_bench:
        return batched_bench_run(a, kind, d, batch, dtype, env)
    lib = a.llamacpp_lib and os.path.join(a.llamacpp_lib, "libllama.so")
    if not a.llamacpp_py or not lib or not os.path.exists(lib):
        raise RuntimeError("llama.cpp not found: pass --llamacpp-py (the llama-cpp-python==0.3.36 sdist folder) "
                           "and --llamacpp-lib (the folder with its libllama.so), see docs/generation.md")
    model = gguf_path(a, kind, d, dtype)
    env = dict(env, PYTHONPATH=a.llamacpp_py, LLAMA_CPP_LIB_PATH=a.llamacpp_lib)
    out = subprocess.run([sys.executable, os.path.join(HERE, "llamacpp_decode.py"), model, "--batch", str(batch),
                          "--prompt", str(a.prompt), "--new", str(a.new), "--threads", str(a.threads)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"llamacpp_decode failed: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def batched_bench_run(a, kind, d, batch, dtype, env):
    exe = a.llamacpp_bench
    if not os.access(exe, os.X_OK):
        raise RuntimeError(f"--llamacpp-bench: {exe} is not an executable llama-batched-bench")
    model = gguf_path(a, kind, d, dtype)
    ctx = batch * (a.prompt + a.new) + 16
    cmd = [exe, "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(a.prompt),
           "-ntg", str(a.new), "-npl", str(batch), "-t", str(a.threads), "-tb", str(a.threads),
           "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    note = ""
    if out.returncode < 0:
        # Killed by a signal: on a Xeon with AMX, llama.cpp 0.3.36's q8_0 weight repacking
        # (its AMX/extra buffers, on by default) crashes. Its best working setting is then
        # repacking off; the row says so.
        note = f", --no-repack (the default died of signal {-out.returncode})"
        out = subprocess.run(cmd + ["--no-repack"], capture_output=True, text=True, env=env)
    lines = [l for l in out.stdout.splitlines() + out.stderr.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"llama-batched-bench failed (exit {out.returncode}): {out.stderr.strip()[-300:]}")
    r = json.loads(lines[-1])
    return {"prefill_tok_s": r["speed_pp"], "decode_tok_s": r["speed_tg"], "note": note}


def bandwidth(a):
    if not a.bandwidth or not os.access(a.bandwidth, os.X_OK):
        return None
    out = subprocess.run([a.bandwidth, "--seconds", "2"], capture_output=True, text=True, check=True)
    fields = dict(kv.split("=") for kv in out.stdout.strip().splitlines()[-1].split()[1:])
    print(f"bench_bandwidth: {out.stdout.strip().splitlines()[0]}", flush=True)
    return float(fields["read_all"])  # the memory's rate while on the cores (CPU time, not wall)


def contenders(a):
    rows = [("transformers", "f32")] if "transformers" in a.contenders else []
    for name in ("redco", "llama.cpp"):
        rows += [(name, dt) for dt in a.dtypes if name in a.contenders]
    return rows


def run_one(a, name, kind, d, hf, batch, dtype):
    if name == "transformers":
        return hf_run(hf, batch, a.prompt, a.hf_new or a.new)
    if name == "redco":
        return redco_run(a, d, batch, dtype)
    if kind in SEQ2SEQ:
        raise RuntimeError("not run: the llama.cpp contender is for decoder-only models here")
    return llamacpp_best(a, kind, d, batch, dtype)


def wait_until_quiet(a):
    """The 1-minute load average before a timed run, once it is at most --max-load.

    A contender that just ran leaves its own load behind, which decays within
    a minute; anything still above after --settle seconds is another program,
    and timing beside it would favour whichever contender it hurts least."""
    deadline = time.monotonic() + a.settle
    while True:
        load = os.getloadavg()[0]
        if load <= a.max_load:
            return load
        if time.monotonic() >= deadline:
            sys.exit(f"bench_generate: the load average is {load:.2f}, above --max-load {a.max_load:.2f}, "
                     f"after waiting {a.settle} s: the machine is not quiet (stop what runs, "
                     f"or raise --max-load and say so beside the numbers)")
        time.sleep(5)


def bench_model(a, kind, bw):
    d = checkpoint(kind, a.root)
    auto = tf.AutoModelForSeq2SeqLM if kind in SEQ2SEQ else tf.AutoModelForCausalLM
    hf = auto.from_pretrained(d).eval() if "transformers" in a.contenders else None
    n = streamed_weights(d)
    hf_new = f" (transformers {a.hf_new})" if a.hf_new else ""
    print(f"\n## {kind}: {n / 1e6:.1f}M streamed weights, prompt {a.prompt}, {a.new}{hf_new} new tokens, "
          f"{a.threads} threads, {a.rounds} round(s)", flush=True)
    results = {}  # (batch, name, dtype) -> list of runs, or the reason it did not run
    for r in range(a.rounds):
        for bi, batch in enumerate(a.batch):
            order = contenders(a)
            k = (r + bi) % len(order)
            for name, dtype in order[k:] + order[:k]:  # rotating order: no contender always goes first
                key = (batch, name, dtype)
                if isinstance(results.get(key), str):
                    continue
                load = wait_until_quiet(a)
                try:
                    x = run_one(a, name, kind, d, hf, batch, dtype)
                except Exception as e:  # the row stays, with why it has no numbers
                    results[key] = str(e).splitlines()[0][:200]
                    print(f"  {name} {dtype} batch {batch}: {results[key]}", flush=True)
                    continue
                x["load_before"], x["load"] = load, os.getloadavg()[0]
                results.setdefault(key, []).append(x)
                env = f", {x['env']}" if "env" in x else ""
                print(f"  round {r} batch {batch} {name} {dtype}: prefill {x['prefill_tok_s']:.1f} tok/s, "
                      f"decode {x['decode_tok_s']:.2f} tok/s (load {load:.2f} before, {x['load']:.2f} after{env})",
                      flush=True)
    report(a, kind, n, bw, results)


def median(runs, field):
    return statistics.median(x[field] for x in runs)


def report(a, kind, n, bw, results):
    print(f"\n| {kind} batch | contender | weights | prefill tok/s, median (best) | decode tok/s, median (best) "
          f"| decode weight GB/s | of read bandwidth | load before each run (or why not run) |"
          f"\n|---|---|---|---|---|---|---|---|")
    for (batch, name, dtype), runs in sorted(results.items(), key=lambda kv: kv[0]):
        if isinstance(runs, str):
            print(f"| {batch} | {name} | {dtype} | — | — | — | — | {runs} |")
            continue
        dec = median(runs, "decode_tok_s")
        gbs = dec / batch * n * WEIGHT_BYTES[dtype] / 1e9
        share = f"{100 * gbs / bw:.0f}%" if bw else "not measured"
        loads = ", ".join(f"{x['load_before']:.2f}" for x in runs)
        best = {f: max(x[f] for x in runs) for f in ("prefill_tok_s", "decode_tok_s")}
        print(f"| {batch} | {name} | {dtype} | {median(runs, 'prefill_tok_s'):.1f} ({best['prefill_tok_s']:.1f}) "
              f"| {dec:.2f} ({best['decode_tok_s']:.2f}) | {gbs:.1f} | {share} | {loads} |")
    print(f"\n| {kind} batch | ratio | value | target |\n|---|---|---|---|")
    for batch in a.batch:
        def get(name, dtype, field):
            runs = results.get((batch, name, dtype))
            return median(runs, field) if isinstance(runs, list) else None

        # Issue 42's targets: decode >= 1.1x llama.cpp and prefill >= 1.0x at every dtype,
        # int8 decode >= 1.8x bf16 (half the bytes).
        checks = [("redco f32 / transformers, decode", ("redco", "f32"), ("transformers", "f32"), "decode", 3.0)]
        for dt in a.dtypes:
            checks += [(f"redco / llama.cpp {dt}, decode", ("redco", dt), ("llama.cpp", dt), "decode", 1.1),
                       (f"redco / llama.cpp {dt}, prefill", ("redco", dt), ("llama.cpp", dt), "prefill", 1.0)]
        checks.append(("redco bf16 / f32, decode", ("redco", "bf16"), ("redco", "f32"), "decode", 1.7))
        checks.append(("redco int8 / bf16, decode", ("redco", "int8"), ("redco", "bf16"), "decode", 1.8))
        for label, x, y, what, target in checks:
            u, v = get(*x, f"{what}_tok_s"), get(*y, f"{what}_tok_s")
            if u is None or v is None:
                continue
            verdict = "met" if u / v >= target else "MISSED"
            print(f"| {batch} | {label} | {u / v:.2f}× | ≥ {target}× ({verdict}) |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    csv = lambda s: [x for x in s.split(",") if x]
    ap.add_argument("--redco", default="build/tools/redco-generate")
    ap.add_argument("--models", type=csv, default=["gpt2"], help="gpt2,llama1b,t5-small,bart-base")
    ap.add_argument("--root", default="/tmp/redco-bench-generate", help="checkpoints and GGUFs (made once)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in csv(s)], default=[1])
    ap.add_argument("--dtypes", type=csv, default=["f32"], help="weights for redco and llama.cpp: f32,bf16,int8")
    ap.add_argument("--contenders", type=csv, default=["transformers", "redco", "llama.cpp"])
    ap.add_argument("--hf-new", type=int, default=0,
                    help="new tokens for transformers only (default --new): its decode rate over fewer "
                         "steps, when 128 steps of a 1B model take too long on a loaded machine")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (min and median reported)")
    ap.add_argument("--threads", type=int, default=2, help="each contender's threads (redco-generate --threads, "
                    "torch.set_num_threads, llama.cpp -t)")
    ap.add_argument("--max-load", type=float, default=0.75 * (os.cpu_count() or 1),
                    help="refuse to time above this 1-minute load average (default: 0.75 a core)")
    ap.add_argument("--settle", type=int, default=300, help="seconds to wait for the load to fall first")
    ap.add_argument("--bandwidth", default="build/tools/bench/bench_bandwidth")
    ap.add_argument("--llamacpp-py", default=os.environ.get("LLAMACPP_PY"),
                    help="llama-cpp-python sdist folder (its llama_cpp package)")
    ap.add_argument("--llamacpp-lib", default=os.environ.get("LLAMA_CPP_LIB_PATH"),
                    help="folder with the libllama.so built from the sdist's vendor/llama.cpp")
    ap.add_argument("--llamacpp-bench", default=os.environ.get("LLAMACPP_BATCHED_BENCH"),
                    help="llama-batched-bench, used instead of the bindings when given")
    ap.add_argument("--llamacpp-src", default=os.environ.get("LLAMACPP_SRC"))
    a = ap.parse_args()
    for m in a.models:
        if m not in ("gpt2", "llama1b") + SEQ2SEQ:
            ap.error(f"--models: unknown model '{m}' (gpt2, llama1b, t5-small, bart-base)")
    for dt in a.dtypes:
        if dt not in GGUF_TYPE:
            ap.error(f"--dtypes: unknown dtype '{dt}' (f32, bf16, int8)")
    if "redco" in a.contenders and not os.access(a.redco, os.X_OK):
        ap.error(f"--redco: {a.redco} is not an executable; build it: ninja -C build tools/redco-generate")
    torch.set_num_threads(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    bw = bandwidth(a)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; read bandwidth "
          f"{f'{bw:.1f} GB/s' if bw else 'not measured (no --bandwidth binary)'}; torch {torch.__version__}, "
          f"transformers {tf.__version__}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    for kind in a.models:
        bench_model(a, kind, bw)


if __name__ == "__main__":
    main()

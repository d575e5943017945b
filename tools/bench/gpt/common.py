"""Shared pieces of the GPT training peers (PyTorch, JAX/Flax): the command line, the
configs, the token windows, the step timing and the RESULT line. They follow the contract
of tools/bench/bench_gpt_train.cpp so that every peer does the same work as redco.

Only the standard library and numpy are used here, so both the Debian PyTorch 1.13 (system
python3) and the virtual environments can import it.
"""
import argparse
import os
import resource
import statistics

import numpy as np

# name: (layers, dim, heads, seq, vocab, batch)
CONFIGS = {
    "S": dict(layers=4, dim=256, heads=4, seq=256, vocab=8192, batch=8),
    "M": dict(layers=12, dim=768, heads=12, seq=512, vocab=50257, batch=4),
    # GPT-2 small at its full context, a GPU-sized batch (tools/gpu-check's benchmark)
    "G": dict(layers=12, dim=768, heads=12, seq=1024, vocab=50257, batch=16),
}


def parse_args(extra=None):
    p = argparse.ArgumentParser()
    p.add_argument("--config", choices=sorted(CONFIGS), default="S")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--tokens", required=True, help="little-endian int32 token ids")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--init", help="load initial weights (safetensors, redco's names)")
    p.add_argument("--save-init", help="save the initial weights (safetensors, redco's names)")
    p.add_argument("--losses", help="write 'step S loss L ms T' per step")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=0,
                   help="rows of wpe (default: the sequence length, or the --init file's)")
    if extra:
        extra(p)
    return p.parse_args()


def pin_cpus(n):
    """Keep the process on at most n CPUs (thread pools that size themselves from the
    affinity mask, like XLA's, then start n threads)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > n:
            os.sched_setaffinity(0, cpus[:n])
    except (AttributeError, OSError):
        pass


def load_tokens(path):
    tok = np.fromfile(path, dtype="<i4").astype(np.int64)
    if tok.size < 2:
        raise SystemExit(f"{path}: too few tokens")
    return tok


def batch_at(tok, step, batch, seq):
    """Rows of step `step` (0-based, warm-up steps included): window start
    ((step*B + b) * (T+1)) mod (n - T - 1); inputs tok[s:s+T], targets tok[s+1:s+T+1]."""
    n = tok.size
    span = n - seq - 1
    if span <= 0:
        raise SystemExit("token file shorter than one window")
    x = np.empty((batch, seq), dtype=np.int32)
    y = np.empty((batch, seq), dtype=np.int32)
    for b in range(batch):
        s = ((step * batch + b) * (seq + 1)) % span
        x[b] = tok[s:s + seq]
        y[b] = tok[s + 1:s + seq + 1]
    return x, y


def param_count(cfg, context):
    d, L, V = cfg["dim"], cfg["layers"], cfg["vocab"]
    per_layer = 4 * d + 4 * (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return V * d + context * d + L * per_layer + 2 * d


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


class Recorder:
    """Collects per-step losses and times; writes the losses file and the RESULT line."""

    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.lines, self.timed_ms, self.last_loss = [], [], float("nan")
        self.f = open(args.losses, "w") if args.losses else None

    def step(self, s, loss, ms):
        self.last_loss = loss
        if s >= self.args.warmup:
            self.timed_ms.append(ms)
        if self.f:
            self.f.write(f"step {s} loss {loss:.8g} ms {ms:.3f}\n")
            self.f.flush()

    def finish(self):
        if self.f:
            self.f.close()
        ms = self.timed_ms or [float("nan")]
        med = statistics.median(ms)
        tokens = self.cfg["batch"] * self.cfg["seq"]
        print(f"RESULT tokens_per_s={tokens / (med / 1000.0):.2f} step_ms_median={med:.3f} "
              f"step_ms_min={min(ms):.3f} step_ms_max={max(ms):.3f} "
              f"final_loss={self.last_loss:.6f} peak_rss_mb={peak_rss_mb():.1f}", flush=True)


def init_numpy(cfg, context, seed):
    """redco's GPT-2 initialisation in numpy (float32): N(0, 0.02) for the embeddings and
    every linear weight, zeros for biases, ones/zeros for LayerNorm. Used by the peers when
    no --init is given (the values differ from redco's, the distribution does not)."""
    rng = np.random.default_rng(seed)
    d, L, V = cfg["dim"], cfg["layers"], cfg["vocab"]
    out = {}

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    out["wte.weight"] = normal(V, d)
    out["wpe.weight"] = normal(context, d)
    for i in range(L):
        h = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[h + ln + ".weight"] = np.ones(d, np.float32)
            out[h + ln + ".bias"] = np.zeros(d, np.float32)
        for pr in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[h + "attn." + pr + ".weight"] = normal(d, d)
            out[h + "attn." + pr + ".bias"] = np.zeros(d, np.float32)
        out[h + "mlp.fc1.weight"] = normal(4 * d, d)
        out[h + "mlp.fc1.bias"] = np.zeros(4 * d, np.float32)
        out[h + "mlp.fc2.weight"] = normal(d, 4 * d)
        out[h + "mlp.fc2.bias"] = np.zeros(d, np.float32)
    out["ln_f.weight"] = np.ones(d, np.float32)
    out["ln_f.bias"] = np.zeros(d, np.float32)
    return out


def check_shapes(cfg, params):
    d, L, V = cfg["dim"], cfg["layers"], cfg["vocab"]
    want = {"wte.weight": (V, d)}
    for i in range(L):
        want[f"h.{i}.mlp.fc1.weight"] = (4 * d, d)
        want[f"h.{i}.attn.q_proj.weight"] = (d, d)
    for k, shape in want.items():
        if k not in params:
            raise SystemExit(f"--init file lacks {k}")
        if tuple(params[k].shape) != shape:
            raise SystemExit(f"--init {k}: shape {tuple(params[k].shape)}, expected {shape}")
    if params["wpe.weight"].shape[1] != d:
        raise SystemExit("--init wpe.weight has the wrong width")


# ---- safetensors (the format is a little-endian u64 header size, a JSON header, raw data);
# read and written here with numpy so that the system python3 with Debian's torch needs
# no extra package. F32 and BF16 (widened to float32) tensors are read.
def load_safetensors(path):
    import json
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        shape = tuple(info["shape"])
        if info["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], dtype="<f4").reshape(shape)
        elif info["dtype"] == "BF16":
            u = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32).reshape(shape)
        else:
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']} (F32/BF16 expected)")
        out[name] = np.array(arr, dtype=np.float32)  # own the memory, writable
    return out


def save_safetensors(path, params):
    import json
    header, blobs, off = {}, [], 0
    for name, arr in params.items():
        arr = np.ascontiguousarray(arr, dtype="<f4")
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for raw in blobs:
            f.write(raw)

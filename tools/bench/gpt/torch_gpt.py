"""GPT-2 training in plain PyTorch (torch.nn), the peer of tools/bench/bench_gpt_train.cpp.

Same model, data windows, loss, optimiser and output as redco's benchmark (see common.py).
Runs on PyTorch 1.13 (Debian's python3-torch) and on the newest PyTorch from PyPI; each
version gets its fastest plain-PyTorch path: F.scaled_dot_product_attention (causal) where
it exists, else masked softmax attention; AdamW fused where the version has a fused CPU
kernel, else foreach. q/k/v are held as one [3d, d] projection (the usual fast
formulation); --init/--save-init split and join it under redco's names.

  python torch_gpt.py --config S --steps 10 --warmup 2 --tokens tok.bin [--init w.safetensors]
"""
import inspect
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

def extra_args(p):
    p.add_argument("--interop-threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")


args = common.parse_args(extra_args)
common.pin_cpus(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
try:
    torch.set_num_interop_threads(args.interop_threads)
except RuntimeError:
    pass

cfg = common.CONFIGS[args.config]
D, H, L, T, V, B = cfg["dim"], cfg["heads"], cfg["layers"], cfg["seq"], cfg["vocab"], cfg["batch"]
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-5)
        self.qkv = nn.Linear(D, 3 * D)
        self.o_proj = nn.Linear(D, D)
        self.ln_2 = nn.LayerNorm(D, eps=1e-5)
        self.fc1 = nn.Linear(D, 4 * D)
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(D, dim=2)
        q = q.view(b, t, H, D // H).transpose(1, 2)
        k = k.view(b, t, H, D // H).transpose(1, 2)
        v = v.view(b, t, H, D // H).transpose(1, 2)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
            att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = att @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, context):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(context, D)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(D, eps=1e-5)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.h:
            x = blk(x, self.mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.view(-1, V).float(), targets.reshape(-1))

    # redco's names <-> this module's tensors
    def load_redco(self, p):
        sd = {"wte.weight": p["wte.weight"], "wpe.weight": p["wpe.weight"],
              "ln_f.weight": p["ln_f.weight"], "ln_f.bias": p["ln_f.bias"]}
        for i in range(L):
            h = f"h.{i}."
            a = h + "attn."
            for ln in ("ln_1", "ln_2"):
                for w in ("weight", "bias"):
                    sd[h + ln + "." + w] = p[h + ln + "." + w]
            for w in ("weight", "bias"):
                sd[h + "qkv." + w] = np.concatenate([p[a + n + "_proj." + w] for n in "qkv"])
                sd[h + "o_proj." + w] = p[a + "o_proj." + w]
                sd[h + "fc1." + w] = p[h + "mlp.fc1." + w]
                sd[h + "fc2." + w] = p[h + "mlp.fc2." + w]
        self.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})

    def redco_params(self):
        sd = {k: v.detach().float().numpy() for k, v in self.state_dict().items()}
        p = {"wte.weight": sd["wte.weight"], "wpe.weight": sd["wpe.weight"]}
        for i in range(L):
            h = f"h.{i}."
            p[h + "ln_1.weight"], p[h + "ln_1.bias"] = sd[h + "ln_1.weight"], sd[h + "ln_1.bias"]
            for w in ("weight", "bias"):
                for j, n in enumerate("qkv"):
                    p[h + f"attn.{n}_proj.{w}"] = sd[h + "qkv." + w][j * D:(j + 1) * D]
                p[h + f"attn.o_proj.{w}"] = sd[h + "o_proj." + w]
            p[h + "ln_2.weight"], p[h + "ln_2.bias"] = sd[h + "ln_2.weight"], sd[h + "ln_2.bias"]
            for w in ("weight", "bias"):
                p[h + "mlp.fc1." + w] = sd[h + "fc1." + w]
            for w in ("weight", "bias"):
                p[h + "mlp.fc2." + w] = sd[h + "fc2." + w]
        p["ln_f.weight"], p["ln_f.bias"] = sd["ln_f.weight"], sd["ln_f.bias"]
        return p


init = common.load_safetensors(args.init) if args.init else None
if init is not None:
    common.check_shapes(cfg, init)
context = args.context or (init["wpe.weight"].shape[0] if init is not None else T)
if init is None:
    init = common.init_numpy(cfg, context, args.seed)
model = GPT(context)
model.load_redco(init)
del init
if args.save_init:
    common.save_safetensors(args.save_init, model.redco_params())
model.to(args.device).train()

# weight decay on rank >= 2 tensors only (weights and embeddings, not biases or norms)
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
opt_kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
sig = inspect.signature(torch.optim.AdamW).parameters
adamw_impl = "default"
opt = None
if "fused" in sig:
    try:
        opt = torch.optim.AdamW(groups, fused=True, **opt_kw)
        adamw_impl = "fused"
    except (RuntimeError, ValueError, TypeError):
        opt = None
if opt is None and "foreach" in sig:
    opt = torch.optim.AdamW(groups, foreach=True, **opt_kw)
    adamw_impl = "foreach"
if opt is None:
    opt = torch.optim.AdamW(groups, **opt_kw)

step_fn = torch.compile(model) if args.compile else model
tok = common.load_tokens(args.tokens)
rec = common.Recorder(args, cfg)
autocast = ((lambda: torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16))
            if args.dtype == "bf16" else None)
cuda = args.device.startswith("cuda")
print(f"# torch {torch.__version__} threads={torch.get_num_threads()} sdpa={HAS_SDPA} "
      f"adamw={adamw_impl} dtype={args.dtype} device={args.device} compile={args.compile} "
      f"params={sum(p.numel() for p in model.parameters())} "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')} "
      f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')} "
      f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')}", flush=True)

for s in range(args.warmup + args.steps):
    x, y = common.batch_at(tok, s, B, T)
    x, y = torch.from_numpy(x).long(), torch.from_numpy(y).long()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = x.to(args.device), y.to(args.device)
    if autocast:
        with autocast():
            loss = step_fn(x, y)
    else:
        loss = step_fn(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    lv = loss.item()  # waits for the step (a GPU's too)
    rec.step(s, lv, (time.perf_counter() - t0) * 1000.0)
rec.finish()

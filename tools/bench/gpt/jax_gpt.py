"""GPT-2 training in JAX + Flax (linen) + optax, the peer of tools/bench/bench_gpt_train.cpp.

Same model, data windows, loss, optimiser and output as redco's benchmark (see common.py).
The whole train step (forward, backward, AdamW) is one jitted function with the parameters
and optimiser state donated; compile time falls in the warm-up steps. Flax modules are
written with redco's parameter names (weight [out, in], bias), so --init maps one to one.

Threads: XLA's CPU thread pool sizes itself from the CPUs the process may run on, so the
process is pinned to --threads CPUs before jax is imported (XLA_FLAGS has no thread-count
flag in current releases); --xla_cpu_multi_thread_eigen stays on.

  python jax_gpt.py --config S --steps 10 --warmup 2 --tokens tok.bin [--init w.safetensors]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

args = common.parse_args(lambda p: p.add_argument(
    "--trainer", choices=["jax", "redco-pypi"], default="jax",
    help="jax: a jitted step written here; redco-pypi: the same model and optimiser "
         "trained by the redco package from PyPI (its Deployer and Trainer)"))
common.pin_cpus(args.threads)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import flax  # noqa: E402
import flax.linen as nn  # noqa: E402
import optax  # noqa: E402

cfg = common.CONFIGS[args.config]
D, H, L, T, V, B = cfg["dim"], cfg["heads"], cfg["layers"], cfg["seq"], cfg["vocab"], cfg["batch"]
CDT = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
HAS_DPA = hasattr(jax.nn, "dot_product_attention")
zeros = nn.initializers.zeros
ones = nn.initializers.ones
normal = nn.initializers.normal(0.02)


class Linear(nn.Module):
    out: int

    @nn.compact
    def __call__(self, x):
        w = self.param("weight", normal, (self.out, x.shape[-1]))  # [out, in] as in redco
        b = self.param("bias", zeros, (self.out,))
        return x @ w.astype(CDT).T + b.astype(CDT)


class LayerNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        w = self.param("weight", ones, (x.shape[-1],))
        b = self.param("bias", zeros, (x.shape[-1],))
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mu).mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * w + b).astype(CDT)


class Attention(nn.Module):
    @nn.compact
    def __call__(self, x):
        b, t, _ = x.shape
        q, k, v = (Linear(D, name=n)(x).reshape(b, t, H, D // H) for n in ("q_proj", "k_proj", "v_proj"))
        if HAS_DPA:
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        else:
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H).astype(np.float32)
            s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, jnp.finfo(s.dtype).min)
            y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
        return Linear(D, name="o_proj")(y.reshape(b, t, D))


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Linear(D, name="fc2")(jax.nn.gelu(Linear(4 * D, name="fc1")(x), approximate=True))


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x + Attention(name="attn")(LayerNorm(name="ln_1")(x))
        return x + MLP(name="mlp")(LayerNorm(name="ln_2")(x))


class GPT(nn.Module):
    context: int

    @nn.compact
    def __call__(self, idx):
        wte = self.param("wte", normal, (V, D))
        wpe = self.param("wpe", normal, (self.context, D))
        x = (wte[idx] + wpe[: idx.shape[1]]).astype(CDT)
        for i in range(L):
            x = Block(name=f"h_{i}")(x)
        x = LayerNorm(name="ln_f")(x)
        return (x @ wte.astype(CDT).T).astype(jnp.float32)  # tied LM head


# Flax path <-> redco name: ('h_3', 'attn', 'q_proj', 'weight') <-> h.3.attn.q_proj.weight;
# the embeddings are params 'wte', 'wpe' of the top module <-> wte.weight, wpe.weight.
def redco_name(path):
    parts = [p.key if hasattr(p, "key") else str(p) for p in path]
    if len(parts) == 1:
        return parts[0] + ".weight"
    if parts[0].startswith("h_"):
        parts[0] = "h." + parts[0][2:]
    return ".".join(parts)


def to_redco(params):
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {redco_name(p): np.asarray(v, dtype=np.float32) for p, v in flat}


def from_redco(params, p):
    def pick(path, leaf):
        a = p[redco_name(path)]
        if a.shape != leaf.shape:
            raise SystemExit(f"--init {redco_name(path)}: shape {a.shape}, expected {leaf.shape}")
        return jnp.asarray(a)
    return jax.tree_util.tree_map_with_path(pick, params)


init = common.load_safetensors(args.init) if args.init else None
if init is not None:
    common.check_shapes(cfg, init)
context = args.context or (init["wpe.weight"].shape[0] if init is not None else T)
model = GPT(context)
params = jax.jit(model.init)(jax.random.PRNGKey(args.seed), jnp.zeros((1, T), jnp.int32))["params"]
if init is not None:
    params = from_redco(params, init)
del init
if args.save_init:
    common.save_safetensors(args.save_init, to_redco(params))

# weight decay on rank >= 2 tensors only (a callable mask: redco's Trainer freezes the tree)
decay_mask = lambda p: jax.tree_util.tree_map(lambda a: a.ndim >= 2, p)  # noqa: E731
opt = optax.adamw(args.lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1, mask=decay_mask)


def loss_fn(params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


tok = common.load_tokens(args.tokens)
rec = common.Recorder(args, cfg)
n_params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(params))
banner = (f"# jax {jax.__version__} flax {flax.__version__} optax {optax.__version__} "
          f"devices={jax.devices()} cpus={len(os.sched_getaffinity(0))} dpa={HAS_DPA} "
          f"dtype={args.dtype} params={n_params} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")

if args.trainer == "jax":
    opt_state = opt.init(params)
    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    print(banner, flush=True)
    for s in range(args.warmup + args.steps):
        x, y = common.batch_at(tok, s, B, T)
        t0 = time.perf_counter()
        params, opt_state, loss = step_fn(params, opt_state, x, y)
        lv = float(loss)  # waits for the step
        rec.step(s, lv, (time.perf_counter() - t0) * 1000.0)
else:
    # The redco package (JAX) from PyPI: its Deployer builds the batches, its Trainer's
    # train step (pmap over the one local device when n_model_shards=1) runs forward,
    # backward and the optax update. The loop body is Trainer.train's, one batch at a time
    # so that each step is timed and the batches come in the contract's order (train()
    # would shuffle them).
    from importlib.metadata import version
    import redco
    from flax.jax_utils import unreplicate

    def collate_fn(examples):
        return {"x": np.stack([e["x"] for e in examples]), "y": np.stack([e["y"] for e in examples])}

    def redco_loss_fn(rng, state, params, batch, is_training):
        return loss_fn(params, batch["x"], batch["y"])

    deployer = redco.Deployer(jax_seed=args.seed, n_model_shards=1, verbose=False)
    trainer = redco.Trainer(deployer=deployer, collate_fn=collate_fn, apply_fn=model.apply,
                            loss_fn=redco_loss_fn, params=params, optimizer=opt,
                            compute_dtype=CDT)
    del params
    print(banner + f" redco {version('redco')}", flush=True)
    for s in range(args.warmup + args.steps):
        x, y = common.batch_at(tok, s, B, T)
        examples = [{"x": x[b], "y": y[b]} for b in range(B)]
        t0 = time.perf_counter()
        batch = next(iter(deployer.get_model_input_batches(
            examples=examples, per_device_batch_size=B, collate_fn=collate_fn, shuffle=False,
            shuffle_rng=None, desc="Training", is_train=True)))
        if trainer._p_train_step is None:
            trainer.setup_running_step(dummy_batch=batch)
        rng = deployer.gen_model_step_rng()
        trainer._state, metrics = deployer.run_model_step(
            step_fn=trainer._p_train_step, input_args=(rng, trainer._state, batch))
        lv = float(unreplicate(metrics)["loss"])
        rec.step(s, lv, (time.perf_counter() - t0) * 1000.0)
rec.finish()

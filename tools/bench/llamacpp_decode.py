"""llama.cpp's prefill and decode rates through llama-cpp-python's bindings.

bench_generate.py runs this in a child process (its own threads and memory)
for the llama.cpp contender. It does what llama.cpp's `llama-batched-bench`
does, through the `llama_cpp` low-level API of the `llama-cpp-python` package
(PyPI sdist; its libllama built from the sdist's vendor/llama.cpp, found with
LLAMA_CPP_LIB_PATH): B sequences of P random tokens prefilled (logits for the
last position only), then N steps of one random token per sequence, like
llama-batched-bench (no sampling). Prints one JSON line like redco-generate
--bench.

  python tools/bench/llamacpp_decode.py MODEL.gguf --batch B --prompt P --new N --threads T
"""
import argparse
import json
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        import llama_cpp.llama_cpp as L
    except Exception as e:  # noqa: BLE001 - any import failure means the contender is absent
        sys.exit(f"llamacpp_decode: cannot import llama_cpp ({e}); put the llama-cpp-python sdist on "
                 "PYTHONPATH and its built libllama folder in LLAMA_CPP_LIB_PATH")
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        sys.exit(f"llamacpp_decode: llama.cpp could not load {a.model}")
    B, P, N = a.batch, a.prompt, a.new
    cp = L.llama_context_default_params()
    cp.n_ctx = B * (P + N + 16)
    cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2048, 512, B
    cp.n_threads = cp.n_threads_batch = a.threads
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(cp.n_batch, 0, B)
    rng = random.Random(1)

    def add(pos, seq, logits):
        i = batch.n_tokens
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = rng.randrange(vocab), pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
        batch.n_tokens += 1
        if batch.n_tokens == cp.n_batch:
            flush()

    def flush():
        if batch.n_tokens and L.llama_decode(ctx, batch) != 0:
            sys.exit("llamacpp_decode: llama_decode failed")
        batch.n_tokens = 0

    for i in range(16):  # warm-up, as llama-batched-bench does
        add(i, 0, False)
    flush()
    L.llama_synchronize(ctx)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    t0 = time.perf_counter()
    for j in range(B):
        for i in range(P):
            add(i, j, i == P - 1)
    flush()
    L.llama_synchronize(ctx)
    t1 = time.perf_counter()
    for step in range(N):
        for j in range(B):
            add(P + step, j, True)
        flush()
    L.llama_synchronize(ctx)
    t2 = time.perf_counter()
    print(json.dumps({"batch": B, "prompt": P, "new": N, "prefill_s": round(t1 - t0, 4),
                      "prefill_tok_s": B * P / (t1 - t0), "decode_tok_s": B * N / (t2 - t1)}))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()

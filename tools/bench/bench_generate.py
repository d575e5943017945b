"""Generation speed, redco against transformers, side by side in one run.

Builds (once) a random-weight checkpoint with transformers' save_pretrained,
then alternates contenders: transformers.generate (PyTorch CPU, KV cache) and
redco-generate --bench, greedy, batch B, prompt P random tokens, N new tokens.
Prefill tokens/s and decode tokens/s per contender; the ratios are what to
quote (the machine is shared).

  .venv/bin/python tools/bench/bench_generate.py --redco build/tools/redco-generate \
      --model gpt2 --prompt 512 --new 128 --batch 1 --rounds 2 [--bf16]

Encoder-decoders (--model t5-small or bart-base, random weights at those
sizes): the prompt is the encoder's source; prefill is the encoder plus the
first decoder step, decode the decoder's steps with cached self- and
cross-attention.
"""
import argparse
import json
import os
import subprocess
import time

import torch
import transformers as tf
import transformers.generation.utils as gen_utils

gen_utils.is_fsdp_managed_module = lambda module: False  # torch 1.13 + Python 3.11


def checkpoint(kind, root):
    d = os.path.join(root, kind)
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    torch.manual_seed(0)
    if kind == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config())
    elif kind == "t5-small":  # t5-small's sizes (60M)
        model = tf.T5ForConditionalGeneration(tf.T5Config(decoder_start_token_id=0))
    elif kind == "bart-base":  # bart-base's sizes (140M)
        model = tf.BartForConditionalGeneration(tf.BartConfig(
            d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
            decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072))
    else:  # a LLaMA of ~1B parameters
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048))
    model.save_pretrained(d, safe_serialization=True)
    return d


def hf_run(model, batch, prompt, new):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=g)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        t2 = time.perf_counter()
    prefill = t1 - t0
    return {"prefill_tok_s": batch * prompt / prefill,
            "decode_tok_s": batch * (new - 1) / ((t2 - t1) - prefill)}


def redco_run(exe, d, batch, prompt, new, dtype="f32"):
    out = subprocess.run([exe, d, "--bench", "--batch", str(batch), "--prompt-length", str(prompt),
                          "--max-new-tokens", str(new), "--dtype", dtype],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--redco", default="build/tools/redco-generate")
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama1b", "t5-small", "bart-base"])
    ap.add_argument("--root", default="/tmp/redco-bench-generate")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="also redco with bf16 weights (--dtype bf16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = checkpoint(a.model, a.root)
    auto = tf.AutoModelForSeq2SeqLM if a.model in ("t5-small", "bart-base") else tf.AutoModelForCausalLM
    model = auto.from_pretrained(d).eval()
    print(f"{a.model}: batch {a.batch}, prompt {a.prompt}, new {a.new}, {a.threads} threads; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    rows = []
    for r in range(a.rounds):
        h = hf_run(model, a.batch, a.prompt, a.new)
        x = redco_run(a.redco, d, a.batch, a.prompt, a.new)
        rows.append((h, x))
        print(f"round {r}: transformers prefill {h['prefill_tok_s']:.1f} tok/s decode "
              f"{h['decode_tok_s']:.2f} tok/s | redco prefill {x['prefill_tok_s']:.1f} decode "
              f"{x['decode_tok_s']:.2f} | decode ratio {x['decode_tok_s'] / h['decode_tok_s']:.2f} "
              f"prefill ratio {x['prefill_tok_s'] / h['prefill_tok_s']:.2f} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        if a.bf16:
            y = redco_run(a.redco, d, a.batch, a.prompt, a.new, "bf16")
            print(f"round {r}: redco bf16 weights prefill {y['prefill_tok_s']:.1f} decode "
                  f"{y['decode_tok_s']:.2f} | bf16 / f32 decode {y['decode_tok_s'] / x['decode_tok_s']:.2f} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()

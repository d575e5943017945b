"""Train transformers' T5ForConditionalGeneration on the token ids samples/text_to_text
trains on (written by dump_verse_ids), with the sample's recipe: AdamW (weight decay 0.01,
none on norms), linear warm-up over 5% of the steps then cosine decay to 0, gradient
clipping 1, no dropout, ReLU feed-forward, untied head. Prints the mean training loss every
50 steps and the validation loss (per token) every 250, to set against the sample's
workdir/metrics.jsonl.

--init redco draws every matrix from N(0, 0.02) as redco does (nn::kTransformerInitStd);
--init hf keeps transformers' T5 initialiser (q: (d_model*d_kv)**-0.5, k/v/wi: d_model**-0.5,
embedding and untied head: 1.0).
  dump_verse_ids KJV KJV copy 600 48 Gen,Exod,Josh,Judg Jonah Phlm
  python t5_reference.py --data copy --init redco     # the vocab/pad ids dump_verse_ids printed
"""
import argparse, json, math, random, time

import torch
from transformers import T5Config, T5ForConditionalGeneration

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--vocab", type=int, default=640)
p.add_argument("--pad", type=int, default=600, help="pad and decoder start; eos is pad + 1")
p.add_argument("--dim", type=int, default=64)
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--layers", type=int, default=1)
p.add_argument("--heads", type=int, default=2)
p.add_argument("--steps", type=int, default=1500)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--lr", type=float, default=5e-3)
p.add_argument("--init", choices=["redco", "hf"], default="redco")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=42)
a = p.parse_args()
torch.manual_seed(a.seed)
random.seed(a.seed)
torch.set_num_threads(a.threads)


def load(name):
    out = []
    for line in open(f"{a.data}/{name}.ids"):
        s, t = line.split("|")
        out.append(([int(x) for x in s.split()], [int(x) for x in t.split()]))
    return out


train, valid = load("train"), load("valid")
cfg = T5Config(vocab_size=a.vocab, d_model=a.dim, d_kv=a.dim // a.heads, d_ff=a.hidden,
               num_layers=a.layers, num_decoder_layers=a.layers, num_heads=a.heads,
               dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=False,
               decoder_start_token_id=a.pad, pad_token_id=a.pad, eos_token_id=a.pad + 1)
model = T5ForConditionalGeneration(cfg)
if a.init == "redco":
    with torch.no_grad():
        for n, w in model.named_parameters():
            if "layer_norm" not in n:
                w.normal_(0, 0.02)


def batch(ex):
    S, T = max(len(s) for s, _ in ex), max(len(t) for _, t in ex)
    ids = torch.full((len(ex), S), a.pad)
    mask = torch.zeros((len(ex), S), dtype=torch.long)
    labels = torch.full((len(ex), T), -100)
    for i, (s, t) in enumerate(ex):
        ids[i, :len(s)], mask[i, :len(s)], labels[i, :len(t)] = torch.tensor(s), 1, torch.tensor(t)
    return ids, mask, labels


named = list(model.named_parameters())
opt = torch.optim.AdamW([{"params": [w for n, w in named if "layer_norm" not in n], "weight_decay": 0.01},
                         {"params": [w for n, w in named if "layer_norm" in n], "weight_decay": 0.0}],
                        lr=a.lr)
warm = max(1, int(0.05 * a.steps))
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, a.steps - warm))))


def valid_loss():
    model.eval()
    total = n = 0
    with torch.no_grad():
        for i in range(0, len(valid), a.batch):
            ids, mask, labels = batch(valid[i:i + a.batch])
            k = (labels != -100).sum().item()
            total += model(input_ids=ids, attention_mask=mask, labels=labels).loss.item() * k
            n += k
    model.train()
    return total / n


order, step, running, t0 = [], 0, 0.0, time.process_time()
while step < a.steps:
    if not order:
        order = list(range(len(train)))
        random.shuffle(order)
    ids, mask, labels = batch([train[order.pop()] for _ in range(min(a.batch, len(order)))])
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    step, running = step + 1, running + loss.item()
    if step % 50 == 0:
        line = {"step": step, "loss": round(running / 50, 4)}
        running = 0.0
        if step % 250 == 0:
            line["valid"] = round(valid_loss(), 4)
        line["cpu_s"] = round(time.process_time() - t0, 1)
        print(json.dumps(line), flush=True)

"""Golden generations from transformers for redco's generation tests.

For fixtures of tests/fixtures/hf (made by make_hf_fixtures.py): greedy,
greedy with penalties, and beam search outputs of transformers.generate for
prompts of different lengths, each generated alone (batch 1, so no padding
convention is involved), written to tests/fixtures/hf/<name>/generation.json.
The end-of-sequence id is one the model actually produces, so stopping and
finished beam hypotheses are exercised.

Encoder-decoders (t5, flan_t5, bart): the same cases for sources of
different lengths (the decoder starting from the checkpoint's
decoder_start_token_id, its forced_eos_token_id kept), a forced_bos_token_id
case, and all sources in one right-padded batch with their attention mask.

  .venv/bin/python tests/python/make_generation_goldens.py
"""
import json
import os

import torch
import transformers as tf
import transformers.generation.utils as gen_utils

# torch 1.13's FSDP import fails on Python 3.11; generate() only asks whether
# the model is FSDP-managed.
gen_utils.is_fsdp_managed_module = lambda module: False

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
PROMPTS = [[5, 17, 33, 2], [60], [9, 9, 41, 70, 12, 3, 88]]
SOURCES = [[5, 17, 33, 40, 2], [60, 4], [9, 9, 41, 70, 12, 3, 88, 21]]  # no pad ids


def run(model, prompt, **kw):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    return out[0, len(prompt):].tolist()


def late_token(tokens, fallback):
    """The token whose first occurrence comes last (the end id that lets the
    most tokens through), or `fallback` when every token shows up early."""
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    t = max(first, key=lambda t: first[t])
    return t if first[t] >= 3 else fallback


def seq2seq_cases(model):
    g = model.generation_config
    ids = dict(decoder_start_token_id=g.decoder_start_token_id, pad_token_id=g.pad_token_id,
               forced_eos_token_id=g.forced_eos_token_id, forced_bos_token_id=None)
    ids_json = {k: v for k, v in ids.items() if v is not None}

    def gen(source, **kw):
        src = torch.tensor([source])
        return model.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=12,
                              do_sample=False, **{**ids, **kw})

    cases = []
    for source in SOURCES:
        eos = late_token(gen(source, eos_token_id=None)[0, 1:].tolist(), g.eos_token_id)
        greedy = dict(ids_json, eos_token_ids=[eos])
        cases.append({"source": source, "config": greedy,
                      "tokens": gen(source, eos_token_id=eos)[0, 1:].tolist()})
        pen = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=6)
        cases.append({"source": source, "config": dict(greedy, **pen),
                      "tokens": gen(source, eos_token_id=eos, **pen)[0, 1:].tolist()})
        forced = dict(forced_bos_token_id=7)
        cases.append({"source": source, "config": dict(greedy, **forced),
                      "tokens": gen(source, eos_token_id=eos, **forced)[0, 1:].tolist()})
        for early in [False, True]:
            beams = dict(num_beams=4, length_penalty=0.8, early_stopping=early,
                         num_return_sequences=2)
            out = gen(source, eos_token_id=eos, output_scores=True,
                      return_dict_in_generate=True, **beams)
            cases.append({"source": source, "config": dict(greedy, **beams),
                          "sequences": [s[1:].tolist() for s in out.sequences],
                          "scores": out.sequences_scores.tolist()})
    # One batch, right-padded: each row cut after its end id (finished rows pad).
    eos = cases[0]["config"]["eos_token_ids"][0]
    longest = max(len(s) for s in SOURCES)
    pad = g.pad_token_id
    src = torch.tensor([s + [pad] * (longest - len(s)) for s in SOURCES])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in SOURCES])
    out = model.generate(src, attention_mask=mask, max_new_tokens=12, do_sample=False,
                         eos_token_id=eos, **ids)
    rows = []
    for r in out[:, 1:].tolist():
        rows.append(r[:r.index(eos) + 1] if eos in r else r)
    cases.append({"sources": SOURCES, "config": dict(ids_json, eos_token_ids=[eos]),
                  "batch_tokens": rows})
    return cases


def main():
    for name in ["t5", "flan_t5", "bart"]:
        d = os.path.join(HF, name)
        model = tf.AutoModelForSeq2SeqLM.from_pretrained(d).eval()
        cases = seq2seq_cases(model)
        with open(os.path.join(d, "generation.json"), "w") as f:
            json.dump(cases, f, indent=1)
        print(name, len(cases), "cases")
    for name in ["gpt2", "llama", "llama3_tied", "qwen2"]:
        d = os.path.join(HF, name)
        model = tf.AutoModelForCausalLM.from_pretrained(d).eval()
        cases = []
        for prompt in PROMPTS:
            base = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
            greedy = run(model, prompt, eos_token_id=None, **base)
            eos = greedy[4]  # a token the model emits: greedy stops there
            cases.append({"prompt": prompt, "config": {"eos_token_ids": [eos]},
                          "tokens": run(model, prompt, eos_token_id=eos, **base)})
            cases.append({"prompt": prompt,
                          "config": {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2,
                                     "min_new_tokens": 6, "eos_token_ids": [eos]},
                          "tokens": run(model, prompt, eos_token_id=eos, repetition_penalty=1.5,
                                        no_repeat_ngram_size=2, min_new_tokens=6, **base)})
            for early in [False, True]:
                beams = dict(num_beams=4, length_penalty=0.8, early_stopping=early,
                             num_return_sequences=2)
                ids = torch.tensor([prompt])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), eos_token_id=eos,
                                     output_scores=True, return_dict_in_generate=True,
                                     **beams, **base)
                seqs = [s[len(prompt):].tolist() for s in out.sequences]
                cases.append({"prompt": prompt,
                              "config": dict(beams, eos_token_ids=[eos]),
                              "sequences": seqs,
                              "scores": out.sequences_scores.tolist()})
        with open(os.path.join(d, "generation.json"), "w") as f:
            json.dump(cases, f, indent=1)
        print(name, len(cases), "cases")


if __name__ == "__main__":
    main()

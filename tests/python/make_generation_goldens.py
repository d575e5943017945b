"""Golden generations from transformers for redco's generation tests.

For fixtures of tests/fixtures/hf (made by make_hf_fixtures.py): greedy,
greedy with penalties, and beam search outputs of transformers.generate for
prompts of different lengths, each generated alone (batch 1, so no padding
convention is involved), written to tests/fixtures/hf/<name>/generation.json.
The end-of-sequence id is one the model actually produces, so stopping and
finished beam hypotheses are exercised.

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


def run(model, prompt, **kw):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    return out[0, len(prompt):].tolist()


def main():
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

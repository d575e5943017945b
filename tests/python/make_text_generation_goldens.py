#!/usr/bin/env python3
"""Golden text generations from transformers for tests/fixtures/hf/gpt2_text
(a tiny GPT-2 with the committed tokenizer tests/data/tokenizers/gpt2, made by
make_hf_fixtures.py): greedy completions of text prompts, and greedy runs with
`stop_strings` (transformers' StopStringCriteria: a row stops at the token
whose text completes a stop string). The stop strings are cut from the
greedy text itself, across and inside token boundaries, so they are hit.

  .venv/bin/python tests/python/make_text_generation_goldens.py

Writes tests/fixtures/hf/gpt2_text/text_generation.json.
"""
import json
import os

import torch
import transformers as tf
import transformers.generation.utils as gen_utils

gen_utils.is_fsdp_managed_module = lambda module: False  # torch 1.13 on Python 3.11

D = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf", "gpt2_text")
PROMPTS = ["In the beginning God", "And the LORD said unto Moses,", "Jesus wept.",
           "Blessed are the meek"]
NEW = 16


def greedy(model, tok, prompt, **kw):
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                         do_sample=False, eos_token_id=0, pad_token_id=0, **kw)
    return ids[0].tolist(), out[0, ids.shape[1]:].tolist()


def main():
    tok = tf.AutoTokenizer.from_pretrained(D)
    model = tf.AutoModelForCausalLM.from_pretrained(D).eval()
    completions, stops = [], []
    for prompt in PROMPTS:
        ids, new = greedy(model, tok, prompt)
        text = tok.decode(new, skip_special_tokens=True)
        completions.append({"prompt": prompt, "prompt_ids": ids, "tokens": new, "text": text})
        # Stop strings from the completion, without U+FFFD (the text of a
        # partial UTF-8 character, which the reference sees per token): one
        # across a token boundary, one inside a token, one across the
        # prompt's end, and one that never occurs.
        pieces = [tok.decode(new[:k]) for k in range(len(new) + 1)]
        candidates = []
        for k in range(2, len(new)):
            s = pieces[k + 1][len(pieces[k]) - 2:len(pieces[k]) + 1]
            if len(s) == 3 and "\ufffd" not in pieces[k + 1]:
                candidates.append([s])
                break
        for k in range(3, len(new)):
            t = pieces[k + 1][len(pieces[k]):]
            if len(t) >= 3 and "\ufffd" not in pieces[k + 1]:
                candidates.append([t[1:-1], "\u2603never"])
                break
        if pieces[1] and "\ufffd" not in pieces[1]:
            candidates.append([prompt[-2:] + pieces[1][:1]])
        candidates.append(["\u2603never"])
        for strings in candidates:
            _, got = greedy(model, tok, prompt, stop_strings=strings, tokenizer=tok)
            stops.append({"prompt": prompt, "stop_strings": strings, "tokens": got})
    with open(os.path.join(D, "text_generation.json"), "w") as f:
        json.dump({"max_new_tokens": NEW, "eos_token_id": 0, "completions": completions,
                   "stop_strings": stops}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for c in completions:
        print(repr(c["prompt"]), "->", repr(c["text"]))
    for s in stops:
        print(s["stop_strings"], len(s["tokens"]))


if __name__ == "__main__":
    main()

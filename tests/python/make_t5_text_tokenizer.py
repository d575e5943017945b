#!/usr/bin/env python3
"""A tokenizer.json for the tiny T5 fixture (tests/fixtures/hf/t5: 96 ids,
pad 0, eos 1), so redco-generate's text mode for encoder-decoders can be
tested on it: T5's layout (Unigram, Metaspace, </s> appended by the
post-processor) with <pad>, </s>, <unk> at T5's ids 0, 1, 2 and the 93 most
likely pieces of the committed KJV Unigram (tests/data/tokenizers/t5).
No third-party packages.

  python3 tests/python/make_t5_text_tokenizer.py

Writes tests/fixtures/hf/t5_text/tokenizer.json.
"""
import json
import os

ROOT = os.path.join(os.path.dirname(__file__), "..")
src = json.load(open(os.path.join(ROOT, "data/tokenizers/t5/tokenizer.json")))
specials = ["<pad>", "</s>", "<unk>"]
pieces = [p for p in src["model"]["vocab"] if p[0] not in ("<unk>", "<s>", "</s>")][:93]
vocab = [[s, 0.0] for s in specials] + pieces
out = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, s in enumerate(specials)],
    "normalizer": None,
    "pre_tokenizer": src["pre_tokenizer"],
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}},
    },
    "decoder": src["decoder"],
    "model": {"type": "Unigram", "unk_id": 2, "vocab": vocab, "byte_fallback": False},
}
assert len(vocab) == 96
path = os.path.join(ROOT, "fixtures/hf/t5_text/tokenizer.json")
with open(path, "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print("wrote", path)

#!/usr/bin/env python3
"""What transformers' AutoTokenizer does with the options of
tokenizer_config.json / special_tokens_map.json on top of a committed
tokenizer.json, for tests/test_tokenizer_config.cpp.

  make_tokenizer_config_goldens.py [OUT]   (default tests/data/tokenizers/config/goldens.json)

Each case names a committed tokenizer kind (tests/data/tokenizers/<kind>) and
the config files written next to its tokenizer.json; the answers are
AutoTokenizer's ids for single texts and pairs, a batch under padding=True,
truncation=True (model_max_length, padding_side, truncation_side, pad_token),
and decodes (clean_up_tokenization_spaces). A case the reference refuses
records its error instead. Needs transformers==4.46.3 (tools/setup).
"""
import json
import os
import shutil
import sys
import tempfile

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = ["In the beginning God created the heaven and the earth.", "Jesus wept.", "",
         "And God said , Let there be light : and there was light !",
         "Isn ' t it the LORD ' s ? We ' re here , they ' ve gone ."]
# (A non-empty second text: transformers reads "" as no pair.)
PAIRS = [("In the beginning", "God created the heaven."), ("Jesus wept.", "Amen.")]

CASES = [
    ("llama_bos_eos", "llama2",
     {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": True,
      "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 12, "padding_side": "left"},
     {"pad_token": "</s>"}),
    ("llama_no_bos", "llama2",
     {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "add_eos_token": False,
      "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<s>", "model_max_length": 9,
      "truncation_side": "left"},
     None),
    ("llama_eos_only", "llama2",
     {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "add_eos_token": True,
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                    "normalized": False, "rstrip": False, "single_word": False},
      "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                    "normalized": False, "rstrip": False, "single_word": False},
      "pad_token": "</s>", "model_max_length": 7},
     None),
    ("llama_defaults", "llama2",
     {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"},
     {"pad_token": "<s>"}),
    ("neox_eos", "gpt2",
     {"tokenizer_class": "GPTNeoXTokenizerFast", "add_eos_token": True,
      "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
      "model_max_length": 10},
     None),
    ("gpt2_clean_up", "gpt2",
     {"tokenizer_class": "GPT2TokenizerFast", "add_bos_token": True,
      "clean_up_tokenization_spaces": True, "model_max_length": 11, "padding_side": "left",
      "eos_token": "<|endoftext|>"},
     {"pad_token": "<|endoftext|>"}),
    ("bert_right", "bert",
     {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True,
      "clean_up_tokenization_spaces": False, "model_max_length": 8, "truncation_side": "left",
      "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]"},
     None),
    ("llama_no_bos_token", "llama2",
     {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "eos_token": "</s>"},
     None),
]


def answers(tok):
    out = {"single": [], "pair": [], "decode": []}
    for t in TEXTS:
        e = tok(t)
        # type_ids only where the class returns them (not LLaMA's).
        out["single"].append({"text": t, "ids": e["input_ids"],
                              "type_ids": e.get("token_type_ids")})
        for skip in (False, True):
            out["decode"].append({"ids": e["input_ids"], "skip": skip,
                                  "text": tok.decode(e["input_ids"], skip_special_tokens=skip)})
    for a, b in PAIRS:
        e = tok(a, b)
        out["pair"].append({"a": a, "b": b, "ids": e["input_ids"],
                            "type_ids": e.get("token_type_ids")})
    b = tok(TEXTS, padding=True, truncation=True)
    out["batch"] = {"texts": TEXTS, "ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    return out


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "tests/data/tokenizers/config/goldens.json")
    cases = []
    for name, kind, config, special_map in CASES:
        case = {"name": name, "kind": kind, "tokenizer_config": config,
                "special_tokens_map": special_map}
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(ROOT, "tests/data/tokenizers", kind, "tokenizer.json"), d)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(config, f)
            if special_map is not None:
                with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
                    json.dump(special_map, f)
            try:
                case.update(answers(AutoTokenizer.from_pretrained(d)))
                case["error"] = None
            except ValueError as e:
                case["error"] = str(e)
        cases.append(case)
    with open(dest, "w") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

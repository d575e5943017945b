"""Loads a checkpoint folder redco wrote with transformers and compares its
logits with the ones redco computed (redco_outputs.safetensors in the folder).

  check_hf_roundtrip.py DIR... -> exit 0 when max |diff| <= 1e-4 (or 2e-5 of
                                 the largest logit) and every tensor loaded
                                 (no missing or unexpected key)
"""
import os
import sys

import torch
import transformers as tf
from safetensors.torch import load_file


def check(d):
    g = load_file(os.path.join(d, "redco_outputs.safetensors"))
    arch = tf.AutoConfig.from_pretrained(d).architectures[0]
    model, info = getattr(tf, arch).from_pretrained(d, output_loading_info=True)
    bad = [k for k in info["missing_keys"] + info["unexpected_keys"] if "pooler" not in k]
    if bad or info["mismatched_keys"]:
        print(f"{arch}: keys not loaded: {bad} {info['mismatched_keys']}")
        return 1
    model.eval()
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            out = model(input_ids=g["input_ids"], attention_mask=g["attention_mask"],
                        decoder_input_ids=g["decoder_input_ids"]).logits
        else:
            out = model(input_ids=g["input_ids"], token_type_ids=g["token_type_ids"]).logits
    # fp32 rounding grows with the logits: within 1e-4, or 2e-5 of the largest
    # logit (transformers' own fp32 flan_t5 logits are 3.5e-5 off its fp64 ones).
    diff = (out - g["logits"]).abs().max().item()
    scale = g["logits"].abs().max().item()
    print(f"{arch}: redco's save loaded by transformers, max |logits diff| {diff:.2e} "
          f"(largest logit {scale:.1f})")
    return 0 if diff <= max(1e-4, 2e-5 * scale) else 1


if __name__ == "__main__":
    # One process for every folder: importing transformers takes seconds.
    sys.exit(max(check(d) for d in sys.argv[1:]))

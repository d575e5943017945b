"""Loads ViT / VisionEncoderDecoder folders redco wrote with transformers and
compares their outputs with redco's (redco_outputs.safetensors in the folder:
the pixel values, decoder ids, and redco's last hidden state or logits).

  check_vit_roundtrip.py DIR... -> exit 0 when every tensor loaded (only the
                                   pooler, which redco does not model, may be
                                   missing) and max |diff| <= 1e-4
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
        if "decoder_input_ids" in g:
            out = model(pixel_values=g["pixel_values"],
                        decoder_input_ids=g["decoder_input_ids"]).logits
        else:
            out = model(pixel_values=g["pixel_values"]).last_hidden_state
    diff = (out - g["output"]).abs().max().item()
    print(f"{arch}: redco's save loaded by transformers, max |diff| {diff:.2e}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(max(check(d) for d in sys.argv[1:]))

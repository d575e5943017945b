#!/usr/bin/env python3
"""transformers' side of tests/test_pretrained.cpp's live round trip: loads
folders redco's save_pretrained wrote with AutoModelForCausalLM and checks
their logits against the ones redco computed.

  hf_logits.py DIR GOLDEN [DIR GOLDEN]...
      GOLDEN is a safetensors file with "input_ids" [B, T] (i64) and
      "logits" [B, T, V] (f32). Prints max |difference| per folder; exits 1
      if any exceeds 1e-4, 77 (skip) if torch or transformers is missing.
"""
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # the tests' venv lacks them: skip, do not pass
    print(f"skipping: {e}")
    sys.exit(77)


def main(args):
    if not args or len(args) % 2:
        sys.exit(__doc__)
    worst = 0.0
    for d, golden in zip(args[::2], args[1::2]):
        g = load_file(golden)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=g["input_ids"]).logits.float()
        diff = (logits - g["logits"]).abs().max().item()
        print(f"{d}: {type(model).__name__} max |transformers - redco| = {diff:.3g}")
        worst = max(worst, diff)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

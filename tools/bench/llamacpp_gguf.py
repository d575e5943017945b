"""Make llama.cpp's GGUF from a Hugging Face folder with llama.cpp's own converter.

bench_generate.py calls this so that llama.cpp reads the very checkpoint that
redco and transformers read. It runs `convert_hf_to_gguf.py` from a llama.cpp
source tree (the `vendor/llama.cpp` folder of the `llama-cpp-python` sdist)
unchanged, with two adaptations made from the outside:

- Debian's PyTorch 1.13 lacks dtype names the converter only compares against
  (float8_*, uint16/32/64); placeholders that equal no real dtype stand in.
- The random-weight checkpoints have no tokenizer, and the converter refuses a
  folder without one. The benchmark feeds token ids, never text, so the GGUF
  gets a placeholder SentencePiece-style vocabulary of exactly the model's
  vocabulary size (<unk>, <s>, </s>, then t3, t4, ...). Weights and
  hyper-parameters go through the converter's own code.

  python tools/bench/llamacpp_gguf.py --llamacpp SRC_DIR HF_DIR OUT.gguf --outtype f32|bf16|q8_0
"""
import argparse
import os
import sys


class _MissingDtype:
    """Stands in for a torch dtype that torch 1.13 does not have."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name} (absent in torch {self.version})"


def patch_torch():
    import torch

    for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        if not hasattr(torch, name):
            d = _MissingDtype(name)
            d.version = torch.__version__
            setattr(torch, name, d)


def placeholder_vocab(self, *args, **kwargs):
    """A vocabulary of n ids with no merges: what a benchmark on ids needs."""
    import gguf

    n = int(self.hparams["vocab_size"])
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, n)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.NORMAL] * (n - 3)
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp", required=True, help="llama.cpp source folder (has convert_hf_to_gguf.py)")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=["f32", "bf16", "q8_0"], default="f32")
    a = ap.parse_args()
    script = os.path.join(a.llamacpp, "convert_hf_to_gguf.py")
    if not os.path.isfile(script):
        sys.exit(f"llamacpp_gguf: {script} not found; pass --llamacpp the llama.cpp folder "
                 "(vendor/llama.cpp of the llama-cpp-python sdist)")
    patch_torch()
    sys.path.insert(0, os.path.join(a.llamacpp, "gguf-py"))
    sys.path.insert(0, a.llamacpp)
    import conversion.base as base

    for cls in vars(base).values():
        if isinstance(cls, type) and hasattr(cls, "_set_vocab_gpt2"):
            cls._set_vocab_gpt2 = placeholder_vocab
            cls._set_vocab_sentencepiece = placeholder_vocab
    sys.argv = [script, a.hf_dir, "--outfile", a.out, "--outtype", a.outtype]
    import convert_hf_to_gguf

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()

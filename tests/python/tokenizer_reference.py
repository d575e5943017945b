#!/usr/bin/env python3
"""The `tokenizers` package's side of tests/test_tokenizer_kjv.cpp.

  tokenizer_reference.py TOKENIZER_JSON TEXT_FILE OUT_FILE

Encodes every line of TEXT_FILE (UTF-8, '\\n'-separated, no trailing newline
after the last line) with Tokenizer.encode_batch and writes, per line, as
little-endian int32: n, the n ids, the 2n character offsets, then the byte
length and UTF-8 bytes of decode(ids) and of decode(ids, skip_special_tokens=True).
"""
import struct
import sys

from tokenizers import Tokenizer


def main():
    tok_path, text_path, out_path = sys.argv[1:4]
    tok = Tokenizer.from_file(tok_path)
    with open(text_path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    encs = tok.encode_batch(lines)
    ids = [e.ids for e in encs]
    decodes = tok.decode_batch(ids, skip_special_tokens=False)
    skips = tok.decode_batch(ids, skip_special_tokens=True)
    with open(out_path, "wb") as out:
        for e, d, s in zip(encs, decodes, skips):
            n = len(e.ids)
            flat = [x for o in e.offsets for x in o]
            out.write(struct.pack(f"<i{n}i{2 * n}i", n, *e.ids, *flat))
            for text in (d, s):
                b = text.encode("utf-8")
                out.write(struct.pack("<i", len(b)) + b)


if __name__ == "__main__":
    main()

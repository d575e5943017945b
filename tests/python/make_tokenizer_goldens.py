#!/usr/bin/env python3
"""Trains one tokenizer of each kind on the KJV with the reference libraries
(`tokenizers`, `sentencepiece`, and `transformers`' SentencePiece converters)
and writes, for tests/test_tokenizer.cpp, each tokenizer.json next to the
reference's answers on an edge-case list and on seeded random Unicode strings.

  make_tokenizer_goldens.py [OUT_DIR]      (default tests/data/tokenizers)

Writes OUT_DIR/<kind>/tokenizer.json and OUT_DIR/<kind>/goldens.json.gz:
{"cases": [{"text", "ids", "offsets" (character offsets, as the package
reports them), "decode", "decode_skip"}]}. The vocabularies are small (2000)
so the files stay small. Needs the pinned packages of tools/setup and the
`bible` program (Debian's bible-kjv).
"""
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

VOCAB = 2000
SEED = 20241125
N_RANDOM = 2000

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def kjv_verses():
    out = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    verses = []
    for line in out.split("\n"):
        if line.startswith("  "):
            num, _, text = line.strip().partition(" ")
            if num.isdigit():
                verses.append(text)
    return verses


def byte_level_bpe(verses, special, split_regex=None, ignore_merges=False, roberta=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if split_regex:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=roberta)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(verses, trainer)
    return tok


def gpt2(verses):
    tok = byte_level_bpe(verses, ["<|endoftext|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    # A non-special added token with both strips, to exercise added-token options.
    tok.add_tokens([AddedToken("[LORD]", lstrip=True, rstrip=True, normalized=False)])
    return tok, "<|endoftext|>"


def llama3(verses):
    tok = byte_level_bpe(verses, ["<|begin_of_text|>", "<|end_of_text|>"], LLAMA3_SPLIT,
                         ignore_merges=True)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    tok.add_tokens([AddedToken("Jehovah", single_word=True, normalized=False)])
    return tok, "<|end_of_text|>"


def roberta(verses):
    tok = byte_level_bpe(verses, ["<s>", "<pad>", "</s>", "<unk>"], roberta=True)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0),
                                                      trim_offsets=True, add_prefix_space=True)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    return tok, "<mask>"


def bert(verses):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(verses, trainers.WordPieceTrainer(vocab_size=VOCAB,
                                                              special_tokens=special))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok, "[MASK]"


def misc(verses):
    """A file made of the remaining components: Unicode forms, StripAccents,
    Replace (regex), Lowercase, Strip; Whitespace, Punctuation, Digits,
    Metaspace (prepend_scheme first, no split); BPE with a continuing-subword
    prefix and an unknown token; a [CLS] $A [SEP] template; WordPiece decoding."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFD(), normalizers.StripAccents(), normalizers.NFKC(),
        normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Metaspace(prepend_scheme="first", split=False)])
    tok.decoder = decoders.WordPiece(prefix="##")
    special = ["[UNK]", "[CLS]", "[SEP]"]
    tok.train_from_iterator(verses, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                                        continuing_subword_prefix="##"))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    # Added tokens matched in the normalized (here lowercased) text.
    tok.add_tokens([AddedToken("Holy Ghost", normalized=True)])
    tok.add_special_tokens([AddedToken("[AMEN]", normalized=True, special=True)])
    return tok, "[SEP]"


def sentencepiece_model(verses, model_type, workdir):
    import sentencepiece as spm
    text = os.path.join(workdir, "kjv.txt")
    with open(text, "w") as f:
        f.write("\n".join(verses))
    prefix = os.path.join(workdir, model_type)
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, model_type=model_type, vocab_size=VOCAB,
        byte_fallback=(model_type == "bpe"), character_coverage=1.0, num_threads=2,
        bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    return prefix + ".model"


def llama2(verses, workdir):
    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import LlamaConverter
    slow = LlamaTokenizer(vocab_file=sentencepiece_model(verses, "bpe", workdir), legacy=True)
    tok = LlamaConverter(slow).converted()
    # As LlamaTokenizerFast sets it: <s> before each sequence.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok, "</s>"


def t5(verses, workdir):
    from transformers import T5Tokenizer
    from transformers.convert_slow_tokenizer import T5Converter
    slow = T5Tokenizer(vocab_file=sentencepiece_model(verses, "unigram", workdir), extra_ids=8,
                       legacy=True)
    return T5Converter(slow).converted(), "<extra_id_0>"


def edge_cases(special):
    return [
        "", " ", "  ", "a", " a", "a ", "   leading", "trailing   ", "a  b   c    d",
        "\t", "\ttab\tseparated\t", "\n", "line\nbreak", "two\n\nbreaks", "\r\n crlf \r\n",
        " \n \t mixed \t \n ", "In the beginning God created the heaven and the earth.",
        "it's we'll they're I'D 'tis ''' IT'S", "The LORD's", "e\u0301 combining e\u0301\u0301",
        "caf\u00e9 cafe\u0301", "non\u00a0breaking\u00a0space", "zero\u200bwidth\u200bspace",
        "\ufeffbom", "\U0001F44D\U0001F3FD thumbs", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
        "\u2764\ufe0f", "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0", "\u4e2d\u6587 mixed \u6587\u5b57",
        "\ud55c\uad6d\uc5b4", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "C\u1eeda Vi\u1ec7t", "\u00c5ngstr\u00f6m \u00df \ufb01 \u2126 \u212b", "\u2460\u2461 \u00bd \u00b2",
        "12345678901234567890", "3.14159 1,000,000 $100", "a1b2c3", "...!!!???", "<s>a",
        "</s>", "<unk>", "[CLS] x [SEP]", "x" * 10000, ("word " * 300).strip(),
        "\u0000nul\u0001ctl\u007f", "\u3000ideographic\u3000space", "\u2028\u2029 separators",
        f"{special}", f"{special}a", f"a{special}", f" {special} ", f"a {special} b",
        f"{special}{special}", f"x  {special}  y", f"\n{special}\n", "[LORD] the [LORD]",
        "a[LORD]b", "Jehovah Jehovahs xJehovah Jehovah.", "<mask>", "a <mask> b", "a<mask>",
        "<extra_id_0> <extra_id_1>x", "[MASK] mask [MASK]", "UPPER lower MiXeD",
        "\u0130stanbul \u0131", "\u1e9e", "\u00ad soft\u00adhyphen", "next\u0085line a\u0085 b",
        "\u1885\u1886 mongolian", "\ufffd replacement \u061d",
        "the HOLY GHOST, holy ghost; [Amen] x[AMEN]y Holy  Ghost",
    ]


def random_unicode(rng, n):
    pools = [
        (0x20, 0x7E, 30), (0x09, 0x0D, 3), (0xA0, 0x17F, 6), (0x300, 0x36F, 4),
        (0x370, 0x4FF, 4), (0x590, 0x6FF, 4), (0x900, 0x97F, 2), (0x3040, 0x30FF, 3),
        (0x4E00, 0x9FFF, 4), (0xAC00, 0xD7A3, 2), (0x1F300, 0x1F64F, 3), (0x1F3FB, 0x1F3FF, 1),
        (0x2000, 0x206F, 3), (0xFE00, 0xFE0F, 1), (0xFF00, 0xFFEF, 2), (0x1, 0x1F, 1),
        (0x10000, 0x10FFFF, 1), (0x80, 0xFFFD, 3),
    ]
    weights = [w for _, _, w in pools]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(0, 40)):
            lo, hi, _ = rng.choices(pools, weights)[0]
            cp = rng.randint(lo, hi)
            if 0xD800 <= cp <= 0xDFFF:
                cp = 0x20
            chars.append(chr(cp))
        out.append("".join(chars))
    return out


def goldens(tok, texts):
    cases = []
    for text in texts:
        enc = tok.encode(text)
        cases.append({"text": text, "ids": enc.ids, "offsets": [list(o) for o in enc.offsets],
                      "decode": tok.decode(enc.ids, skip_special_tokens=False),
                      "decode_skip": tok.decode(enc.ids, skip_special_tokens=True)})
    return {"cases": cases, "pairs": pair_goldens(tok), "batches": batch_goldens(tok)}


PAIRS = [("In the beginning", "God created the heaven"), ("", "and the earth."),
         ("Jesus wept.", ""), ("a  b", " c\td "), ("caf\u00e9 \u65e5\u672c", "\U0001F44D ok")]
BATCH = ["In the beginning God created the heaven and the earth.", "", "Jesus wept.",
         "And God said, Let there be light: and there was light.", "\u65e5\u672c \U0001F44D  x"]


def pair_goldens(tok):
    """encode(a, b) without and with truncation (max_length 7)."""
    out = []
    for max_length in (None, 7):
        t = Tokenizer.from_str(tok.to_str())
        if max_length:
            t.enable_truncation(max_length=max_length)
        for a, b in PAIRS:
            e = t.encode(a, b)
            out.append({"a": a, "b": b, "max_length": max_length or 0, "ids": e.ids,
                        "type_ids": e.type_ids, "offsets": [list(o) for o in e.offsets]})
    return out


def batch_goldens(tok):
    """encode_batch with truncation and padding, both sides."""
    out = []
    for side, max_length, multiple in (("right", 9, None), ("left", 6, 4), ("right", 1, None)):
        t = Tokenizer.from_str(tok.to_str())
        t.enable_truncation(max_length=max_length, direction=side)
        t.enable_padding(direction=side, pad_id=3, pad_type_id=1, pad_to_multiple_of=multiple)
        encs = t.encode_batch(BATCH)
        out.append({"side": side, "max_length": max_length, "multiple_of": multiple or 0,
                    "ids": [e.ids for e in encs], "type_ids": [e.type_ids for e in encs],
                    "attention_mask": [e.attention_mask for e in encs],
                    "offsets": [[list(o) for o in e.offsets] for e in encs]})
    return out


def legacy_merges(path):
    """Rewrites merges as "a b" strings, the older of the two formats both load."""
    with open(path) as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(path, "w") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "data", "tokenizers")
    verses = kjv_verses()
    rng = random.Random(SEED)
    randoms = random_unicode(rng, N_RANDOM)
    with tempfile.TemporaryDirectory() as work:
        kinds = {"gpt2": lambda: gpt2(verses), "llama3": lambda: llama3(verses),
                 "roberta": lambda: roberta(verses), "bert": lambda: bert(verses),
                 "llama2": lambda: llama2(verses, work), "t5": lambda: t5(verses, work),
                 "misc": lambda: misc(verses)}
        only = sys.argv[2:] or list(kinds)
        for kind in only:
            tok, special = kinds[kind]()
            d = os.path.join(out_dir, kind)
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "tokenizer.json")
            tok.save(path)
            if kind == "gpt2":
                legacy_merges(path)
            tok = Tokenizer.from_file(path)  # the goldens come from the file as saved
            g = goldens(tok, edge_cases(special) + randoms)
            with gzip.open(os.path.join(d, "goldens.json.gz"), "wt", compresslevel=9) as f:
                json.dump(g, f, ensure_ascii=False, separators=(",", ":"))
            print(f"{kind}: {len(g['cases'])} cases, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()

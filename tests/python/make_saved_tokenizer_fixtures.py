#!/usr/bin/env python3
"""Tokenizer folders as transformers' save_pretrained writes them, with
AutoTokenizer's ids on them, for tests/test_saved_tokenizers.cpp.

  make_saved_tokenizer_fixtures.py [OUT]   (default tests/data/tokenizers/saved)

For each family redco runs (GPT-2, OPT, GPT-J, GPT-NeoX, Qwen2, LLaMA,
Mistral, T5, BART, BERT) a tiny tokenizer is trained here, offline (byte-level
BPE and WordPiece with `tokenizers`, SentencePiece BPE and Unigram with
`sentencepiece`), wrapped in the family's fast class and, where the family has
one, its slow class, and saved with save_pretrained into OUT/<case>/. The
answers are AutoTokenizer.from_pretrained(OUT/<case>)'s: ids with and without
special tokens, pairs, and decodes, in OUT/goldens.json. The "_resaved" folders
are slow ones loaded and saved again by AutoTokenizer: the command redco's
errors give for a folder without tokenizer.json. Whether redco must
load a folder (or refuse it, naming the missing tokenizer.json) is the
test's business, not this script's.

Needs transformers==4.46.3, tokenizers==0.20.3, sentencepiece==0.2.0 and
protobuf==4.25.5 (the slow SentencePiece classes and their conversion).
"""
import functools
import json
import os
import shutil
import sys
import tempfile

import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (AutoTokenizer, BartTokenizer, BartTokenizerFast, BertTokenizer,
                          BertTokenizerFast, GPT2Tokenizer, GPT2TokenizerFast,
                          GPTNeoXTokenizerFast, LlamaTokenizer, LlamaTokenizerFast,
                          Qwen2Tokenizer, Qwen2TokenizerFast, T5Tokenizer, T5TokenizerFast)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Training text (Genesis 1, King James Version, public domain) and a little
# more, so that the texts below meet merges, unknown pieces and byte fallback.
CORPUS = """In the beginning God created the heaven and the earth.
And the earth was without form, and void; and darkness was upon the face of the deep.
And the Spirit of God moved upon the face of the waters.
And God said, Let there be light: and there was light.
And God saw the light, that it was good: and God divided the light from the darkness.
And God called the light Day, and the darkness he called Night.
And the evening and the morning were the first day.
And God said, Let there be a firmament in the midst of the waters,
and let it divide the waters from the waters.
And God made the firmament, and divided the waters which were under the firmament
from the waters which were above the firmament: and it was so.
And God called the firmament Heaven. And the evening and the morning were the second day.
Jesus wept. They're here; it's 1234 or 56.78 isn't it? Café naïve résumé.
""".splitlines()

TEXTS = ["In the beginning God created the heaven and the earth.",
         " And God said, Let there be light",
         "  two leading spaces and  inner  ones ",
         "Café naïve résumé: 1234, 56.78!",
         "Ünïcödé 中文 and emoji 🙂 here",
         "They're here; isn't it?",
         "",
         "light</s>Day<s>Night"]
PAIRS = [("In the beginning", "God created the heaven."), (" Jesus wept.", "Amen!")]


@functools.lru_cache(maxsize=None)
def train_byte_bpe(vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def byte_bpe_files(d, specials, vocab_size=300):
    """vocab.json and merges.txt of a tiny byte-level BPE, in d."""
    train_byte_bpe(vocab_size, tuple(specials)).model.save(d)
    return os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")


def spm_model(d, model_type, vocab_size, **extra):
    path = os.path.join(d, "sp_" + model_type + ".model")
    with open(path, "wb") as f:
        f.write(trained_spm(model_type, vocab_size, tuple(sorted(extra.items()))))
    return path


@functools.lru_cache(maxsize=None)
def trained_spm(model_type, vocab_size, extra):
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "sp")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(CORPUS), model_prefix=prefix, model_type=model_type,
            vocab_size=vocab_size, character_coverage=1.0, normalization_rule_name="identity",
            minloglevel=2, num_threads=1, **dict(extra))
        with open(prefix + ".model", "rb") as f:
            return f.read()


def llama_model(d):
    # LLaMA's layout: <unk> <s> </s>, byte fallback, digits split.
    return spm_model(d, "bpe", 320, byte_fallback=True, split_digits=True,
                     unk_id=0, bos_id=1, eos_id=2, pad_id=-1)


def t5_model(d):
    # T5's layout: <pad> </s> <unk>, no <s>.
    return spm_model(d, "unigram", 100, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)


@functools.lru_cache(maxsize=None)
def trained_wordpiece():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tuple(t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]))


def wordpiece_vocab(d):
    path = os.path.join(d, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in trained_wordpiece())
    return path


# Each case: (name, how to build the tokenizer from a scratch folder). The
# "_resaved" cases are slow folders re-saved through AutoTokenizer, the
# command redco's errors give for folders without tokenizer.json.
def cases(dest):
    def resaved(slow):
        return lambda d: AutoTokenizer.from_pretrained(os.path.join(dest, slow))

    gpt2 = ["<|endoftext|>"]
    bart = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    opt = ["<s>", "<pad>", "</s>", "<unk>"]
    qwen = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return [
        ("gpt2_fast", lambda d: GPT2TokenizerFast(*byte_bpe_files(d, gpt2))),
        ("gpt2_slow", lambda d: GPT2Tokenizer(*byte_bpe_files(d, gpt2))),
        ("gpt2_slow_prefix_space",
         lambda d: GPT2Tokenizer(*byte_bpe_files(d, gpt2), add_prefix_space=True)),
        # OPT: a GPT-2 tokenizer that starts every text with </s>.
        ("opt_fast", lambda d: GPT2TokenizerFast(
            *byte_bpe_files(d, opt), bos_token="</s>", eos_token="</s>", unk_token="</s>",
            pad_token="<pad>", add_bos_token=True, from_slow=True)),
        ("opt_slow", lambda d: GPT2Tokenizer(
            *byte_bpe_files(d, opt), bos_token="</s>", eos_token="</s>", unk_token="</s>",
            pad_token="<pad>", add_bos_token=True)),
        # GPT-J: GPT-2's tokenizer with extra added tokens after the vocabulary.
        ("gptj_fast", lambda d: gptj(GPT2TokenizerFast(*byte_bpe_files(d, gpt2)))),
        ("gptj_slow", lambda d: gptj(GPT2Tokenizer(*byte_bpe_files(d, gpt2)))),
        ("gpt_neox_fast", lambda d: GPTNeoXTokenizerFast(
            tokenizer_object=train_byte_bpe(300, tuple(gpt2)), bos_token="<|endoftext|>",
            eos_token="<|endoftext|>", unk_token="<|endoftext|>")),
        ("qwen2_fast", lambda d: Qwen2TokenizerFast(*byte_bpe_files(d, qwen))),
        ("qwen2_slow", lambda d: Qwen2Tokenizer(*byte_bpe_files(d, qwen))),
        ("bart_fast", lambda d: BartTokenizerFast(*byte_bpe_files(d, bart))),
        ("bart_slow", lambda d: BartTokenizer(*byte_bpe_files(d, bart))),
        # LLaMA: the fast class converted from the slow one writes
        # add_prefix_space (and legacy) into tokenizer_config.json.
        ("llama_fast", lambda d: LlamaTokenizerFast(vocab_file=llama_model(d))),
        ("llama_fast_legacy_false",
         lambda d: LlamaTokenizerFast(vocab_file=llama_model(d), legacy=False)),
        ("llama_fast_no_prefix_space",
         lambda d: LlamaTokenizerFast(vocab_file=llama_model(d), add_prefix_space=False)),
        ("llama_fast_bos_eos", lambda d: LlamaTokenizerFast(
            vocab_file=llama_model(d), add_eos_token=True, pad_token="<unk>")),
        ("llama_slow", lambda d: LlamaTokenizer(vocab_file=llama_model(d))),
        ("llama_resaved", resaved("llama_slow")),
        # Mistral's checkpoints name LlamaTokenizer with legacy false.
        ("mistral_fast", lambda d: LlamaTokenizerFast(
            vocab_file=llama_model(d), legacy=False, add_prefix_space=True)),
        ("t5_fast", lambda d: T5TokenizerFast(vocab_file=t5_model(d), extra_ids=3)),
        ("t5_fast_legacy_false",
         lambda d: T5TokenizerFast(vocab_file=t5_model(d), extra_ids=3, legacy=False)),
        ("t5_slow", lambda d: T5Tokenizer(vocab_file=t5_model(d), extra_ids=3)),
        ("t5_resaved", resaved("t5_slow")),
        ("bert_fast", lambda d: BertTokenizerFast(vocab_file=wordpiece_vocab(d))),
        ("bert_slow", lambda d: BertTokenizer(vocab_file=wordpiece_vocab(d))),
        ("bert_resaved", resaved("bert_slow")),
    ]


def gptj(tok):
    tok.add_tokens([f"<|extratoken_{i}|>" for i in range(1, 4)])
    return tok


def answers(tok):
    out = {"reference_class": type(tok).__name__, "single": [], "pair": []}
    for t in TEXTS:
        ids = tok(t)["input_ids"]
        # decode: of ids, keeping and skipping the special tokens.
        out["single"].append({"text": t, "ids": ids,
                              "ids_plain": tok(t, add_special_tokens=False)["input_ids"],
                              "decode": [tok.decode(ids, skip_special_tokens=s)
                                         for s in (False, True)]})
    for a, b in PAIRS:
        out["pair"].append({"a": a, "b": b, "ids": tok(a, b)["input_ids"]})
    return out


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "tests/data/tokenizers/saved")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    goldens = []
    for name, build in cases(dest):
        folder = os.path.join(dest, name)
        with tempfile.TemporaryDirectory() as scratch:
            build(scratch).save_pretrained(folder)
        case = {"name": name, "files": sorted(os.listdir(folder))}
        case.update(answers(AutoTokenizer.from_pretrained(folder)))
        goldens.append(case)
    with open(os.path.join(dest, "goldens.json"), "w", encoding="utf-8") as f:
        f.write('{"cases": [\n')  # a case a line: small, and diffs stay readable
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in goldens))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()

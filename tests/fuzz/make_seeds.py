#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<target>/):
small valid inputs of each format, so fuzzing starts from the parsers' deep
paths. Standard library only; the output is deterministic.

  tests/fuzz/make_seeds.py [corpus-dir]
"""
import gzip
import json
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors: u64 header length, JSON header, data --------------------------
def safetensors(tensors, meta=None):
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = struct.pack("<6f", -1, -0.5, 0, 0.5, 1, 1.5)
put("safetensors", "f32_2x3", safetensors({"w": ("F32", [2, 3], f32)}))
put("safetensors", "mixed", safetensors({
    "h.0.ln.bias": ("BF16", [2], b"\x80\x3f\x00\xc0"),
    "h.0.fc.weight": ("F16", [2, 2], struct.pack("<4e", 1.5, -2, 65504, 0)),
    "ids": ("I64", [3], struct.pack("<3q", -7, 0, 1 << 53)),
    "step": ("I32", [], struct.pack("<i", 42)),
    "mask": ("U8", [4], bytes([0, 1, 254, 255])),
}, {"format": "pt", "note": "seed"}))
put("safetensors", "empty_tensor", safetensors({"e": ("F32", [0, 4], b"")}))
put("safetensors", "no_tensors", safetensors({}, {"only": "metadata"}))

# ---- IDX: 0 0 type ndim, big-endian u32 dims, big-endian data ----------------------
def idx(code, dims, payload):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


images = idx(0x08, [2, 2, 2], bytes(range(8)))
put("idx", "u8_2x2x2", images)
put("idx", "u8_labels", idx(0x08, [3], bytes([0, 9, 4])))
put("idx", "i32_vec", idx(0x0C, [2], struct.pack(">2i", -1, 7)))
put("idx", "f32_mat", idx(0x0D, [1, 2], struct.pack(">2f", 0.25, -3)))
put("idx", "f64_scalar_rows", idx(0x0E, [1], struct.pack(">d", 1e300)))
put("idx", "i16_vec", idx(0x0B, [2], struct.pack(">2h", -2, 3)))
put("idx", "gz_images", gzip.compress(images, mtime=0))

# ---- state.json as the Trainer writes it ----------------------------------------
state = {
    "version": 1, "step": 6, "epoch": 0, "step_in_epoch": 6, "optimizer_step": 5,
    "next_lr": 0.01, "skipped_steps": 1, "seed": 5,
    "best": {"accuracy": {"value": 0.75, "step": 4, "mode": "max"}},
    "config": {"n_examples": 64, "per_device_batch_size": 8, "global_batch_size": 8,
               "accumulation_steps": 1, "steps_per_epoch": 8, "n_epochs": 10,
               "shuffle": True, "dp_size": 1, "n_model_shards": 1,
               "data_order": "philox fisher-yates of (seed, epoch)"},
}
put("state_json", "state", json.dumps(state, indent=2))
put("state_json", "unicode", json.dumps({"k\u00e9y": ["\u540d\u524d", "\\\"q\"", None, -0.0,
                                                     1.5e-300, 18446744073709551615]}))
put("state_json", "nested", "[" * 20 + "]" * 20)

# ---- launch environments: NAME=VALUE lines ---------------------------------------
put("launch_env", "slurm", "\n".join([
    "SLURM_STEP_NODELIST=node[01-03,07],gpu-a[1-2]x,login5", "SLURM_PROCID=5",
    "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=4",
    "SLURM_STEP_TASKS_PER_NODE=2(x3),2", "SLURM_JOB_ID=123456", "SLURM_STEP_ID=0"]))
put("launch_env", "tasks_per_node", "SLURM_STEP_TASKS_PER_NODE=2(x3),1,4(x2)")
put("launch_env", "redco_run", "\n".join([
    "REDCO_HOST0=10.0.0.1:29500", "REDCO_RANK=1", "REDCO_WORLD_SIZE=4",
    "REDCO_LOCAL_RANK=1", "REDCO_LOCAL_WORLD_SIZE=2", "REDCO_NODE_RANK=0", "REDCO_NNODES=2",
    "REDCO_JOB_TOKEN=abc", "REDCO_TIMEOUT=30.5", "REDCO_RESTART=2", "REDCO_PORT=29501"]))
put("launch_env", "openmpi", "\n".join([
    "REDCO_HOST0=[::1]:29500", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
    "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
    "OMPI_MCA_ess_base_jobid=77"]))
put("launch_env", "multi_bracket", "X=a[1-2]b[08-10]c,d[5]")

# ---- tokenizer.json: one small file per model kind and the stages around it ------
def added(i, content, special=True, **kw):
    t = {"id": i, "content": content, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": special}
    t.update(kw)
    return t


def tokenizer(model, normalizer=None, pre=None, post=None, decoder=None, added_tokens=(),
              **extra):
    t = {"version": "1.0", "truncation": None, "padding": None,
         "added_tokens": list(added_tokens), "normalizer": normalizer,
         "pre_tokenizer": pre, "model": model, "post_processor": post, "decoder": decoder}
    t.update(extra)
    return json.dumps(t, ensure_ascii=False)


byte_chars = "abcdefghijklmnopqrstuvwxyzIGT \u0120.,"
bpe_vocab = {c: i + 2 for i, c in enumerate(byte_chars)}
for m in ["t h", "th e", "\u0120 th", "i n", "e a", "ea r"]:
    bpe_vocab[m.replace(" ", "")] = len(bpe_vocab) + 2
put("tokenizer_json", "gpt2_bpe", tokenizer(
    {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
     "ignore_merges": False, "vocab": bpe_vocab,
     "merges": ["t h", "th e", "\u0120 th", "i n", "e a", "ea r"]},
    pre={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    post={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
             "use_regex": True},
    added_tokens=[added(0, "<s>"), added(1, "</s>"),
                  added(len(bpe_vocab) + 2, "[LORD]", False, lstrip=True, rstrip=True)]))
put("tokenizer_json", "llama_sentencepiece_bpe", tokenizer(
    {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
     "ignore_merges": False,
     "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "<0xC3>": 4, "<0xA9>": 5,
               "\u2581": 6, "a": 7, "b": 8, "\u2581a": 9, "ab": 10},
     "merges": ["\u2581 a", "a b"]},
    normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    post={"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}],
          "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"Sequence": {"id": "B", "type_id": 1}}],
          "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    decoder={"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    added_tokens=[added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")]))
put("tokenizer_json", "bert_wordpiece", tokenizer(
    {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
     "max_input_chars_per_word": 100,
     "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "in": 4, "the": 5,
               "begin": 6, "##ning": 7, "god": 8, ".": 9, "##s": 10, "cafe": 11}},
    normalizer={"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                "strip_accents": None, "lowercase": True},
    pre={"type": "BertPreTokenizer"},
    post={"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    decoder={"type": "WordPiece", "prefix": "##", "cleanup": True},
    added_tokens=[added(0, "[PAD]"), added(1, "[UNK]"), added(2, "[CLS]"), added(3, "[SEP]")],
    truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
    padding={"strategy": {"Fixed": 10}, "direction": "Left", "pad_to_multiple_of": None,
             "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}))
put("tokenizer_json", "t5_unigram", tokenizer(
    {"type": "Unigram", "unk_id": 2, "byte_fallback": False,
     "vocab": [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0],
               ["\u2581the", -3.0], ["e", -4.0], ["t", -4.5], ["h", -4.6], ["in", -5.0],
               ["\u2581in", -5.5], ["1", -6.0], ["2", -6.0]]},
    normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Strip", "strip_left": False, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
    pre={"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
         "split": True}]},
    post={"type": "TemplateProcessing",
          "single": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
          "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}},
                   {"Sequence": {"id": "B", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
          "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
    decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
             "split": True},
    added_tokens=[added(0, "<pad>"), added(1, "</s>"), added(2, "<unk>")]))

# ---- Hugging Face config.json: the committed fixtures' configs, one per family ----
fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
for name in ["gpt2", "llama3_tied", "qwen2", "mistral", "opt_post_ln_proj", "gptj", "gpt_neox",
             "t5", "flan_t5", "bart", "bert", "roberta"]:
    with open(os.path.join(fixtures, name, "config.json")) as f:
        put("hf_config", name, json.dumps(json.load(f), indent=2, sort_keys=True))
# Regression: num_attention_heads 0 divided hidden_size before it was checked.
with open(os.path.join(fixtures, "llama", "config.json")) as f:
    zero_heads = json.load(f)
zero_heads["num_attention_heads"] = 0
put("hf_config", "llama_zero_heads", json.dumps(zero_heads, indent=2))

# ---- model.safetensors.index.json ------------------------------------------------
put("hf_index", "two_shards", json.dumps({
    "metadata": {"total_size": 1234},
    "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                   "model.norm.weight": "model-00002-of-00002.safetensors",
                   "lm_head.weight": "model-00002-of-00002.safetensors"}}, indent=2))
put("hf_index", "one_file", json.dumps({"weight_map": {"wte.weight": "model.safetensors"}}))

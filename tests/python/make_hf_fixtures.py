"""Builds the tiny Hugging Face checkpoints redco's pretrained-model tests load.

For every family and config variant: a random-weight model from `transformers`
saved with save_pretrained(safe_serialization=True) into
tests/fixtures/hf/<name>/, and golden.safetensors beside it holding fixed
input ids and the reference logits (fp32). Weights are redrawn with a larger
spread than transformers' initialiser so logits are O(1): a wrong transpose,
permutation or scale then moves them far beyond the tests' 1e-4.

Encoder-decoders (T5, BART) record the encoder's last hidden state beside
the decoder's logits, for a full and a padded source batch; encoders (BERT,
RoBERTa) the classifier's logits and the last hidden state, with token types
and for a padded batch.

Run with the test venv (Debian's python3-torch 1.13 + transformers 4.46.3):
  .venv/bin/python tests/python/make_hf_fixtures.py            # every fixture
  .venv/bin/python tests/python/make_hf_fixtures.py opt gptj   # only these
"""
import json
import os
import shutil
import sys

import torch
import transformers as tf
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf")
VOCAB = 96


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("weight")
                        else 0.2 * torch.randn(p.shape, generator=g))
            else:
                std = 0.3 if p.dim() < 2 else 1.0 / p.shape[-1] ** 0.5 * 1.5
                p.copy_(std * torch.randn(p.shape, generator=g))


def inputs(seed, batch=3, seq=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def write(name, model, seed):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    ids = inputs(seed + 1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().contiguous()
    # A padded batch: right padding, left padding and a full row (positions are
    # 0.. in every row, as transformers' forward numbers them without position_ids).
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    mask[1, :4] = 0
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits.float().contiguous()
    save_file({"input_ids": ids.contiguous(), "logits": logits, "attention_mask": mask.contiguous(),
               "padded_logits": padded}, os.path.join(d, "golden.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"logits std {logits.std():.3f}")


def write_seq2seq(name, model, seed, target_len=9, buffers=()):
    """An encoder-decoder: source ids with and without padding, decoder ids.
    `buffers`: state-dict buffers to randomise too (BART's final_logits_bias)."""
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    randomise(model, seed)
    g = torch.Generator().manual_seed(seed + 3)
    for b in buffers:
        buf = model.get_buffer(b)
        buf.copy_(0.5 * torch.randn(buf.shape, generator=g))
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    ids = inputs(seed + 1)
    dec = inputs(seed + 2, seq=target_len)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding
    mask[1, :4] = 0   # left padding
    with torch.no_grad():
        full = model(input_ids=ids, decoder_input_ids=dec)
        padded = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
    f32 = lambda t: t.float().contiguous()
    save_file({"input_ids": ids.contiguous(), "decoder_input_ids": dec.contiguous(),
               "attention_mask": mask.contiguous(), "logits": f32(full.logits),
               "encoder_hidden": f32(full.encoder_last_hidden_state),
               "padded_logits": f32(padded.logits),
               "padded_encoder_hidden": f32(padded.encoder_last_hidden_state)},
              os.path.join(d, "golden.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"logits std {full.logits.std():.3f}")


def write_encoder(name, model, seed):
    """A sequence classifier: logits and the encoder's last hidden state, for
    ids with token types and for a padded batch whose padding holds pad ids."""
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    cfg = model.config
    ids = inputs(seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    types = torch.randint(0, cfg.type_vocab_size, ids.shape, generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding
    mask[1, :4] = 0   # left padding
    padded_ids = torch.where(mask == 1, ids, torch.full_like(ids, cfg.pad_token_id))
    with torch.no_grad():
        full = model(input_ids=ids, token_type_ids=types, output_hidden_states=True)
        padded = model(input_ids=padded_ids, attention_mask=mask, output_hidden_states=True)
    f32 = lambda t: t.float().contiguous()
    save_file({"input_ids": ids.contiguous(), "token_type_ids": types.contiguous(),
               "padded_ids": padded_ids.contiguous(), "attention_mask": mask.contiguous(),
               "logits": f32(full.logits), "hidden": f32(full.hidden_states[-1]),
               "padded_logits": f32(padded.logits),
               "padded_hidden": f32(padded.hidden_states[-1])},
              os.path.join(d, "golden.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"logits std {full.logits.std():.3f}")


def gpt2(**kw):
    cfg = dict(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    cfg.update(kw)
    return tf.GPT2LMHeadModel(tf.GPT2Config(**cfg))


def llama(cls=tf.LlamaForCausalLM, config=tf.LlamaConfig, **kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg.update(kw)
    return cls(config(**cfg))


def opt(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=32)
    cfg.update(kw)
    return tf.OPTForCausalLM(tf.OPTConfig(**cfg))


def gptj(**kw):
    cfg = dict(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
               n_inner=48)
    cfg.update(kw)
    return tf.GPTJForCausalLM(tf.GPTJConfig(**cfg))


def gpt_neox(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=32, rotary_pct=0.5)
    cfg.update(kw)
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**cfg))


def t5(**kw):
    cfg = dict(vocab_size=VOCAB, d_model=32, d_kv=12, num_heads=4, d_ff=40, num_layers=2,
               num_decoder_layers=3, relative_attention_num_buckets=8,
               relative_attention_max_distance=20, decoder_start_token_id=0, pad_token_id=0,
               eos_token_id=1)
    cfg.update(kw)
    return tf.T5ForConditionalGeneration(tf.T5Config(**cfg))


def bart(**kw):
    cfg = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=40,
               decoder_ffn_dim=48, max_position_embeddings=24)
    cfg.update(kw)
    return tf.BartForConditionalGeneration(tf.BartConfig(**cfg))


def bert(cls=tf.BertForSequenceClassification, config=tf.BertConfig, **kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=40, max_position_embeddings=24, num_labels=3)
    cfg.update(kw)
    return cls(config(**cfg))


# name -> (model factory, seed[, writer]); factories run only for the fixtures
# written; the writer is `write` (a causal LM) unless given.
def write_with_tokenizer(kind):
    """write(), plus the committed tokenizer tests/data/tokenizers/<kind>
    (whose vocabulary the model's matches), for text generation."""
    def writer(name, model, seed):
        write(name, model, seed)
        src = os.path.join(os.path.dirname(OUT), "..", "data", "tokenizers", kind,
                           "tokenizer.json")
        shutil.copy(src, os.path.join(OUT, name, "tokenizer.json"))
        # Its logits goldens (0.5 MB at this vocabulary) would test nothing new.
        os.remove(os.path.join(OUT, name, "golden.safetensors"))
    return writer


FIXTURES = {
    "gpt2": (lambda: gpt2(n_inner=40), 1),
    # The vocabulary of tests/data/tokenizers/gpt2 (2000 + one added token).
    "gpt2_text": (lambda: gpt2(vocab_size=2001, n_positions=64, bos_token_id=0, eos_token_id=0),
                  21, write_with_tokenizer("gpt2")),
    # The same vocabulary for the families the language-modelling and LoRA
    # samples fine-tune (--init-from): tests/test_lm_sample.sh.
    "opt_text": (lambda: opt(vocab_size=2001, max_position_embeddings=64, bos_token_id=0,
                             eos_token_id=0, pad_token_id=1), 22, write_with_tokenizer("gpt2")),
    "gptj_text": (lambda: gptj(vocab_size=2001, n_positions=64, bos_token_id=0, eos_token_id=0),
                  23, write_with_tokenizer("gpt2")),
    "gpt_neox_text": (lambda: gpt_neox(vocab_size=2001, max_position_embeddings=64,
                                       bos_token_id=0, eos_token_id=0), 24,
                      write_with_tokenizer("gpt2")),
    "gpt2_variants": (lambda: gpt2(activation_function="gelu", layer_norm_epsilon=1e-3,
                                   scale_attn_by_inverse_layer_idx=True, n_layer=3), 2),
    "llama": (lambda: llama(), 3),
    "llama_head_dim": (lambda: llama(head_dim=12, num_key_value_heads=4, rope_theta=500.0,
                                     rope_scaling={"rope_type": "linear", "factor": 2.0}), 4),
    "llama3_tied": (lambda: llama(tie_word_embeddings=True, attention_bias=True,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 16}), 5),
    "mistral": (lambda: llama(tf.MistralForCausalLM, tf.MistralConfig, head_dim=8,
                              sliding_window=64, rms_norm_eps=1e-5), 6),
    "qwen2": (lambda: llama(tf.Qwen2ForCausalLM, tf.Qwen2Config, num_key_value_heads=1,
                            rope_theta=1e6), 7),
    # OPT-125m's shape (pre-LN, final norm) and OPT-350m's (post-LN, no final
    # norm, 16-wide embeddings projected in and out of the 32-wide blocks).
    "opt": (lambda: opt(), 8),
    "opt_post_ln_proj": (lambda: opt(do_layer_norm_before=False, word_embed_proj_dim=16,
                                     num_hidden_layers=3), 9),
    # Partial rotary (4 of 8 dimensions per head) with interleaved pairs; then
    # every dimension rotated (redco's fused rotary kernel) and a tied head.
    "gptj": (lambda: gptj(), 10),
    "gptj_full_rotary_tied": (lambda: gptj(rotary_dim=8, tie_word_embeddings=True), 13),
    # Parallel residual with half of each head rotated; sequential with a
    # quarter (2 of 8), gelu_new, no attention biases and a tied head.
    "gpt_neox": (lambda: gpt_neox(), 11),
    "gpt_neox_sequential": (lambda: gpt_neox(use_parallel_residual=False, rotary_pct=0.25,
                                             hidden_act="gelu_new", attention_bias=False,
                                             rotary_emb_base=500, tie_word_embeddings=True), 12),
    # t5 v1.0: ReLU, tied head (scaled by d_model**-0.5), 4 heads of 12 (48 != d_model 32).
    "t5": (lambda: t5(), 8, write_seq2seq),
    # flan-t5 / t5 v1.1: gated-gelu, untied lm_head, more buckets than distances.
    "flan_t5": (lambda: t5(feed_forward_proj="gated-gelu", tie_word_embeddings=False, d_kv=8,
                           d_ff=24, relative_attention_num_buckets=16,
                           relative_attention_max_distance=32, layer_norm_epsilon=1e-3), 9,
                write_seq2seq),
    # post-LN, scaled embeddings, positions from row 2, a nonzero final_logits_bias.
    "bart": (lambda: bart(scale_embedding=True), 10,
             lambda n, m, s: write_seq2seq(n, m, s, buffers=["final_logits_bias"])),
    # token types, pooler, classifier; post-LN; erf GELU.
    "bert": (lambda: bert(), 11, write_encoder),
    # positions from padding_idx + 1 over the non-pad tokens; classifier.dense/out_proj.
    "roberta": (lambda: bert(tf.RobertaForSequenceClassification, tf.RobertaConfig,
                             type_vocab_size=1, pad_token_id=1, num_labels=2,
                             layer_norm_eps=1e-5), 12, write_encoder),
}


def main(names):
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        sys.exit(f"unknown fixture(s) {unknown}; known: {list(FIXTURES)}")
    torch.manual_seed(0)
    for name in names or FIXTURES:
        factory, seed, *writer = FIXTURES[name]
        (writer[0] if writer else write)(name, factory(), seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Builds the tiny ViT and ViT-GPT-2 checkpoints redco's vision tests load.

  vit         ViTModel, 3-channel 16x32 images in 8x8 patches, qkv biases
  vit_square  ViTModel, 1-channel 12x12 images (image_size an int) in 4x4
              patches, no qkv biases, gelu_new
  vit_gpt2    VisionEncoderDecoderModel: a ViT encoder (1-channel 16x32, 8x8
              patches) and a GPT-2 decoder with add_cross_attention=True

Each is saved with save_pretrained(safe_serialization=True) into
tests/fixtures/hf/<name>/ with weights redrawn as make_hf_fixtures.py does (so
outputs are O(1) and a wrong layout moves them far beyond the tests' 1e-4),
and golden.safetensors beside it: fixed pixel_values and the last hidden
state; for vit_gpt2 also decoder ids, the logits, and the tokens of
model.generate (greedy and 3 beams) with the generation settings in
generation.json.

Run with the test venv (python3-torch 1.13 + transformers 4.46.3):
  .venv/bin/python tests/python/make_vit_fixtures.py
"""
import json
import os
import shutil

import torch
import transformers as tf
from safetensors.torch import save_file
from transformers.generation import utils as gen_utils

from make_hf_fixtures import OUT, VOCAB, randomise

gen_utils.is_fsdp_managed_module = lambda module: False  # torch 1.13 on Python 3.11

from make_hf_fixtures import OUT, VOCAB, randomise


def pixels(seed, config, batch=2):
    g = torch.Generator().manual_seed(seed)
    size = config.image_size
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn((batch, config.num_channels, h, w), generator=g)


def fresh(name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def write_vit(name, seed, **kw):
    d = fresh(name)
    config = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, **kw)
    model = tf.ViTModel(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    x = pixels(seed + 1, config)
    with torch.no_grad():
        hidden = model(pixel_values=x).last_hidden_state.contiguous()
    save_file({"pixel_values": x.contiguous(), "hidden": hidden},
              os.path.join(d, "golden.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"hidden std {hidden.std():.3f}")


def write_vit_gpt2(name, seed):
    d = fresh(name)
    enc = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, image_size=[16, 32], patch_size=8, num_channels=1)
    dec = tf.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        add_cross_attention=True, is_decoder=True, bos_token_id=1,
                        eos_token_id=2)
    config = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    config.decoder_start_token_id = 1
    config.pad_token_id = 0
    config.eos_token_id = 2
    model = tf.VisionEncoderDecoderModel(config=config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    x = pixels(seed + 1, enc)
    g = torch.Generator().manual_seed(seed + 2)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    gen = {"max_new_tokens": 8, "min_new_tokens": 8}
    with torch.no_grad():
        out = model(pixel_values=x, decoder_input_ids=ids)
        greedy = model.generate(pixel_values=x, do_sample=False, num_beams=1, **gen)
        beams = model.generate(pixel_values=x, do_sample=False, num_beams=3, **gen)
    save_file({"pixel_values": x.contiguous(), "decoder_input_ids": ids.contiguous(),
               "logits": out.logits.contiguous(),
               "encoder_hidden": out.encoder_last_hidden_state.contiguous(),
               "greedy": greedy.contiguous(), "beams": beams.contiguous()},
              os.path.join(d, "golden.safetensors"))
    with open(os.path.join(d, "generation.json"), "w") as f:
        json.dump(gen, f)
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"logits std {out.logits.std():.3f}, greedy {greedy.tolist()}")


if __name__ == "__main__":
    torch.manual_seed(0)
    write_vit("vit", 70, image_size=[16, 32], patch_size=8, num_channels=3)
    write_vit("vit_square", 72, image_size=12, patch_size=4, num_channels=1, qkv_bias=False,
              hidden_act="gelu_new")
    write_vit_gpt2("vit_gpt2", 74)

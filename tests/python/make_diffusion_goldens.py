"""Records Hugging Face diffusers' noise schedules and DDIM steps for redco's
diffusion test (tests/test_diffusion.cpp).

    pip install --no-deps --target /tmp/diffusers diffusers==0.31.0
    PYTHONPATH=/tmp/diffusers python tests/python/make_diffusion_goldens.py \
        [--out tests/goldens/diffusion.txt]

(--no-deps: only the schedulers are used; they need torch and numpy.)
Format, one record per line:
    alphas_cumprod <schedule> <T> <count> <index value>...   (every 37th index and the last)
    timesteps <T> <n> <t...>                                  (DDIMScheduler.set_timesteps(n))
    ddim <schedule> <t> <prev_t> <clip> <count> <values...>   (DDIMScheduler.step prev_sample)
DDIM inputs are closed-form: sample[i] = sin(0.9 i) * 1.5, model_output[i] = cos(0.4 i) over 12 values.
"""

import argparse
import math

import diffusers
import torch
from diffusers import DDIMScheduler, DDPMScheduler

SCHEDULES = {"linear": "linear", "cosine": "squaredcos_cap_v2"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/goldens/diffusion.txt")
    args = ap.parse_args()
    lines = [f"# diffusers {diffusers.__version__}, torch {torch.__version__}: "
             "written by tests/python/make_diffusion_goldens.py"]
    for name, kind in SCHEDULES.items():
        for T in (1000, 100):
            ac = DDPMScheduler(num_train_timesteps=T, beta_schedule=kind).alphas_cumprod.tolist()
            idx = sorted(set(range(0, T, 37)) | {T - 1})
            lines.append(f"alphas_cumprod {name} {T} {len(idx)} "
                         + " ".join(f"{i} {ac[i]:.9g}" for i in idx))
    for T, n in ((1000, 50), (1000, 30), (100, 7)):
        s = DDIMScheduler(num_train_timesteps=T)
        s.set_timesteps(n)
        lines.append(f"timesteps {T} {n} " + " ".join(str(int(t)) for t in s.timesteps))
    sample = torch.tensor([math.sin(0.9 * i) * 1.5 for i in range(12)]).reshape(1, 3, 2, 2)
    eps = torch.tensor([math.cos(0.4 * i) for i in range(12)]).reshape(1, 3, 2, 2)
    for name, kind in SCHEDULES.items():
        for clip in (False, True):
            s = DDIMScheduler(num_train_timesteps=1000, beta_schedule=kind, clip_sample=clip,
                              set_alpha_to_one=True)
            s.set_timesteps(50)
            for t in (980, 500, 20, 0):
                prev = t - 1000 // 50
                out = s.step(eps, t, sample, eta=0.0).prev_sample.reshape(-1).tolist()
                lines.append(f"ddim {name} {t} {prev} {int(clip)} {len(out)} "
                             + " ".join(f"{v:.9g}" for v in out))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

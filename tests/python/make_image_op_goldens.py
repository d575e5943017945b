"""Records torch's group norm and nearest upsampling (values and gradients)
for redco's image-op test (tests/test_ops_grad.cpp, "[torch]" cases).

    python tests/python/make_image_op_goldens.py [--out tests/goldens/image_ops.txt]

Inputs are closed-form so the C++ test rebuilds them without torch:
    x[i]     = sin(0.7 i) * (1 + 0.1 (i mod 5)) + 0.3   over x's flat index i
    gamma[c] = 1 + 0.1 c,  beta[c] = 0.05 c - 0.1
    probe    = cos(0.3 j)  over the output's flat index j; gradients are of sum(y * probe).
Format, one tensor per line: <name> <count> <values...>.
"""

import argparse
import math

import torch
import torch.nn.functional as F

SHAPE = (2, 6, 3, 4)
GROUPS = 3


def closed_form_input(shape):
    n = math.prod(shape)
    v = [math.sin(0.7 * i) * (1 + 0.1 * (i % 5)) + 0.3 for i in range(n)]
    return torch.tensor(v, dtype=torch.float64).reshape(shape)


def probe(like):
    return torch.tensor([math.cos(0.3 * j) for j in range(like.numel())],
                        dtype=torch.float64).reshape(like.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/goldens/image_ops.txt")
    args = ap.parse_args()
    rows = []
    x = closed_form_input(SHAPE).requires_grad_(True)
    C = SHAPE[1]
    gamma = torch.tensor([1 + 0.1 * c for c in range(C)], dtype=torch.float64, requires_grad=True)
    beta = torch.tensor([0.05 * c - 0.1 for c in range(C)], dtype=torch.float64, requires_grad=True)
    y = F.group_norm(x, GROUPS, gamma, beta, eps=1e-5)
    (y * probe(y)).sum().backward()
    rows += [("group_norm.y", y), ("group_norm.dx", x.grad), ("group_norm.dgamma", gamma.grad),
             ("group_norm.dbeta", beta.grad)]
    x2 = closed_form_input(SHAPE).requires_grad_(True)
    u = F.interpolate(x2, scale_factor=2, mode="nearest")
    (u * probe(u)).sum().backward()
    rows += [("upsample.y", u), ("upsample.dx", x2.grad)]
    with open(args.out, "w") as f:
        f.write(f"# torch {torch.__version__} (float64): written by tests/python/make_image_op_goldens.py\n")
        for name, t in rows:
            vals = t.detach().reshape(-1).tolist()
            f.write(f"{name} {len(vals)} " + " ".join(f"{v:.9g}" for v in vals) + "\n")


if __name__ == "__main__":
    main()

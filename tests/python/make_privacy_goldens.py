"""Records RDP and (epsilon, delta) values of the Poisson-sampled Gaussian
mechanism from two reference accountants, for redco's privacy accountant test.

    python tests/python/make_privacy_goldens.py [--out tests/goldens/privacy.txt]

Needs dp-accounting==0.4.4 and opacus==1.4.0 (installed with --no-deps: only
opacus/accountants/analysis/rdp.py is loaded, by path, so torch is not
imported) and scipy. Both are given redco's default orders (dp-accounting's
defaults), so they are compared on the same orders.

Format, one record per line:
    rdp <q> <sigma> <order> <dp-accounting> <opacus>            (one step)
    eps <q> <sigma> <steps> <delta> <dp-accounting eps> <its order> <opacus eps> <its order>
"""

import argparse
import importlib.util
import os

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp


def load_opacus_rdp():
    spec = importlib.util.find_spec("opacus")  # locates the package without importing it
    path = os.path.join(spec.submodule_search_locations[0], "accountants", "analysis", "rdp.py")
    mod_spec = importlib.util.spec_from_file_location("opacus_rdp_analysis", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def versions():
    from importlib.metadata import version

    v = {p: version(p) for p in ("dp-accounting", "opacus", "scipy", "numpy")}
    assert v["dp-accounting"] == "0.4.4" and v["opacus"] == "1.4.0", v
    return v


ORDERS = dpa_rdp.DEFAULT_RDP_ORDERS  # 1.1 .. 10.9, 11 .. 63, 128, 256, 512, 1024

MECHANISMS = [  # (q, sigma)
    (256 / 60000, 1.12), (256 / 60000, 0.6), (0.01, 4.0), (0.01, 0.8), (0.1, 2.0),
    (0.5, 1.5), (1.0, 3.0), (0.001, 0.5), (0.02, 10.0),
]
RDP_ORDERS = [1.1, 1.5, 2, 2.5, 3.7, 5, 8, 10.5, 11, 20, 32, 63, 128, 1024]
EPS_CASES = [  # (q, sigma, steps, delta)
    (256 / 60000, 1.12, 60 * 60000 // 256, 1e-5),
    (256 / 60000, 0.6, 30 * 60000 // 256, 1e-5),
    (256 / 60000, 1.2, 10 * 60000 // 256, 1e-5),
    (0.01, 4.0, 10000, 1e-5),
    (0.01, 0.8, 1000, 1e-6),
    (0.1, 2.0, 500, 1e-5),
    (0.5, 1.5, 20, 1e-3),
    (1.0, 3.0, 100, 1e-5),
    (0.001, 0.5, 100000, 1e-5),
    (0.02, 10.0, 50000, 1e-8),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/goldens/privacy.txt")
    args = ap.parse_args()
    v = versions()
    op = load_opacus_rdp()
    with open(args.out, "w") as out:
        out.write("# " + ", ".join(f"{k} {x}" for k, x in v.items())
                  + ": written by tests/python/make_privacy_goldens.py\n")
        for q, sigma in MECHANISMS:
            a = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, RDP_ORDERS)
            b = op.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=RDP_ORDERS)
            for order, x, y in zip(RDP_ORDERS, a, b):
                out.write(f"rdp {q!r} {sigma!r} {order!r} {float(x)!r} {float(y)!r}\n")
        for q, sigma, steps, delta in EPS_CASES:
            acc = dp_accounting.rdp.RdpAccountant(ORDERS)
            acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
            e1, o1 = acc.get_epsilon_and_optimal_order(delta)
            rdp = op.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDERS)
            e2, o2 = op.get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)
            out.write(f"eps {q!r} {sigma!r} {steps} {delta!r} {float(e1)!r} {float(o1)!r} "
                      f"{float(e2)!r} {float(o2)!r}\n")


if __name__ == "__main__":
    main()

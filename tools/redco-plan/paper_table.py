#!/usr/bin/env python3
"""RedCoast's Table 1, by the planner: for every cell (cluster, model, the
paper's training length), whether the paper's strategy fits (tensor
parallelism over any number of shards, no ZeRO, no recomputation, f32,
AdamW, one row per replica), the longest length that strategy fits, and the
longest length redco's best plan fits (ZeRO up to stage 2, then 3, recomputation)
on the same devices (ZeRO up to 2, what redco runs today; and up to 3,
modelled), and whether the paper's length fits on half the devices. Prints a
Markdown table.

  tools/redco-plan/paper_table.py --redco-plan build/tools/redco-plan
"""
import argparse
import json
import pathlib
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
# (cluster label, device preset, memory, devices, hosts, model config, paper's length)
CELLS = [
    ("2 x 1080Ti (10 GB)", "1080ti", "10GB", 2, 1, "bart-large", 1024),
    ("2 x 1080Ti (10 GB)", "1080ti", "10GB", 2, 1, "gpt2-large", 512),
    ("4 x A100 40 GB", "a100-40gb", None, 4, 1, "llama-7b", 1024),
    ("4 x A100 40 GB", "a100-40gb", None, 4, 1, "gpt-j-6b", 1024),
    ("2 TPU-v4 hosts (8 x 32 GB)", "tpu-v4", None, 8, 2, "t5-11b", 512),
    ("2 TPU-v4 hosts (8 x 32 GB)", "tpu-v4", None, 8, 2, "opt-13b", 1024),
    ("16 TPU-v4 hosts (64 x 32 GB)", "tpu-v4", None, 64, 16, "opt-66b", 512),
]


def plan(tool, device, memory, devices, hosts, model, length, *extra):
    cmd = [tool, str(HERE / "configs" / f"{model}.json"), "--device", device,
           "--devices", str(devices), "--hosts", str(hosts), "--seq-len", str(length),
           "--top", "1", "--json", *extra]
    if memory:
        cmd += ["--memory", memory]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr}")
    return json.loads(out.stdout)


def describe(p):
    best = p["plans"][0]
    z = f", ZeRO-{best['zero_stage']}" if best["zero_stage"] else ""
    r = ", recompute" if best["recompute"] else ""
    gib = best["memory_bytes"]["needed"] / 2**30
    return f"mp {best['n_model_shards']} x dp {best['data_parallel']}{z}{r}, {gib:.1f} GiB/rank"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--redco-plan", required=True)
    a = ap.parse_args()
    print("| cluster | model | paper's length | paper's strategy (TP only) | its longest "
          "| redco (ZeRO <= 2, recompute) | its longest | redco with ZeRO-3 | its longest "
          "| half the devices |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, device, memory, devices, hosts, model, length in CELLS:
        cell = (a.redco_plan, device, memory, devices, hosts, model, length)
        paper = plan(*cell, "--zero", "0", "--recompute", "off")
        two = plan(*cell, "--max-zero", "2")
        three = plan(*cell, "--max-zero", "3")
        half = plan(a.redco_plan, device, memory, devices // 2, max(1, hosts // 2), model, length,
                    "--max-zero", "3")

        def text(p):
            return describe(p) if p["fits"] else "does not fit"

        half_text = describe(half) if half["fits"] else f"does not fit (longest {half['longest_seq_len']})"
        print(f"| {label} | {model} | {length} | {text(paper)} | {paper['longest_seq_len']} | "
              f"{text(two)} | {two['longest_seq_len']} | {text(three)} | "
              f"{three['longest_seq_len']} | {half_text} |")

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reads a redco run directory back with the real tensorboard package.

Usage: read_events.py <dir>

Checks, failing with a non-zero exit on any problem:
  * every events.out.tfevents.* file is read by tensorboard's own TFRecord
    loader, which checks both CRCs of each record and stops at the first bad
    one, so the record counts printed (compared by the C++ test) show that
    every record passed;
  * EventAccumulator sees file_version "brain.Event:2";
  * if <dir>/metrics.jsonl exists, every line is strict JSON (no NaN) with
    step / split / time, and each numeric field is a "<split>/<name>" scalar
    at that step with the float32 value.

Prints, for the C++ test to compare:
  file_version <version>
  records <file name> <count>
  scalar <tag> <step> <value, 9 significant digits>   (sorted by tag, then in step order)
  metrics_lines <count>
"""
import glob
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def count_records(path):
    return sum(1 for _ in event_file_loader.RawEventFileLoader(path).Load())


def reject_constant(name):
    raise ValueError(f"metrics.jsonl holds {name}, which is not JSON")


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_metrics(path, scalars):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        obj = json.loads(line, parse_constant=reject_constant)
        step, split = obj["step"], obj["split"]
        assert isinstance(step, int) and isinstance(split, str), line
        assert isinstance(obj["time"], float), line
        for name, value in obj.items():
            if name in ("step", "split", "time") or value is None:
                continue
            got = scalars.get(f"{split}/{name}", {}).get(step)
            assert got is not None, f"line {i + 1}: no scalar {split}/{name} at step {step}"
            want = as_float32(value)
            assert math.isclose(got, want, rel_tol=1e-6, abs_tol=0), (name, step, got, want)
    return len(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run_dir = sys.argv[1]
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        sys.exit(f"no event files in {run_dir}")
    acc = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    if acc.file_version != 2:
        sys.exit(f"file_version is {acc.file_version!r}, expected 2 (brain.Event:2)")
    print(f"file_version {acc.file_version:g}")
    for path in files:
        print(f"records {os.path.basename(path)} {count_records(path)}")
    scalars = {}
    for tag in sorted(acc.Tags()["scalars"]):
        scalars[tag] = {}
        for ev in acc.Scalars(tag):
            scalars[tag][ev.step] = ev.value
            print(f"scalar {tag} {ev.step} {ev.value:.9g}")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        print(f"metrics_lines {check_metrics(metrics, scalars)}")


if __name__ == "__main__":
    main()

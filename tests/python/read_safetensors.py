#!/usr/bin/env python3
"""Python's side of tests/test_io.cpp's interop tests: the real `safetensors`
package from PyPI and numpy, no redco.

  read_safetensors.py check FILE [--meta KEY=VALUE]... NAME|DTYPE|SHAPE|CHECKSUM...
      Reads FILE and asserts it holds exactly these tensors and this metadata.
      SHAPE is comma-separated dims ("" for a scalar); CHECKSUM is
      sum_i (i + 1) * value[i] over the row-major elements, as a float64, so
      a transposed or shifted tensor fails too. Tensors are read with
      safetensors.numpy (safe_open, load_file); BF16, which numpy lacks, is
      decoded from safetensors.deserialize's raw bytes.
  read_safetensors.py write FILE
      Writes a fixed set of tensors with safetensors.numpy.save_file.
  read_safetensors.py golden FILE
      Writes the small file whose exact bytes test_io.cpp compares with its own.
Exits non-zero with a message on any mismatch.
"""
import math
import sys

import numpy as np
from safetensors import deserialize, safe_open
from safetensors.numpy import load_file, save_file

NUMPY_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint8): "U8",
}


def load_all(path):
    """{name: (dtype string, numpy array)} and the metadata dict."""
    with open(path, "rb") as f:
        raw = f.read()
    out = {}
    # deserialize runs the reference parser's validation over the whole file.
    for name, info in deserialize(raw):
        if info["dtype"] == "BF16":
            bits = np.frombuffer(bytes(info["data"]), dtype="<u2").astype("<u4") << 16
            out[name] = ("BF16", bits.view("<f4").reshape(info["shape"]))
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            if name not in out:
                arr = f.get_tensor(name)
                out[name] = (NUMPY_DTYPES[arr.dtype], arr)
    if not any(dtype == "BF16" for dtype, _ in out.values()):
        for name, arr in load_file(path).items():
            assert np.array_equal(arr, out[name][1]), f"load_file disagrees on {name!r}"
    return out, metadata


def checksum(arr):
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    return float(np.sum(flat * np.arange(1, flat.size + 1, dtype=np.float64)))


def check(path, args):
    expected_meta, expected = {}, {}
    it = iter(args)
    for arg in it:
        if arg == "--meta":
            key, _, value = next(it).partition("=")
            expected_meta[key] = value
            continue
        name, dtype, shape, total = arg.rsplit("|", 3)
        dims = tuple(int(d) for d in shape.split(",")) if shape else ()
        expected[name] = (dtype, dims, float(total))
    tensors, metadata = load_all(path)
    assert metadata == expected_meta, f"metadata {metadata!r} != {expected_meta!r}"
    assert set(tensors) == set(expected), f"names {sorted(tensors)} != {sorted(expected)}"
    for name, (dtype, dims, total) in expected.items():
        got_dtype, arr = tensors[name]
        assert got_dtype == dtype, f"{name!r}: dtype {got_dtype} != {dtype}"
        assert arr.shape == dims, f"{name!r}: shape {arr.shape} != {dims}"
        got = checksum(arr)
        assert math.isclose(got, total, rel_tol=1e-12, abs_tol=1e-12), (
            f"{name!r}: checksum {got!r} != {total!r}")
        print(f"ok {name} {dtype} {list(dims)} {got!r}")


def write(path):
    tensors = {
        "py.f32": np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.5) - np.float32(1),
        "py.f16": np.array([[1.5, -2.0], [65504.0, 0.0]], dtype=np.float16),
        "py.i32": np.array([[-7], [2**31 - 1]], dtype=np.int32),
        "py.i64": np.array([-(2**62), 2**53 + 1, 7], dtype=np.int64),
        "py.u8": np.arange(256, dtype=np.uint8),
        "py.scalar": np.array(3.25, dtype=np.float32),
        "py.empty": np.zeros((0, 4), dtype=np.float32),
        "unicodé.名前": np.array([42], dtype=np.int32),
    }
    save_file(tensors, path, metadata={"format": "np", "note": 'ünï "quoted"\n'})


def golden(path):
    tensors = {
        "b": np.array([1, 2], dtype=np.int64),
        "a": np.array([1.5], dtype=np.float32),
        "c": np.zeros((0, 3), dtype=np.uint8),
        "s": np.array(2.0, dtype=np.float32),
        "h": np.array([1.0], dtype=np.float16),
    }
    save_file(tensors, path, metadata={"k": "v"})


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("check", "write", "golden"):
        sys.exit(__doc__)
    mode, path = sys.argv[1], sys.argv[2]
    try:
        if mode == "check":
            check(path, sys.argv[3:])
        elif mode == "write":
            write(path)
        else:
            golden(path)
    except AssertionError as e:
        sys.exit(f"read_safetensors.py: {path}: {e}")


if __name__ == "__main__":
    main()

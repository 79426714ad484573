#!/usr/bin/env python3
"""Independent reader of a Skein checkpoint, written from the safetensors spec with
json + numpy only, to check that other tools can read our files. Prints each tensor's
name, shape and sum. Usage: python3 bench/read_safetensors.py runs/train/checkpoint.safetensors
"""
import json, struct, sys
import numpy as np

def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", e
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(raw[base + b:base + en], dtype="<f4").reshape(e["shape"])
    return meta, out

if __name__ == "__main__":
    meta, ts = load(sys.argv[1])
    print("metadata:", {k: v[:60] for k, v in meta.items()})
    for name in sorted(ts)[:8]:
        print(f"{name:40s} {str(ts[name].shape):16s} sum={ts[name].sum():.6f}")
    print(f"{len(ts)} tensors, {sum(t.size for t in ts.values())} floats")

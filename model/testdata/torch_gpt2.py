#!/usr/bin/python3
"""An independent GPT-2 in PyTorch, for checking `skein export`.

Reads a Hugging Face GPT-2 directory (config.json, model.safetensors) with
nothing but json, numpy and torch (no transformers, no safetensors package:
neither is installable on the project's machines), builds the model the way
transformers' GPT2LMHeadModel computes it (Conv1D weights (in, out), gelu_new,
layer norm eps from config.json, causal attention, lm_head tied to wte), and
prints a JSON object: the logits of every position for the token ids given
as argv[2] (a JSON array) and the mean cross-entropy of predicting ids[1:]
from ids[:-1].

    torch_gpt2.py MODEL_DIR '[1, 2, 3]'
"""
import json
import math
import struct
import sys

import numpy as np
import torch


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        a = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
        tensors[name] = torch.from_numpy(a.copy()).double()
    return tensors, meta


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def main():
    d = sys.argv[1]
    ids = torch.tensor(json.loads(sys.argv[2]), dtype=torch.long)
    cfg = json.load(open(d + "/config.json"))
    w, meta = load_safetensors(d + "/model.safetensors")
    assert meta.get("format") == "pt", meta
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    T = len(ids)
    p = "transformer."
    x = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    ln = lambda x, g, b: torch.nn.functional.layer_norm(x, (C,), g, b, eps)
    for i in range(L):
        h = p + "h.%d." % i
        a = ln(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"])
        qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(T, H, C // H).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = ln(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"])
        m = gelu_new(m @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"])
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = ln(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"])
    logits = x @ w[p + "wte.weight"].T
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item()
    json.dump({"logits": logits.tolist(), "loss": loss}, sys.stdout)


if __name__ == "__main__":
    main()

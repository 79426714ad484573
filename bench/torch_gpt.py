#!/usr/bin/env python3
"""Reference training throughput: the same GPT-2-style model as Skein's presets,
trained with PyTorch's AdamW on random tokens. Prints one JSON line with tokens/s.

Usage: python3 bench/torch_gpt.py --preset tiny --batch 16 --threads 1 --steps 20
Needs Debian's python3-torch (1.13); run with /usr/bin/python3. On a GPU:
--device cuda (--tf32 lets matmuls use TF32, like Skein's default CUDA GEMMs).
"""
import argparse, json, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "tiny": dict(vocab=256, ctx=128, d=128, layers=4, heads=4),
    "small": dict(vocab=256, ctx=256, d=384, layers=6, heads=6),
    "gpt2-124m": dict(vocab=50257, ctx=1024, d=768, layers=12, heads=12),
}

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fcproj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        hs = C // self.heads
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(self, vocab, ctx, d, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.lnf = nn.LayerNorm(d)
        for name, w in self.named_parameters():  # GPT-2 init, as Skein's
            if w.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(w, std=std)
            elif "ln" not in name:
                nn.init.zeros_(w)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied embeddings
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tf32", action="store_true", help="let CUDA matmuls round to TF32")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    p = PRESETS[a.preset]
    m = GPT(**p).to(a.device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    T = p["ctx"]
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, p["vocab"], (a.batch, T + 1), generator=g).to(a.device)
    def step():
        loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        return loss.item()
    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0
    impl = "torch " + torch.__version__
    if a.device != "cpu":
        impl += " on " + torch.cuda.get_device_name() + (" tf32" if a.tf32 else " fp32")
    print(json.dumps({"impl": impl, "preset": a.preset, "batch": a.batch,
                      "threads": a.threads, "steps": a.steps, "loss": loss,
                      "tokens_per_sec": a.batch * T * a.steps / dt}))

if __name__ == "__main__":
    main()

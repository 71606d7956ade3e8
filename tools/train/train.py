#!/usr/bin/env python3
"""Trains the demo target/draft pair: two Llama-architecture models sharing one
byte-level BPE vocabulary, on the Python documentation sources that Debian's
python3.11-doc package ships (PSF licence). The draft learns from the data and
from the target's predictions (distillation), so that it agrees with the
target often. Exports each model as a manifest (JSON) + raw float32 tensors,
which `specula-import` turns into Q8_0 GGUF files with specula's own writer.

    /usr/bin/python3 tools/train/train.py --out build/train   (see tools/train/README.md)
"""
import argparse
import glob
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

CORPUS_GLOB = "/usr/share/doc/python3.11/html/_sources/**/*.rst.txt"
CONFIGS = {
    "target": dict(n_embd=256, n_layer=6, n_head=8, n_head_kv=4, n_ff=704),
    "draft": dict(n_embd=96, n_layer=2, n_head=3, n_head_kv=1, n_ff=256),
}
ROPE_BASE = 10000.0
RMS_EPS = 1e-5


def load_corpus():
    files = sorted(glob.glob(CORPUS_GLOB, recursive=True))
    if not files:
        sys.exit(f"no corpus at {CORPUS_GLOB}: apt-get install python3.11-doc")
    texts = [open(f, encoding="utf-8", errors="replace").read() for f in files]
    # Every 25th document is held out (4%): never seen in training or by the tokenizer trainer.
    train = [t for i, t in enumerate(texts) if i % 25 != 0]
    held = [t for i, t in enumerate(texts) if i % 25 == 0]
    return train, held


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def rope(x, cos, sin):
    """Rotates adjacent pairs (x[2j], x[2j+1]): GGUF's layout, no permutation at export."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, hd = c["n_embd"], c["n_embd"] // c["n_head"]
        self.n_head, self.n_head_kv, self.hd = c["n_head"], c["n_head_kv"], hd
        self.attn_norm, self.ffn_norm = RMSNorm(e), RMSNorm(e)
        self.wq = nn.Linear(e, e, bias=False)
        self.wk = nn.Linear(e, c["n_head_kv"] * hd, bias=False)
        self.wv = nn.Linear(e, c["n_head_kv"] * hd, bias=False)
        self.wo = nn.Linear(e, e, bias=False)
        self.w_gate = nn.Linear(e, c["n_ff"], bias=False)
        self.w_up = nn.Linear(e, c["n_ff"], bias=False)
        self.w_down = nn.Linear(c["n_ff"], e, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = rope(self.wq(h).view(b, t, self.n_head, self.hd), cos, sin).transpose(1, 2)
        k = rope(self.wk(h).view(b, t, self.n_head_kv, self.hd), cos, sin).transpose(1, 2)
        v = self.wv(h).view(b, t, self.n_head_kv, self.hd).transpose(1, 2)
        group = self.n_head // self.n_head_kv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, c, vocab):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(vocab, c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.out_norm = RMSNorm(c["n_embd"])
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        hd = self.c["n_embd"] // self.c["n_head"]
        inv = ROPE_BASE ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.tok_emb(idx)
        for b in self.blocks:
            x = b(x, cos, sin, mask)
        return self.out_norm(x) @ self.tok_emb.weight.T  # tied output head


def export(model, name, encoder, out_dir, n_ctx):
    """manifest.json + tensors.f32: what specula-import turns into GGUF."""
    c = model.c
    tensors, blobs, offset = [], [], 0

    def add(tname, w, quantize=True):
        nonlocal offset
        a = w.detach().float().numpy().astype(np.float32)
        shape = [a.shape[-1], a.shape[0]] if a.ndim == 2 else [a.shape[0]]
        tensors.append({"name": tname, "shape": shape, "offset": offset, "quantize": quantize})
        blobs.append(a.tobytes())
        offset += a.size

    add("token_embd.weight", model.tok_emb.weight)
    for i, b in enumerate(model.blocks):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", b.attn_norm.weight, False)
        add(p + "attn_q.weight", b.wq.weight)
        add(p + "attn_k.weight", b.wk.weight)
        add(p + "attn_v.weight", b.wv.weight)
        add(p + "attn_output.weight", b.wo.weight)
        add(p + "ffn_norm.weight", b.ffn_norm.weight, False)
        add(p + "ffn_gate.weight", b.w_gate.weight)
        add(p + "ffn_up.weight", b.w_up.weight)
        add(p + "ffn_down.weight", b.w_down.weight)
    add("output_norm.weight", model.out_norm.weight, False)
    hd = c["n_embd"] // c["n_head"]
    meta = {
        "general.architecture": ["str", "llama"],
        "general.name": ["str", f"specula-demo-{name}"],
        "general.license": ["str", "trained on the Python documentation (PSF License)"],
        "llama.context_length": ["u32", n_ctx],
        "llama.embedding_length": ["u32", c["n_embd"]],
        "llama.block_count": ["u32", c["n_layer"]],
        "llama.feed_forward_length": ["u32", c["n_ff"]],
        "llama.attention.head_count": ["u32", c["n_head"]],
        "llama.attention.head_count_kv": ["u32", c["n_head_kv"]],
        "llama.rope.dimension_count": ["u32", hd],
        "llama.rope.freq_base": ["f32", ROPE_BASE],
        "llama.attention.layer_norm_rms_epsilon": ["f32", RMS_EPS],
        "tokenizer.ggml.model": ["str", "gpt2"],
        "tokenizer.ggml.pre": ["str", "gpt-2"],
        "tokenizer.ggml.tokens": ["str_array", encoder.tokens],
        "tokenizer.ggml.token_type": ["i32_array", [1] * (len(encoder.tokens) - 1) + [3]],
        "tokenizer.ggml.merges": ["str_array", [a + " " + b for a, b in sorted(encoder.ranks, key=encoder.ranks.get)]],
        "tokenizer.ggml.bos_token_id": ["u32", encoder.eos],
        "tokenizer.ggml.eos_token_id": ["u32", encoder.eos],
        "tokenizer.ggml.add_bos_token": ["bool", False],
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.tensors.f32"), "wb") as f:
        for b in blobs:
            f.write(b)
    with open(os.path.join(out_dir, f"{name}.manifest.json"), "w") as f:
        json.dump({"metadata": meta, "tensors": tensors, "data": f"{name}.tensors.f32"}, f)


def warmup_cosine(opt, steps):
    """The learning rate: a linear warm-up over the first 5% of the steps, then a cosine down to
    a tenth."""
    warmup = max(1, steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))


def batches(ids, seq, batch, rng):
    while True:
        starts = rng.integers(0, len(ids) - seq - 1, size=batch)
        x = np.stack([ids[s:s + seq + 1] for s in starts])
        yield torch.from_numpy(x[:, :-1]).long(), torch.from_numpy(x[:, 1:]).long()


@torch.no_grad()
def perplexity(model, ids, seq):
    model.eval()
    nll, n = 0.0, 0
    for s in range(0, len(ids) - seq - 1, seq):
        x = torch.from_numpy(ids[s:s + seq][None]).long()
        y = torch.from_numpy(ids[s + 1:s + seq + 1][None]).long()
        nll += F.cross_entropy(model(x)[0], y[0], reduction="sum").item()
        n += seq
    model.train()
    return math.exp(nll / n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    t_start = time.time()

    train_texts, held_texts = load_corpus()
    merges = bpe.train(train_texts, args.vocab)
    enc = bpe.Encoder(merges)
    train_ids = np.array([i for t in train_texts for i in enc.encode(t) + [enc.eos]], dtype=np.int32)
    held_ids = np.array([i for t in held_texts for i in enc.encode(t) + [enc.eos]], dtype=np.int32)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(held_texts))
    print(f"corpus: {len(train_texts)} documents, {len(train_ids)} tokens; held out {len(held_texts)} "
          f"documents, {len(held_ids)} tokens; vocab {len(enc.tokens)}; {time.time() - t_start:.0f} s", flush=True)

    V = len(enc.tokens)
    target, draft = Llama(CONFIGS["target"], V), Llama(CONFIGS["draft"], V)
    for name, m in (("target", target), ("draft", draft)):
        print(f"{name}: {sum(p.numel() for p in m.parameters()) / 1e6:.2f}M parameters", flush=True)
    params = list(target.parameters()) + list(draft.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = warmup_cosine(opt, args.steps)
    data = batches(train_ids, args.seq, args.batch, rng)
    t0 = time.time()
    for step in range(args.steps):
        x, y = next(data)
        zt = target(x)
        loss_t = F.cross_entropy(zt.view(-1, V), y.view(-1))
        zd = draft(x)
        # The draft: half next-token loss, half distillation towards the target's distribution.
        loss_d = 0.5 * F.cross_entropy(zd.view(-1, V), y.view(-1)) + 0.5 * F.kl_div(
            F.log_softmax(zd.view(-1, V), -1), F.log_softmax(zt.detach().view(-1, V), -1), log_target=True,
            reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        (loss_t + loss_d).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step}: target loss {loss_t.item():.3f}, draft loss {loss_d.item():.3f}, "
                  f"{(step + 1) * args.batch * args.seq / el:.0f} tokens/s, {el / 60:.1f} min", flush=True)
    train_minutes = (time.time() - t0) / 60
    ppl_t, ppl_d = perplexity(target, held_ids, args.seq), perplexity(draft, held_ids, args.seq)
    report = {"steps": args.steps, "tokens_seen": args.steps * args.batch * args.seq, "train_minutes": train_minutes,
              "total_minutes": (time.time() - t_start) / 60, "heldout_tokens": int(len(held_ids)),
              "heldout_perplexity": {"target": ppl_t, "draft": ppl_d}, "seed": args.seed, "torch": torch.__version__,
              "threads": args.threads}
    print(json.dumps(report, indent=2), flush=True)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    export(target, "target", enc, args.out, 1024)
    export(draft, "draft", enc, args.out, 1024)


if __name__ == "__main__":
    main()

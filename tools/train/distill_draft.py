#!/usr/bin/env python3
"""Distils the demo draft further from the bundled target, for sampled speculative decoding.

A sampled draft token is accepted with probability 1 - TVD(p, q) on average, where p and q are
the target's and the draft's distributions after the sampler's temperature, top-k and top-p
(Leviathan et al. 2023, Corollary 3.6). train.py distils the draft at temperature 1 over the whole
vocabulary; this script starts from the bundled draft and trains it, with the bundled Q8_0 target
frozen (the weights specula runs), on the target's distribution as the sampler shapes it
(temperature 0.8, top-k 40, top-p 0.95 by default): the cross-entropy to it plus the total
variation distance itself; with --coupled, also the rate at which the coupled acceptance (the
default when sampling) rejects a draft. It prints the held-out acceptance rates it expects
(teacher-forced on the held-out documents) before and after, and exports the draft for
specula-import.

    /usr/bin/python3 tools/train/distill_draft.py --out build/distill   (see tools/train/README.md)
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(_HERE, "..", "..", "tests", "reference"))
import bpe  # noqa: E402
import llama_ref  # noqa: E402  (its GGUF reader and dequantizers)
import train  # noqa: E402

_LAYER_NAMES = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
                "wo": "attn_output", "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up",
                "w_down": "ffn_down"}


def load_model(path, config):
    """A train.Llama with the weights of a GGUF file (Q8_0 dequantized) and the file's tokenizer."""
    g = llama_ref.Gguf(path)
    meta = g.meta
    vocab = len(meta["tokenizer.ggml.tokens"])
    model = train.Llama(config, vocab)

    def weight(name, like):
        return torch.from_numpy(g.tensor(name).astype(np.float32)).reshape(like.shape)

    with torch.no_grad():
        model.tok_emb.weight.copy_(weight("token_embd.weight", model.tok_emb.weight))
        model.out_norm.weight.copy_(weight("output_norm.weight", model.out_norm.weight))
        for i, b in enumerate(model.blocks):
            for attr, name in _LAYER_NAMES.items():
                m = getattr(b, attr)
                m.weight.copy_(weight(f"blk.{i}.{name}.weight", m.weight))
    enc = bpe.Encoder([tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]])
    if enc.tokens != meta["tokenizer.ggml.tokens"]:
        sys.exit(f"{path}: its merges do not give its tokens")
    return model, enc


def processed(z, temp, top_k, top_p):
    """The sampler's distribution (docs/DESIGN.md "Sampling"): softmax of z / temp over the top_k
    largest, then the shortest prefix whose mass reaches top_p. Returns (ids, probabilities), with
    the probabilities of dropped ranks 0."""
    s, ids = (z / temp).topk(top_k, dim=-1)
    p = s.softmax(-1)
    before = p.cumsum(-1) - p  # mass of the ranks ahead of each
    p = torch.where(before < top_p, p, torch.zeros_like(p))
    return ids, p / p.sum(-1, keepdim=True)


def target_samples(cli, target, texts, n, a, rng):
    """n continuations the target samples with specula-cli (the sampler of the distillation) from
    prompts cut from the training texts: the text the draft is asked to predict when it drafts."""
    out = []
    for i in range(n):
        t = texts[rng.integers(len(texts))]
        at = rng.integers(max(1, len(t) - 300))
        prompt = t[at:at + 200].split(" ", 1)[-1].rsplit(" ", 1)[0]
        if not prompt.strip():
            continue
        r = subprocess.run([cli, "-m", target, "-p", prompt, "-n", str(a.seq), "--temp", str(a.temp),
                            "--top-k", str(a.top_k), "--top-p", str(a.top_p), "--seed", str(i + 1),
                            "--threads", "1", "--backend", "cpu", "--no-bos"],
                           capture_output=True, check=True)
        # Without top-p a rare token may end within a character: such bytes become U+FFFD.
        out.append(r.stdout.decode("utf-8", errors="replace"))
    return out


def losses(zt, zd, a):
    """(cross-entropy to the target's processed distribution, TVD of the draft's tempered one to
    it): what the draft is trained on."""
    ids, p = processed(zt, a.temp, a.top_k, a.top_p)
    logq_on = (zd / a.temp).log_softmax(-1).gather(-1, ids)
    q_on = logq_on.exp()
    ce = -(p * logq_on).sum(-1).mean()
    tvd = 0.5 * ((p - q_on).abs().sum(-1) + (1 - q_on.sum(-1)).clamp(min=0)).mean()
    return ce, tvd


def coupled_agreement(zt, zd, a):
    """The mean probability that the coupled acceptance accepts a draft (docs/DESIGN.md
    "Speculative decoding"): the target and the draft draw a position by exponential races with
    the same noise E_x, and the draft is accepted when both races pick the same token. Both pick
    i with probability 1 / sum_j max(p_j / p_i, q_j / q_i), so the mean agreement is the sum of
    that over the tokens both keep: differentiable in the draft's processed distribution q
    (over its own top-k; top-p is not applied to q here)."""
    tids, p = processed(zt, a.temp, a.top_k, a.top_p)
    _, dids = (zd / a.temp).topk(a.top_k, dim=-1)
    lq = (zd / a.temp).gather(-1, dids).log_softmax(-1)  # the draft's kept log-probabilities
    far = -1e4  # a log-probability for "not kept": its terms vanish from the sums below
    ids = torch.cat([tids, dids], -1)  # the union of the kept sets, the draft's repeats masked
    repeat = torch.cat([torch.zeros_like(tids, dtype=torch.bool),
                        (dids[..., :, None] == tids[..., None, :]).any(-1)], -1)
    lp_t = torch.where(p > 0, p.clamp(min=1e-30).log(), torch.full_like(p, far))
    # log p and log q at every id of the union
    in_t = ids[..., :, None] == tids[..., None, :]
    in_d = ids[..., :, None] == dids[..., None, :]
    lpu = torch.where(in_t.any(-1), (in_t * lp_t[..., None, :]).sum(-1), torch.full_like(ids, far, dtype=lp_t.dtype))
    lqu = torch.where(in_d.any(-1), (in_d * lq[..., None, :]).sum(-1), torch.full_like(lpu, far))
    lpu = torch.where(repeat, torch.full_like(lpu, far), lpu)
    lqu = torch.where(repeat, torch.full_like(lqu, far), lqu)
    both = (lpu > far / 2) & (lqu > far / 2)
    m = torch.maximum(lpu[..., None, :] - lpu[..., :, None], lqu[..., None, :] - lqu[..., :, None])
    term = torch.exp(-torch.logsumexp(m, -1))
    return (term * both).sum(-1).mean()


@torch.no_grad()
def agreement(zt, zd, a):
    """(expected acceptance Σ min(p, q) with both distributions processed, argmax agreement)"""
    ids, p = processed(zt, a.temp, a.top_k, a.top_p)
    dids, dp = processed(zd, a.temp, a.top_k, a.top_p)
    match = (ids[..., :, None] == dids[..., None, :]).float()
    q = (match * dp[..., None, :]).sum(-1)  # the draft's processed q at the target's kept ids
    return torch.minimum(p, q).sum(-1).mean(), (zt.argmax(-1) == zd.argmax(-1)).float().mean()


@torch.no_grad()
def held_out(target, draft, ids, a, n_windows=64):
    draft.eval()
    stats = np.zeros(5)
    starts = np.linspace(0, len(ids) - a.seq - 1, n_windows).astype(int)
    for s in range(0, n_windows, a.batch):
        x = torch.from_numpy(np.stack([ids[i:i + a.seq] for i in starts[s:s + a.batch]])).long()
        zt, zd = target(x), draft(x)
        stats += [v.item() for v in losses(zt, zd, a) + agreement(zt, zd, a) + (coupled_agreement(zt, zd, a),)]
    draft.train()
    return stats / math.ceil(n_windows / a.batch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="examples/models/specula-demo-target.gguf")
    ap.add_argument("--draft", default="examples/models/specula-demo-draft.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--coupled", type=float, default=0.0,
                    help="weight of the coupled acceptance's disagreement (1 - its acceptance) in the loss")
    ap.add_argument("--sampled-share", type=float, default=0.5,
                    help="the share of each batch that is the target's sampled continuations")
    ap.add_argument("--samples", type=int, default=2000,
                    help="continuations sampled from the target (--sampled-share of each batch); 0: the corpus only")
    ap.add_argument("--cli", default="build/release/examples/specula-cli")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)
    t_start = time.time()

    target, enc = load_model(a.target, train.CONFIGS["target"])
    draft, draft_enc = load_model(a.draft, train.CONFIGS["draft"])
    if draft_enc.tokens != enc.tokens:
        sys.exit("the draft's vocabulary is not the target's")
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    train_texts, held_texts = train.load_corpus()
    train_ids = np.array([i for t in train_texts for i in enc.encode(t) + [enc.eos]], dtype=np.int32)
    held_ids = np.array([i for t in held_texts for i in enc.encode(t) + [enc.eos]], dtype=np.int32)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(held_texts))
    print(f"{len(train_ids)} training tokens, {len(held_ids)} held out; {time.time() - t_start:.0f} s", flush=True)
    sampled = target_samples(a.cli, a.target, train_texts, a.samples, a, rng)
    sample_ids = np.array([i for t in sampled for i in enc.encode(t) + [enc.eos]], dtype=np.int32)
    print(f"{len(sampled)} samples of the target, {len(sample_ids)} tokens; {time.time() - t_start:.0f} s", flush=True)

    def report(tag):
        ce, tvd, alpha, agree, coupled = held_out(target, draft, held_ids, a)
        print(f"{tag}: held-out cross-entropy {ce:.3f}, TVD {tvd:.3f}, expected acceptance {alpha:.3f} "
              f"(T {a.temp}, top-k {a.top_k}, top-p {a.top_p}), coupled {coupled:.3f}, "
              f"argmax agreement {agree:.3f}", flush=True)
        return {"cross_entropy": ce, "tvd": tvd, "alpha": alpha, "coupled_alpha": coupled,
                "argmax_agreement": agree}

    before = report("starting draft")
    opt = torch.optim.AdamW(draft.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = train.warmup_cosine(opt, a.steps)
    half = round(a.batch * a.sampled_share) if len(sample_ids) > a.seq + 1 else 0
    corpus = train.batches(train_ids, a.seq, a.batch - half, rng)
    samples = train.batches(sample_ids, a.seq, half, rng) if half else None
    t0 = time.time()
    for step in range(a.steps):
        x = next(corpus)[0]
        if samples:
            x = torch.cat([x, next(samples)[0]])
        with torch.no_grad():
            zt = target(x)
        zd = draft(x)
        ce, tvd = losses(zt, zd, a)
        loss = ce + tvd
        if a.coupled > 0:
            coupled = coupled_agreement(zt, zd, a)
            loss = loss + a.coupled * (1 - coupled)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            alpha, _ = agreement(zt, zd.detach(), a)
            c = coupled.item() if a.coupled > 0 else float("nan")
            print(f"step {step}: cross-entropy {ce.item():.3f}, TVD {tvd.item():.3f}, acceptance {alpha.item():.3f}, "
                  f"coupled {c:.3f}, "
                  f"{time.time() - t0:.0f} s", flush=True)
        if (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            report(f"step {step + 1}")
    after = report(f"after {a.steps} steps")
    result = {"steps": a.steps, "seed": a.seed, "threads": a.threads, "train_seconds": time.time() - t0,
              "torch": torch.__version__, "temp": a.temp, "top_k": a.top_k, "top_p": a.top_p,
              "before": before, "after": after}
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(result, f, indent=2)
    train.export(draft, "draft", enc, a.out, 1024)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trains the bundled Whisper pair on the synthetic speech of asr_data.py: a target
(Whisper architecture, 192 wide, 4 encoder and 4 decoder blocks) and a Distil-Whisper-style
draft (the target's encoder, its own 2-block decoder, distilled from the target's
distributions in the same run). Both use Whisper's English vocabulary and special tokens,
with and without timestamps, and sometimes a previous sentence after <|startofprev|>.

A compact training softmax: only the tokens the corpus can produce (its sentences' tokens,
the special tokens, the window's timestamps) have trained embeddings. The decoder's final
norm has one channel fixed at 1 (weight 0, bias 1), so an embedding's value there is the
token's logit bias: the exported rows of all other tokens are -60 there and zero elsewhere,
so their logits are -60, and the file holds Whisper's whole 51,864-token vocabulary.

Exports each model as a manifest (hyperparameters, tensors by whisper.cpp's names) and raw
float32 data, which `specula-import --whisper-header` writes as whisper.cpp model files.

    /usr/bin/python3 tools/train/train_asr.py --data DIR --header HEADER --out DIR
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

# torch's threads do the parallel work; OpenBLAS threads of its own on top oversubscribe the
# cores (measured: 2 torch threads with OpenBLAS's 2 ran slower than one thread; with
# OpenBLAS on one, 2 torch threads train 1.75x faster than one). Set before numpy loads it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from asr_data import read_header  # noqa: E402

N_VOCAB = 51864  # Whisper's English-only vocabulary
EOT, SOT, PREV, NOSP, NO_TS, TS0 = 50256, 50257, 50360, 50361, 50362, 50363
TRANSCRIBE = 50358
N_MELS, N_TEXT_CTX = 80, 128
TARGET = dict(width=192, heads=3, enc_layers=4, dec_layers=4)
DRAFT_DEC_LAYERS = 2
BIAS_CHANNEL = 0  # the final norm's channel that carries each token's logit bias
ABSENT_LOGIT = -60.0
CTC_CHARS = "abcdefghijklmnopqrstuvwxyz' "
SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


class Bpe:
    """GPT-2's byte-level BPE over a whisper.cpp vocabulary (token bytes in id order): GPT-2
    numbers merged tokens in merge order, so a pair's rank is the id of the merged token."""

    def __init__(self, tokens):
        self.rank = {t: i for i, t in enumerate(tokens[:EOT])}

    def encode(self, text):
        ids = []
        for word in SPLIT.findall(text):
            parts = [bytes([b]) for b in word.encode()]
            while len(parts) > 1:
                best = min(((self.rank.get(parts[i] + parts[i + 1], 1 << 30), i)
                            for i in range(len(parts) - 1)))
                if best[0] == 1 << 30:
                    break
                i = best[1]
                parts[i : i + 2] = [parts[i] + parts[i + 1]]
            ids += [self.rank[p] for p in parts]
        return ids


def gelu(x):
    """Exact GELU by its formula: torch 1.13's CPU GELU backward returned gradients of 1e10+ for
    bounded inputs at random here (a non-contiguous incoming gradient)."""
    return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))


class Gelu(nn.Module):
    def forward(self, x):
        return gelu(x)


def sinusoids(length, channels):
    inc = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.query, self.key = nn.Linear(d, d), nn.Linear(d, d, bias=False)
        self.value, self.out = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, kv=None, causal=False):
        b, t, d = x.shape
        src = x if kv is None else kv
        split = lambda y: y.view(b, y.shape[1], self.h, d // self.h).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(src)), split(self.value(src))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.h)
        if causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = scores.softmax(-1) @ v
        return self.out(o.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, h, cross):
        super().__init__()
        self.attn, self.attn_ln = Attention(d, h), nn.LayerNorm(d)
        self.cross_attn = Attention(d, h) if cross else None
        self.cross_attn_ln = nn.LayerNorm(d) if cross else None
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), Gelu(), nn.Linear(4 * d, d))
        self.mlp_ln = nn.LayerNorm(d)

    def forward(self, x, xa=None):
        x = x + self.attn(self.attn_ln(x), causal=self.cross_attn is not None)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.cross_attn_ln(x), xa)
        return x + self.mlp(self.mlp_ln(x))


class Encoder(nn.Module):
    def __init__(self, d, h, layers, n_ctx):
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, d))
        self.blocks = nn.ModuleList(Block(d, h, False) for _ in range(layers))
        self.ln_post = nn.LayerNorm(d)

    @staticmethod
    def conv(conv, x, stride):
        """A width-3 convolution as a matrix product over windows (rows of time), as the runtime
        computes it (im2col)."""
        xp, n = F.pad(x, (1, 1)), (x.shape[2] + stride - 1) // stride
        cols = torch.stack([xp[:, :, k : k + stride * (n - 1) + 1 : stride] for k in range(3)], -1)
        cols = cols.permute(0, 2, 1, 3).reshape(x.shape[0], n, -1)  # [batch, time, channels * 3]
        return F.linear(cols, conv.weight.reshape(conv.weight.shape[0], -1), conv.bias)

    def forward(self, mel):
        x = gelu(self.conv(self.conv1, mel, 1)).transpose(1, 2)
        x = gelu(self.conv(self.conv2, x, 2))
        x = x + self.positional_embedding
        for blk in self.blocks:
            x = blk(x)
        return self.ln_post(x)


class Decoder(nn.Module):
    def __init__(self, d, h, layers, n_sub):
        super().__init__()
        self.token_embedding = nn.Parameter(torch.randn(n_sub, d) * 0.02)
        self.positional_embedding = nn.Parameter(torch.randn(N_TEXT_CTX, d) * 0.01)
        self.blocks = nn.ModuleList(Block(d, h, True) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.pin_bias_channel()

    @torch.no_grad()
    def pin_bias_channel(self):
        self.ln.weight[BIAS_CHANNEL] = 0.0
        self.ln.bias[BIAS_CHANNEL] = 1.0

    def forward(self, tokens, xa):
        x = self.token_embedding[tokens] + self.positional_embedding[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, xa)
        return self.ln(x) @ self.token_embedding.T  # compact logits


class Pair(nn.Module):
    def __init__(self, n_sub, n_audio_ctx):
        super().__init__()
        c = TARGET
        self.encoder = Encoder(c["width"], c["heads"], c["enc_layers"], n_audio_ctx)
        self.decoder = Decoder(c["width"], c["heads"], c["dec_layers"], n_sub)
        self.draft = Decoder(c["width"], c["heads"], DRAFT_DEC_LAYERS, n_sub)
        # Auxiliary CTC over characters (cheap next to a CTC over the tokens): blank is 0.
        self.ctc = nn.Linear(c["width"], len(CTC_CHARS) + 1)


class Batches:
    """Token sequences for the clips: Whisper's transcription prompts with and without
    timestamps, some after a previous sentence; `weight` marks the positions that are judged."""

    def __init__(self, data, bpe, n_audio_ctx, seed):
        self.mel = data["train_mel"]
        self.sentence = list(data["train_text"])
        self.text = [bpe.encode(" " + t) for t in self.sentence]
        self.span = data["train_span"]
        self.n_audio_ctx = n_audio_ctx
        self.rng = random.Random(seed)

    def sequence(self, i):
        r = self.rng
        text = self.text[i]
        prefix = []
        if r.random() < 0.15:
            prefix = [PREV] + self.text[r.randrange(len(self.text))]
        if r.random() < 0.5:
            t0 = min(int(self.span[i][0] / 0.02), 50)
            t1 = min(max(int(math.ceil(self.span[i][1] / 0.02)), t0 + 1), self.n_audio_ctx)
            judged = [TS0 + t0] + text + [TS0 + t1, EOT]
            seq = prefix + [SOT] + judged
        else:
            judged = text + [EOT]
            seq = prefix + [SOT, NO_TS] + judged
        return seq, len(seq) - len(judged), text

    def get(self, idx):
        seqs = [self.sequence(i) for i in idx]
        n = max(len(s) for s, _, _ in seqs)
        tokens = np.full((len(idx), n), EOT, np.int64)
        weight = np.zeros((len(idx), n - 1), np.float32)
        for b, (s, first, _) in enumerate(seqs):
            tokens[b, : len(s)] = s
            weight[b, first - 1 : len(s) - 1] = 1
        mel = torch.from_numpy(self.mel[idx].astype(np.float32))
        return mel, torch.from_numpy(tokens), torch.from_numpy(weight), [t for _, _, t in seqs]


def augment(mel, rng):
    """Masks a few mel bands and short time spans (SpecAugment, mild)."""
    mel = mel.clone()
    floor = mel.amin(dim=(1, 2), keepdim=True)
    for b in range(mel.shape[0]):
        if rng.random() < 0.5:
            for _ in range(2):
                f = rng.randrange(0, N_MELS - 8)
                mel[b, f : f + rng.randrange(1, 8)] = floor[b]
            t = rng.randrange(0, mel.shape[2] - 12)
            mel[b, :, t : t + rng.randrange(1, 12)] = floor[b]
    return mel


def normalize(text):
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def wer(refs, hyps):
    errors = words = 0
    for r, h in zip(refs, hyps):
        r, h = normalize(r), normalize(h)
        d = list(range(len(h) + 1))
        for i in range(1, len(r) + 1):
            prev, d[0] = d[0], i
            for j in range(1, len(h) + 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
        errors += d[len(h)]
        words += len(r)
    return errors / max(words, 1)


def specials_suppressed(sub_ids):
    """The compact ids the runtime's rules leave out of greedy text decoding: every special
    token but <|endoftext|>."""
    return torch.tensor([t >= EOT and t != EOT for t in sub_ids.tolist()])


@torch.no_grad()
def greedy(decoder, xa, sub_of, sub_ids, max_len=40):
    """Greedy transcription without timestamps (compact logits; specials other than
    <|endoftext|> left out as the runtime's rules leave them out)."""
    b = xa.shape[0]
    tokens = torch.tensor([[sub_of[SOT], sub_of[NO_TS]]] * b)
    banned = specials_suppressed(sub_ids)
    done = torch.zeros(b, dtype=torch.bool)
    for _ in range(max_len):
        logits = decoder(tokens, xa)[:, -1]
        logits[:, banned] = -1e9
        nxt = logits.argmax(-1)
        nxt[done] = sub_of[EOT]
        done |= nxt == sub_of[EOT]
        tokens = torch.cat([tokens, nxt[:, None]], 1)
        if done.all():
            break
    return tokens


@torch.no_grad()
def agreement(draft, xa, tokens, sub_of, sub_ids):
    """How often the draft's greedy choice is the next token of the target's greedy transcript
    `tokens` (greedy() of the target, to its first <|endoftext|>): greedy drafting's acceptance
    rate per token. Returns (agreeing, judged)."""
    logits = draft(tokens[:, :-1], xa)
    logits[:, :, specials_suppressed(sub_ids)] = -1e9
    nxt = tokens[:, 1:]
    ended = (nxt == sub_of[EOT]).long().cumsum(1)
    judged = (ended - (nxt == sub_of[EOT]).long()) == 0  # up to the first <|endoftext|>
    judged[:, 0] = False  # <|notimestamps|> is the prompt's
    hit = (logits.argmax(-1) == nxt) & judged
    return int(hit.sum()), int(judged.sum())


def decode_text(tokens, sub_ids, vocab):
    out = []
    for row in tokens.tolist():
        ids = [int(sub_ids[t]) for t in row]
        ids = ids[: ids.index(EOT)] if EOT in ids else ids
        out.append(b"".join(vocab[i] for i in ids if i < EOT).decode("utf-8", "replace"))
    return out


def evaluate(model, data, bpe, sub_of, sub_ids, vocab, n=None):
    model.eval()
    mel = torch.from_numpy(data["heldout_mel"][:n].astype(np.float32))
    refs = list(data["heldout_text"][:n])
    res, agree, judged = {}, 0, 0
    for name, dec in (("target", model.decoder), ("draft", model.draft)):
        hyps = []
        for s in range(0, len(mel), 64):
            xa = model.encoder(mel[s : s + 64])
            tokens = greedy(dec, xa, sub_of, sub_ids)
            hyps += decode_text(tokens[:, 2:], sub_ids, vocab)
            if dec is model.decoder:
                a, j = agreement(model.draft, xa, tokens, sub_of, sub_ids)
                agree, judged = agree + a, judged + j
        res[name] = wer(refs, hyps)
        res[name + "_examples"] = list(zip(refs[:3], hyps[:3]))
    res["agreement"] = agree / max(judged, 1)
    model.train()
    return res


def load_data(folders):
    """asr_data.npz of each folder: the training clips of all (another --seed speaks the same
    sentences with other voices, speeds and noise, and draws other random words), the held-out
    clips of the first, and every sentence of any (their tokens are the trained ones)."""
    data = dict(np.load(os.path.join(folders[0], "asr_data.npz")))
    for folder in folders[1:]:
        more = np.load(os.path.join(folder, "asr_data.npz"))
        assert int(more["n_audio_ctx"]) == int(data["n_audio_ctx"]), "another window"
        for k in ("train_mel", "train_text", "train_voice", "train_span"):
            data[k] = np.concatenate([data[k], more[k]])
        known = set(data["all_sentences"])
        data["all_sentences"] = np.concatenate(
            [data["all_sentences"], [s for s in more["all_sentences"] if s not in known]])
    return data


def load_files(model, sub_ids, target_path, draft_path):
    """The reverse of export(): a target and a draft file (whisper.cpp's format, any type the
    NumPy reference reads) into the Pair's weights."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/reference"))
    from whisper_ref import WhisperFile

    sd = {}
    for path, decoder in ((target_path, "decoder."), (draft_path, "draft.")):
        f = WhisperFile(path)
        for name in f.tensors:
            if name.startswith("decoder.") or path == target_path:
                key = decoder + name[len("decoder."):] if name.startswith("decoder.") else name
                sd[key] = torch.from_numpy(np.ascontiguousarray(f(name), dtype=np.float32))
        emb = sd.pop(decoder + "token_embedding.weight")
        absent = np.ones(len(emb), bool)
        absent[sub_ids] = False
        if emb[absent][:, BIAS_CHANNEL].max() > ABSENT_LOGIT / 2 or emb[absent].abs().sum(0)[BIAS_CHANNEL + 1:].max() != 0:
            sys.exit(f"{path}: tokens outside this corpus have trained embeddings (another corpus?)")
        sd[decoder + "token_embedding"] = emb[torch.from_numpy(sub_ids)]
    for k in ("encoder.conv1.bias", "encoder.conv2.bias"):
        sd[k] = sd[k].reshape(-1)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or any(not k.startswith("ctc.") for k in missing):
        sys.exit(f"the files do not fit the model: missing {missing}, unexpected {unexpected}")


def export(model, sub_ids, n_audio_ctx, decoder, dec_layers, path):
    """A manifest + raw float32 tensors by whisper.cpp's names (ggml shapes: fastest first)."""
    sd = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    for k, v in decoder.state_dict().items():
        sd["decoder." + k] = v
    emb = torch.zeros(N_VOCAB, TARGET["width"])
    emb[:, BIAS_CHANNEL] = ABSENT_LOGIT
    emb[torch.from_numpy(sub_ids)] = decoder.token_embedding.detach()
    sd["decoder.token_embedding.weight"] = emb
    del sd["decoder.token_embedding"]
    tensors, offset = [], 0
    with open(path + ".f32", "wb") as f:
        for name, v in sd.items():
            v = v.detach().float().contiguous()
            if name.endswith("conv1.bias") or name.endswith("conv2.bias"):
                v = v.reshape(-1, 1)  # whisper.cpp: {1, width}
            f.write(v.numpy().tobytes())
            tensors.append(dict(name=name, shape=list(reversed(v.shape)), offset=offset))
            offset += v.numel()
    c = TARGET
    hp = dict(n_vocab=N_VOCAB, n_audio_ctx=n_audio_ctx, n_audio_state=c["width"],
              n_audio_head=c["heads"], n_audio_layer=c["enc_layers"], n_text_ctx=N_TEXT_CTX,
              n_text_state=c["width"], n_text_head=c["heads"], n_text_layer=dec_layers,
              n_mels=N_MELS)
    with open(path + ".manifest.json", "w") as f:
        json.dump(dict(format="whisper", hparams=hp, data=os.path.basename(path) + ".f32",
                       tensors=tensors), f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, nargs="+",
                    help="asr_data.py output folders: their training clips together, the first's "
                         "held-out clips")
    ap.add_argument("--header", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--bf16", type=int, default=1, help="bfloat16 matrix products")
    ap.add_argument("--export-from", help="only export and evaluate this checkpoint (asr.pt)")
    ap.add_argument("--save-every", type=int, default=100, help="steps between resumable states")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/state.pt")
    ap.add_argument("--init-from", help="start from this checkpoint's weights (asr.pt) with a new "
                    "optimizer and schedule: a second, shorter cosine cycle")
    ap.add_argument("--enc-layers", type=int, default=TARGET["enc_layers"], help="the target's encoder blocks")
    ap.add_argument("--dec-layers", type=int, default=TARGET["dec_layers"], help="the target's decoder blocks")
    ap.add_argument("--init-from-files", nargs=2, metavar=("TARGET", "DRAFT"),
                    help="start from a pair's whisper.cpp files (dequantized: the weights the runtime "
                         "runs) with a new optimizer and schedule, as --init-from; --steps 0 only "
                         "evaluates them")
    a = ap.parse_args()
    # A deeper decoder over a shallower encoder moves a clip's time towards the decoder, which
    # the draft speeds up (the encoder runs once per window for both).
    TARGET.update(enc_layers=a.enc_layers, dec_layers=a.dec_layers)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = random.Random(a.seed)
    data = load_data(a.data)
    n_audio_ctx = int(data["n_audio_ctx"])
    _, _, vocab = read_header(a.header)
    bpe = Bpe(vocab)
    corpus_ids = {t for s in data["all_sentences"] for t in bpe.encode(" " + s)}
    sub_ids = np.array(sorted(corpus_ids | {EOT, SOT, TRANSCRIBE, PREV, NOSP, NO_TS} |
                              set(range(TS0, TS0 + n_audio_ctx + 1))), np.int64)
    sub_of = {int(t): i for i, t in enumerate(sub_ids)}
    model = Pair(len(sub_ids), n_audio_ctx)
    if a.export_from:
        ckpt = torch.load(a.export_from)
        model.load_state_dict(ckpt["model"])
        finish(a, model, data, bpe, sub_of, sub_ids, vocab, n_audio_ctx, ckpt["step"], 0.0)
        return
    if a.init_from:
        model.load_state_dict(torch.load(a.init_from)["model"])
    elif a.init_from_files:
        load_files(model, sub_ids, *a.init_from_files)
        if a.steps == 0:  # only evaluate the files
            finish(a, model, data, bpe, sub_of, sub_ids, vocab, n_audio_ctx, 0, 0.0)
            return
    batches = Batches(data, bpe, n_audio_ctx, a.seed)
    to_sub = torch.from_numpy(np.vectorize(lambda t: sub_of.get(int(t), 0))(np.arange(N_VOCAB)))
    print(f"{len(sub_ids)} trained tokens; target {sum(p.numel() for n, p in model.named_parameters() if not n.startswith(('draft', 'ctc')))/1e6:.2f}M "
          f"parameters (compact), draft decoder {sum(p.numel() for p in model.draft.parameters())/1e6:.2f}M; "
          f"{len(batches.text)} clips", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = min(400, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps))))
    order, pos, t_start, first = [], 0, time.time(), 1
    state_path = os.path.join(a.out, "state.pt")
    if a.resume and os.path.exists(state_path):
        # The whole state of the run, so a resumed run takes the same steps as one that was not
        # stopped: weights, optimizer, schedule, data order and every random generator.
        st = torch.load(state_path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        order, pos, first, t_start = st["order"], st["pos"], st["step"] + 1, time.time() - st["seconds"]
        rng.setstate(st["rng"])
        batches.rng.setstate(st["batch_rng"])
        torch.set_rng_state(st["torch_rng"])
        print(f"resumed after step {st['step']}", flush=True)
    for step in range(first, a.steps + 1):
        if pos + a.batch > len(order):
            order, pos = list(range(len(batches.text))), 0
            rng.shuffle(order)
        idx = sorted(order[pos : pos + a.batch])
        pos += a.batch
        mel, tokens, weight, texts = batches.get(idx)
        tokens = to_sub[tokens]
        # bfloat16 matrix products (float32 weights and losses): 1.4x faster on one core.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(a.bf16)):
            xa = model.encoder(augment(mel, rng))
            logits = model.decoder(tokens[:, :-1], xa)
            d_logits = model.draft(tokens[:, :-1], xa.detach())
            # The files hold no CTC head: a new one learns without steering the encoder.
            ctc_logits = model.ctc(xa.detach() if a.init_from_files else xa)
        xa, logits, d_logits, ctc_logits = xa.float(), logits.float(), d_logits.float(), ctc_logits.float()
        ce = (F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none") * weight).sum() / weight.sum()
        d_ce = (F.cross_entropy(d_logits.transpose(1, 2), tokens[:, 1:], reduction="none") * weight).sum() / weight.sum()
        kl = (F.kl_div(F.log_softmax(d_logits, -1), F.log_softmax(logits.detach(), -1), log_target=True,
                       reduction="none").sum(-1) * weight).sum() / weight.sum()
        ctc_targets = [torch.tensor([CTC_CHARS.index(c) + 1 for c in " ".join(normalize(batches.sentence[i]))])
                       for i in idx]
        ctc = F.ctc_loss(F.log_softmax(ctc_logits, -1).transpose(0, 1), torch.cat(ctc_targets),
                         torch.full((len(idx),), xa.shape[1]), torch.tensor([len(t) for t in ctc_targets]),
                         zero_infinity=True)  # per character, averaged over the clips
        loss = ce + 0.5 * ctc + 0.5 * d_ce + 0.5 * kl
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            print(f"step {step}: loss {loss.item()} (ce {ce.item()} ctc {ctc.item()} draft {d_ce.item()} kl {kl.item()}), skipped", flush=True)
            continue
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.decoder.pin_bias_channel()
        model.draft.pin_bias_channel()
        if step % 50 == 0:
            # Teacher-forced: how often the draft's choice is the target's.
            match = ((d_logits.argmax(-1) == logits.argmax(-1)).float() * weight).sum() / weight.sum()
            print(f"step {step} ce {ce.item():.3f} ctc {ctc.item():.3f} draft ce {d_ce.item():.3f} kl {kl.item():.3f} "
                  f"match {match.item():.3f} "
                  f"lr {sched.get_last_lr()[0]:.2e} {time.time() - t_start:.0f} s", flush=True)
        if step % a.eval_every == 0 or step == a.steps:
            r = evaluate(model, data, bpe, sub_of, sub_ids, vocab, n=None if step == a.steps else 100)
            print(f"step {step} held-out WER target {r['target']:.3f} draft {r['draft']:.3f} "
                  f"agreement {r['agreement']:.3f} {r['target_examples'][:2]}", flush=True)
            os.makedirs(a.out, exist_ok=True)
            torch.save(dict(model=model.state_dict(), sub_ids=sub_ids, step=step), os.path.join(a.out, "asr.pt"))
        if step % a.save_every == 0:
            os.makedirs(a.out, exist_ok=True)
            torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                            order=order, pos=pos, step=step, seconds=time.time() - t_start,
                            rng=rng.getstate(), batch_rng=batches.rng.getstate(),
                            torch_rng=torch.get_rng_state()), state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)
    finish(a, model, data, bpe, sub_of, sub_ids, vocab, n_audio_ctx, a.steps, time.time() - t_start)


def finish(a, model, data, bpe, sub_of, sub_ids, vocab, n_audio_ctx, step, seconds):
    """Exports both models and evaluates them on every held-out clip."""
    os.makedirs(a.out, exist_ok=True)
    export(model, sub_ids, n_audio_ctx, model.decoder, TARGET["dec_layers"], os.path.join(a.out, "target"))
    export(model, sub_ids, n_audio_ctx, model.draft, DRAFT_DEC_LAYERS, os.path.join(a.out, "draft"))
    r = evaluate(model, data, bpe, sub_of, sub_ids, vocab)
    json.dump(dict(wer_target=r["target"], wer_draft=r["draft"], agreement=r["agreement"], step=step, seconds=seconds,
                   threads=a.threads), open(os.path.join(a.out, "train.json"), "w"), indent=1)
    print(f"done at step {step}: held-out WER target {r['target']:.3f} draft {r['draft']:.3f}, "
          f"the draft agrees with the target's greedy transcripts on {r['agreement']:.3f} of their tokens, "
          f"{seconds:.0f} s of training", flush=True)


if __name__ == "__main__":
    main()

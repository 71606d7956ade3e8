#!/usr/bin/env python3
"""An independent NumPy reference of Whisper's encoder and decoder (OpenAI's model.py: the
AudioEncoder and TextDecoder), reading whisper.cpp's model file itself, in float64 from the
dequantized weights. GELU is the exact erf form Whisper was trained with."""
import math
import struct

import numpy as np

from llama_ref import GGML_TYPES, dequantize

_erf = np.frompyfunc(math.erf, 1, 1)


class WhisperFile:
    HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
               "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")

    def __init__(self, path):
        self.buf = open(path, "rb").read()
        magic, *hp = struct.unpack_from("<I11i", self.buf, 0)
        assert magic == 0x67676D6C, hex(magic)
        self.h = dict(zip(self.HPARAMS, hp))
        pos = 48
        n_mel, n_fft = struct.unpack_from("<2i", self.buf, pos)
        pos += 8
        self.filters = np.frombuffer(self.buf, dtype="<f4", count=n_mel * n_fft, offset=pos).reshape(n_mel, n_fft)
        pos += 4 * n_mel * n_fft
        (n_tokens,) = struct.unpack_from("<i", self.buf, pos)
        pos += 4
        for _ in range(n_tokens):
            (length,) = struct.unpack_from("<I", self.buf, pos)
            pos += 4 + length
        self.tensors = {}
        while pos < len(self.buf):
            n_dims, name_len, ttype = struct.unpack_from("<3i", self.buf, pos)
            pos += 12
            dims = struct.unpack_from(f"<{n_dims}i", self.buf, pos)
            pos += 4 * n_dims
            name = self.buf[pos:pos + name_len].decode()
            pos += name_len
            n = int(np.prod(dims))
            self.tensors[name] = (dims, ttype, pos)
            block, block_bytes = GGML_TYPES[ttype]
            pos += n // block * block_bytes

    def __call__(self, name):
        """numpy shape: the ggml dims reversed (rows of the first dim)."""
        dims, ttype, offset = self.tensors[name]
        return dequantize(self.buf, offset, ttype, int(np.prod(dims))).reshape(tuple(reversed(dims)))


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def attention(q, k, v, n_head, causal_from=None):
    """softmax(q k^T / sqrt(d)) v per head; causal_from: query row i sits at position causal_from + i."""
    n, width = q.shape
    d = width // n_head
    out = np.zeros_like(q)
    mask = 0.0
    if causal_from is not None:
        pos = causal_from + np.arange(n)[:, None]
        mask = np.where(np.arange(k.shape[0])[None, :] > pos, -np.inf, 0.0)
    for h in range(n_head):
        s = q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T / math.sqrt(d) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h * d:(h + 1) * d] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h * d:(h + 1) * d]
    return out


def conv3(x, w, b, stride):
    """x (T, C) rows of time; w (out, C, 3): PyTorch's Conv1d(kernel 3, padding 1)."""
    padded = np.concatenate([np.zeros((1, x.shape[1])), x, np.zeros((1, x.shape[1]))])
    t_out = (x.shape[0] - 1) // stride + 1
    out = np.zeros((t_out, w.shape[0]))
    for k in range(3):
        out += padded[k:k + stride * t_out:stride] @ w[:, :, k].T
    return out + b.reshape(-1)


def encode(f, mel):
    """mel (n_mels, frames >= 2 n_audio_ctx) -> (n_audio_ctx, width)."""
    h = f.h
    x = mel[:, :2 * h["n_audio_ctx"]].T.astype(np.float64)
    x = gelu(conv3(x, f("encoder.conv1.weight"), f("encoder.conv1.bias"), 1))
    x = gelu(conv3(x, f("encoder.conv2.weight"), f("encoder.conv2.bias"), 2))
    x = x + f("encoder.positional_embedding")
    for l in range(h["n_audio_layer"]):
        x = block(f, f"encoder.blocks.{l}.", x, h["n_audio_head"])
    return layer_norm(x, f("encoder.ln_post.weight"), f("encoder.ln_post.bias"))


def linear(f, name, x, bias=True):
    y = x @ f(name + ".weight").T
    return y + f(name + ".bias") if bias else y


def block(f, p, x, n_head, cross=None, cache=None, pos0=0):
    """One residual block. cross: the encoder output (decoder blocks); cache: [k, v] of the
    positions before pos0, extended in place."""
    h = layer_norm(x, f(p + "attn_ln.weight"), f(p + "attn_ln.bias"))
    q, k, v = linear(f, p + "attn.query", h), linear(f, p + "attn.key", h, False), linear(f, p + "attn.value", h)
    if cache is not None:
        cache[0] = np.concatenate([cache[0], k])
        cache[1] = np.concatenate([cache[1], v])
        k, v = cache
    x = x + linear(f, p + "attn.out", attention(q, k, v, n_head, pos0 if cache is not None else None))
    if cross is not None:
        h = layer_norm(x, f(p + "cross_attn_ln.weight"), f(p + "cross_attn_ln.bias"))
        q = linear(f, p + "cross_attn.query", h)
        k, v = linear(f, p + "cross_attn.key", cross, False), linear(f, p + "cross_attn.value", cross)
        # kept in F16, as whisper.cpp keeps them (Backend::round_to_half)
        k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        x = x + linear(f, p + "cross_attn.out", attention(q, k, v, n_head))
    h = layer_norm(x, f(p + "mlp_ln.weight"), f(p + "mlp_ln.bias"))
    return x + linear(f, p + "mlp.2", gelu(linear(f, p + "mlp.0", h)))


def decode(f, enc, tokens):
    """Logits (len(tokens), n_vocab) of tokens at positions 0.. after the encoder output enc."""
    h = f.h
    emb = f("decoder.token_embedding.weight")
    x = emb[tokens] + f("decoder.positional_embedding")[:len(tokens)]
    for l in range(h["n_text_layer"]):
        x = block(f, f"decoder.blocks.{l}.", x, h["n_text_head"], cross=enc, cache=[np.zeros((0, x.shape[1]))] * 2)
    return layer_norm(x, f("decoder.ln.weight"), f("decoder.ln.bias")) @ emb.T

#!/usr/bin/env python3
"""An independent NumPy reference of the Llama forward pass, reading the GGUF
file itself (its own reader: no code shared with the C++ runtime). Computes in
float64 from the dequantized weights. With quantized_inputs, the inputs of matmuls of
quantized weights are first quantized per block of 32 as specula's cpu backend does
(dx = max|x| / 127, qx = x * (1 / dx) rounded to nearest even, in float32)."""
import struct

import numpy as np

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type -> (block size, bytes per block)
GGML_TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              12: (256, 144), 13: (256, 176), 14: (256, 210)}


def _f16(blocks, at):
    """The fp16 at byte `at` of every block, as a (n_blocks, 1) column."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float64)


def _nibbles(qs):
    """Bytes (n_blocks, 16) -> 32 values: low nibbles are elements 0..15, high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int64)


def _fifth_bits(blocks, at):
    """Bit j of the little-endian uint32 at byte `at`, for j < 32: (n_blocks, 32)."""
    qh = blocks[:, at:at + 4].copy().view("<u4").astype(np.int64)
    return (qh >> np.arange(32)) & 1


def _k_scales_mins(sc):
    """Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins -> (n_blocks, 8) each."""
    sc = sc.astype(np.int64)
    scale = np.empty((sc.shape[0], 8), np.int64)
    mins = np.empty_like(scale)
    scale[:, :4] = sc[:, 0:4] & 63
    mins[:, :4] = sc[:, 4:8] & 63
    scale[:, 4:] = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    mins[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return scale, mins


def dequantize(buf, offset, ttype, n):
    """n values of ggml type ttype stored at buf[offset:], as float64."""
    block, block_bytes = GGML_TYPES[ttype]
    raw = np.frombuffer(buf, dtype=np.uint8, count=n // block * block_bytes, offset=offset)
    if ttype == 0:
        return raw.view(np.float32).astype(np.float64)
    if ttype == 1:
        return raw.view(np.float16).astype(np.float64)
    blocks = raw.reshape(-1, block_bytes)
    if ttype == 8:  # Q8_0: x = d * q
        return (_f16(blocks, 0) * blocks[:, 2:].view(np.int8)).reshape(-1)
    if ttype == 2:  # Q4_0: x = d * (q - 8)
        return (_f16(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8)).reshape(-1)
    if ttype == 3:  # Q4_1: x = d * q + m
        return (_f16(blocks, 0) * _nibbles(blocks[:, 4:]) + _f16(blocks, 2)).reshape(-1)
    if ttype == 6:  # Q5_0: x = d * (q - 16), q = nibble | fifth bit << 4
        q = _nibbles(blocks[:, 6:]) | (_fifth_bits(blocks, 2) << 4)
        return (_f16(blocks, 0) * (q - 16)).reshape(-1)
    if ttype == 7:  # Q5_1: x = d * q + m
        q = _nibbles(blocks[:, 8:]) | (_fifth_bits(blocks, 4) << 4)
        return (_f16(blocks, 0) * q + _f16(blocks, 2)).reshape(-1)
    if ttype in (12, 13):  # Q4_K / Q5_K: sub-block j of 32: d * scale_j * q - dmin * min_j
        scale, mins = _k_scales_mins(blocks[:, 4:16])
        qs = blocks[:, 16:144] if ttype == 12 else blocks[:, 48:176]
        q = np.empty((blocks.shape[0], 8, 32), np.int64)
        for j in range(8):  # 32 bytes per pair of sub-blocks: low nibbles first, then high
            q[:, j, :] = (qs[:, 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 0x0F
            if ttype == 13:
                q[:, j, :] |= ((blocks[:, 16:48].astype(np.int64) >> j) & 1) << 4
        x = _f16(blocks, 0)[:, :, None] * scale[:, :, None] * q - _f16(blocks, 2)[:, :, None] * mins[:, :, None]
        return x.reshape(-1)
    if ttype == 14:  # Q6_K: halves of 128, each four runs of 32 from ql (128 B) and qh (64 B)
        ql, qh = blocks[:, 0:128].astype(np.int64), blocks[:, 128:192].astype(np.int64)
        sc = blocks[:, 192:208].view(np.int8).astype(np.int64)
        d = _f16(blocks, 208)
        x = np.empty((blocks.shape[0], 256))
        l = np.arange(32)
        for h in range(2):
            lo, hi, high = ql[:, 64 * h:64 * h + 32], ql[:, 64 * h + 32:64 * h + 64], qh[:, 32 * h:32 * h + 32]
            runs = [(lo & 0x0F) | ((high & 3) << 4), (hi & 0x0F) | (((high >> 2) & 3) << 4),
                    (lo >> 4) | (((high >> 4) & 3) << 4), (hi >> 4) | (((high >> 6) & 3) << 4)]
            for k, q in enumerate(runs):
                x[:, 128 * h + 32 * k + l] = d * sc[:, 8 * h + 2 * k + l // 16] * (q - 32)
        return x.reshape(-1)
    raise ValueError(f"ggml type {ttype} has no dequantizer here")


class Gguf:
    def __init__(self, path):
        self.buf = open(path, "rb").read()
        self.pos = 0
        magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", self.buf, 0)
        assert magic == 0x46554747 and version in (2, 3)
        self.pos = 24
        self.meta = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            self.meta[key] = self._value(vtype)
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack("<" + "Q" * n_dims)
            ttype, offset = self._unpack("<IQ")
            self.tensors[name] = (list(dims), ttype, offset)
        align = self.meta.get("general.alignment", 32)
        self.data_start = (self.pos + align - 1) // align * align

    def _unpack(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _string(self):
        (n,) = self._unpack("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype == 8:
            return self._string()
        if vtype == 9:
            etype, count = self._unpack("<IQ")
            return [self._value(etype) for _ in range(count)]
        return self._unpack(GGUF_SCALARS[vtype])[0]

    def tensor(self, name, start=0, stop=None):
        """Rows start..stop (all by default) of the tensor as float64 with numpy shape
        (rows, cols) = (dims[1], dims[0])."""
        dims, ttype, offset = self.tensors[name]
        cols = dims[0]
        rows = int(np.prod(dims[1:]))
        stop = rows if stop is None else stop
        block, block_bytes = GGML_TYPES[ttype]
        row_bytes = cols // block * block_bytes
        x = dequantize(self.buf, self.data_start + offset + start * row_bytes, ttype, (stop - start) * cols)
        return x.reshape(stop - start, cols)

    def rows(self, name, indices):
        """The rows at indices (a token embedding lookup) without dequantizing the others."""
        return np.stack([self.tensor(name, i, i + 1)[0] for i in indices])


# x / dx this close to a half may round either way under float32 evaluation orders (FMA or not),
# which no reference can predict. quantize_inputs counts such elements in `ambiguous` (numbered
# in the order the forward meets them) and rounds those numbered in ambiguous["flips"] the other
# way.
AMBIGUOUS = 2e-4


def quantize_inputs(x, ambiguous):
    """x (n, cols) as the float64 values of its 8-bit blocks: dx * qx."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = blocks * inv
    q = np.rint(v).astype(np.float64)
    near = np.flatnonzero(np.abs(np.abs(v.astype(np.float64) - np.floor(v)) - 0.5) < AMBIGUOUS)
    for flip in ambiguous["flips"]:
        flip -= ambiguous["count"]
        if 0 <= flip < len(near):
            i = np.unravel_index(near[flip], v.shape)
            q[i] = np.floor(v[i]) + (1.0 if q[i] == np.floor(v[i]) else 0.0)
    ambiguous["count"] += len(near)
    return (d.astype(np.float64) * q).reshape(x.shape)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, n_head, head_dim, n_rot, base, neox=False, freq_scale=1.0, factors=None, magnitude=1.0):
    """Llama's rotation pairs elements 2j and 2j + 1 of a head; GPT-NeoX's (Qwen2) pairs
    element j with element j + n_rot / 2. Pair j turns by pos * freq_scale * base^(-2j/n_rot)
    divided by factors[j] (Llama 3's rope_freqs, LongRoPE's short or long factors), as
    llama.cpp's rope with frequency factors, and is scaled by magnitude (LongRoPE's attention
    factor, llama.cpp's attn_factor); dimensions from n_rot on are left as they are."""
    x = x.reshape(len(positions), n_head, head_dim).copy()
    j = np.arange(n_rot // 2)
    inv = freq_scale * base ** (-2.0 * j / n_rot)
    if factors is not None:
        inv = inv / factors
    theta = positions[:, None] * inv  # (n, n_rot/2)
    c, s = magnitude * np.cos(theta)[:, None, :], magnitude * np.sin(theta)[:, None, :]
    first, second = (slice(0, n_rot // 2), slice(n_rot // 2, n_rot)) if neox else (slice(0, n_rot, 2), slice(1, n_rot, 2))
    a, b = x[:, :, first].copy(), x[:, :, second].copy()
    x[:, :, first] = a * c - b * s
    x[:, :, second] = a * s + b * c
    return x.reshape(len(positions), n_head * head_dim)


def forward(path, tokens, quantized_inputs=False, flips=(), n_ctx=256):
    """Logits (len(tokens), n_vocab) for the tokens at positions 0..n-1 in a context of n_ctx
    (which picks LongRoPE's factors), and how many inputs of quantized matmuls were ambiguous
    (AMBIGUOUS); flips: those rounded the other way."""
    ambiguous = {"count": 0, "flips": flips}
    g = Gguf(path)

    def mm(x, name):  # x @ W.T, over W's rows a slice at a time (a real vocabulary's head in
        # float64 is gigabytes)
        if quantized_inputs and g.tensors[name][1] not in (0, 1):
            x = quantize_inputs(x, ambiguous)
        rows = int(np.prod(g.tensors[name][0][1:]))
        step = 8192
        return np.concatenate([x @ g.tensor(name, r, min(r + step, rows)).T for r in range(0, rows, step)], axis=1)

    m = g.meta
    # llama; qwen2: q/k/v biases, NeoX's rotation; qwen3: q/k head norms, NeoX; phi3: q/k/v in
    # one tensor and gate/up in one (the gate's rows first), NeoX, LongRoPE, a sliding window;
    # gemma3: embeddings times sqrt(n_embd), q/k head norms, NeoX, norms after the attention and
    # the feed-forward, GELU's tanh form, every sixth layer global (the file's rope base and
    # scaling), the others local (a sliding window, rope base 10000 unscaled), as llama.cpp;
    # gemma2: as gemma3 without head norms, every other layer global (one rope), attention scores
    # and logits soft-capped (c tanh(x / c))
    arch = m["general.architecture"]
    a = arch + "."
    qwen2 = arch == "qwen2"
    qwen3 = arch == "qwen3"
    phi3 = arch == "phi3"
    gemma3 = arch == "gemma3"
    gemma2 = arch == "gemma2"
    gemma = gemma2 or gemma3
    granite = arch == "granite"
    neox = qwen2 or qwen3 or phi3 or gemma
    n_embd, n_layer = m[a + "embedding_length"], m[a + "block_count"]
    n_head = m[a + "attention.head_count"]
    n_head_kv = m.get(a + "attention.head_count_kv", n_head)
    head_dim = m.get(a + "attention.key_length", n_embd // n_head)
    n_rot = m.get(a + "rope.dimension_count", head_dim)
    eps = m.get(a + "attention.layer_norm_rms_epsilon", 1e-5)
    base = m.get(a + "rope.freq_base", 10000.0)
    factor = m.get(a + "rope.scaling.factor", 0.0)
    freq_scale = 1.0 / factor if factor else 1.0
    factors = g.tensor("rope_freqs.weight")[0].astype(np.float64) if "rope_freqs.weight" in g.tensors else None
    if "rope_factors_short.weight" in g.tensors:  # LongRoPE: the long factors past the original context
        original = m.get(a + "rope.scaling.original_context_length", m[a + "context_length"])
        name = "rope_factors_long.weight" if n_ctx > original else "rope_factors_short.weight"
        factors = g.tensor(name)[0].astype(np.float64)
    magnitude = m.get(a + "rope.scaling.attn_factor", 1.0)

    def proj(h, name):  # a q/k/v projection, with its bias where the model has one
        y = mm(h, name + ".weight")
        return y + g.tensor(name + ".bias")[0] if qwen2 else y

    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = g.rows("token_embd.weight", tokens)
    if gemma:
        x = x * np.sqrt(n_embd)
    # granite: the embeddings, each residual update and the logits scaled (llama.cpp's keys)
    residual = m.get(a + "residual_scale", 0.0) if granite else 0.0
    if granite:
        x = x * m.get(a + "embedding_scale", 1.0)
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    window = m.get(a + "attention.sliding_window", 0) if phi3 or gemma else 0
    big = (gemma3 and n_layer == 62) or (gemma2 and n_layer == 46)  # 27B's query_pre_attn_scalar
    scale = 1.0 / np.sqrt(n_embd // n_head if big else head_dim)
    if granite and m.get(a + "attention.scale", 0.0):
        scale = m[a + "attention.scale"]
    attn_cap = m.get(a + "attn_logit_softcapping", 50.0) if gemma2 else 0
    final_cap = m.get(a + "final_logit_softcapping", 30.0) if gemma2 else 0
    for l in range(n_layer):
        p = f"blk.{l}."
        local = window > 0 and not (gemma3 and (l + 1) % 6 == 0) and not (gemma2 and l % 2 == 1)
        mask = causal.copy()
        if local:  # row i sees keys i - window + 1 .. i (llama.cpp's sliding-window mask)
            mask += np.tril(np.full((n, n), -np.inf), k=-window)
        if gemma3 and local:
            layer_base, layer_scale, layer_factors = 10000.0, 1.0, None
        else:
            layer_base, layer_scale, layer_factors = base, freq_scale, factors
        h = rms_norm(x, g.tensor(p + "attn_norm.weight")[0], eps)
        if phi3:
            qkv = mm(h, p + "attn_qkv.weight")
            q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
            q, k, v = qkv[:, :q_dim], qkv[:, q_dim:q_dim + kv_dim], qkv[:, q_dim + kv_dim:]
        else:
            q, k, v = proj(h, p + "attn_q"), proj(h, p + "attn_k"), proj(h, p + "attn_v")
        if qwen3 or gemma3:  # each head RMS-normed before the rotation
            q = rms_norm(q.reshape(n, n_head, head_dim), g.tensor(p + "attn_q_norm.weight")[0], eps).reshape(n, -1)
            k = rms_norm(k.reshape(n, n_head_kv, head_dim), g.tensor(p + "attn_k_norm.weight")[0], eps).reshape(n, -1)
        q = rope(q, pos, n_head, head_dim, n_rot, layer_base, neox, layer_scale, layer_factors, magnitude)
        k = rope(k, pos, n_head_kv, head_dim, n_rot, layer_base, neox, layer_scale, layer_factors, magnitude)
        out = np.zeros((n, n_head * head_dim))
        for hd in range(n_head):
            kv = hd // (n_head // n_head_kv)
            qh = q[:, hd * head_dim:(hd + 1) * head_dim]
            kh = k[:, kv * head_dim:(kv + 1) * head_dim]
            vh = v[:, kv * head_dim:(kv + 1) * head_dim]
            s = qh @ kh.T * scale
            if attn_cap:
                s = attn_cap * np.tanh(s / attn_cap)
            s = s + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hd * head_dim:(hd + 1) * head_dim] = (s / s.sum(axis=1, keepdims=True)) @ vh
        o = mm(out, p + "attn_output.weight")
        if gemma:
            o = rms_norm(o, g.tensor(p + "post_attention_norm.weight")[0], eps)
        if residual:
            o = o * residual
        x = x + o
        h = rms_norm(x, g.tensor(p + "ffn_norm.weight")[0], eps)
        if phi3:
            gate_up = mm(h, p + "ffn_up.weight")
            gate, up = np.split(gate_up, 2, axis=1)
        else:
            gate = mm(h, p + "ffn_gate.weight")
            up = mm(h, p + "ffn_up.weight")
        if gemma:
            act = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate ** 3)))
        else:
            act = gate / (1.0 + np.exp(-gate))
        o = mm(act * up, p + "ffn_down.weight")
        if gemma:
            o = rms_norm(o, g.tensor(p + "post_ffw_norm.weight")[0], eps)
        if residual:
            o = o * residual
        x = x + o
    h = rms_norm(x, g.tensor("output_norm.weight")[0], eps)
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    logits = mm(h, head)
    if final_cap:
        logits = final_cap * np.tanh(logits / final_cap)
    if granite:
        logits = logits / m[a + "logit_scale"]
    return logits, ambiguous["count"]

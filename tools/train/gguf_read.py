"""Reads the GGUF files the demo pair is shipped as (metadata, F32 and Q8_0 tensors) into NumPy,
so that training can start from the bundled, quantized weights: what specula actually runs."""
import struct

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_F32, _Q8_0 = 0, 8
_Q8_0_BLOCK = np.dtype([("d", "<f2"), ("q", "i1", 32)])


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.at:self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, kind):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.take("<I"), self.take("<Q")
            return [self.value(item) for _ in range(n)]
        return self.take(_SCALARS[kind])


def read(path):
    """(metadata dict, {name: float32 array shaped [ne1, ne0] or [ne0]})"""
    data = open(path, "rb").read()
    r = _Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.at + align - 1) // align * align
    tensors = {}
    for name, dims, kind, offset in infos:
        count = int(np.prod(dims))
        if kind == _F32:
            a = np.frombuffer(data, np.float32, count, base + offset)
        elif kind == _Q8_0:
            b = np.frombuffer(data, _Q8_0_BLOCK, count // 32, base + offset)
            a = (b["d"].astype(np.float32)[:, None] * b["q"].astype(np.float32)).reshape(-1)
        else:
            raise ValueError(f"{path}: tensor {name} has type {kind}, which this reader does not know")
        tensors[name] = a.reshape(list(reversed(dims))).copy()
    return meta, tensors

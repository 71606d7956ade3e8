"""Byte-level BPE (GPT-2 style) for the demo models: the pre-tokenizer, a
trainer and an encoder. The pre-tokenizer and the merge rule are the ones
lib/tokenizer/tokenizer.cpp implements, so specula tokenizes exactly as the
models were trained (tests/data/specula-demo-vocab.* checks that)."""
import heapq
import unicodedata
from collections import Counter, defaultdict


def bytes_to_unicode():
    """GPT-2's map from bytes to printable code points."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE_TO_CHAR = bytes_to_unicode()
WHITESPACE = set([0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000] + list(range(0x09, 0x0E)) +
                 list(range(0x2000, 0x200B)))


def _class(ch):
    if ord(ch) in WHITESPACE:
        return "space"
    cat = unicodedata.category(ch)
    if cat.startswith("L"):
        return "letter"
    if cat.startswith("N"):
        return "number"
    return "other"


def pre_split(text):
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    words, n, pos = [], len(text), 0
    cls = [_class(c) for c in text]
    while pos < n:
        c = text[pos]
        if c == "'" and pos + 1 < n:
            c1 = text[pos + 1]
            if c1 in "stmd":
                words.append(text[pos:pos + 2])
                pos += 2
                continue
            if pos + 2 < n and text[pos + 1:pos + 3] in ("re", "ve", "ll"):
                words.append(text[pos:pos + 3])
                pos += 3
                continue
        probe = pos + 1 if c == " " else pos
        if probe < n and cls[probe] != "space":
            run = cls[probe]
            end = probe
            while end < n and cls[end] == run:
                end += 1
            words.append(text[pos:end])
            pos = end
            continue
        spaces = 0
        while pos + spaces < n and cls[pos + spaces] == "space":
            spaces += 1
        if spaces > 1 and pos + spaces < n:
            words.append(text[pos:pos + spaces - 1])
            pos += spaces - 1
            continue
        if spaces > 0:
            words.append(text[pos:pos + spaces])
            pos += spaces
            continue
        words.append(text[pos])
        pos += 1
    return words


def to_symbols(word):
    return [BYTE_TO_CHAR[b] for b in word.encode("utf-8")]


def train(texts, vocab_size):
    """Merges (list of (left, right)) learned from an iterable of texts."""
    counts = Counter()
    for t in texts:
        counts.update(pre_split(t))
    words = [to_symbols(w) for w in counts]
    freqs = list(counts.values())
    pairs = Counter()
    where = defaultdict(set)
    for i, (syms, f) in enumerate(zip(words, freqs)):
        for a, b in zip(syms, syms[1:]):
            pairs[(a, b)] += f
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < vocab_size - 256 - 1 and heap:
        c, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -c or -c < 2:
            continue
        merges.append(p)
        merged = p[0] + p[1]
        changed = Counter()
        for i in list(where[p]):
            syms, f = words[i], freqs[i]
            j, out = 0, []
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == p[0] and syms[j + 1] == p[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            for a, b in zip(syms, syms[1:]):
                changed[(a, b)] -= f
            for a, b in zip(out, out[1:]):
                changed[(a, b)] += f
                where[(a, b)].add(i)
            words[i] = out
        for q, d in changed.items():
            if d:
                pairs[q] += d
                heapq.heappush(heap, (-pairs[q], q))
    return merges


class Encoder:
    def __init__(self, merges):
        self.ranks = {p: i for i, p in enumerate(merges)}
        self.tokens = [BYTE_TO_CHAR[b] for b in range(256)] + [a + b for a, b in merges] + ["<|endoftext|>"]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.eos = len(self.tokens) - 1
        self.cache = {}

    def encode_word(self, word):
        if word in self.cache:
            return self.cache[word]
        syms = to_symbols(word)
        while len(syms) > 1:
            best = min(range(len(syms) - 1), key=lambda i: (self.ranks.get((syms[i], syms[i + 1]), 1 << 30), i))
            if (syms[best], syms[best + 1]) not in self.ranks:
                break
            syms = syms[:best] + [syms[best] + syms[best + 1]] + syms[best + 2:]
        ids = [self.ids[s] for s in syms]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        return [i for w in pre_split(text) for i in self.encode_word(w)]

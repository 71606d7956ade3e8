"""Speculative decoding from Python: a target, its draft, a streamed reply and its statistics.
Usage: python3 generate.py target.gguf draft.gguf"""
import sys

import specula

target_path, draft_path = sys.argv[1], sys.argv[2]
with specula.Model(target_path, backend="cpu") as target, \
        specula.Model(draft_path, backend=target.backend) as draft, \
        target.session(draft=draft, temperature=0.8, top_k=40, seed=1) as session:
    for piece in session.generate("The json module can be used to", max_tokens=48):
        print(piece, end="", flush=True)
    stats = session.stats
    print(f"\n{stats.n_generated} tokens, α {stats.acceptance_rate:.2f}, "
          f"{stats.tokens_per_step:.2f} tokens per target call")

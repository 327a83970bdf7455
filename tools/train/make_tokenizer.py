"""Train the byte-level BPE tokenizer on the training text:

  python3 tools/train/make_tokenizer.py --kjv kjv.txt.gz --out tokenizer.json

The text: every KJV verse, and haystack-like samples (shuffled words,
needles, questions and answers of every kind and value type) from --seed.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import haystack as hs  # noqa: E402
import tok  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kjv", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    t0 = time.time()
    corpus = hs.Corpus(hs.load_kjv(a.kjv))
    rng = np.random.default_rng([a.seed, 999])
    t = tok.train(hs.tokenizer_corpus(rng, corpus, a.samples), a.vocab, a.out)
    ex = "One of the special magic numbers for cedar is: 123456."
    print(f"tokenizer: {t.vocab_size} tokens in {time.time() - t0:.0f} s; {ex!r} -> {len(t.encode(ex))} tokens",
          flush=True)


if __name__ == "__main__":
    main()

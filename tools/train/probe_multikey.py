"""Which needle does a model answer when the asked key stands at each
position of a group of multikey needles?  Through sift's own forward pass
on the CPU (`sift generate`), no GPU needed:

  python3 tools/train/probe_multikey.py --sift build/tools/sift --kjv kjv.txt.gz \
      --model models/sift-needle-14m-f16.gguf [--keys 4] [--n 10] [--length 1000]

The prompts are the evaluations' multikey prompts (haystack.py's format:
RULER's preamble, haystack, `--keys` needles side by side at one depth,
the question) except that the asked key's needle stands at position p of
the group, for every p; depths spread evenly over [0, 1].  --layout
scatter plants the needles at random depths instead (position p: the p-th
needle of the text).  evaluate.py and
sift's harness used to ask the first key of the group, so they could not
tell a model that binds keys to values from one that answers the first
needle; both now ask a key drawn at random.
The lengths are counted with the word-level toy tokenizer (about --length
BPE tokens too, give or take 10%).  Prints, for each asked position, the
share of answers that are the asked value and how often each needle's
value was answered.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import haystack as hs  # noqa: E402
from toy_tok import ToyTok  # noqa: E402


def prompts(kjv, n_keys, n, length, seed, layout="group"):
    corpus = hs.Corpus(hs.load_kjv(kjv))
    tok = ToyTok.build(corpus.verses + [" " + w for w in corpus.words] +
                       [hs.preamble_text("number") + hs.question_text("multikey", ["x"], "number")])
    ts = hs.TokenSpace(corpus, tok)
    rng = np.random.default_rng([seed, n_keys, length])
    out = []
    for i in range(n):
        for pos in range(n_keys):
            # the probe places the asked needle itself: take the first, as when measured
            t = hs.make_task(rng, "multikey", "number", corpus, n_keys, multikey_ask="first")
            asked = t.needles[0]
            rest = t.needles[1:]
            needles = rest[:pos] + [asked] + rest[pos:]
            task = hs.Task("multikey", "number", needles, [asked[0]], [asked[1]])
            if layout == "group":
                depths = [(i + 0.5) / n] * n_keys
            else:  # scattered, in planting order
                depths = sorted(float(x) for x in rng.random(n_keys))
            s = hs.build(rng, ts, task, length, needle_depths=depths, with_answer=False)
            out.append({"pos": pos, "needles": needles, "text": s.text(corpus)})
    return out


def answer(sift, model, text, n_predict):
    r = subprocess.run([sift, "generate", "--model", model, "--n-predict", str(n_predict), "--prompt", text],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"sift generate failed ({r.returncode}): {r.stderr.strip()[:300]}")
    if not r.stdout.startswith(text):
        raise RuntimeError("sift generate did not echo the prompt before the generated text")
    return r.stdout[len(text):].split("\n")[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sift", required=True, help="the sift program (build/tools/sift)")
    p.add_argument("--model", required=True, action="append", help="GGUF model (repeatable)")
    p.add_argument("--kjv", required=True)
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--n", type=int, default=10, help="prompts per asked position")
    p.add_argument("--length", type=int, default=1000)
    p.add_argument("--seed", type=int, default=20261)
    p.add_argument("--layout", default="group", choices=["group", "scatter"],
                   help="needles side by side at one depth (as the evaluations plant them) or each at "
                        "its own random depth, in order")
    p.add_argument("--json", help="write the answers here")
    a = p.parse_args()
    if a.keys < 2:
        p.error("--keys must be at least 2")
    ps = prompts(a.kjv, a.keys, a.n, a.length, a.seed, a.layout)
    record = {}
    for model in a.model:
        rows = {pos: np.zeros(a.keys + 1, dtype=int) for pos in range(a.keys)}
        answers = []
        for s in ps:
            gen = answer(a.sift, model, s["text"], 8)
            vals = [v for _, v in s["needles"]]
            hit = next((i for i, v in enumerate(vals) if v in gen), a.keys)
            rows[s["pos"]][hit] += 1
            answers.append({"pos": s["pos"], "values": vals, "generated": gen})
        record[model] = answers
        where = "side by side" if a.layout == "group" else "scattered"
        print(f"{model}: {a.keys} needles {where}, {a.n} prompts of ~{a.length} tokens per asked position")
        print("| asked position | correct | " + " | ".join(f"answered #{i}" for i in range(a.keys)) + " | other |")
        print("|---" * (a.keys + 3) + "|")
        for pos in range(a.keys):
            r = rows[pos]
            print(f"| {pos} | {100 * r[pos] / a.n:.0f}% | " + " | ".join(str(x) for x in r) + " |")
        total = sum(rows[pos][pos] for pos in range(a.keys))
        print(f"all positions: {100 * total / (a.n * a.keys):.0f}% correct\n", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

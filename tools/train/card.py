"""Material for the model card and the CPU-side checks, from what the GPU
runs returned:

  python3 tools/train/card.py --meta meta.json --eval eval.json --ref ref.json --out models/

writes OUT/loss.png (needs matplotlib), OUT/eval-pytorch.json, the
accuracy table in Markdown on stdout, and OUT/ref/ (reference logits and
tokenizer cases as plain text files, described in OUT/ref/README.md).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

KIND_LABEL = {("single", "number"): "single (number)", ("single", "word"): "single (word)",
              ("single", "uuid"): "single (uuid)", ("multikey", "number"): "multikey (4 keys)",
              ("multivalue", "number"): "multivalue (4)", ("multiquery", "number"): "multiquery (4)"}


def plot(meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    h = np.asarray(meta["history"], dtype=np.float64)
    step, lm, ans = h[:, 0], h[:, 2], h[:, 3]

    def smooth(y, k=20):
        k = min(k, len(y))
        return np.convolve(y, np.ones(k) / k, mode="valid"), step[k - 1:]

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    y, x = smooth(lm)
    ax.plot(x, y, label="mean LM loss (all tokens)")
    y, x = smooth(ans)
    ax.plot(x, y, label="mean loss on answer tokens")
    sched = meta["segments"][-1]["args"]["schedule"]
    for part in sched.split(",")[1:]:
        s, n = part.split(":")
        ax.axvline(int(s), color="grey", lw=0.6, ls=":")
        ax.text(int(s), ax.get_ylim()[1] * 0.97, f" {int(n) // 1024}K", fontsize=7, va="top")
    for seg in meta["segments"][1:]:
        ax.axvline(seg["from"], color="red", lw=0.6, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("step (65,536 tokens each); dotted: curriculum maximum length; dashed: resume")
    ax.set_ylabel("cross-entropy (nats), 200-step mean")
    ax.set_title(f"sift-needle-14m: training loss ({meta['train_seconds'] / 60:.1f} min on "
                 f"{meta['segments'][0]['device']})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def table(ev):
    lengths = sorted({c["length"] for c in ev["cells"]})
    keys = list(dict.fromkeys((c["kind"], c["value"]) for c in ev["cells"]))
    by = {(c["length"], c["kind"], c["value"]): c for c in ev["cells"]}
    head = "| needle kind | " + " | ".join(f"{n // 1024}K" for n in lengths) + " |"
    lines = [head, "|---" * (len(lengths) + 1) + "|"]
    for k in keys:
        row = [KIND_LABEL.get(k, "/".join(k))]
        for n in lengths:
            c = by[(n, *k)]
            row.append(f"{100 * c['string_match_all']:.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_ref(ref, out):
    out.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(ref["prompts"]):
        (out / f"prompt{i}.txt").write_text(p["text"], encoding="utf-8")
        (out / f"prompt{i}.ids").write_text(" ".join(map(str, p["ids"])) + "\n")
        (out / f"prompt{i}.argmax").write_text(" ".join(map(str, p["argmax"])) + "\n")
        (out / f"prompt{i}.greedy").write_text(" ".join(map(str, p["greedy"])) + "\n")
        (out / f"prompt{i}.logits").write_text("\n".join(repr(v) for v in p["last_logits"]) + "\n")
    with open(out / "tokenizer-cases.json", "w", encoding="utf-8") as f:
        json.dump(ref["tokenizer_cases"], f, ensure_ascii=False, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--meta", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--ref")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = Path(a.out)
    meta = json.load(open(a.meta))
    ev = json.load(open(a.eval))
    plot(meta, out / "loss.png")
    shutil.copyfile(a.eval, out / "eval-pytorch.json")
    if a.ref:
        write_ref(json.load(open(a.ref)), out / "ref")
    print(table(ev))
    return 0


if __name__ == "__main__":
    sys.exit(main())

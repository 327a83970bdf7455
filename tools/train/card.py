"""Material for the model card and the CPU-side checks, from what the GPU
runs returned:

  python3 tools/train/card.py --meta meta.json --eval eval.json --ref ref.json --out models/ \
      [--prev-meta EARLIER.json] [--add KEY=FILE.json ...]

writes OUT/loss.png (needs matplotlib), OUT/eval-pytorch.json, the
accuracy table in Markdown on stdout, and OUT/ref/ (reference logits and
tokenizer cases as plain text files, described in OUT/ref/README.md).

A model fine-tuned from an earlier one (stage 3 from v2): --prev-meta is
the earlier stage's meta.json (or an eval-pytorch.json holding it under
"training"); the loss curve then shows both stages end to end, the later
one's steps counted on from the earlier one's last.  --add KEY=FILE puts
FILE's JSON into eval-pytorch.json under KEY (the training record, a side
by side evaluation).
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


def plot(meta, path, prev=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    h = np.asarray(meta["history"], dtype=np.float64)
    offset = 0
    if prev:
        offset = prev["step"]
        h = h.copy()
        h[:, 0] += offset
        h = np.concatenate([np.asarray(prev["history"], dtype=np.float64), h])
    step, lm, ans = h[:, 0], h[:, 2], h[:, 3]

    def smooth(y, k=20):
        k = min(k, len(y))
        return np.convolve(y, np.ones(k) / k, mode="valid"), step[k - 1:]

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    y, x = smooth(lm)
    ax.plot(x, y, label="mean LM loss (all tokens)")
    y, x = smooth(ans)
    ax.plot(x, y, label="mean loss on answer tokens")
    stages = [(prev, 0), (meta, offset)] if prev else [(meta, 0)]
    for m, off in stages:
        sched = m["segments"][-1]["args"]["schedule"]
        for part in sched.split(",")[1:]:
            s, n = part.split(":")
            ax.axvline(off + int(s), color="grey", lw=0.6, ls=":")
            ax.text(off + int(s), ax.get_ylim()[1] * 0.97, f" {int(n) // 1024}K", fontsize=7, va="top")
        for seg in m["segments"][1:]:
            ax.axvline(off + seg["from"], color="red", lw=0.6, ls="--")
    ax.set_yscale("log")
    what = "dotted: curriculum maximum length; dashed: resume"
    if prev:
        ax.axvline(offset, color="black", lw=0.8, ls="-.")
        ax.text(offset, ax.get_ylim()[0] * 1.05, f" {meta.get('mix', '')} fine-tune", fontsize=7)
        what += "; dash-dot: fine-tune starts"
    ax.set_xlabel(f"step (65,536 tokens each); {what}", fontsize=8)
    ax.set_ylabel("cross-entropy (nats), 200-step mean")
    minutes = sum(m["train_seconds"] for m, _ in stages) / 60
    devices = " + ".join(dict.fromkeys(m["segments"][0]["device"] for m, _ in stages))
    ax.set_title(f"sift-needle-14m: training loss ({minutes:.1f} min on {devices})", fontsize=10)
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
    p.add_argument("--prev-meta", help="the earlier stage's meta.json (or an eval-pytorch.json with it)")
    p.add_argument("--add", action="append", default=[], metavar="KEY=FILE",
                   help="put FILE's JSON into eval-pytorch.json under KEY")
    a = p.parse_args()
    out = Path(a.out)
    meta = json.load(open(a.meta))
    ev = json.load(open(a.eval))
    prev = None
    if a.prev_meta:
        prev = json.load(open(a.prev_meta))
        prev = prev.get("training", prev)
        if "history" not in prev:
            p.error(f"--prev-meta {a.prev_meta}: no training history in it")
    plot(meta, out / "loss.png", prev)
    if a.add:
        for kv in a.add:
            key, sep, fn = kv.partition("=")
            if not sep or not key:
                p.error(f"--add {kv!r}: expected KEY=FILE")
            ev[key] = json.load(open(fn))
        with open(out / "eval-pytorch.json", "w") as f:
            json.dump(ev, f, indent=1)
    else:
        shutil.copyfile(a.eval, out / "eval-pytorch.json")
    if a.ref:
        write_ref(json.load(open(a.ref)), out / "ref")
    print(table(ev))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Export a checkpoint to GGUF, and check the file against transformers:

  python3 tools/train/export.py --ckpt DIR --tokenizer tokenizer.json --out model.gguf \
      [--type f16|q8_0] [--check ref.json]

Matrices F16 (the checkpoint's bfloat16 values, which F16 holds exactly
unless tiny) or Q8_0; norms F32; the tied embedding stored once.  --check
runs the numpy GGUF-layout forward pass (gguf.forward) on the prompts of
ref.json (written by evaluate.py from transformers on the GPU) and compares
the logits; it exits 1 when the largest error exceeds --tol of the logits'
range.  Needs numpy and torch (to read the checkpoint), not transformers.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from tok import gguf_vocab  # noqa: E402


def load_state(ckpt):
    import train
    meta, w, _ = train.load_checkpoint(ckpt)
    return meta, {k: v.float().numpy() for k, v in w.items()}


def check(path, ref_path, tol):
    r = gguf.Reader(path)
    ref = json.load(open(ref_path))
    worst = 0.0
    for i, p in enumerate(ref["prompts"]):
        logits = gguf.forward(r, p["ids"])
        last = np.asarray(p["last_logits"])
        err = np.abs(logits[-1] - last).max() / (last.max() - last.min())
        agree = float(np.mean(logits.argmax(-1) == np.asarray(p["argmax"])))
        print(f"prompt {i}: {len(p['ids'])} tokens, last-position max error {err:.2e} of the logit range, "
              f"argmax agreement {agree:.3f}", flush=True)
        worst = max(worst, err)
    return worst <= tol


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--type", default="f16", choices=["f16", "q8_0"])
    p.add_argument("--name", default="sift-needle-14m")
    p.add_argument("--check", help="ref.json from evaluate.py")
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    meta, state = load_state(a.ckpt)
    cfg = meta["config"]
    mt = gguf.GGML_F16 if a.type == "f16" else gguf.GGML_Q8_0
    if mt == gguf.GGML_F16:
        n = sum(int((v.astype(np.float16).astype(np.float32) != v).sum()) for v in state.values() if v.ndim == 2)
        total = sum(v.size for v in state.values() if v.ndim == 2)
        print(f"{n} of {total} matrix values round in F16 (below its normal range); "
              "evaluate.py measured the same rounded values", flush=True)
    gguf.export_llama(a.out, state, cfg, gguf_vocab(a.tokenizer), a.name, matrix_type=mt)
    print(f"wrote {a.out}: {Path(a.out).stat().st_size} bytes, step {meta['step']}", flush=True)
    if a.check and not check(a.out, a.check, a.tol):
        print("FAIL: the GGUF forward pass differs from transformers' logits", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

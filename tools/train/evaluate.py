"""Measure a checkpoint in PyTorch (on the GPU) and record reference logits:

  python3 tools/train/evaluate.py --ckpt DIR --kjv kjv.txt.gz --tokenizer tokenizer.json \
      --eval-out eval.json --ref-out ref.json

The weights are first rounded as the shipped F16 GGUF stores them (the
checkpoint's bfloat16 matrices to float16, norms kept), so both the
accuracy and the reference logits are those of the shipped file.

eval.json: for each context length and needle kind, --n samples at depths
spread evenly over [0, 1], greedy generation (bf16 autocast) until EOS,
scored as RULER (string_match_all: the fraction of expected values in the
output) and exactly.  Multikey asks a key of the group drawn at random
(--multikey-ask first: always the first, as sift-needle-14m v1 was
measured).  --gguf FILE measures a GGUF (import_gguf.py) instead of a
checkpoint, e.g. the shipped model against a new one; --kinds limits the
needle kinds.

ref.json: in float32 (TF32 off), for a few fixed prompts: the text, its
token ids (BOS + the tokenizer's ids of the text), the argmax at every
position, the full logits of the last position, and 8 greedily generated
tokens; plus tokenizer cases (text -> ids) for checking a tokenizer.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import haystack as hs  # noqa: E402
import model as mdl  # noqa: E402
import train  # noqa: E402

CELLS = [("single", "number"), ("single", "word"), ("single", "uuid"),
         ("multikey", "number"), ("multivalue", "number"), ("multiquery", "number")]

TOKENIZER_CASES = [
    "Hello world", "hello  world", " leading space", "trailing space ", "tabs\tand\nnewlines\n\n",
    "In the beginning God created the heaven and the earth.",
    "The LORD'S house; it's what we've done, they'll see, I'm here, he'd go.",
    "Numbers: 0 7 42 123456 9876543210 3.14159",
    "uuid 3f9a1c2e-7b4d-a0c9 and HEX 0xDEADBEEF",
    "Punctuation!!! (parens) [brackets] {braces} \"quotes\" -- dashes...",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600",
    "One of the special magic numbers for cedar is: 482913.",
    "   spaces   between   words   ",
    "\n\nQuestion: What is the special magic number for cedar mentioned in the text?",
]


def shipped_weights(model, w):
    """Load checkpoint weights rounded as the F16 GGUF holds them."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            t = w[n].to(torch.bfloat16)
            t = t.float() if p.dim() == 1 else t.half().float()
            p.copy_(t)


@torch.no_grad()
def greedy(model, ids, max_new, eos):
    """ids [B, T] -> generated ids [B, <= max_new] (stops when all hit EOS)."""
    if hasattr(model, "config"):
        try:
            return _greedy_cached(model, ids, max_new, eos)
        except Exception as e:  # a transformers API change: recompute without the cache
            print(f"greedy: cached generation failed ({type(e).__name__}: {e}); recomputing", flush=True)
    # MiniLlama (CPU tests) has no cache: recompute the whole sequence
    gen = []
    for _ in range(max_new):
        nxt = model(input_ids=ids).logits[:, -1].argmax(-1)
        gen.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
    return torch.stack(gen, 1)


def _greedy_cached(model, ids, max_new, eos):
    try:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    except TypeError:
        out = model(input_ids=ids, use_cache=True)
    pkv = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1)
    gen = [nxt]
    done = nxt == eos
    for _ in range(max_new - 1):
        if bool(done.all()):
            break
        out = model(input_ids=nxt[:, None], past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1)
        gen.append(nxt)
        done |= nxt == eos
    return torch.stack(gen, 1)


def cut_eos(ids, eos):
    ids = list(ids)
    return ids[:ids.index(eos)] if eos in ids else ids


def run_eval(model, ts, tok, lengths, n, seed, dev, log, multikey_ask="random", kinds=None):
    results = []
    for length in lengths:
        for kind, vtype in CELLS:
            if kinds and kind not in kinds:
                continue
            t0 = time.time()
            rng = np.random.default_rng([seed, length, hs.KINDS.index(kind), hs.VALUE_TYPES.index(vtype)])
            samples = []
            for i in range(n):
                task = hs.make_task(rng, kind, vtype, ts.corpus, multikey_ask=multikey_ask)
                samples.append(hs.build(rng, ts, task, length, depth=(i + 0.5) / n, with_answer=False))
            canon = sum(hs.check_canonical(s, ts) for s in samples[:2])
            ids = torch.from_numpy(np.stack([s.ids for s in samples])).to(dev)
            max_new = max(len(tok.encode(hs.answer_text(s.task.answers))) for s in samples) + 4
            gen = []
            bs = max(1, min(n, (1 << 19) // length))
            for b in range(0, n, bs):
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                    gen += greedy(model, ids[b:b + bs], max_new, tok.eos_id).cpu().tolist()
            scores, texts = [], []
            for s, g in zip(samples, gen):
                text = tok.decode(cut_eos(g, tok.eos_id))
                texts.append(text)
                scores.append(hs.score(text, s.task.answers))
            acc = float(np.mean([x[0] for x in scores]))
            allf = float(np.mean([x[0] == 1.0 for x in scores]))
            exact = float(np.mean([x[1] for x in scores]))
            by_depth = [round(x[0], 3) for x in scores]
            results.append({"length": length, "kind": kind, "value": vtype, "n": n,
                            "multikey_ask": multikey_ask if kind == "multikey" else None,
                            "string_match_all": round(acc, 4), "all_found": round(allf, 4),
                            "exact": round(exact, 4), "by_depth": by_depth,
                            "canonical_tokenization": f"{canon}/2",
                            "examples": [{"expected": hs.answer_text(s.task.answers), "generated": t}
                                         for s, t in list(zip(samples, texts))[:2]]})
            log(f"eval {length:6d} {kind:10s} {vtype:6s} match {acc:.2f} all {allf:.2f} exact {exact:.2f} "
                f"canon {canon}/2 ({time.time() - t0:.1f} s)")
    return results


@torch.no_grad()
def reference(model, ts, tok, dev, seed):
    rng = np.random.default_rng([seed, 77])
    prompts = ["In the beginning God created the heaven and the earth. And the earth was without form, "
               "and void; and darkness was upon the face of the deep."]
    for kind, vtype, length in (("single", "number", 128), ("multikey", "word", 300)):
        task = hs.make_task(rng, kind, vtype, ts.corpus)
        prompts.append(hs.build(rng, ts, task, length, depth=0.4, with_answer=False).text(ts.corpus))
    out = []
    for text in prompts:
        ids = [tok.bos_id] + tok.encode(text)
        x = torch.tensor([ids], device=dev)
        logits = model(input_ids=x).logits[0].float()
        gen = greedy(model, x, 8, tok.eos_id)[0].tolist()
        out.append({"text": text, "ids": ids, "argmax": logits.argmax(-1).tolist(),
                    "last_logits": [float(f"{v:.7g}") for v in logits[-1].tolist()],
                    "greedy": gen, "greedy_text": tok.decode(cut_eos(gen, tok.eos_id))})
    cases = [{"text": t, "ids": tok.encode(t), "decoded": tok.decode(tok.encode(t))} for t in TOKENIZER_CASES]
    return {"prompts": out, "tokenizer_cases": cases}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="checkpoint folder (train.py --out)")
    src.add_argument("--gguf", help="a llama GGUF (export.py's), read by import_gguf.py")
    p.add_argument("--kjv", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--eval-out")
    p.add_argument("--ref-out")
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--seed", type=int, default=20260)
    p.add_argument("--multikey-ask", default="random", choices=hs.MULTIKEY_ASK)
    p.add_argument("--kinds", help="comma-separated needle kinds to measure (default: all)")
    p.add_argument("--mini", action="store_true", help="CPU test mode (toy tokenizer, MiniLlama)")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = train.load_tokenizer(a)
    kinds = a.kinds.split(",") if a.kinds else None
    for k in kinds or []:
        if k not in hs.KINDS:
            p.error(f"--kinds: unknown needle kind {k!r}; expected some of {hs.KINDS}")
    if a.gguf:
        import import_gguf
        cfg, state = import_gguf.import_llama(a.gguf)
        meta = {"step": None, "config": cfg}
        model = mdl.build(cfg, use_hf=not a.mini)
        import_gguf.load_into(model, state)  # the file's values, as sift reads them
        model = model.to(dev)
    else:
        meta, w, _ = train.load_checkpoint(a.ckpt)
        model = mdl.build(meta["config"], use_hf=not a.mini).to(dev)
        shipped_weights(model, w)
    model.eval()
    ts = hs.TokenSpace(hs.Corpus(hs.load_kjv(a.kjv)), tok)
    res = {"step": meta["step"], "config": meta["config"], "source": a.gguf or a.ckpt,
           "multikey_ask": a.multikey_ask,
           "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}

    def log(s):
        print(s, flush=True)

    if a.ref_out:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        ref = reference(model, ts, tok, dev, a.seed)
        ref.update(res, dtype="float32, weights as in the F16 GGUF")
        with open(a.ref_out, "w") as f:
            json.dump(ref, f)
        for pr in ref["prompts"]:
            log(f"ref: {len(pr['ids'])} tokens -> greedy {pr['greedy_text']!r}")
    if a.eval_out:
        t0 = time.time()
        lengths = [int(x) for x in a.lengths.split(",")]
        res["cells"] = run_eval(model, ts, tok, lengths, a.n, a.seed, dev, log, a.multikey_ask, kinds)
        res["eval_seconds"] = round(time.time() - t0, 1)
        with open(a.eval_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

"""Train sift's retrieval model: a small LlamaForCausalLM on haystacks with
needles, with a length curriculum, resumable from a checkpoint.

  python3 tools/train/train.py --kjv kjv.txt.gz --out DIR [--resume DIR] ...

Each step takes --tokens-per-step tokens (65536) as batch x length.  The
length of a step: with probability 1/2 the curriculum's current maximum
(--schedule "step:len,..."), else a smaller power of two from 512.  The
loss is the mean LM loss over all tokens plus the mean loss over the
answer tokens.  The learning rate warms up, stays flat, and decays linearly
to a tenth over the last --decay-steps steps before --steps (a
warmup-stable-decay schedule, so a run can be split at any step).

A step's data depends only on (--seed, --mix, step), so a resumed run sees
the same data as an unbroken one.

Stage 2 (--init-gguf FILE --mix multikey) starts from the weights of a
GGUF (the exported stage-1 model, read by import_gguf.py) at step 0 with a
fresh optimizer, on haystack.py's stage-2 mix (multikey binding); its data
comes from other random streams than stage 1's at the same steps.  Stage 3
(--init-gguf v2.gguf --mix stage3) does the same from v2 on stage 3's mix,
usually with --min-len 1024 --top-share 0.2 (every length 1K-16K as
likely).

The checkpoint (written to --out every --ckpt-every seconds and at the
end) holds the weights in bfloat16, Adam's second moment in bfloat16, and
meta.json (step, configuration, data mix, the GGUF it started from, loss
history); Adam's first moment is not kept (it rebuilds within ~10 steps of
a resume, beta1 = 0.9).  Files stay under 16 MiB each.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import haystack as hs  # noqa: E402
import model as mdl  # noqa: E402

SHARD_BYTES = 15 * 2**20


def parse_schedule(s):
    pts = []
    for part in s.split(","):
        a, b = part.split(":")
        pts.append((int(a), int(b)))
    pts.sort()
    if pts[0][0] != 0:
        raise ValueError(f"--schedule must start at step 0: {s}")
    return pts


def max_len_at(schedule, step):
    cur = schedule[0][1]
    for s, n in schedule:
        if step >= s:
            cur = n
    return cur


def step_rng(seed, step, salt=0):
    return np.random.default_rng([seed, step, salt])


MIX_SALT = {"base": 0, "multikey": 10, "stage3": 20}  # each fine-tune's data from its own streams


def step_length(seed, schedule, step, min_len=512, mix="base", top_share=0.5):
    """The curriculum's current maximum with probability top_share, else a
    power of two from min_len below it, each as likely."""
    rng = step_rng(seed, step, MIX_SALT[mix] + 1)
    top = max_len_at(schedule, step)
    if top <= min_len or rng.random() < top_share:
        return top
    choices = []
    n = min_len
    while n < top:
        choices.append(n)
        n *= 2
    return choices[int(rng.integers(len(choices)))]


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    start = a.steps - a.decay_steps
    if step < start:
        return a.lr
    frac = min(1.0, (step - start) / max(1, a.decay_steps))
    return a.lr * (1.0 - 0.9 * frac)


class Batches(torch.utils.data.IterableDataset):
    """Steps start..end-1; worker w of W makes the steps congruent to w, and
    the DataLoader's round robin returns them in step order."""

    def __init__(self, a, start, end):
        self.a, self.start, self.end = a, start, end
        self.ts = None

    def _space(self):
        if self.ts is None:
            corpus = hs.Corpus(hs.load_kjv(self.a.kjv))
            self.ts = hs.TokenSpace(corpus, load_tokenizer(self.a))
        return self.ts

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        ts = self._space()
        sched = parse_schedule(self.a.schedule)
        for step in range(self.start + w, self.end, nw):
            length = step_length(self.a.seed, sched, step, self.a.min_len, self.a.mix, self.a.top_share)
            batch = max(1, self.a.tokens_per_step // length)
            rng = step_rng(self.a.seed, step, MIX_SALT[self.a.mix] + 2)
            ids, mask = hs.mix_batch(self.a.mix, rng, ts, length, batch, self.a.multikey_ask)
            yield step, torch.from_numpy(ids), torch.from_numpy(mask)


def load_tokenizer(a):
    if a.mini:
        from toy_tok import ToyTok
        return ToyTok.load(a.tokenizer)
    from tok import Tok
    return Tok.load(a.tokenizer)


def save_checkpoint(out, model, opt, meta):
    """Weights and Adam's second moment in bf16 shards of < 16 MiB, then
    meta.json last (a checkpoint is complete when meta.json names it)."""
    out = Path(out)
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    files = {}
    for kind in ("w", "v"):
        shards, cur, size = [], {}, 0
        for n in names:
            p = params[n]
            if kind == "w":
                t = p.detach()
            else:
                st = opt.state.get(p, {})
                if "exp_avg_sq" not in st:
                    continue
                t = st["exp_avg_sq"]
            t = t.to(torch.bfloat16).cpu().contiguous()
            nb = t.numel() * 2
            if cur and size + nb > SHARD_BYTES:
                shards.append(cur)
                cur, size = {}, 0
            cur[n] = t
            size += nb
        if cur:
            shards.append(cur)
        files[kind] = []
        for i, sh in enumerate(shards):
            fn = f"ckpt_{kind}{i}.pt"
            torch.save(sh, out / (fn + ".tmp"))
            os.replace(out / (fn + ".tmp"), out / fn)
            files[kind].append(fn)
    meta = dict(meta, files=files)
    with open(out / "meta.json.tmp", "w") as f:
        json.dump(meta, f)
    os.replace(out / "meta.json.tmp", out / "meta.json")


def load_checkpoint(d):
    d = Path(d)
    with open(d / "meta.json") as f:
        meta = json.load(f)
    w, v = {}, {}
    for fn in meta["files"]["w"]:
        w.update(torch.load(d / fn))
    for fn in meta["files"].get("v", []):
        if (d / fn).exists():
            v.update(torch.load(d / fn))
    return meta, w, v


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kjv", required=True, help="KJV verses from tools/train/kjv.sh (.txt or .txt.gz)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json (from tools/train/make_tokenizer.py)")
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--resume", help="checkpoint folder to resume from")
    p.add_argument("--init-gguf", help="start at step 0 from this GGUF's weights (stage 2)")
    p.add_argument("--mix", default="base", choices=sorted(MIX_SALT),
                   help="data mix: base (stage 1), multikey (stage 2) or stage3 (haystack.py)")
    p.add_argument("--multikey-ask", default="random", choices=hs.MULTIKEY_ASK,
                   help="which key of a multikey group stage 1 asks: random (default) or first "
                        "(sift-needle-14m v1's data, kept to reproduce it)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--size", default="base", choices=sorted(mdl.CONFIGS))
    p.add_argument("--rope-theta", type=float, default=5e5)
    p.add_argument("--steps", type=int, default=12000, help="the schedule's last step")
    p.add_argument("--stop-step", type=int, help="stop before this step (default --steps)")
    p.add_argument("--time-budget", type=float, default=0,
                   help="stop after this many seconds from the start, with a checkpoint (0: none)")
    p.add_argument("--fit-budget", action="store_true",
                   help="with --time-budget: once the curriculum has reached its longest length, "
                        "if the steps left would overrun the budget, move --steps (and so the "
                        "decay) earlier so that the run still ends decayed")
    p.add_argument("--fit-steps", type=int, default=200,
                   help="--fit-budget times this many steps at the longest length")
    p.add_argument("--tokens-per-step", type=int, default=65536)
    p.add_argument("--schedule", default="0:512,600:1024,1500:2048,3000:4096,5000:8192,8000:16384")
    p.add_argument("--min-len", type=int, default=512,
                   help="the shortest length a step draws below the curriculum's maximum")
    p.add_argument("--top-share", type=float, default=0.5,
                   help="the share of steps at the curriculum's maximum length (the others draw a "
                        "power of two from --min-len below it, each as likely)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--decay-steps", type=int, default=2000)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=float, default=90, help="seconds between checkpoints")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--mini", action="store_true",
                   help="CPU test mode: MiniLlama instead of transformers, toy tokenizer")
    a = p.parse_args(argv)
    if a.resume and a.init_gguf:
        p.error("--resume and --init-gguf exclude each other (a resumed run keeps its own start)")
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)

    tok = load_tokenizer(a)
    sched = parse_schedule(a.schedule)
    max_len = max(n for _, n in sched)
    cfg = mdl.config_dict(a.size, tok.vocab_size, max_len, a.rope_theta)
    model = mdl.build(cfg, use_hf=not a.mini).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {a.size} {n_params / 1e6:.2f}M parameters, vocab {tok.vocab_size}, device {dev}", flush=True)

    decay, no_decay = [], []
    for n, prm in model.named_parameters():
        (decay if prm.dim() == 2 else no_decay).append(prm)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    start, history, used, segments = 0, [], 0.0, []
    replan = None
    init = None
    if a.init_gguf:
        import import_gguf
        gcfg, state = import_gguf.import_llama(a.init_gguf)
        bad = import_gguf.config_mismatch(gcfg, cfg)
        if bad:
            raise ValueError(f"{a.init_gguf}: its model differs from --size {a.size} ({bad})")
        import_gguf.load_into(model, state)
        init = {"gguf": os.path.basename(a.init_gguf), "sha256": file_sha256(a.init_gguf)}
        print(f"initialised from {a.init_gguf} (sha256 {init['sha256'][:16]})", flush=True)
    if a.resume:
        meta, w, v = load_checkpoint(a.resume)
        if meta["config"] != cfg:
            raise ValueError(f"{a.resume}: checkpoint config {meta['config']} differs from {cfg}")
        if meta.get("mix", "base") != a.mix:
            raise ValueError(f"{a.resume}: checkpoint trained on mix {meta.get('mix', 'base')!r}, not --mix {a.mix}")
        # checkpoints from before the option asked the first key
        if meta.get("multikey_ask", "first") != a.multikey_ask:
            raise ValueError(f"{a.resume}: checkpoint's multikey questions asked the "
                             f"{meta.get('multikey_ask', 'first')} key, not --multikey-ask {a.multikey_ask}")
        replan = meta.get("replan")
        if replan:  # the resumed run keeps the schedule its budget moved
            a.steps, a.decay_steps = replan["steps"], replan["decay_steps"]
        missing = set(dict(model.named_parameters())) - set(w)
        if missing:
            raise ValueError(f"{a.resume}: checkpoint lacks {sorted(missing)[:3]}")
        with torch.no_grad():
            for n, prm in model.named_parameters():
                prm.copy_(w[n].float())
        start = meta["step"]
        history = meta["history"]
        used = meta.get("train_seconds", 0.0)
        segments = meta.get("segments", [])
        init = meta.get("init")
        for n, prm in model.named_parameters():
            if n in v:
                opt.state[prm] = {"step": torch.tensor(float(start)),
                                  "exp_avg": torch.zeros_like(prm),
                                  "exp_avg_sq": v[n].float().to(dev)}
        print(f"resumed at step {start} ({used:.0f} s trained before; Adam first moment reset)", flush=True)

    stop = min(a.stop_step or a.steps, a.steps)
    extra = {"prefetch_factor": 4} if a.workers else {}
    loader = torch.utils.data.DataLoader(Batches(a, start, stop), batch_size=None,
                                         num_workers=a.workers, **extra)
    use_amp = dev.type == "cuda"
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    segment = {"from": start, "args": dict(vars(a)),
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}

    def meta_now(step, seconds):
        seg = dict(segment, to=step)
        return {"step": step, "config": cfg, "seed": a.seed, "size": a.size, "mix": a.mix,
                "multikey_ask": a.multikey_ask, "init": init, "replan": replan,
                "segments": segments + [seg], "history": history, "train_seconds": seconds,
                "params": n_params}

    # --fit-budget: time --fit-steps steps once the curriculum is at its
    # longest length (the run's steady pace)
    fit = None
    if a.fit_budget and a.time_budget and replan is None and stop == a.steps:
        top = sched[-1][0]
        p0 = max(start, top) + 10 - (max(start, top) % 10)
        fit = {"p0": p0, "p1": p0 + a.fit_steps, "t0": None}

    model.train()
    t0 = time.time()
    last_ckpt = t0
    step = start
    acc = []
    for step, ids, mask in loader:
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        ids = ids.to(dev, non_blocking=True)
        mask = mask.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = model(input_ids=ids[:, :-1]).logits
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                             ids[:, 1:].reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1)
        lm = ce.mean()
        ans = (ce * m).sum() / m.sum().clamp(min=1)
        loss = lm + ans
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc.append((lm.detach(), ans.detach()))
        if (step + 1) % 10 == 0 or step + 1 == stop:
            vals = torch.stack([torch.stack(x) for x in acc]).float().mean(0).tolist()
            acc = []
            history.append([step + 1, ids.shape[1], round(vals[0], 4), round(vals[1], 4)])
        now = time.time()
        if fit and step + 1 in (fit["p0"], fit["p1"]):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            now = time.time()
            if step + 1 == fit["p0"]:
                fit["t0"] = now
            elif fit["t0"] is not None:
                pace = (now - fit["t0"]) / (fit["p1"] - fit["p0"])
                margin = min(10.0, 0.05 * a.time_budget)  # the last checkpoint
                left = a.time_budget - (now - t_start) - margin
                need = (stop - step - 1) * pace
                print(f"fit-budget: {pace * 1e3:.1f} ms a step; {stop - step - 1} steps left need "
                      f"{need:.0f} s, {left:.0f} s left", flush=True)
                if need > left:
                    new_end = step + 1 + max(0, int(left / pace))
                    new_decay = min(a.decay_steps, new_end - step - 1)
                    replan = {"at": step + 1, "sec_per_step": round(pace, 5), "steps": new_end,
                              "decay_steps": new_decay, "was": [a.steps, a.decay_steps]}
                    a.steps, a.decay_steps, stop = new_end, new_decay, new_end
                    print(f"fit-budget: the run now ends at step {new_end}, decaying over the last "
                          f"{new_decay} steps", flush=True)
                fit = None
        if (step + 1) % a.log_every == 0 and history:
            h = history[-1]
            print(f"step {step + 1} len {ids.shape[1]} x{ids.shape[0]} lm {h[2]:.3f} ans {h[3]:.3f} "
                  f"lr {lr:.2e} {now - t0:.0f}s", flush=True)
        done = step + 1 >= stop or (a.time_budget and now - t_start > a.time_budget)
        if done or now - last_ckpt > a.ckpt_every:
            save_checkpoint(a.out, model, opt, meta_now(step + 1, used + now - t0))
            last_ckpt = time.time()
            print(f"checkpoint at step {step + 1}", flush=True)
        if done:
            break
    else:
        save_checkpoint(a.out, model, opt, meta_now(step + 1 if step >= start else start, used + time.time() - t0))
    print(f"stopped at step {step + 1}; {time.time() - t0:.0f} s this run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

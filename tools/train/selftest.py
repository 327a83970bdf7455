"""Checks of tools/train that run on a CPU (numpy + torch), and, where
transformers and tokenizers are installed (the GPU machine), against them:

  python3 tools/train/selftest.py --kjv kjv.txt.gz [--tokenizer tokenizer.json]

- haystack: exact lengths, needles at the asked depth, values in the text,
  token ids equal to the tokenizer's ids for the text (the toy tokenizer
  here; the BPE when --tokenizer is given);
- scoring on crafted outputs;
- GGUF: metadata and tensors read back as written, Q8_0 within its step;
- export: the numpy GGUF-layout forward pass (interleaved RoPE) of an
  exported random model reproduces the PyTorch model's logits (MiniLlama
  here; transformers' LlamaForCausalLM where installed), and fails to when
  the Q/K permutation is left out;
- training: a few steps of a tiny model, a checkpoint, a resume.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
import haystack as hs  # noqa: E402
import model as mdl  # noqa: E402
import train  # noqa: E402
from toy_tok import ToyTok  # noqa: E402

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def test_haystack(corpus, tok, label):
    ts = hs.TokenSpace(corpus, tok)
    rng = np.random.default_rng(7)
    canon = 0
    total = 0
    for kind in hs.KINDS:
        for vtype in hs.VALUE_TYPES:
            for length, depth in ((400, 0.0), (1500, 0.5), (3000, 1.0)):
                task = hs.make_task(rng, kind, vtype, corpus)
                s = hs.build(rng, ts, task, length, depth=depth, with_answer=False)
                ok = len(s.ids) == length and s.ids[0] == tok.bos_id
                text = s.text(corpus)
                ok &= all(v in text for _, v in task.needles)
                # each needle's ids start at its recorded offset, near the asked depth
                for (k, v), off in zip(task.needles, s.depths):
                    nid = tok.encode(hs.needle_text(k, v, vtype))
                    ok &= list(s.ids[off:off + len(nid)]) == nid
                pre = 1 + len(tok.encode(hs.preamble_text(vtype)))
                hay = length - pre - len(tok.encode(hs.question_text(kind, task.query_keys, vtype)))
                rel = (s.depths[0] - pre) / hay
                ok &= abs(rel - depth) < 0.1
                check(ok, f"{label}: {kind}/{vtype} at {length} tokens, depth {depth}: length, needles, offsets")
                canon += hs.check_canonical(s, ts)
                total += 1
            t = hs.build(rng, ts, hs.make_task(rng, kind, vtype, corpus), 800)
            ans = t.ids[t.prompt_len:]
            check(t.answer_mask.sum() == len(ans) and ans[-1] == tok.eos_id
                  and tok.decode(ans[:-1]).strip() == hs.answer_text(t.task.answers).strip(),
                  f"{label}: {kind}/{vtype} training sample: answer mask covers answer + EOS")
    check(canon == total, f"{label}: {canon}/{total} samples tokenize to their ids from text")
    ids, mask = hs.train_batch(rng, ts, 1024, 3)
    check(ids.shape == (3, 1024) and (mask.sum(1) > 0).all(), f"{label}: train_batch shape and masks")
    share = []
    for _ in range(5):
        h = hs.haystack(rng, ts, 4000)
        share.append(sum(len(x.ids) for x in h if x.kind == "v") / 4000)
    check(0.12 < np.mean(share) < 0.3, f"{label}: prose share {np.mean(share):.2f} near {hs.PROSE_SHARE}")


def test_multikey_ask(corpus):
    """Multikey asks a key drawn at random from the group (every place of a
    4-key group over 400 draws, about a quarter each) and expects that
    key's value; "first" always asks the first needle; anything else is
    refused."""
    rng = np.random.default_rng(13)
    places, ok = [], True
    for _ in range(400):
        t = hs.make_task(rng, "multikey", "number", corpus)
        keys = [k for k, _ in t.needles]
        ok &= len(set(keys)) == len(keys) == hs.N_MULTI and dict(t.needles)[t.query_keys[0]] == t.answers[0]
        places.append(keys.index(t.query_keys[0]))
    share = np.bincount(places, minlength=hs.N_MULTI) / len(places)
    check(ok, "multikey: the answer is the asked key's value")
    check(all(0.18 < x < 0.32 for x in share), f"multikey: the asked key at every place of the group {share.round(2)}")
    first = [hs.make_task(rng, "multikey", "word", corpus, 6, multikey_ask="first") for _ in range(50)]
    check(all(t.query_keys == [t.needles[0][0]] and t.answers == [t.needles[0][1]] for t in first),
          "multikey: multikey_ask='first' asks the first needle (sift-needle-14m v1's data)")
    try:
        hs.make_task(rng, "multikey", "word", corpus, multikey_ask="last")
        check(False, "multikey: an unknown multikey_ask is refused")
    except ValueError as e:
        check("multikey_ask" in str(e), "multikey: an unknown multikey_ask is refused")


def test_fine_data(corpus, tok, name="multikey", label="stage 2"):
    """A fine-tune mix's multikey samples (stage 2: 2..12 keys; stage 3:
    2..10): the asked key anywhere among them, similar keys never a prefix
    of each other, layouts and kinds as drawn."""
    mix = hs.FINE_TUNES[name]
    lo, hi = mix.keys
    ts = hs.TokenSpace(corpus, tok)
    rng = np.random.default_rng(11)
    pos, counts, ok = [], [], True
    for _ in range(300):
        t = hs.make_task_fine(rng, "multikey", "number", corpus, mix)
        keys = [k for k, _ in t.needles]
        ok &= len(set(keys)) == len(keys) and dict(t.needles)[t.query_keys[0]] == t.answers[0]
        pos.append(keys.index(t.query_keys[0]) / max(1, len(keys) - 1))
        counts.append(len(keys))
    check(ok, f"{label}: multikey keys distinct, the answer is the asked key's value")
    check(min(counts) == lo and max(counts) == hi, f"{label}: {lo}..{hi} keys ({min(counts)}..{max(counts)})")
    check(0.4 < np.mean(pos) < 0.6 and min(pos) == 0 and max(pos) == 1,
          f"{label}: the asked key anywhere among the needles (mean relative position {np.mean(pos):.2f})")
    sim = [hs.similar_keys(rng, corpus, 6) for _ in range(50)]
    check(all(len(set(k)) == 6 and not any(a != b and b.startswith(a) for a in k for b in k) for k in sim),
          f"{label}: similar keys distinct, none a prefix of another")
    check(np.mean([len({k[:3] for k in ks}) < 6 for ks in sim]) > 0.8, f"{label}: similar keys share prefixes")
    lay = [hs.layout_depths(rng, 5, mix.layout_p) for _ in range(400)]
    grouped = np.mean([len(set(d)) == 1 for d in lay])
    want = mix.layout_p["group"]
    check(abs(grouped - want) < 0.1, f"{label}: {want:.0%} of the samples keep their needles side by side ({grouped:.2f})")
    t = hs.make_task_fine(rng, "multikey", "word", corpus, mix)
    s = hs.build(rng, ts, t, 1500, needle_depths=[0.5] * len(t.needles), with_answer=False)
    spans = [len(tok.encode(hs.needle_text(k, v, "word"))) for k, v in t.needles]
    check(all(s.depths[i] + spans[i] == s.depths[i + 1] for i in range(len(spans) - 1))
          and hs.check_canonical(s, ts), f"{label}: needles at one depth stand side by side, in planting order")
    # the kinds of a batch in the mix's proportions, read back from the text:
    # the question tells multivalue and multiquery, the needles' count
    # single from multikey
    ids, mask = hs.mix_batch(name, np.random.default_rng(12), ts, 1024, 400)
    check(ids.shape == (400, 1024) and (mask.sum(1) > 0).all(), f"{label}: batch shape and answer masks")
    seen = {k: 0 for k in hs.KINDS}
    for row in ids:
        text = tok.decode([int(i) for i in row])
        q = text.split("Question:")[-1]
        if "What are all" in q:
            seen["multivalue"] += 1
        elif "What are" in q:
            seen["multiquery"] += 1
        else:
            seen["single" if text.count(" One of the special magic ") == 1 else "multikey"] += 1
    share = {k: seen[k] / len(ids) for k in hs.KINDS}
    check(all(abs(share[k] - mix.kind_p[k]) < 0.07 for k in hs.KINDS),
          f"{label}: kinds as the mix draws them ({share} for {mix.kind_p})")


def test_step_lengths():
    """--min-len and --top-share: the share of steps at the maximum length,
    the others spread evenly over the powers of two from --min-len."""
    sched = train.parse_schedule("0:16384")
    for min_len, top, want in ((1024, 0.2, (1024, 2048, 4096, 8192, 16384)),
                               (512, 0.5, (512, 1024, 2048, 4096, 8192, 16384))):
        lens = [train.step_length(1, sched, st, min_len, "stage3", top) for st in range(3000)]
        share = {n: lens.count(n) / len(lens) for n in want}
        other = (1 - top) / (len(want) - 1)
        check(set(lens) == set(want) and abs(share[16384] - top) < 0.03
              and all(abs(share[n] - other) < 0.03 for n in want[:-1]),
              f"train: --min-len {min_len} --top-share {top}: lengths {share}")


def test_score():
    check(hs.score(" 123456.", ["123456"]) == (1.0, True), "score: exact single")
    check(hs.score(" 123457.", ["123456"]) == (0.0, False), "score: wrong digit")
    check(hs.score(" 1, 2, 3 and 4.", ["1", "2", "3", "4"]) == (1.0, True), "score: multi exact")
    check(hs.score(" 4, 2 and 1.", ["1", "2", "3", "4"]) == (0.75, False), "score: partial, reordered")


def test_gguf(tmp):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    p = tmp / "t.gguf"
    meta = [("general.architecture", "llama"), ("x.u", 7), ("x.f", 0.5), ("x.s", "héllo"),
            ("x.arr", ["a", "b c"]), ("x.i", [gguf.I32(-1), gguf.I32(3)]), ("x.b", True)]
    gguf.write(p, meta, [("a16", a, gguf.GGML_F16), ("b", b, gguf.GGML_F32), ("a8", a, gguf.GGML_Q8_0)])
    r = gguf.Reader(p)
    check(r.meta == {k: v for k, v in meta}, "gguf: metadata round trip")
    check(np.array_equal(r.tensor("a16"), a.astype(np.float16).astype(np.float32)), "gguf: F16 tensor round trip")
    check(np.array_equal(r.tensor("b"), b), "gguf: F32 tensor round trip")
    step = np.abs(a).reshape(-1, 32).max(1) / 127
    err = np.abs(r.tensor("a8") - a).reshape(-1, 32).max(1)
    check(bool((err <= step * 0.5 + 1e-3 * step + 1e-6).all()), "gguf: Q8_0 within half a step")
    check([i[0] for i in r.infos] == ["a16", "b", "a8"] and r.infos[0][1] == (64, 8),
          "gguf: tensor order and dims innermost first")


def fake_vocab(n):
    tokens = ["<|bos|>", "<|eos|>"] + [f"t{i}" for i in range(n - 2)]
    return {"tokens": tokens, "types": [3, 3] + [1] * (n - 2), "merges": ["t t0"], "bos": 0, "eos": 1}


def test_export(tmp, use_hf):
    label = "transformers" if use_hf else "MiniLlama"
    torch.manual_seed(0)
    cfg = mdl.config_dict("tiny", 97, 256, rope_theta=5e5)
    m = mdl.build(cfg, use_hf=use_hf).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                # f16-exact weights, so the F16 file holds the model exactly
                p.copy_((0.08 * torch.randn_like(p)).half().float())
    ids = np.random.default_rng(1).integers(0, 97, size=40)
    with torch.no_grad():
        ref = m(input_ids=torch.from_numpy(ids)[None]).logits[0].double().numpy()
    state = mdl.numpy_state(m)
    path = tmp / "m.gguf"
    gguf.export_llama(path, state, cfg, fake_vocab(97), "test")
    r = gguf.Reader(path)
    got = gguf.forward(r, ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    check(rel < 1e-5, f"export ({label}): GGUF-layout numpy forward matches logits, rel err {rel:.2e}")
    check(not r.has("output.weight") and r.meta["llama.rope.freq_base"] == 5e5
          and r.meta["tokenizer.ggml.model"] == "gpt2", f"export ({label}): tied output, metadata")
    keep = gguf.permute_rope
    gguf.permute_rope = lambda w, n: w
    try:
        gguf.export_llama(tmp / "bad.gguf", state, cfg, fake_vocab(97), "test")
    finally:
        gguf.permute_rope = keep
    bad = gguf.forward(gguf.Reader(tmp / "bad.gguf"), ids)
    rel_bad = np.abs(bad - ref).max() / np.abs(ref).max()
    check(rel_bad > 1e-3, f"export ({label}): without the Q/K permutation the logits differ ({rel_bad:.2e})")
    cfg_q = dict(cfg)
    gguf.export_llama(tmp / "q8.gguf", state, cfg_q, fake_vocab(97), "test", matrix_type=gguf.GGML_Q8_0)
    q8 = gguf.forward(gguf.Reader(tmp / "q8.gguf"), ids)
    rel_q = np.abs(q8 - ref).max() / np.abs(ref).max()
    check(rel_q < 3e-2, f"export ({label}): Q8_0 file close to the logits ({rel_q:.2e})")


def test_import(tmp, use_hf):
    """GGUF -> LlamaForCausalLM state: the inverse of the export."""
    import import_gguf
    label = "transformers" if use_hf else "MiniLlama"
    torch.manual_seed(1)
    cfg = mdl.config_dict("tiny", 97, 256, rope_theta=5e5)
    m = mdl.build(cfg, use_hf=use_hf).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(((1 + 0.3 * torch.randn_like(p)) if "norm" in n else 0.08 * torch.randn_like(p)).half().float())
    state = mdl.numpy_state(m)
    path = tmp / "imp.gguf"
    gguf.export_llama(path, state, cfg, fake_vocab(97), "test")
    gcfg, got = import_gguf.import_llama(path)
    check(import_gguf.config_mismatch(gcfg, cfg) is None, f"import ({label}): configuration read back")
    check(set(got) >= {n for n, _ in m.named_parameters()}
          and all(np.array_equal(got[n], state[n]) for n in state),
          f"import ({label}): every tensor equals the exported state (Q/K rows un-permuted)")
    check(import_gguf.roundtrip(path, gcfg, got), f"import ({label}): import -> export writes the same bytes")
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 97, size=30))[None]
    with torch.no_grad():
        ref = m(input_ids=ids).logits
        again = import_gguf.torch_model(gcfg, got, use_hf=use_hf)(input_ids=ids).logits
    check(torch.equal(ref, again), f"import ({label}): the imported model gives the same logits")
    keep = gguf.unpermute_rope
    gguf.unpermute_rope = lambda w, n: w
    try:
        _, bad = import_gguf.import_llama(path)
    finally:
        gguf.unpermute_rope = keep
    with torch.no_grad():
        worse = import_gguf.torch_model(gcfg, bad, use_hf=use_hf)(input_ids=ids).logits
    rel = float((worse - ref).abs().max() / ref.abs().max())
    check(rel > 1e-3, f"import ({label}): without un-permuting Q/K the logits differ ({rel:.2e})")
    r = gguf.Reader(path)
    bad_meta = [(k, v) for k, v in r.meta.items() if k != "llama.embedding_length"]
    try:
        gguf.write(tmp / "nometa.gguf", bad_meta, [])
        import_gguf.import_llama(tmp / "nometa.gguf")
        check(False, "import: a GGUF without llama.embedding_length is refused")
    except ValueError as e:
        check("llama.embedding_length" in str(e), f"import: a GGUF without llama.embedding_length is refused ({e})")


def test_vocab(tmp):
    j = {"model": {"type": "BPE", "vocab": {"a": 2, "b": 3, "ab": 4}, "merges": [["a", "b"]]},
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
         "added_tokens": [{"id": 0, "content": "<|bos|>", "special": True},
                          {"id": 1, "content": "<|eos|>", "special": True}]}
    p = tmp / "tokenizer.json"
    p.write_text(json.dumps(j))
    from tok import gguf_vocab
    v = gguf_vocab(p)
    check(v["tokens"] == ["<|bos|>", "<|eos|>", "a", "b", "ab"] and v["types"] == [3, 3, 1, 1, 1]
          and v["merges"] == ["a b"] and v["bos"] == 0 and v["eos"] == 1, "tokenizer.json -> GGUF vocab")


def test_train(tmp, kjv, corpus, use_hf):
    tokp = tmp / "toy.json"
    ToyTok.build(corpus.verses + [" " + w for w in corpus.words] + [
        hs.preamble_text(v) + hs.question_text(k, ["x", "y"], v) for k in hs.KINDS for v in hs.VALUE_TYPES], tokp)
    out = tmp / "ck"
    common = ["--kjv", str(kjv), "--tokenizer", str(tokp), "--size", "tiny", "--tokens-per-step", "2048",
              "--schedule", "0:512,6:1024", "--steps", "20", "--warmup", "2", "--decay-steps", "4",
              "--log-every", "10", "--workers", "2", "--ckpt-every", "1e9"]
    if not use_hf:
        common.append("--mini")
    train.main(common + ["--out", str(out), "--stop-step", "12"])
    meta = json.loads((out / "meta.json").read_text())
    check(meta["step"] == 12 and len(meta["history"]) >= 1, "train: stops at --stop-step with a checkpoint")
    check(all((out / f).stat().st_size < 16 * 2**20 for f in meta["files"]["w"] + meta["files"]["v"]),
          "train: checkpoint files under 16 MiB")
    train.main(common + ["--out", str(out), "--resume", str(out)])
    meta2 = json.loads((out / "meta.json").read_text())
    check(meta2["step"] == 20 and meta2["history"][-1][0] == 20, "train: resume runs to --steps")
    check(train.step_length(1, train.parse_schedule("0:512,10:4096"), 50) in (512, 1024, 2048, 4096),
          "train: curriculum lengths are powers of two up to the maximum")
    # stage 2: from the stage-1 model exported to GGUF, on the multikey mix, resumable
    import export
    _, state = export.load_state(out)
    g = tmp / "stage1.gguf"
    gguf.export_llama(g, state, meta2["config"], fake_vocab(meta2["config"]["vocab_size"]), "stage1")
    out2 = tmp / "ck2"
    s2 = list(common)
    s2[s2.index("--schedule") + 1] = "0:1024"
    s2[s2.index("--workers") + 1] = "0"
    train.main(s2 + ["--out", str(out2), "--init-gguf", str(g), "--mix", "multikey", "--stop-step", "5"])
    m3 = json.loads((out2 / "meta.json").read_text())
    check(m3["step"] == 5 and m3["mix"] == "multikey" and m3["init"]["sha256"] == train.file_sha256(g),
          "train: stage 2 starts from the GGUF (its sha256 recorded) on the multikey mix")
    _, w3, _ = train.load_checkpoint(out2)
    moved = max(float((w3[n].float() - torch.from_numpy(state[n])).abs().max()) for n in w3)
    check(0 < moved < 0.05, f"train: stage 2 moves the stage-1 weights a little ({moved:.2e})")
    train.main(s2 + ["--out", str(out2), "--resume", str(out2), "--mix", "multikey"])
    m4 = json.loads((out2 / "meta.json").read_text())
    check(m4["step"] == 20 and m4["init"] == m3["init"] and len(m4["segments"]) == 2,
          "train: stage 2 resumes to --steps and keeps its origin")
    try:
        train.main(s2 + ["--out", str(tmp / "ck3"), "--resume", str(out2)])
        check(False, "train: resuming a stage-2 checkpoint on the base mix is refused")
    except ValueError as e:
        check("mix" in str(e), "train: resuming a stage-2 checkpoint on the base mix is refused")
    try:
        train.main(common + ["--out", str(tmp / "ck4"), "--resume", str(out), "--multikey-ask", "first"])
        check(False, "train: resuming with the other --multikey-ask is refused")
    except ValueError as e:
        check("multikey" in str(e), "train: resuming with the other --multikey-ask is refused")
    # --fit-budget: a budget the run cannot meet moves the end (and the decay)
    # earlier.  On a clock that advances 1 s at each reading (a step reads it
    # once, a timed step twice), 20 steps timed from step 10 take ~1 s each,
    # so a 70 s budget (3.5 s of margin) ends the run near step 30 + 33 / 1.05,
    # decaying from step 30
    out5 = tmp / "ck5"
    fitc = list(common)
    fitc[fitc.index("--steps") + 1] = "100000"
    fitc[fitc.index("--decay-steps") + 1] = "50"
    fitc[fitc.index("--schedule") + 1] = "0:512,6:1024"
    fitc[fitc.index("--workers") + 1] = "0"
    real_time = train.time

    class Clock:
        t = 0.0

        def time(self):
            Clock.t += 1.0
            return Clock.t

    train.time = Clock()
    try:
        train.main(fitc + ["--out", str(out5), "--time-budget", "70", "--fit-budget", "--fit-steps", "20"])
    finally:
        train.time = real_time
    m5 = json.loads((out5 / "meta.json").read_text())
    rp = m5["replan"] or {}
    check(rp.get("at") == 30 and 40 < rp.get("steps", 0) < 100
          and rp.get("decay_steps") == min(50, rp["steps"] - 30)
          and m5["step"] == rp["steps"] and rp["was"] == [100000, 50]
          and m5["segments"][0]["args"]["steps"] == 100000,
          f"train: --fit-budget ends a run that would overrun at a step it can reach, decayed ({rp})")
    ns = argparse.Namespace(lr=1e-3, warmup=2, steps=rp.get("steps"), decay_steps=rp.get("decay_steps"))
    check(rp and train.lr_at(ns, rp["steps"] - rp["decay_steps"] - 1) == 1e-3
          and abs(train.lr_at(ns, rp["steps"]) - 1e-4) < 1e-12,
          "train: the replanned run decays to a tenth of the learning rate by its new end")
    rng = np.random.default_rng(5)
    ts = hs.TokenSpace(corpus, ToyTok.load(tokp))
    ids, mask = hs.stage2_batch(rng, ts, 1024, 6)
    check(ids.shape == (6, 1024) and (mask.sum(1) > 0).all(), "train: stage-2 batch shape and masks")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kjv", required=True)
    p.add_argument("--tokenizer", help="BPE tokenizer.json to check the haystack against")
    p.add_argument("--skip-train", action="store_true")
    a = p.parse_args()
    corpus = hs.Corpus(hs.load_kjv(a.kjv))
    use_hf = mdl.have_transformers()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        toy = ToyTok.build(corpus.verses + [" " + w for w in corpus.words])
        test_haystack(corpus, toy, "toy tokenizer")
        if a.tokenizer:
            from tok import Tok
            test_haystack(corpus, Tok.load(a.tokenizer), "BPE tokenizer")
        test_score()
        test_gguf(tmp)
        test_vocab(tmp)
        test_export(tmp, use_hf=False)
        test_import(tmp, use_hf=False)
        test_multikey_ask(corpus)
        test_fine_data(corpus, toy, "multikey", "stage 2")
        test_fine_data(corpus, toy, "stage3", "stage 3")
        test_step_lengths()
        if use_hf:
            test_export(tmp, use_hf=True)
            test_import(tmp, use_hf=True)
        if not a.skip_train:
            test_train(tmp, a.kjv, corpus, use_hf)
    print(f"{len(FAILS)} failed" if FAILS else "all passed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

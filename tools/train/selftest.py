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
        if use_hf:
            test_export(tmp, use_hf=True)
        if not a.skip_train:
            test_train(tmp, a.kjv, corpus, use_hf)
    print(f"{len(FAILS)} failed" if FAILS else "all passed", flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

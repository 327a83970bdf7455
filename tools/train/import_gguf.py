"""Import a `llama` GGUF (as export.py writes it) back into the state of
transformers' LlamaForCausalLM, and check the import:

  python3 tools/train/import_gguf.py --gguf models/sift-needle-14m-f16.gguf \
      [--tokenizer models/tokenizer.json] [--ref models/ref] [--roundtrip]

The tensors are read as float32 (F16 and F32 exactly, Q8_0 dequantized);
the rows of attn_q and attn_k are put back from GGUF's interleaved RoPE
order into transformers' rotate_half order (gguf.unpermute_rope, the
inverse of the exporter's permutation); the tied embedding serves as
lm_head.  Stage 2 of the training (train.py --init-gguf) starts from the
shipped stage-1 weights this way.

Checks (exit 1 when one fails):
  --roundtrip   exporting the imported state again (same metadata and
                vocabulary) gives a file byte for byte equal to the input;
  --tokenizer   the GGUF's vocabulary equals the tokenizer.json's;
  --ref DIR     the imported weights in PyTorch (transformers' class where
                installed, else model.MiniLlama) in float32 give models/ref's
                logits (transformers' on the GPU) within --tol of the logit
                range, with the same argmax at every position;
  --ref-json F  the same against evaluate.py's ref.json.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402

_INT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")


def _need(meta, key, path):
    if key not in meta:
        raise ValueError(f"{path}: metadata key {key} is missing")
    return meta[key]


def llama_config(reader, path="GGUF"):
    """The model.config_dict-style configuration of a llama GGUF."""
    m = reader.meta
    arch = m.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'llama'")
    nh = _need(m, "llama.attention.head_count", path)
    d = _need(m, "llama.embedding_length", path)
    hd = m.get("llama.rope.dimension_count", d // nh)
    if hd * nh != d:
        raise ValueError(f"{path}: rope.dimension_count {hd} x head_count {nh} != embedding_length {d}")
    emb = [dims for n, dims, *_ in reader.infos if n == "token_embd.weight"]
    if not emb:
        raise ValueError(f"{path}: tensor token_embd.weight is missing")
    vocab = m.get("llama.vocab_size", emb[0][1])
    return dict(hidden_size=d, intermediate_size=_need(m, "llama.feed_forward_length", path),
                num_hidden_layers=_need(m, "llama.block_count", path), num_attention_heads=nh,
                num_key_value_heads=m.get("llama.attention.head_count_kv", nh), head_dim=hd,
                vocab_size=vocab, max_position_embeddings=_need(m, "llama.context_length", path),
                rope_theta=float(_need(m, "llama.rope.freq_base", path)),
                rms_norm_eps=float(_need(m, "llama.attention.layer_norm_rms_epsilon", path)),
                tie_word_embeddings=not reader.has("output.weight"))


def config_mismatch(a, b):
    """The first key where two configurations differ (floats compared as
    the float32 GGUF stores them), or None."""
    for k in _INT_KEYS + ("tie_word_embeddings",):
        if a.get(k) != b.get(k):
            return f"{k}: {a.get(k)} vs {b.get(k)}"
    for k in _FLOAT_KEYS:
        if np.float32(a[k]) != np.float32(b[k]):
            return f"{k}: {a[k]} vs {b[k]}"
    return None


def import_llama(path):
    """(cfg, state): the configuration and LlamaForCausalLM's state dict as
    float32 numpy arrays (lm_head.weight is the embedding when tied)."""
    r = gguf.Reader(path)
    cfg = llama_config(r, path)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def t(name, shape):
        if not r.has(name):
            raise ValueError(f"{path}: tensor {name} is missing")
        a = r.tensor(name)
        if a.shape != shape:
            raise ValueError(f"{path}: tensor {name} has shape {a.shape}, expected {shape}")
        return a

    d, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    emb = t("token_embd.weight", (cfg["vocab_size"], d))
    st = {"model.embed_tokens.weight": emb}
    for i in range(cfg["num_hidden_layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        st[p + "input_layernorm.weight"] = t(b + "attn_norm.weight", (d,))
        st[p + "self_attn.q_proj.weight"] = gguf.unpermute_rope(t(b + "attn_q.weight", (nh * hd, d)), nh)
        st[p + "self_attn.k_proj.weight"] = gguf.unpermute_rope(t(b + "attn_k.weight", (nkv * hd, d)), nkv)
        st[p + "self_attn.v_proj.weight"] = t(b + "attn_v.weight", (nkv * hd, d))
        st[p + "self_attn.o_proj.weight"] = t(b + "attn_output.weight", (d, nh * hd))
        st[p + "post_attention_layernorm.weight"] = t(b + "ffn_norm.weight", (d,))
        st[p + "mlp.gate_proj.weight"] = t(b + "ffn_gate.weight", (f, d))
        st[p + "mlp.up_proj.weight"] = t(b + "ffn_up.weight", (f, d))
        st[p + "mlp.down_proj.weight"] = t(b + "ffn_down.weight", (d, f))
    st["model.norm.weight"] = t("output_norm.weight", (d,))
    st["lm_head.weight"] = emb if cfg["tie_word_embeddings"] else t("output.weight", (cfg["vocab_size"], d))
    return cfg, st


def vocab_of(reader):
    """The vocabulary in tok.gguf_vocab's form, read from a GGUF."""
    m = reader.meta
    return {"tokens": m["tokenizer.ggml.tokens"], "types": list(m["tokenizer.ggml.token_type"]),
            "merges": m["tokenizer.ggml.merges"], "bos": m["tokenizer.ggml.bos_token_id"],
            "eos": m["tokenizer.ggml.eos_token_id"]}


def roundtrip(path, cfg, state):
    """True when export_llama of the imported state writes the same bytes."""
    r = gguf.Reader(path)
    types = {gt for _, dims, gt, _ in r.infos if len(dims) == 2}
    if len(types) != 1:
        raise ValueError(f"{path}: matrices of several types {sorted(types)}")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "again.gguf"
        gguf.export_llama(out, state, cfg, vocab_of(r), r.meta["general.name"], matrix_type=types.pop(),
                          context_length=cfg["max_position_embeddings"])
        again = gguf.Reader(out)
        same_t = all(np.array_equal(r.tensor(n), again.tensor(n)) for n, *_ in r.infos)
        print(f"roundtrip: {len(r.infos)} tensors {'equal' if same_t else 'DIFFER'}; "
              f"metadata {'equal' if r.meta == again.meta else 'DIFFERS'}", flush=True)
        return same_t and r.meta == again.meta and out.read_bytes() == Path(path).read_bytes()


def torch_model(cfg, state, use_hf=None):
    """A float32 PyTorch model holding the imported state."""
    import torch
    import model as mdl
    if use_hf is None:
        use_hf = mdl.have_transformers()
    m = mdl.build(cfg, use_hf=use_hf).float().eval()
    load_into(m, state)
    return m


def load_into(m, state):
    """Copy a numpy state (HF names) into a model's parameters."""
    import torch
    params = dict(m.named_parameters())
    missing = sorted(set(params) - set(state))
    if missing:
        raise ValueError(f"the imported state lacks {missing[:3]}")
    with torch.no_grad():
        for n, p in params.items():
            src = torch.from_numpy(np.ascontiguousarray(state[n]))
            if src.shape != p.shape:
                raise ValueError(f"{n}: shape {tuple(src.shape)}, the model has {tuple(p.shape)}")
            p.copy_(src.to(p.dtype))


def ref_prompts(ref_dir=None, ref_json=None):
    """(name, ids, last-position logits, argmax) of the reference prompts,
    from models/ref's files or from evaluate.py's ref.json."""
    if ref_json:
        import json
        with open(ref_json) as f:
            ref = json.load(f)
        return [(f"prompt{i}", p["ids"], np.asarray(p["last_logits"]), np.asarray(p["argmax"]))
                for i, p in enumerate(ref["prompts"])]
    ref_dir = Path(ref_dir)
    files = sorted(ref_dir.glob("prompt*.ids"))
    if not files:
        raise ValueError(f"{ref_dir}: no prompt*.ids files")
    out = []
    for p in files:
        stem = str(p.with_suffix(""))
        out.append((p.stem, [int(x) for x in p.read_text().split()], np.loadtxt(stem + ".logits"),
                    np.array([int(x) for x in Path(stem + ".argmax").read_text().split()])))
    return out


def check_ref(m, prompts, tol):
    """Compare a model's float32 logits with the reference prompts'."""
    import torch
    ok = True
    for name, ids, last, argmax in prompts:
        with torch.no_grad():
            logits = m(input_ids=torch.tensor([ids])).logits[0].double().numpy()
        err = np.abs(logits[-1] - last).max() / (last.max() - last.min())
        agree = float(np.mean(logits.argmax(-1) == argmax))
        print(f"{name}: {len(ids)} tokens, last-position max error {err:.2e} of the logit range, "
              f"argmax agreement {agree:.3f}", flush=True)
        ok &= bool(err <= tol) and agree == 1.0
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", required=True)
    p.add_argument("--tokenizer", help="tokenizer.json whose vocabulary the GGUF must hold")
    p.add_argument("--ref", help="models/ref: reference logits to reproduce")
    p.add_argument("--ref-json", help="evaluate.py's ref.json: reference logits to reproduce")
    p.add_argument("--roundtrip", action="store_true", help="check import -> export gives the same file")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--mini", action="store_true", help="use model.MiniLlama even where transformers is installed")
    a = p.parse_args()
    cfg, state = import_llama(a.gguf)
    n = sum(v.size for k, v in state.items() if k != "lm_head.weight" or not cfg["tie_word_embeddings"])
    print(f"{a.gguf}: {n / 1e6:.2f}M parameters, config {cfg}", flush=True)
    ok = True
    if a.tokenizer:
        from tok import gguf_vocab
        same = vocab_of(gguf.Reader(a.gguf)) == gguf_vocab(a.tokenizer)
        print(f"vocabulary {'equals' if same else 'DIFFERS from'} {a.tokenizer}", flush=True)
        ok &= same
    if a.roundtrip:
        ok &= roundtrip(a.gguf, cfg, state)
    if a.ref or a.ref_json:
        m = torch_model(cfg, state, use_hf=False if a.mini else None)
        print(f"logits from {type(m).__name__} in float32", flush=True)
        ok &= check_ref(m, ref_prompts(a.ref, a.ref_json), a.tol)
    print("import: all checks passed" if ok else "import: FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""GGUF v3: a writer and a reader, from the format description, and the
export of a trained LlamaForCausalLM to the `llama` architecture.

Layout: magic 'GGUF', version u32 = 3, tensor count u64, metadata count u64;
metadata (key string, value type u32, value); tensor infos (name, n_dims
u32, dims u64 innermost first, ggml type u32, offset u64 from the data
start); padding to general.alignment; the tensor data, each tensor's offset
a multiple of the alignment.  Strings are u64 length + UTF-8 bytes; all
numbers little-endian.

RoPE: GGUF's `llama` pairs dimensions (2i, 2i+1) of each head (GPT-J,
"NORM"), while transformers' Llama pairs (i, i + head_dim/2) (rotate_half,
NEOX).  The export permutes the rows of the Q and K projections (as
llama.cpp's converter does) so that the interleaved rotation of the
permuted projection equals the rotate_half rotation of the original one.
`forward` below is the GGUF-layout forward pass in numpy that checks it.
"""

import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32

# metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALAR = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h",
           T_UINT32: "<I", T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?",
           T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d"}

# ggml tensor types
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
QK8_0 = 32
FILE_TYPE = {GGML_F16: 1, GGML_Q8_0: 7}  # general.file_type: MOSTLY_F16, MOSTLY_Q8_0


class U32(int):
    pass


class I32(int):
    pass


class F32(float):
    pass


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v):
    """(type, bytes) of a metadata value.  ints are u32 unless tagged,
    floats f32; lists are arrays of one element type."""
    if isinstance(v, bool):
        return T_BOOL, struct.pack("<?", v)
    if isinstance(v, I32):
        return T_INT32, struct.pack("<i", v)
    if isinstance(v, int):
        return T_UINT32, struct.pack("<I", v)
    if isinstance(v, float):
        return T_FLOAT32, struct.pack("<f", v)
    if isinstance(v, str):
        return T_STRING, _str(v)
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("empty metadata array")
        et, _ = _value(v[0])
        parts = []
        for x in v:
            t, b = _value(x)
            if t != et:
                raise ValueError(f"mixed array element types {et} and {t}")
            parts.append(b)
        return T_ARRAY, struct.pack("<IQ", et, len(v)) + b"".join(parts)
    raise TypeError(f"metadata value {v!r} of type {type(v).__name__}")


def quantize_q8_0(x):
    """Q8_0 blocks of 32 along rows: f16 scale d = max|x| / 127, then 32
    int8 q = round(x / d)."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % QK8_0:
        raise ValueError(f"Q8_0 needs rows divisible by {QK8_0}, got {x.shape}")
    b = x.reshape(-1, QK8_0)
    amax = np.abs(b).max(axis=1)
    d = (amax / 127.0).astype(np.float16)
    df = d.astype(np.float32)
    inv = np.divide(1.0, df, out=np.zeros_like(df), where=df != 0)
    q = np.clip(np.round(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty(len(b), dtype=[("d", "<f2"), ("qs", "i1", (QK8_0,))])
    out["d"] = d
    out["qs"] = q
    return out.tobytes()


def dequantize_q8_0(raw, n):
    blocks = np.frombuffer(raw, dtype=[("d", "<f2"), ("qs", "i1", (QK8_0,))], count=n // QK8_0)
    return (blocks["d"].astype(np.float32)[:, None] * blocks["qs"].astype(np.float32)).reshape(-1)


def tensor_nbytes(ggml_type, n):
    if ggml_type == GGML_F32:
        return 4 * n
    if ggml_type == GGML_F16:
        return 2 * n
    if ggml_type == GGML_Q8_0:
        return n // QK8_0 * (2 + QK8_0)
    raise ValueError(f"ggml type {ggml_type} not supported")


def write(path, metadata, tensors):
    """metadata: list of (key, value); tensors: list of (name, numpy array
    shaped as in PyTorch (outer dim first), ggml type)."""
    infos, blobs = [], []
    offset = 0
    for name, arr, gt in tensors:
        arr = np.ascontiguousarray(arr)
        if gt == GGML_F32:
            raw = arr.astype("<f4").tobytes()
        elif gt == GGML_F16:
            raw = arr.astype("<f2").tobytes()
        elif gt == GGML_Q8_0:
            raw = quantize_q8_0(arr)
        else:
            raise ValueError(f"{name}: ggml type {gt} not supported")
        assert len(raw) == tensor_nbytes(gt, arr.size)
        dims = list(reversed(arr.shape))
        info = _str(name) + struct.pack("<I", len(dims))
        info += b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", gt, offset)
        infos.append(info)
        pad = (-len(raw)) % ALIGN
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    head = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata))
    for k, v in metadata:
        t, b = _value(v)
        head += _str(k) + struct.pack("<I", t) + b
    head += b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)


class Reader:
    """Reads what `write` wrote (and any GGUF v3 with F32/F16/Q8_0 tensors)."""

    def __init__(self, path):
        self.data = open(path, "rb").read()
        self.pos = 0
        if self._take(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        version, n_t, n_kv = struct.unpack("<IQQ", self._take(20))
        if version != GGUF_VERSION:
            raise ValueError(f"{path}: GGUF version {version}, expected 3")
        self.meta = {}
        for _ in range(n_kv):
            k = self._string()
            (t,) = struct.unpack("<I", self._take(4))
            self.meta[k] = self._read_value(t)
        align = self.meta.get("general.alignment", ALIGN)
        self.infos = []
        for _ in range(n_t):
            name = self._string()
            (nd,) = struct.unpack("<I", self._take(4))
            dims = struct.unpack(f"<{nd}Q", self._take(8 * nd))
            gt, off = struct.unpack("<IQ", self._take(12))
            if off % align:
                raise ValueError(f"{path}: tensor {name} offset {off} not aligned to {align}")
            self.infos.append((name, dims, gt, off))
        self.data_start = self.pos + (-self.pos) % align

    def _take(self, n):
        b = self.data[self.pos:self.pos + n]
        if len(b) != n:
            raise ValueError("truncated GGUF")
        self.pos += n
        return b

    def _string(self):
        (n,) = struct.unpack("<Q", self._take(8))
        return self._take(n).decode("utf-8")

    def _read_value(self, t):
        if t == T_STRING:
            return self._string()
        if t == T_ARRAY:
            et, n = struct.unpack("<IQ", self._take(12))
            return [self._read_value(et) for _ in range(n)]
        fmt = _SCALAR[t]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def tensor(self, name):
        """float32 array shaped as in PyTorch (dims reversed)."""
        for n, dims, gt, off in self.infos:
            if n == name:
                count = int(np.prod(dims))
                start = self.data_start + off
                raw = self.data[start:start + tensor_nbytes(gt, count)]
                if gt == GGML_F32:
                    a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
                elif gt == GGML_F16:
                    a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
                else:
                    a = dequantize_q8_0(raw, count)
                return a.reshape(tuple(reversed(dims)))
        raise KeyError(name)

    def has(self, name):
        return any(n == name for n, *_ in self.infos)


# ------------------------------------------------------------------ llama

def permute_rope(w, n_head):
    """rotate_half row order -> interleaved row order, per head: new row
    2j + s holds old row s * head_dim/2 + j."""
    out_dim = w.shape[0]
    hd = out_dim // n_head
    return (w.reshape(n_head, 2, hd // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_rope(w, n_head):
    """The inverse of permute_rope: interleaved row order -> rotate_half
    row order, per head (old row s * head_dim/2 + j comes from row 2j + s)."""
    out_dim = w.shape[0]
    hd = out_dim // n_head
    return (w.reshape(n_head, hd // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def export_llama(path, state, cfg, vocab, name, matrix_type=GGML_F16, context_length=None):
    """state: HF LlamaForCausalLM state dict as float32 numpy arrays;
    cfg: dict with hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, head_dim, rope_theta,
    rms_norm_eps, vocab_size, max_position_embeddings, tie_word_embeddings.
    Norms are stored F32, matrices as matrix_type.  Tied embeddings store
    no `output` tensor (loaders fall back to token_embd)."""
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["head_dim"]
    if hd * nh != cfg["hidden_size"]:
        raise ValueError("head_dim * heads must equal hidden_size for the llama GGUF layout")
    meta = [
        ("general.architecture", "llama"),
        ("general.name", name),
        ("general.alignment", ALIGN),
        ("general.file_type", FILE_TYPE[matrix_type]),
        ("llama.vocab_size", cfg["vocab_size"]),
        ("llama.context_length", context_length or cfg["max_position_embeddings"]),
        ("llama.embedding_length", cfg["hidden_size"]),
        ("llama.block_count", cfg["num_hidden_layers"]),
        ("llama.feed_forward_length", cfg["intermediate_size"]),
        ("llama.attention.head_count", nh),
        ("llama.attention.head_count_kv", nkv),
        ("llama.rope.freq_base", float(cfg["rope_theta"])),
        ("llama.rope.dimension_count", hd),
        ("llama.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"])),
        ("tokenizer.ggml.model", "gpt2"),
        ("tokenizer.ggml.pre", "gpt2"),
        ("tokenizer.ggml.tokens", vocab["tokens"]),
        ("tokenizer.ggml.token_type", [I32(t) for t in vocab["types"]]),
        ("tokenizer.ggml.merges", vocab["merges"]),
        ("tokenizer.ggml.bos_token_id", vocab["bos"]),
        ("tokenizer.ggml.eos_token_id", vocab["eos"]),
        ("tokenizer.ggml.add_bos_token", True),
        ("tokenizer.ggml.add_eos_token", False),
    ]
    if len(vocab["tokens"]) != cfg["vocab_size"]:
        raise ValueError(f"tokenizer has {len(vocab['tokens'])} tokens, model {cfg['vocab_size']}")
    mt = matrix_type
    t = [("token_embd.weight", state["model.embed_tokens.weight"], mt)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", state[p + "input_layernorm.weight"], GGML_F32),
            (b + "attn_q.weight", permute_rope(state[p + "self_attn.q_proj.weight"], nh), mt),
            (b + "attn_k.weight", permute_rope(state[p + "self_attn.k_proj.weight"], nkv), mt),
            (b + "attn_v.weight", state[p + "self_attn.v_proj.weight"], mt),
            (b + "attn_output.weight", state[p + "self_attn.o_proj.weight"], mt),
            (b + "ffn_norm.weight", state[p + "post_attention_layernorm.weight"], GGML_F32),
            (b + "ffn_gate.weight", state[p + "mlp.gate_proj.weight"], mt),
            (b + "ffn_up.weight", state[p + "mlp.up_proj.weight"], mt),
            (b + "ffn_down.weight", state[p + "mlp.down_proj.weight"], mt),
        ]
    t.append(("output_norm.weight", state["model.norm.weight"], GGML_F32))
    if not cfg.get("tie_word_embeddings", False):
        t.append(("output.weight", state["lm_head.weight"], mt))
    write(path, meta, t)


def forward(reader, ids):
    """Logits [len(ids), vocab] of the GGUF-layout llama forward pass in
    float64 numpy: RMSNorm, Q/K/V, interleaved RoPE on (2i, 2i+1), causal
    grouped-query attention, SwiGLU.  Independent of transformers."""
    m = reader.meta
    L = m["llama.block_count"]
    nh = m["llama.attention.head_count"]
    nkv = m["llama.attention.head_count_kv"]
    d = m["llama.embedding_length"]
    hd = d // nh
    eps = m["llama.attention.layer_norm_rms_epsilon"]
    base = m["llama.rope.freq_base"]
    T = len(ids)

    def W(name):
        return reader.tensor(name).astype(np.float64)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    emb = W("token_embd.weight")
    x = emb[np.asarray(ids)]
    pos = np.arange(T, dtype=np.float64)
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None, :]          # [T, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):                               # v [T, heads, hd]
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a * cos[:, None, :] - b * sin[:, None, :]
        out[..., 1::2] = a * sin[:, None, :] + b * cos[:, None, :]
        return out

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        b = f"blk.{i}."
        h = rms(x, W(b + "attn_norm.weight"))
        q = rope((h @ W(b + "attn_q.weight").T).reshape(T, nh, hd))
        k = rope((h @ W(b + "attn_k.weight").T).reshape(T, nkv, hd))
        v = (h @ W(b + "attn_v.weight").T).reshape(T, nkv, hd)
        att = np.empty((T, nh, hd))
        for head in range(nh):
            g = head // (nh // nkv)
            s = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att[:, head] = s @ v[:, g]
        x = x + att.reshape(T, d) @ W(b + "attn_output.weight").T
        h = rms(x, W(b + "ffn_norm.weight"))
        gate = h @ W(b + "ffn_gate.weight").T
        up = h @ W(b + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W(b + "ffn_down.weight").T
    x = rms(x, W("output_norm.weight"))
    out = W("output.weight") if reader.has("output.weight") else emb
    return x @ out.T

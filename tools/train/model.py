"""The model: transformers' LlamaForCausalLM with sift's configuration.

Where transformers is missing (this project's CPU machines), `MiniLlama`
stands in for it in the CPU tests of the training loop and the exporter: a
plain PyTorch Llama with the same parameter names and the same rotate_half
RoPE.  Shipped models are always trained with transformers' class.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # the shipped model: ~14M parameters with the tied embedding
    "base": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64),
    # for tests
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}


def config_dict(size, vocab_size, max_len, rope_theta=5e5):
    c = dict(CONFIGS[size])
    c.update(vocab_size=vocab_size, max_position_embeddings=max_len,
             rope_theta=float(rope_theta), rms_norm_eps=1e-5,
             tie_word_embeddings=True)
    return c


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def build(cfg, use_hf=True):
    if use_hf:
        return build_hf(cfg)
    return MiniLlama(cfg)


def build_hf(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(cfg)
    theta = kw.pop("rope_theta")
    hc = LlamaConfig(**kw, rope_theta=theta, attention_bias=False, mlp_bias=False,
                     hidden_act="silu", bos_token_id=0, eos_token_id=1, pad_token_id=1)
    # transformers 5 keeps RoPE settings in rope_parameters; set both spellings
    if hasattr(hc, "rope_parameters"):
        hc.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    try:
        m = LlamaForCausalLM._from_config(hc, attn_implementation="sdpa")
    except (TypeError, AttributeError, ValueError):
        m = LlamaForCausalLM(hc)
    m = m.float()
    inv = m.model.rotary_emb.inv_freq.float().cpu()
    want = 1.0 / theta ** (torch.arange(0, cfg["head_dim"], 2).float() / cfg["head_dim"])
    if not torch.allclose(inv, want, rtol=1e-5):
        raise RuntimeError("transformers did not take the RoPE base: inv_freq differs")
    return m


class _Out:
    def __init__(self, logits):
        self.logits = logits


class MiniLlama(nn.Module):
    """LlamaForCausalLM's computation and parameter names, for CPU tests."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        d, f = c["hidden_size"], c["intermediate_size"]
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], d)
        self.model.layers = nn.ModuleList()
        for _ in range(c["num_hidden_layers"]):
            layer = nn.Module()
            layer.input_layernorm = _RMS(d, c["rms_norm_eps"])
            layer.post_attention_layernorm = _RMS(d, c["rms_norm_eps"])
            a = nn.Module()
            a.q_proj = nn.Linear(d, nh * hd, bias=False)
            a.k_proj = nn.Linear(d, nkv * hd, bias=False)
            a.v_proj = nn.Linear(d, nkv * hd, bias=False)
            a.o_proj = nn.Linear(nh * hd, d, bias=False)
            layer.self_attn = a
            mlp = nn.Module()
            mlp.gate_proj = nn.Linear(d, f, bias=False)
            mlp.up_proj = nn.Linear(d, f, bias=False)
            mlp.down_proj = nn.Linear(f, d, bias=False)
            layer.mlp = mlp
            self.model.layers.append(layer)
        self.model.norm = _RMS(d, c["rms_norm_eps"])
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids, **_):
        c = self.c
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        B, T = input_ids.shape
        x = self.model.embed_tokens(input_ids)
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
        emb = torch.cat([ang, ang], dim=-1)
        cos, sin = emb.cos(), emb.sin()

        def rot(v):
            h = v.shape[-1] // 2
            return v * cos + torch.cat([-v[..., h:], v[..., :h]], dim=-1) * sin

        mask = torch.full((T, T), float("-inf")).triu(1)
        for layer in self.model.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = rot(a.q_proj(h).view(B, T, nh, hd).transpose(1, 2))
            k = rot(a.k_proj(h).view(B, T, nkv, hd).transpose(1, 2))
            v = a.v_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            s = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + a.o_proj(o)
            h = layer.post_attention_layernorm(x)
            x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
        return _Out(self.lm_head(self.model.norm(x)))


class _RMS(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def numpy_state(model):
    """float32 numpy state dict (tied lm_head included once as in HF)."""
    return {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}

"""The byte-level BPE tokenizer (Hugging Face `tokenizers`).

GPT-2's design: the ByteLevel pre-tokenizer with GPT-2's split regex, no
prefix space, BPE merges over the byte alphabet.  That is what GGUF calls
tokenizer.ggml.model = "gpt2" with tokenizer.ggml.pre = "gpt2", so a
llama.cpp-style loader tokenizes the same way.  Two special tokens come
first: <|bos|> (id 0) and <|eos|> (id 1).
"""

import json

BOS = "<|bos|>"
EOS = "<|eos|>"
SPECIALS = [BOS, EOS]


class Tok:
    """encode / encode_batch / decode over a tokenizers.Tokenizer."""

    def __init__(self, hf):
        self.hf = hf
        self.bos_id = hf.token_to_id(BOS)
        self.eos_id = hf.token_to_id(EOS)
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f"tokenizer lacks {BOS} or {EOS}")
        self.vocab_size = hf.get_vocab_size()

    @classmethod
    def load(cls, path):
        from tokenizers import Tokenizer
        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text):
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.hf.decode(list(ids), skip_special_tokens=True)


def train(texts, vocab_size, path):
    """Train the BPE on an iterator of strings and save tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(texts, trainer)
    hf.save(str(path))
    return Tok(hf)


def gguf_vocab(path):
    """From tokenizer.json: tokens by id, their GGUF token types
    (1 normal, 3 control), merges as 'a b' strings, bos and eos ids."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    model = j["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: model.type is {model.get('type')!r}, expected 'BPE'")
    pre = j.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise ValueError(f"{path}: pre_tokenizer must be ByteLevel with the GPT-2 regex and no prefix space")
    vocab = dict(model["vocab"])
    for t in j.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for t, i in vocab.items():
        if tokens[i] is not None:
            raise ValueError(f"{path}: id {i} used by {tokens[i]!r} and {t!r}")
        tokens[i] = t
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise ValueError(f"{path}: ids without a token, first {missing[0]}")
    special = {t["content"] for t in j.get("added_tokens", []) if t.get("special")}
    types = [3 if t in special else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    for m in merges:
        if m.count(" ") != 1:
            raise ValueError(f"{path}: merge {m!r} is not two tokens")
    return {"tokens": tokens, "types": types, "merges": merges,
            "bos": vocab[BOS], "eos": vocab[EOS]}

"""A word-level stand-in for the BPE tokenizer, for CPU tests where
Hugging Face `tokenizers` is missing.  It splits text with (an ASCII
approximation of) GPT-2's pre-tokenizer regex and gives each known
pre-token one id, unknown ones one id per character."""

import json
import re

SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
SPECIALS = ["<|bos|>", "<|eos|>"]


class ToyTok:
    def __init__(self, tokens):
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.bos_id, self.eos_id = 0, 1
        self.vocab_size = len(tokens)

    @classmethod
    def build(cls, texts, path=None):
        seen = dict.fromkeys(SPECIALS)
        for c in range(32, 127):
            seen[chr(c)] = None
        seen["\n"] = None
        for t in texts:
            for p in SPLIT.findall(t):
                seen[p] = None
        tok = cls(list(seen))
        if path:
            with open(path, "w") as f:
                json.dump(tok.tokens, f)
        return tok

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def encode(self, text):
        out = []
        for p in SPLIT.findall(text):
            if p in self.ids:
                out.append(self.ids[p])
            else:
                out.extend(self.ids[c] for c in p)
        return out

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(self.tokens[i] for i in ids if i > 1)

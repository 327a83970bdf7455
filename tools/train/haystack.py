"""Haystacks and RULER-style needles, built in token space.

The haystack mixes public-domain prose (King James Bible verses, in runs of
consecutive verses) with sentences of words drawn at random from the same
text by their frequency: about 80% of the tokens are such shuffled words,
which a model cannot memorise, and 20% prose.  Needles are planted between
sentences.  Kinds (as RULER names them):

  single      one needle; ask for its value
  multikey    needles with distinct keys; ask for the value of one of them,
              drawn at random (MULTIKEY_ASK below)
  multivalue  one key carries 4 values; ask for all of them
  multiquery  4 needles with 4 keys; ask for all 4 values

Values are numbers (6 digits), words, or UUID-like hex strings
(8-4-4 hex digits, shorter than a real UUID so that a 12M model can copy it).

A sample is a list of pieces.  Each piece starts at a pre-token boundary of
the GPT-2 regex (a leading space or newline) and ends with a letter, digit or
punctuation mark, so the token ids of the whole text are the concatenation of
the ids of its pieces.  That lets a training step assemble 64K tokens from
cached ids instead of tokenizing text; `check_canonical` verifies it against
the real tokenizer.

Only numpy is needed here; the tokenizer is any object with
`encode(str) -> list[int]`, `bos_id` and `eos_id`.
"""

import gzip
import re
from dataclasses import dataclass, field

import numpy as np

KINDS = ("single", "multikey", "multivalue", "multiquery")
VALUE_TYPES = ("number", "word", "uuid")
NOUN = {"number": "number", "word": "word", "uuid": "code"}
PROSE_SHARE = 0.2
N_MULTI = 4  # values of multivalue, queries of multiquery, keys of eval multikey
# Which key of a multikey group the question asks: "random" (one drawn from
# the sample's rng; the default, for training and evaluation) or "first"
# (always the first planted needle: what sift-needle-14m v1 was trained and
# evaluated on, kept only to reproduce that model and its tokenizer; a
# model can pass it by answering the group's first needle, models/README.md).
MULTIKEY_ASK = ("random", "first")


def load_kjv(path):
    """Verses of the KJV text dumped by tools/train/kjv.sh (one per line,
    reference first), without their references."""
    opener = gzip.open if str(path).endswith(".gz") else open
    verses = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            ref, _, text = line.partition(" ")
            text = " ".join(text.split())
            if text:
                verses.append(text)
    if len(verses) < 1000:
        raise ValueError(f"{path}: only {len(verses)} verses; expected the whole KJV")
    return verses


class Corpus:
    """The verses and the word list (with frequencies) drawn from them."""

    def __init__(self, verses):
        self.verses = verses
        counts = {}
        for v in verses:
            for w in re.findall(r"[A-Za-z]+", v):
                counts[w] = counts.get(w, 0) + 1
        self.words = sorted(counts)
        c = np.array([counts[w] for w in self.words], dtype=np.float64)
        self.word_p = c / c.sum()
        # keys and word values: lowercase words of 5..10 letters seen a few times
        self.key_words = [w for w in self.words
                          if w.islower() and 5 <= len(w) <= 10 and counts[w] >= 3]
        self.value_words = [w for w in self.words
                            if w.islower() and 4 <= len(w) <= 9 and counts[w] >= 3]


# ---------------------------------------------------------------- needle text

def needle_text(key, value, vtype):
    return f" One of the special magic {NOUN[vtype]}s for {key} is: {value}."


def preamble_text(vtype):
    n = NOUN[vtype]
    return (f"Some special magic {n}s are hidden within the following text. "
            f"Make sure to memorize it. I will quiz you about the {n}s afterwards.\n")


def join_list(items):
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def question_text(kind, keys, vtype):
    n = NOUN[vtype]
    if kind in ("single", "multikey"):
        k = keys[0]
        return (f"\nQuestion: What is the special magic {n} for {k} mentioned in the text? "
                f"Answer: The special magic {n} for {k} is")
    if kind == "multivalue":
        k = keys[0]
        return (f"\nQuestion: What are all the special magic {n}s for {k} mentioned in the text? "
                f"Answer: The special magic {n}s for {k} are")
    ks = join_list(keys)
    return (f"\nQuestion: What are the special magic {n}s for {ks} mentioned in the text? "
            f"Answer: The special magic {n}s for {ks} are")


def answer_text(values):
    return " " + join_list(values) + "."


def random_value(rng, vtype, corpus):
    if vtype == "number":
        return str(int(rng.integers(100000, 1000000)))
    if vtype == "word":
        return corpus.value_words[int(rng.integers(len(corpus.value_words)))]
    h = "0123456789abcdef"
    d = rng.integers(0, 16, size=16)
    s = "".join(h[i] for i in d)
    return f"{s[:8]}-{s[8:12]}-{s[12:]}"


@dataclass
class Task:
    """What a sample asks: the needles (key, value) in planting order, the
    keys the question names, the expected values in answer order."""
    kind: str
    vtype: str
    needles: list
    query_keys: list
    answers: list


def make_task(rng, kind, vtype, corpus, n_keys=None, multikey_ask="random"):
    if multikey_ask not in MULTIKEY_ASK:
        raise ValueError(f"unknown multikey_ask {multikey_ask!r}; expected one of {MULTIKEY_ASK}")
    if n_keys is None:
        n_keys = N_MULTI
    if kind == "multikey":
        nk = max(2, n_keys)
    elif kind == "multiquery":
        nk = N_MULTI
    else:
        nk = 1
    keys = []
    while len(keys) < nk:
        k = corpus.key_words[int(rng.integers(len(corpus.key_words)))]
        if k not in keys:
            keys.append(k)

    def distinct_values(n):
        vals = []
        while len(vals) < n:
            v = random_value(rng, vtype, corpus)
            if v not in vals:
                vals.append(v)
        return vals

    if kind == "single":
        v = distinct_values(1)
        return Task(kind, vtype, [(keys[0], v[0])], [keys[0]], v)
    if kind == "multikey":
        v = distinct_values(nk)
        needles = list(zip(keys, v))
        i = int(rng.integers(nk)) if multikey_ask == "random" else 0
        return Task(kind, vtype, needles, [keys[i]], [v[i]])
    if kind == "multivalue":
        v = distinct_values(N_MULTI)
        return Task(kind, vtype, [(keys[0], x) for x in v], [keys[0]], v)
    if kind == "multiquery":
        v = distinct_values(nk)
        needles = list(zip(keys, v))
        order = list(rng.permutation(nk))
        return Task(kind, vtype, needles, [keys[i] for i in order], [v[i] for i in order])
    raise ValueError(f"unknown needle kind {kind!r}; expected one of {KINDS}")


# ---------------------------------------------------------------- token space

class TokenSpace:
    """Cached token ids of the corpus pieces for one tokenizer."""

    def __init__(self, corpus, tok):
        self.corpus = corpus
        self.tok = tok
        vids = tok.encode_batch([" " + v for v in corpus.verses])
        self.v_len = np.array([len(x) for x in vids], dtype=np.int64)
        self.v_off = np.concatenate([[0], np.cumsum(self.v_len)])
        self.v_flat = np.concatenate([np.asarray(x, dtype=np.int32) for x in vids])
        wids = tok.encode_batch([" " + w for w in corpus.words])
        self.w_len = np.array([len(x) for x in wids], dtype=np.int64)
        self.w_off = np.concatenate([[0], np.cumsum(self.w_len)])[:-1]
        self.w_flat = np.concatenate([np.asarray(x, dtype=np.int32) for x in wids])
        p = tok.encode(".")
        if len(p) != 1:
            raise ValueError("the tokenizer must keep '.' as one token")
        self.period = p[0]
        single = np.nonzero(self.w_len == 1)[0]
        if len(single) < 10:
            raise ValueError("the tokenizer has too few one-token words to fill a haystack")
        sp = corpus.word_p[single]
        self.single = single
        self.single_p = sp / sp.sum()

    def gather_words(self, idx):
        """Ids of the words `idx` (each ' word'), concatenated."""
        lens = self.w_len[idx]
        starts = self.w_off[idx]
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int32)
        base = np.repeat(starts - (np.cumsum(lens) - lens), lens)
        return self.w_flat[base + np.arange(total)]


@dataclass
class Sentence:
    kind: str      # 'v' verse, 'w' shuffled words, 'f' filler words, 'n' needle
    ref: object    # verse index, word index array, or needle text
    ids: np.ndarray = field(repr=False)

    def text(self, corpus):
        if self.kind == "v":
            return " " + corpus.verses[self.ref]
        if self.kind == "w":
            return " " + " ".join(corpus.words[i] for i in self.ref) + "."
        if self.kind == "f":
            return " " + " ".join(corpus.words[i] for i in self.ref)
        return self.ref


def haystack(rng, ts, n_tokens):
    """Sentences whose ids sum to exactly n_tokens: runs of consecutive
    verses (about PROSE_SHARE of the tokens) between runs of shuffled-word
    sentences, the tail filled with one-token words."""
    c = ts.corpus
    out = []
    total = 0
    prose = 0
    while total < n_tokens:
        if prose < PROSE_SHARE * (total + 1):
            start = int(rng.integers(len(c.verses) - 8))
            for i in range(start, start + int(rng.integers(2, 8))):
                ids = ts.v_flat[ts.v_off[i]:ts.v_off[i + 1]]
                out.append(Sentence("v", i, ids))
                total += len(ids)
                prose += len(ids)
        else:
            n_sent = int(rng.integers(3, 9))
            lens = rng.integers(6, 19, size=n_sent)
            idx = rng.choice(len(c.words), size=int(lens.sum()), p=c.word_p)
            pos = 0
            for n in lens:
                w = idx[pos:pos + n]
                pos += n
                ids = np.concatenate([ts.gather_words(w), [ts.period]]).astype(np.int32)
                out.append(Sentence("w", w, ids))
                total += len(ids)
    # drop whole sentences past the budget, then fill the gap with one-token words
    while total > n_tokens:
        total -= len(out.pop().ids)
    gap = n_tokens - total
    if gap:
        w = ts.single[rng.choice(len(ts.single), size=gap, p=ts.single_p)]
        out.append(Sentence("f", w, ts.w_flat[ts.w_off[w]]))
    return out


@dataclass
class Sample:
    ids: np.ndarray          # BOS + prompt (+ answer + EOS when training)
    answer_mask: np.ndarray  # 1 on the answer tokens and the EOS
    prompt_len: int          # tokens before the answer
    task: Task
    depths: list             # token offset of each needle in ids
    pieces: list = field(repr=False)

    def text(self, corpus):
        return "".join(p if isinstance(p, str) else p.text(corpus) for p in self.pieces)


def build(rng, ts, task, length, depth=None, with_answer=True, needle_depths=None):
    """A sample of exactly `length` tokens (BOS included; with the answer and
    EOS when with_answer).  depth in [0, 1] places every needle at that
    fraction of the haystack; None draws one depth per needle;
    needle_depths (one per needle, in planting order) overrides both.
    Needles at the same boundary stand side by side in planting order."""
    tok = ts.tok
    pre = preamble_text(task.vtype)
    q = question_text(task.kind, task.query_keys, task.vtype)
    a = answer_text(task.answers)
    pre_ids, q_ids, a_ids = tok.encode(pre), tok.encode(q), tok.encode(a)
    needles = [needle_text(k, v, task.vtype) for k, v in task.needles]
    n_ids = [np.asarray(tok.encode(t), dtype=np.int32) for t in needles]
    fixed = 1 + len(pre_ids) + len(q_ids) + sum(len(x) for x in n_ids)
    if with_answer:
        fixed += len(a_ids) + 1
    budget = length - fixed
    if budget < 16:
        raise ValueError(f"length {length} leaves only {budget} haystack tokens")
    hay = haystack(rng, ts, budget)
    # sentence boundaries as token offsets within the haystack
    bounds = np.concatenate([[0], np.cumsum([len(s.ids) for s in hay])])
    places = []
    if needle_depths is not None and len(needle_depths) != len(needles):
        raise ValueError(f"{len(needle_depths)} depths for {len(needles)} needles")
    for i in range(len(needles)):
        if needle_depths is not None:
            d = needle_depths[i]
        else:
            d = float(rng.random()) if depth is None else depth
        places.append(int(np.argmin(np.abs(bounds - d * budget))))
    # insert from the back so earlier indices stay valid; equal places keep planting order
    order = sorted(range(len(needles)), key=lambda i: (places[i], i), reverse=True)
    for i in order:
        hay.insert(places[i], Sentence("n", needles[i], n_ids[i]))
    pieces = [pre] + hay + [q]
    ids = [np.array([tok.bos_id], dtype=np.int32), np.asarray(pre_ids, dtype=np.int32)]
    ids += [s.ids for s in hay]
    ids.append(np.asarray(q_ids, dtype=np.int32))
    prompt_len = sum(len(x) for x in ids)
    if with_answer:
        pieces.append(a)
        ids.append(np.asarray(a_ids, dtype=np.int32))
        ids.append(np.array([tok.eos_id], dtype=np.int32))
    ids = np.concatenate(ids).astype(np.int64)
    assert len(ids) == length, (len(ids), length)
    mask = np.zeros(length, dtype=np.float32)
    mask[prompt_len:] = 1.0 if with_answer else 0.0
    offs = []
    pos = 1 + len(pre_ids)
    for s in hay:
        if s.kind == "n":
            offs.append(pos)
        pos += len(s.ids)
    return Sample(ids, mask, prompt_len, task, offs, pieces)


def check_canonical(sample, ts):
    """True when the tokenizer, given the sample's text, yields its ids
    (without BOS)."""
    return list(ts.tok.encode(sample.text(ts.corpus))) == [int(x) for x in sample.ids[1:]]


# ---------------------------------------------------------------- scoring

def score(generated, answers):
    """RULER's string_match_all: the fraction of expected values found in
    the generated text; and exact: the generated answer equals the expected
    answer text."""
    found = sum(1 for a in answers if a in generated)
    exact = generated.strip().rstrip(".").strip() == answer_text(answers).strip().rstrip(".")
    return found / len(answers), exact


# ---------------------------------------------------------------- training mix

TRAIN_KIND_P = {"single": 0.3, "multikey": 0.3, "multivalue": 0.2, "multiquery": 0.2}
TRAIN_VTYPE_P = {"number": 0.5, "word": 0.25, "uuid": 0.25}


def train_batch(rng, ts, length, batch, multikey_ask="random"):
    """`batch` samples of `length` tokens with random kinds, value types and
    depths: ids [batch, length] int64 and answer mask [batch, length]."""
    def task(r, kind, vtype):
        n_keys = int(r.integers(2, 9)) if kind == "multikey" else None
        return make_task(r, kind, vtype, ts.corpus, n_keys, multikey_ask)
    return _batch(rng, ts, length, batch, TRAIN_KIND_P, TRAIN_VTYPE_P, task, None)


def _batch(rng, ts, length, batch, kind_p, vtype_p, task_fn, depth_fn):
    """A batch of a mix: kinds and value types drawn by kind_p and vtype_p,
    tasks by task_fn(rng, kind, vtype), needle depths by depth_fn(rng, n)
    (None: build draws one per needle after the haystack)."""
    kinds = list(kind_p)
    kp = np.array([kind_p[k] for k in kinds])
    vts = list(vtype_p)
    vp = np.array([vtype_p[v] for v in vts])
    ids = np.empty((batch, length), dtype=np.int64)
    mask = np.empty((batch, length), dtype=np.float32)
    for b in range(batch):
        kind = kinds[int(rng.choice(len(kinds), p=kp))]
        vtype = vts[int(rng.choice(len(vts), p=vp))]
        task = task_fn(rng, kind, vtype)
        depths = depth_fn(rng, len(task.needles)) if depth_fn else None
        s = build(rng, ts, task, length, needle_depths=depths)
        ids[b] = s.ids
        mask[b] = s.answer_mask
    return ids, mask


# ---------------------------------------------------------------- fine-tune mixes
#
# The fine-tunes (stage 2, stage 3) start from a trained model and drill
# key/value binding: mostly multikey, a share of the time with keys that
# share their first letters with the asked key, the asked key anywhere
# among them; and the needles of a sample side by side at one depth part of
# the time (as the evaluations and sift's harness plant them), else
# scattered or in a few clusters.  Single, multivalue and multiquery samples
# and the haystack's LM loss stay in the mix so that nothing else is
# forgotten.
#
# stage 2 (mix "multikey"): tried from v1, not shipped (models/README.md).
# stage 3 (mix "stage3"): from v2; multikey with 2..10 keys, a larger share
# of multivalue and multiquery than stage 2 kept (they were v2's weaker
# kinds besides multikey), similar keys a quarter of the time.


@dataclass(frozen=True)
class FineTuneMix:
    kind_p: dict      # needle kind -> probability
    keys: tuple       # multikey: keys from keys[0] to keys[1], the asked one among them
    similar: float    # share of multikey samples with similar keys
    layout_p: dict    # needle layout -> probability (layout_depths)


STAGE2 = FineTuneMix({"single": 0.15, "multikey": 0.55, "multivalue": 0.1, "multiquery": 0.2},
                     (2, 12), 1 / 3, {"group": 0.5, "scatter": 0.3, "clusters": 0.2})
STAGE3 = FineTuneMix({"single": 0.15, "multikey": 0.45, "multivalue": 0.2, "multiquery": 0.2},
                     (2, 10), 1 / 4, {"group": 0.5, "scatter": 0.3, "clusters": 0.2})
FINE_TUNES = {"multikey": STAGE2, "stage3": STAGE3}
MIXES = ("base",) + tuple(FINE_TUNES)


def _prefix_index(corpus, n):
    cache = corpus.__dict__.setdefault("_prefixes", {})
    if n not in cache:
        idx = {}
        for w in corpus.key_words:
            idx.setdefault(w[:n], []).append(w)
        cache[n] = idx
    return cache[n]


def similar_keys(rng, corpus, n):
    """n distinct key words that share their first 3 letters (else 2, else
    1) where the key list allows; none is a prefix of another, so each key
    names one needle only."""
    first = corpus.key_words[int(rng.integers(len(corpus.key_words)))]
    keys = [first]
    for plen in (3, 2, 1):
        group = _prefix_index(corpus, plen).get(first[:plen], [])
        for j in rng.permutation(len(group)):
            w = group[int(j)]
            if len(keys) == n:
                break
            if all(not (w.startswith(k) or k.startswith(w)) for k in keys):
                keys.append(w)
        if len(keys) == n:
            return keys
    while len(keys) < n:
        w = corpus.key_words[int(rng.integers(len(corpus.key_words)))]
        if all(not (w.startswith(k) or k.startswith(w)) for k in keys):
            keys.append(w)
    return keys


def make_task_fine(rng, kind, vtype, corpus, mix=STAGE2):
    """A task of a fine-tune mix: multikey with mix.keys keys (similar ones
    mix.similar of the time), planted in a random order so that the asked
    key may come anywhere; the other kinds as make_task."""
    if kind != "multikey":
        return make_task(rng, kind, vtype, corpus)
    nk = int(rng.integers(mix.keys[0], mix.keys[1] + 1))
    if rng.random() < mix.similar:
        keys = similar_keys(rng, corpus, nk)
    else:
        keys = []
        while len(keys) < nk:
            k = corpus.key_words[int(rng.integers(len(corpus.key_words)))]
            if k not in keys:
                keys.append(k)
    vals = []
    while len(vals) < nk:
        v = random_value(rng, vtype, corpus)
        if v not in vals:
            vals.append(v)
    order = [int(i) for i in rng.permutation(nk)]
    needles = [(keys[i], vals[i]) for i in order]
    return Task(kind, vtype, needles, [keys[0]], [vals[0]])


def make_task_stage2(rng, kind, vtype, corpus):
    """A task of stage 2's mix (make_task_fine with STAGE2)."""
    return make_task_fine(rng, kind, vtype, corpus, STAGE2)


def layout_depths(rng, n, layout_p=None):
    """One depth per needle: all at one depth ('group'), each its own
    ('scatter'), or 2-3 clusters, drawn by layout_p (stage 2's by default)."""
    layout_p = layout_p or STAGE2.layout_p
    names = list(layout_p)
    p = np.array([layout_p[k] for k in names])
    lay = names[int(rng.choice(len(names), p=p))]
    if n == 1 or lay == "scatter":
        return [float(x) for x in rng.random(n)]
    if lay == "group":
        return [float(rng.random())] * n
    centres = rng.random(int(rng.integers(2, 4)))
    return [float(centres[int(rng.integers(len(centres)))]) for _ in range(n)]


def fine_batch(rng, ts, length, batch, mix):
    """train_batch for a fine-tune mix (FineTuneMix, above)."""
    return _batch(rng, ts, length, batch, mix.kind_p, TRAIN_VTYPE_P,
                  lambda r, k, v: make_task_fine(r, k, v, ts.corpus, mix),
                  lambda r, n: layout_depths(r, n, mix.layout_p))


def stage2_batch(rng, ts, length, batch):
    """train_batch for stage 2's mix."""
    return fine_batch(rng, ts, length, batch, STAGE2)


def mix_batch(mix, rng, ts, length, batch, multikey_ask="random"):
    if mix == "base":
        return train_batch(rng, ts, length, batch, multikey_ask)
    if mix in FINE_TUNES:
        return fine_batch(rng, ts, length, batch, FINE_TUNES[mix])
    raise ValueError(f"unknown data mix {mix!r}; expected one of {MIXES}")


def tokenizer_corpus(rng, corpus, n_samples=20000):
    """Text for training the BPE: every verse, shuffled-word sentences in the
    haystack's proportion, and needles, questions and answers of every kind
    and value type.  Its multikey questions ask the first key, as when the
    shipped tokenizer (models/tokenizer.json) was trained, so that the
    same seed rebuilds the same tokenizer."""
    yield from corpus.verses
    for i in range(n_samples):
        kind = KINDS[i % len(KINDS)]
        vtype = VALUE_TYPES[(i // len(KINDS)) % len(VALUE_TYPES)]
        task = make_task(rng, kind, vtype, corpus, int(rng.integers(2, 9)), multikey_ask="first")
        idx = rng.choice(len(corpus.words), size=200, p=corpus.word_p)
        words = " ".join(corpus.words[j] for j in idx)
        parts = [preamble_text(vtype), words]
        parts += [needle_text(k, v, vtype) for k, v in task.needles]
        parts.append(question_text(kind, task.query_keys, vtype))
        parts.append(answer_text(task.answers))
        yield "".join(parts)

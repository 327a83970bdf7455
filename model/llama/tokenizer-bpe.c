/* sift — the "gpt2" tokenizer: byte-level BPE.
 *
 * A pre-tokenizer regex (chosen by tokenizer.ggml.pre) cuts the text into
 * pre-tokens; the text between matches is a pre-token too. Each byte of a
 * pre-token stands as one printable character (GPT-2's byte map), whose
 * vocabulary entry is the starting symbol; the adjacent pair with the lowest
 * merge rank merges first (ties: the leftmost), until no pair has a merge.
 * A heap of candidate pairs keeps this O(n log n) in the pre-token's length. */
#include "tokenizer-private.h"

#include <sift/error.h>
#include <string.h>

/* GPT-2's byte map: bytes that print as themselves in Latin-1 ('!'..'~',
 * '¡'..'¬', '®'..'ÿ') keep their code point; the others, in byte order, take
 * U+0100, U+0101, ... so that no pre-token contains a space or a control. */
static gunichar
byte_char (guint8 b)
{
  if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))
    return b;
  int k = 0; /* how many unprintable bytes come before b */
  for (int i = 0; i < b; i++)
    if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae)))
      k++;
  return 0x100 + (gunichar) k;
}

/* The inverse map: code points below 0x144 -> byte, or -1. */
static gint16 char_byte[0x144];
static char byte_utf8[256][3]; /* UTF-8 of each byte's character, NUL-padded */
static guint8 byte_utf8_len[256];

static gpointer
init_byte_map (gpointer unused)
{
  (void) unused;
  memset (char_byte, 0xff, sizeof char_byte);
  for (int b = 0; b < 256; b++)
    {
      gunichar c = byte_char ((guint8) b);
      char_byte[c] = (gint16) b;
      byte_utf8_len[b] = (guint8) g_unichar_to_utf8 (c, byte_utf8[b]);
    }
  return NULL;
}

static void
ensure_byte_map (void)
{
  static GOnce once = G_ONCE_INIT;
  g_once (&once, init_byte_map, NULL);
}

void
tokenizer_bpe_unmap (const char *text, gsize len, GString *out)
{
  ensure_byte_map ();
  for (const char *p = text, *end = text + len; p < end; p = g_utf8_next_char (p))
    {
      gunichar c = g_utf8_get_char (p);
      if (c < G_N_ELEMENTS (char_byte) && char_byte[c] >= 0)
        g_string_append_c (out, (char) char_byte[c]);
      else /* a character outside the map (an added token's text): itself */
        g_string_append_len (out, p, g_utf8_next_char (p) - p);
    }
}

/* ---- pre-tokenizers ---- */

/* The patterns of the tokenizer.json files these models ship, as PCRE2 reads
 * them. The contractions of Llama 3 and Qwen2 are case-insensitive there
 * ((?i:'s|...)); they are spelt out here ('[sS]) as llama.cpp does, so that
 * PCRE2's caseless matching (which folds 'ſ' to 's') does not widen them. */
#define PAT_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define PAT_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define PAT_LLAMA3 PAT_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define PAT_QWEN2 PAT_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
  const char *name;      /* canonical */
  const char *aliases[4];
  const char *patterns[4]; /* applied in turn */
  gboolean ignore_merges;
} PreTokenizer;

static const PreTokenizer pre_tokenizers[] = {
  /* llama.cpp's fallback: punctuation runs, GPT-2's split, digit runs, then
   * digits three at a time */
  { "default", { NULL },
    { "[\\p{P}\\$\\+<=>\\^~\\|]+", PAT_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" }, FALSE },
  { "gpt-2", { "gpt2", NULL }, { PAT_GPT2 }, FALSE },
  { "llama3", { "llama-bpe", "llama-v3", NULL }, { PAT_LLAMA3 }, TRUE },
  { "qwen2", { NULL }, { PAT_QWEN2 }, FALSE },
};

static const PreTokenizer *
find_pre (const char *name)
{
  for (gsize i = 0; i < G_N_ELEMENTS (pre_tokenizers); i++)
    {
      const PreTokenizer *p = &pre_tokenizers[i];
      if (g_strcmp0 (name, p->name) == 0)
        return p;
      for (const char *const *a = p->aliases; *a != NULL; a++)
        if (g_strcmp0 (name, *a) == 0)
          return p;
    }
  return NULL;
}

static gboolean
init_pre (SiftTokenizer *self, const char *name, const char *source, GError **error)
{
  const PreTokenizer *p = find_pre (name != NULL ? name : "default");
  if (p == NULL)
    {
      g_autoptr (GString) known = g_string_new (NULL);
      for (gsize i = 0; i < G_N_ELEMENTS (pre_tokenizers); i++)
        {
          g_string_append_printf (known, "%s%s", i > 0 ? ", " : "", pre_tokenizers[i].name);
          for (const char *const *a = pre_tokenizers[i].aliases; *a != NULL; a++)
            g_string_append_printf (known, ", %s", *a);
        }
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.pre \"%s\" is not supported (supported: %s)", source, name,
                   known->str);
      return FALSE;
    }
  self->pre = g_strdup (p->name);
  self->ignore_merges = p->ignore_merges;
  while (self->n_regex < (gint32) G_N_ELEMENTS (p->patterns) && p->patterns[self->n_regex] != NULL)
    self->n_regex++;
  self->regex = g_new0 (GRegex *, self->n_regex);
  for (gint32 i = 0; i < self->n_regex; i++)
    {
      /* (*UCP): \s, \d and friends follow Unicode, as the reference tokenizers' do */
      g_autofree char *pattern = g_strconcat ("(*UCP)", p->patterns[i], NULL);
      self->regex[i] = g_regex_new (pattern, G_REGEX_OPTIMIZE, 0, error);
      if (self->regex[i] == NULL)
        {
          g_prefix_error (error, "%s: pre-tokenizer %s: ", source, p->name);
          return FALSE;
        }
    }
  return TRUE;
}

typedef struct {
  gsize off, len;
} Span;

/* Cuts each span by the regex's matches; the text between matches stays a span. */
static void
split (const GRegex *regex, const char *text, const GArray *in, GArray *out)
{
  g_array_set_size (out, 0);
  for (guint s = 0; s < in->len; s++)
    {
      Span sp = g_array_index (in, Span, s);
      GMatchInfo *mi = NULL;
      gsize pos = 0;
      g_regex_match_full (regex, text + sp.off, (gssize) sp.len, 0, 0, &mi, NULL);
      while (g_match_info_matches (mi))
        {
          gint start, end;
          g_match_info_fetch_pos (mi, 0, &start, &end);
          if ((gsize) start > pos)
            g_array_append_val (out, ((Span) { sp.off + pos, (gsize) start - pos }));
          if (end > start)
            g_array_append_val (out, ((Span) { sp.off + (gsize) start, (gsize) (end - start) }));
          pos = MAX (pos, (gsize) end);
          g_match_info_next (mi, NULL);
        }
      g_match_info_free (mi);
      if (pos < sp.len)
        g_array_append_val (out, ((Span) { sp.off + pos, sp.len - pos }));
    }
}

/* ---- merges ---- */

static guint32
merge_hash (guint64 key)
{
  return (guint32) ((key * G_GUINT64_CONSTANT (0x9E3779B97F4A7C15)) >> 32);
}

const MergeSlot *
tokenizer_merge (const SiftTokenizer *self, gint32 left, gint32 right)
{
  guint64 key = (guint64) (guint32) left << 32 | (guint32) right;
  for (guint32 i = merge_hash (key) & self->merge_mask;; i = (i + 1) & self->merge_mask)
    {
      const MergeSlot *m = &self->merges[i];
      if (m->key == key)
        return m;
      if (m->key == G_MAXUINT64)
        return NULL;
    }
}

static gboolean
merge_error (const char *source, gint32 i, const char *merge, const char *what, GError **error)
{
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
               "%s: tokenizer.ggml.merges[%d] \"%s\" %s", source, i, merge, what);
  return FALSE;
}

/* Every merge names two vocabulary entries and makes a third. */
static gboolean
init_merges (SiftTokenizer *self, const SiftTokenizerSpec *spec, const char *source, GError **error)
{
  if (spec->n_merges < 0 || (spec->n_merges > 0 && spec->merges == NULL))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.merges is missing (%d merges)", source, spec->n_merges);
      return FALSE;
    }
  guint32 size = 16;
  while (size < 2u * (guint32) spec->n_merges)
    size *= 2;
  self->merge_mask = size - 1;
  self->merges = g_new (MergeSlot, size);
  for (guint32 i = 0; i < size; i++)
    self->merges[i].key = G_MAXUINT64;
  g_autoptr (GString) both = g_string_new (NULL);
  for (gint32 r = 0; r < spec->n_merges; r++)
    {
      const char *m = spec->merges[r];
      const char *sp = m != NULL && m[0] != '\0' ? strchr (m + 1, ' ') : NULL;
      if (sp == NULL)
        return merge_error (source, r, m != NULL ? m : "", "is not two tokens separated by a space", error);
      gint32 left = tokenizer_find (self, m, (gsize) (sp - m));
      gint32 right = tokenizer_find (self, sp + 1, strlen (sp + 1));
      if (left < 0 || right < 0)
        {
          g_autofree char *what = g_strdup_printf ("names \"%.*s\", which is not in tokenizer.ggml.tokens",
                                                   left < 0 ? (int) (sp - m) : (int) strlen (sp + 1),
                                                   left < 0 ? m : sp + 1);
          return merge_error (source, r, m, what, error);
        }
      g_string_assign (both, self->text[left]);
      g_string_append (both, self->text[right]);
      gint32 result = tokenizer_find (self, both->str, both->len);
      if (result < 0)
        {
          g_autofree char *what = g_strdup_printf ("makes \"%s\", which is not in tokenizer.ggml.tokens", both->str);
          return merge_error (source, r, m, what, error);
        }
      guint64 key = (guint64) (guint32) left << 32 | (guint32) right;
      guint32 i = merge_hash (key) & self->merge_mask;
      while (self->merges[i].key != G_MAXUINT64 && self->merges[i].key != key)
        i = (i + 1) & self->merge_mask;
      if (self->merges[i].key == key) /* a repeated merge keeps its first rank */
        continue;
      self->merges[i] = (MergeSlot) { key, r, result };
    }
  return TRUE;
}

gboolean
tokenizer_bpe_init (SiftTokenizer *self, const SiftTokenizerSpec *spec, const char *source, GError **error)
{
  ensure_byte_map ();
  for (int b = 0; b < 256; b++)
    {
      self->byte_token[b] = tokenizer_find (self, byte_utf8[b], byte_utf8_len[b]);
      if (self->byte_token[b] < 0)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                       "%s: the gpt2 vocabulary has no token for byte 0x%02x (\"%.*s\")", source, b,
                       (int) byte_utf8_len[b], byte_utf8[b]);
          return FALSE;
        }
    }
  return init_merges (self, spec, source, error) && init_pre (self, spec->pre, source, error);
}

void
tokenizer_bpe_clear (SiftTokenizer *self)
{
  for (gint32 i = 0; i < self->n_regex; i++)
    if (self->regex[i] != NULL)
      g_regex_unref (self->regex[i]);
  g_free (self->regex);
  g_free (self->merges);
}

/* ---- encode ---- */

static void
try_pair (const SiftTokenizer *self, const Symbol *sym, gint32 left, gint32 right, BigramHeap *heap)
{
  if (left < 0 || right < 0)
    return;
  const MergeSlot *m = tokenizer_merge (self, sym[left].id, sym[right].id);
  if (m != NULL)
    bigram_heap_push (heap, (Bigram) { -(float) m->rank, left, right, (guint32) m->result });
}

static void
encode_word (const SiftTokenizer *self, const guint8 *w, gsize n, GString *mapped, Symbol *sym,
             BigramHeap *heap, GArray *ids)
{
  if (self->ignore_merges)
    {
      g_string_truncate (mapped, 0);
      for (gsize i = 0; i < n; i++)
        g_string_append_len (mapped, byte_utf8[w[i]], byte_utf8_len[w[i]]);
      gint32 id = tokenizer_find (self, mapped->str, mapped->len);
      if (id >= 0)
        {
          g_array_append_val (ids, id);
          return;
        }
    }
  for (gsize i = 0; i < n; i++)
    sym[i] = (Symbol) { (gint32) i - 1, i + 1 < n ? (gint32) i + 1 : -1, (guint32) i, 1,
                        self->byte_token[w[i]] };
  heap->n = 0;
  for (gsize i = 1; i < n; i++)
    try_pair (self, sym, (gint32) i - 1, (gint32) i, heap);
  while (heap->n > 0)
    {
      Bigram b = bigram_heap_pop (heap);
      Symbol *l = &sym[b.left], *r = &sym[b.right];
      /* stale: a side merged elsewhere since the pair was queued */
      if (l->len == 0 || r->len == 0 || l->next != b.right)
        continue;
      const MergeSlot *m = tokenizer_merge (self, l->id, r->id);
      if (m == NULL || m->result != (gint32) b.size)
        continue;
      l->id = m->result;
      l->len += r->len;
      r->len = 0;
      l->next = r->next;
      if (r->next >= 0)
        sym[r->next].prev = b.left;
      try_pair (self, sym, l->prev, b.left, heap);
      try_pair (self, sym, b.left, l->next, heap);
    }
  for (gint32 i = 0; i >= 0; i = sym[i].next)
    g_array_append_val (ids, sym[i].id);
}

void
tokenizer_bpe_encode (const SiftTokenizer *self, const char *text, gsize len, GArray *ids)
{
  ensure_byte_map ();
  g_autoptr (GArray) spans = g_array_new (FALSE, FALSE, sizeof (Span));
  g_autoptr (GArray) next = g_array_new (FALSE, FALSE, sizeof (Span));
  if (len == 0)
    return;
  g_array_append_val (spans, ((Span) { 0, len }));
  for (gint32 r = 0; r < self->n_regex; r++)
    {
      split (self->regex[r], text, spans, next);
      GArray *t = spans;
      spans = next;
      next = t;
    }
  gsize longest = 0;
  for (guint s = 0; s < spans->len; s++)
    longest = MAX (longest, g_array_index (spans, Span, s).len);
  g_autofree Symbol *sym = g_new (Symbol, longest);
  g_autoptr (GString) mapped = g_string_new (NULL);
  BigramHeap heap = { 0 };
  for (guint s = 0; s < spans->len; s++)
    {
      Span sp = g_array_index (spans, Span, s);
      encode_word (self, (const guint8 *) text + sp.off, sp.len, mapped, sym, &heap, ids);
    }
  g_free (heap.items);
}

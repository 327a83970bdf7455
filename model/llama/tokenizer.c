/* sift — GGUF tokenizers: the spec's validation, the vocabulary index, special
 * tokens, encode and decode. The two BPEs are tokenizer-spm.c and tokenizer-bpe.c. */
#include "tokenizer-private.h"

#include <sift/error.h>
#include <string.h>

#define SPACE_MARK "\xe2\x96\x81" /* U+2581 "▁", SentencePiece's space */

/* ---- vocabulary index ---- */

static guint32
hash_bytes (const char *s, gsize n)
{
  guint32 h = 2166136261u; /* FNV-1a */
  for (gsize i = 0; i < n; i++)
    h = (h ^ (guint8) s[i]) * 16777619u;
  return h;
}

gint32
tokenizer_find (const SiftTokenizer *self, const char *text, gsize len)
{
  for (guint32 i = hash_bytes (text, len) & self->index.mask;; i = (i + 1) & self->index.mask)
    {
      gint32 id = self->index.slots[i];
      if (id < 0)
        return -1;
      if (self->text_len[id] == len && memcmp (self->text[id], text, len) == 0)
        return id;
    }
}

/* Later duplicates of a text win, as in llama.cpp's token_to_id map. */
static void
index_build (SiftTokenizer *self)
{
  guint32 size = 16;
  while (size < 2u * (guint32) self->n_tokens)
    size *= 2;
  self->index.mask = size - 1;
  self->index.slots = g_new (gint32, size);
  memset (self->index.slots, 0xff, size * sizeof (gint32));
  for (gint32 id = 0; id < self->n_tokens; id++)
    {
      guint32 i = hash_bytes (self->text[id], self->text_len[id]) & self->index.mask;
      for (;; i = (i + 1) & self->index.mask)
        {
          gint32 old = self->index.slots[i];
          if (old < 0 || (self->text_len[old] == self->text_len[id]
                          && memcmp (self->text[old], self->text[id], self->text_len[id]) == 0))
            break;
        }
      self->index.slots[i] = id;
    }
}

/* ---- candidate merges ---- */

/* Higher priority first; among equals the leftmost, as llama.cpp orders them. */
static gboolean
bigram_better (const Bigram *a, const Bigram *b)
{
  return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

void
bigram_heap_push (BigramHeap *heap, Bigram b)
{
  if (heap->n == heap->cap)
    {
      heap->cap = MAX (16, heap->cap * 2);
      heap->items = g_renew (Bigram, heap->items, heap->cap);
    }
  gsize i = heap->n++;
  while (i > 0 && bigram_better (&b, &heap->items[(i - 1) / 2]))
    {
      heap->items[i] = heap->items[(i - 1) / 2];
      i = (i - 1) / 2;
    }
  heap->items[i] = b;
}

Bigram
bigram_heap_pop (BigramHeap *heap)
{
  g_assert (heap->n > 0);
  Bigram top = heap->items[0];
  Bigram last = heap->items[--heap->n];
  gsize i = 0;
  for (;;)
    {
      gsize c = 2 * i + 1;
      if (c >= heap->n)
        break;
      if (c + 1 < heap->n && bigram_better (&heap->items[c + 1], &heap->items[c]))
        c++;
      if (!bigram_better (&heap->items[c], &last))
        break;
      heap->items[i] = heap->items[c];
      i = c;
    }
  if (heap->n > 0)
    heap->items[i] = last;
  return top;
}

/* ---- construction ---- */

static const char *const eog_texts[] = {
  "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
  "<end_of_turn>", "<EOT>",
};

static gboolean
check_id (const char *source, const char *key, gint32 id, gint32 n_tokens, GError **error)
{
  if (id >= -1 && id < n_tokens)
    return TRUE;
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
               "%s: %s %d is outside the vocabulary (%d tokens)", source, key, id, n_tokens);
  return FALSE;
}

static gboolean
check_ids (SiftTokenizer *self, const SiftTokenizerSpec *spec, const char *source, GError **error)
{
  if (!check_id (source, "tokenizer.ggml.bos_token_id", spec->bos_id, spec->n_tokens, error)
      || !check_id (source, "tokenizer.ggml.eos_token_id", spec->eos_id, spec->n_tokens, error)
      || !check_id (source, "tokenizer.ggml.unknown_token_id", spec->unk_id, spec->n_tokens, error)
      || !check_id (source, "tokenizer.ggml.padding_token_id", spec->pad_id, spec->n_tokens, error))
    return FALSE;
  self->bos = spec->bos_id;
  self->eos = spec->eos_id;
  self->unk = spec->unk_id;
  self->pad = spec->pad_id;
  if (self->kind == TOKENIZER_LLAMA)
    {
      /* llama.cpp's defaults for a SentencePiece vocabulary that names none */
      if (self->unk < 0 && self->n_tokens > 0)
        self->unk = 0;
      if (self->bos < 0 && self->n_tokens > 1)
        self->bos = 1;
      if (self->eos < 0 && self->n_tokens > 2)
        self->eos = 2;
    }
  gboolean llama3 = self->kind == TOKENIZER_GPT2 && g_strcmp0 (self->pre, "llama3") == 0;
  self->add_bos = spec->add_bos >= 0 ? spec->add_bos != 0 : (self->kind == TOKENIZER_LLAMA || llama3);
  self->add_eos = spec->add_eos > 0;
  /* byte-level BPE has no "▁" to put first, whatever the file says */
  self->add_space_prefix = self->kind == TOKENIZER_LLAMA && spec->add_space_prefix != 0;
  if (self->add_bos && self->bos < 0)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is absent",
                   source);
      return FALSE;
    }
  if (self->add_eos && self->eos < 0)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is absent",
                   source);
      return FALSE;
    }
  return TRUE;
}

/* Token types: absent ones are normal, but the spec's BOS, EOS and padding are
 * control tokens and its unknown token is unknown, whatever the file says of them
 * when it says nothing. */
static gboolean
load_types (SiftTokenizer *self, const SiftTokenizerSpec *spec, const char *source, GError **error)
{
  self->types = g_new (guint8, self->n_tokens);
  for (gint32 i = 0; i < self->n_tokens; i++)
    {
      gint32 t = spec->token_types != NULL ? spec->token_types[i] : SIFT_TOKEN_TYPE_NORMAL;
      if (t < SIFT_TOKEN_TYPE_UNDEFINED || t > SIFT_TOKEN_TYPE_BYTE)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                       "%s: tokenizer.ggml.token_type[%d] is %d; the types are 0 to 6", source, i, t);
          return FALSE;
        }
      self->types[i] = (guint8) t;
    }
  if (spec->token_types == NULL)
    {
      gint32 control[] = { self->bos, self->eos, self->pad };
      for (gsize i = 0; i < G_N_ELEMENTS (control); i++)
        if (control[i] >= 0)
          self->types[control[i]] = SIFT_TOKEN_TYPE_CONTROL;
      if (self->unk >= 0)
        self->types[self->unk] = SIFT_TOKEN_TYPE_UNKNOWN;
    }
  return TRUE;
}

static gboolean
load_tokens (SiftTokenizer *self, const SiftTokenizerSpec *spec, const char *source, GError **error)
{
  if (spec->tokens == NULL || spec->n_tokens <= 0)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.tokens is empty (%d tokens)", source, spec->n_tokens);
      return FALSE;
    }
  self->n_tokens = spec->n_tokens;
  self->text = g_new (const char *, self->n_tokens);
  self->text_len = g_new (guint32, self->n_tokens);
  self->scores = g_new0 (float, self->n_tokens);
  for (gint32 i = 0; i < self->n_tokens; i++)
    {
      const char *t = spec->tokens[i];
      if (t == NULL || !g_utf8_validate (t, -1, NULL))
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                       "%s: tokenizer.ggml.tokens[%d] is %s", source, i,
                       t == NULL ? "missing" : "not valid UTF-8");
          return FALSE;
        }
      gsize len = strlen (t);
      if (len > G_MAXINT32)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                       "%s: tokenizer.ggml.tokens[%d] is %" G_GSIZE_FORMAT " bytes long", source, i, len);
          return FALSE;
        }
      self->text[i] = g_string_chunk_insert_len (self->strings, t, len);
      self->text_len[i] = (guint32) len;
      if (spec->scores != NULL)
        self->scores[i] = spec->scores[i];
    }
  index_build (self);
  return TRUE;
}

/* <0x00>..<0xFF>: SentencePiece's byte fallback. A byte without its token
 * becomes the unknown token (which the llama kind always has). */
static void
load_byte_tokens (SiftTokenizer *self)
{
  for (int b = 0; b < 256; b++)
    {
      char name[8];
      g_snprintf (name, sizeof name, "<0x%02X>", b);
      self->byte_token[b] = tokenizer_find (self, name, 6);
    }
}

/* What each token decodes to; computed once, so decode is a lookup. */
static void
build_pieces (SiftTokenizer *self)
{
  g_autoptr (GString) buf = g_string_new (NULL);
  self->piece = g_new (const char *, self->n_tokens);
  self->piece_len = g_new (guint32, self->n_tokens);
  for (gint32 i = 0; i < self->n_tokens; i++)
    {
      const char *t = self->text[i];
      gsize n = self->text_len[i];
      g_string_truncate (buf, 0);
      switch (self->types[i])
        {
        case SIFT_TOKEN_TYPE_NORMAL:
          if (self->kind == TOKENIZER_GPT2)
            tokenizer_bpe_unmap (t, n, buf);
          else
            for (gsize j = 0; j < n;)
              if (n - j >= 3 && memcmp (t + j, SPACE_MARK, 3) == 0)
                g_string_append_c (buf, ' '), j += 3;
              else
                g_string_append_c (buf, t[j++]);
          break;
        case SIFT_TOKEN_TYPE_BYTE:
          if (self->kind == TOKENIZER_LLAMA && n == 6 && g_str_has_prefix (t, "<0x") && t[5] == '>'
              && g_ascii_isxdigit (t[3]) && g_ascii_isxdigit (t[4]))
            g_string_append_c (buf, (char) (g_ascii_xdigit_value (t[3]) * 16 + g_ascii_xdigit_value (t[4])));
          break;
        case SIFT_TOKEN_TYPE_CONTROL:
        case SIFT_TOKEN_TYPE_USER_DEFINED:
        case SIFT_TOKEN_TYPE_UNKNOWN:
          g_string_append_len (buf, t, (gssize) n);
          break;
        default: /* undefined and unused tokens stand for nothing, as in llama.cpp */
          break;
        }
      /* A piece that is its text (control tokens, most ASCII) shares it. */
      self->piece[i] = buf->len == n && memcmp (buf->str, t, n) == 0
                           ? t : g_string_chunk_insert_len (self->strings, buf->str, (gssize) buf->len);
      self->piece_len[i] = (guint32) buf->len;
    }
}

static gboolean
is_special_type (guint8 type)
{
  return type == SIFT_TOKEN_TYPE_CONTROL || type == SIFT_TOKEN_TYPE_USER_DEFINED
         || type == SIFT_TOKEN_TYPE_UNKNOWN;
}

static gint
longer_first (gconstpointer a, gconstpointer b, gpointer data)
{
  const SiftTokenizer *self = data;
  gint32 x = *(const gint32 *) a, y = *(const gint32 *) b;
  guint32 lx = self->text_len[x], ly = self->text_len[y];
  if (lx != ly)
    return lx > ly ? -1 : 1;
  return x < y ? -1 : x > y;
}

static void
collect_special (SiftTokenizer *self)
{
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  for (gint32 i = 0; i < self->n_tokens; i++)
    if (is_special_type (self->types[i]) && self->text_len[i] > 0)
      g_array_append_val (ids, i);
  g_array_sort_with_data (ids, longer_first, self);
  self->n_special = (gint32) ids->len;
  self->special = (gint32 *) (void *) g_array_free (ids, FALSE);
}

SiftTokenizer *
sift_tokenizer_new (const SiftTokenizerSpec *spec, GError **error)
{
  g_return_val_if_fail (spec != NULL, NULL);
  const char *source = spec->source != NULL ? spec->source : "tokenizer";
  g_autoptr (SiftTokenizer) self = g_new0 (SiftTokenizer, 1);
  self->strings = g_string_chunk_new (1 << 16);

  if (g_strcmp0 (spec->model, "llama") == 0)
    self->kind = TOKENIZER_LLAMA;
  else if (g_strcmp0 (spec->model, "gpt2") == 0)
    self->kind = TOKENIZER_GPT2;
  else
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: tokenizer.ggml.model \"%s\" is not supported (supported: llama, gpt2)", source,
                   spec->model != NULL ? spec->model : "(absent)");
      return NULL;
    }
  self->model = g_strdup (spec->model);
  if (!load_tokens (self, spec, source, error))
    return NULL;
  if (self->kind == TOKENIZER_GPT2)
    {
      if (!tokenizer_bpe_init (self, spec, source, error))
        return NULL;
    }
  else
    self->pre = g_strdup ("default");
  if (!check_ids (self, spec, source, error) || !load_types (self, spec, source, error))
    return NULL;
  if (self->kind == TOKENIZER_LLAMA)
    load_byte_tokens (self);
  build_pieces (self);
  collect_special (self);
  return g_steal_pointer (&self);
}

void
sift_tokenizer_free (SiftTokenizer *self)
{
  if (self == NULL)
    return;
  tokenizer_bpe_clear (self);
  g_free (self->model);
  g_free (self->pre);
  g_free (self->text);
  g_free (self->text_len);
  g_free (self->piece);
  g_free (self->piece_len);
  g_free (self->scores);
  g_free (self->types);
  g_free (self->index.slots);
  g_free (self->special);
  if (self->strings != NULL)
    g_string_chunk_free (self->strings);
  g_free (self);
}

/* ---- encode ---- */

/* A run of the input: raw text still to tokenize (token -1), or a special token
 * found in it. */
typedef struct {
  gsize off, len;
  gint32 token;
} Fragment;

/* Splits the raw fragments around every occurrence of each special token,
 * longest tokens first, as llama.cpp's tokenizer_st_partition does. Control and
 * unknown tokens are only recognised when parse_special; user-defined ones always. */
static GArray *
partition (const SiftTokenizer *self, const char *text, gsize len, gboolean parse_special)
{
  GArray *frags = g_array_new (FALSE, FALSE, sizeof (Fragment));
  GArray *next = g_array_new (FALSE, FALSE, sizeof (Fragment));
  Fragment all = { 0, len, -1 };
  if (len > 0)
    g_array_append_val (frags, all);
  for (gint32 s = 0; s < self->n_special; s++)
    {
      gint32 id = self->special[s];
      if (!parse_special && self->types[id] != SIFT_TOKEN_TYPE_USER_DEFINED)
        continue;
      const char *tok = self->text[id];
      gsize tlen = self->text_len[id];
      g_array_set_size (next, 0);
      for (guint f = 0; f < frags->len; f++)
        {
          Fragment fr = g_array_index (frags, Fragment, f);
          if (fr.token >= 0 || fr.len < tlen)
            {
              g_array_append_val (next, fr);
              continue;
            }
          gsize pos = fr.off, end = fr.off + fr.len;
          const char *hit;
          while (end - pos >= tlen && (hit = memmem (text + pos, end - pos, tok, tlen)) != NULL)
            {
              gsize at = (gsize) (hit - text);
              if (at > pos)
                {
                  Fragment before = { pos, at - pos, -1 };
                  g_array_append_val (next, before);
                }
              Fragment special = { at, tlen, id };
              g_array_append_val (next, special);
              pos = at + tlen;
            }
          if (pos < end)
            {
              Fragment rest = { pos, end - pos, -1 };
              g_array_append_val (next, rest);
            }
        }
      GArray *t = frags;
      frags = next;
      next = t;
    }
  g_array_free (next, TRUE);
  return frags;
}

gboolean
sift_tokenizer_encode (const SiftTokenizer *self, const char *text, gssize len,
                       SiftTokenizeFlags flags, GArray *ids, GError **error)
{
  g_return_val_if_fail (self != NULL && ids != NULL && (text != NULL || len == 0), FALSE);
  g_return_val_if_fail (g_array_get_element_size (ids) == sizeof (gint32), FALSE);
  gsize n = len < 0 ? strlen (text) : (gsize) len;
  const char *bad;
  if (!g_utf8_validate_len (text, n, &bad))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "text to tokenize is not valid UTF-8 at byte %" G_GSIZE_FORMAT " (0x%02x)",
                   (gsize) (bad - text), (guint8) *bad);
      return FALSE;
    }
  gboolean add_special = (flags & SIFT_TOKENIZE_ADD_SPECIAL) != 0;
  if (add_special && self->add_bos)
    g_array_append_val (ids, self->bos);

  g_autoptr (GArray) frags = partition (self, text, n, (flags & SIFT_TOKENIZE_PARSE_SPECIAL) != 0);
  /* SentencePiece puts a space before the text and after each special token */
  gboolean prev_special = TRUE;
  for (guint f = 0; f < frags->len; f++)
    {
      const Fragment *fr = &g_array_index (frags, Fragment, f);
      if (fr->token >= 0)
        g_array_append_val (ids, fr->token);
      else if (self->kind == TOKENIZER_LLAMA)
        tokenizer_spm_encode (self, text + fr->off, fr->len, self->add_space_prefix && prev_special, ids);
      else
        tokenizer_bpe_encode (self, text + fr->off, fr->len, ids);
      prev_special = fr->token >= 0;
    }
  if (add_special && self->add_eos)
    g_array_append_val (ids, self->eos);
  return TRUE;
}

/* ---- decode ---- */

static gboolean
hidden (const SiftTokenizer *self, gint32 id, gboolean special)
{
  guint8 t = self->types[id];
  return !special && (t == SIFT_TOKEN_TYPE_CONTROL || t == SIFT_TOKEN_TYPE_UNKNOWN);
}

void
sift_tokenizer_piece (const SiftTokenizer *self, gint32 id, gboolean special, GString *out)
{
  g_return_if_fail (self != NULL && out != NULL && id >= 0 && id < self->n_tokens);
  if (!hidden (self, id, special))
    g_string_append_len (out, self->piece[id], (gssize) self->piece_len[id]);
}

char *
sift_tokenizer_decode (const SiftTokenizer *self, const gint32 *ids, gsize n, gboolean special,
                       GError **error)
{
  g_return_val_if_fail (self != NULL && (ids != NULL || n == 0), NULL);
  g_autoptr (GString) out = g_string_new (NULL);
  gboolean strip = self->add_space_prefix;
  for (gsize i = 0; i < n; i++)
    {
      if (ids[i] < 0 || ids[i] >= self->n_tokens)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                       "token id %d (at %" G_GSIZE_FORMAT ") is outside the vocabulary (%d tokens)",
                       ids[i], i, self->n_tokens);
          return NULL;
        }
      gsize at = out->len;
      sift_tokenizer_piece (self, ids[i], special, out);
      /* encode put a space before the text and after each special token: the
       * first piece of each such run loses it */
      if (is_special_type (self->types[ids[i]]))
        {
          strip = self->add_space_prefix;
          continue;
        }
      if (strip && out->len > at && out->str[at] == ' ')
        g_string_erase (out, (gssize) at, 1);
      strip = FALSE;
    }
  if (!g_utf8_validate_len (out->str, out->len, NULL))
    return g_utf8_make_valid (out->str, (gssize) out->len);
  return g_string_free (g_steal_pointer (&out), FALSE);
}

/* ---- accessors ---- */

gint32
sift_tokenizer_n_tokens (const SiftTokenizer *self)
{
  g_return_val_if_fail (self != NULL, 0);
  return self->n_tokens;
}

const char *
sift_tokenizer_model (const SiftTokenizer *self)
{
  g_return_val_if_fail (self != NULL, NULL);
  return self->model;
}

const char *
sift_tokenizer_pre (const SiftTokenizer *self)
{
  g_return_val_if_fail (self != NULL, NULL);
  return self->pre;
}

gint32
sift_tokenizer_bos (const SiftTokenizer *self)
{
  g_return_val_if_fail (self != NULL, -1);
  return self->bos;
}

gint32
sift_tokenizer_eos (const SiftTokenizer *self)
{
  g_return_val_if_fail (self != NULL, -1);
  return self->eos;
}

gboolean
sift_tokenizer_is_eog (const SiftTokenizer *self, gint32 id)
{
  g_return_val_if_fail (self != NULL, FALSE);
  if (id < 0 || id >= self->n_tokens)
    return FALSE;
  if (id == self->eos)
    return TRUE;
  if (self->types[id] != SIFT_TOKEN_TYPE_CONTROL)
    return FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS (eog_texts); i++)
    if (strlen (eog_texts[i]) == self->text_len[id] && memcmp (eog_texts[i], self->text[id], self->text_len[id]) == 0)
      return TRUE;
  return FALSE;
}

const char *
sift_tokenizer_token_text (const SiftTokenizer *self, gint32 id)
{
  g_return_val_if_fail (self != NULL && id >= 0 && id < self->n_tokens, NULL);
  return self->text[id];
}

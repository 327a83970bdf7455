/* sift — the "llama" tokenizer: SentencePiece BPE over a scored vocabulary.
 *
 * Spaces become "▁"; the text starts as one symbol per character; the adjacent
 * pair whose concatenation is the vocabulary entry with the highest score
 * merges first (ties: the leftmost), until no pair is an entry. A symbol left
 * that is not an entry (a character outside the vocabulary) falls back to its
 * bytes' <0xXX> tokens. A heap of candidate pairs keeps this O(n log n). */
#include "tokenizer-private.h"

#include <string.h>

#define SPACE_MARK "\xe2\x96\x81" /* U+2581 "▁" */

static void
try_pair (const SiftTokenizer *self, const GString *word, const Symbol *sym, gint32 left,
          gint32 right, BigramHeap *heap)
{
  if (left < 0 || right < 0)
    return;
  guint32 size = sym[left].len + sym[right].len;
  gint32 id = tokenizer_find (self, word->str + sym[left].off, size);
  if (id < 0)
    return;
  bigram_heap_push (heap, (Bigram) { self->scores[id], left, right, size });
}

void
tokenizer_spm_encode (const SiftTokenizer *self, const char *text, gsize len,
                      gboolean space_prefix, GArray *ids)
{
  g_autoptr (GString) word = g_string_sized_new (len + len / 2 + 4);
  if (space_prefix)
    g_string_append (word, SPACE_MARK);
  for (gsize i = 0; i < len; i++)
    if (text[i] == ' ')
      g_string_append (word, SPACE_MARK);
    else
      g_string_append_c (word, text[i]);
  if (word->len == 0)
    return;

  /* one symbol per character (the text is valid UTF-8) */
  g_autofree Symbol *sym = g_new (Symbol, word->len);
  gint32 n = 0;
  for (const char *p = word->str, *end = word->str + word->len; p < end; n++)
    {
      const char *q = g_utf8_next_char (p);
      sym[n] = (Symbol) { n - 1, -1, (guint32) (p - word->str), (guint32) (q - p), -1 };
      if (n > 0)
        sym[n - 1].next = n;
      p = q;
    }

  BigramHeap heap = { 0 };
  for (gint32 i = 1; i < n; i++)
    try_pair (self, word, sym, i - 1, i, &heap);
  while (heap.n > 0)
    {
      Bigram b = bigram_heap_pop (&heap);
      Symbol *l = &sym[b.left], *r = &sym[b.right];
      /* stale: a side merged elsewhere since the pair was queued */
      if (l->len == 0 || r->len == 0 || l->next != b.right || l->len + r->len != b.size)
        continue;
      l->len += r->len;
      r->len = 0;
      l->next = r->next;
      if (r->next >= 0)
        sym[r->next].prev = b.left;
      try_pair (self, word, sym, l->prev, b.left, &heap);
      try_pair (self, word, sym, b.left, l->next, &heap);
    }
  g_free (heap.items);

  for (gint32 i = 0; i >= 0; i = sym[i].next)
    {
      gint32 id = tokenizer_find (self, word->str + sym[i].off, sym[i].len);
      if (id >= 0)
        {
          g_array_append_val (ids, id);
          continue;
        }
      for (guint32 j = 0; j < sym[i].len; j++)
        {
          gint32 b = self->byte_token[(guint8) word->str[sym[i].off + j]];
          if (b < 0)
            b = self->unk;
          g_array_append_val (ids, b);
        }
    }
}

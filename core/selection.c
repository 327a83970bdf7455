/* Block selections: what a policy adds, validated and compacted by the host. */
#include <string.h>

#include <sift/error.h>
#include <sift/policy.h>

#include "selection-private.h"

typedef struct {
  gint64 id;
  gint32 q_head;   /* -1: every head */
  gint32 n_heads;  /* heads from q_head on (kv head: the group) */
} Entry;

struct _SiftSelection {
  gint32 n_q_heads, n_kv_heads, words; /* words: guint64 per head mask */
  GArray *added;                       /* Entry, as the policy added them */
  GArray *blocks;                      /* gint64, ascending, after validate */
  GArray *masks;                       /* guint64 [n_blocks][words] */
  gboolean validated;
};

SiftSelection *
sift_selection_new (gint32 n_q_heads, gint32 n_kv_heads)
{
  g_return_val_if_fail (n_q_heads > 0 && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0, NULL);
  SiftSelection *s = g_new0 (SiftSelection, 1);
  s->n_q_heads = n_q_heads;
  s->n_kv_heads = n_kv_heads;
  s->words = (n_q_heads + 63) / 64;
  s->added = g_array_new (FALSE, FALSE, sizeof (Entry));
  s->blocks = g_array_new (FALSE, FALSE, sizeof (gint64));
  s->masks = g_array_new (FALSE, TRUE, sizeof (guint64));
  return s;
}

void
sift_selection_free (SiftSelection *sel)
{
  if (sel == NULL)
    return;
  g_array_unref (sel->added);
  g_array_unref (sel->blocks);
  g_array_unref (sel->masks);
  g_free (sel);
}

void
sift_selection_clear (SiftSelection *sel)
{
  g_return_if_fail (sel != NULL);
  g_array_set_size (sel->added, 0);
  g_array_set_size (sel->blocks, 0);
  g_array_set_size (sel->masks, 0);
  sel->validated = FALSE;
}

static void
add (SiftSelection *sel, gint64 id, gint32 q_head, gint32 n_heads)
{
  g_return_if_fail (sel != NULL);
  Entry e = { id, q_head, n_heads };
  g_array_append_val (sel->added, e);
  sel->validated = FALSE;
}

void
sift_selection_add (SiftSelection *sel, gint64 block_id)
{
  add (sel, block_id, -1, 0);
}

void
sift_selection_add_q_head (SiftSelection *sel, gint64 block_id, gint32 q_head)
{
  add (sel, block_id, q_head, 1);
}

void
sift_selection_add_kv_head (SiftSelection *sel, gint64 block_id, gint32 kv_head)
{
  g_return_if_fail (sel != NULL);
  gint32 group = sel->n_q_heads / sel->n_kv_heads;
  /* An out-of-range kv head is kept as an invalid head for validate to report. */
  if (kv_head < 0 || kv_head >= sel->n_kv_heads)
    add (sel, block_id, kv_head < 0 ? -2 : sel->n_q_heads + kv_head, 1);
  else
    add (sel, block_id, kv_head * group, group);
}

static gint
cmp_entry (gconstpointer a, gconstpointer b)
{
  const Entry *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

static gboolean
is_available (const gint64 *available, gsize n, gint64 id)
{
  gsize lo = 0, hi = n;
  while (lo < hi)
    {
      gsize mid = lo + (hi - lo) / 2;
      if (available[mid] == id)
        return TRUE;
      if (available[mid] < id)
        lo = mid + 1;
      else
        hi = mid;
    }
  return FALSE;
}

gboolean
sift_selection_validate (SiftSelection *sel, const gint64 *available, gsize n_available,
                         const char *policy_name, GError **error)
{
  g_return_val_if_fail (sel != NULL, FALSE);
  const char *who = policy_name ? policy_name : "(unnamed)";
  Entry *e = (Entry *) (void *) sel->added->data;
  guint n = sel->added->len;

  for (guint i = 0; i < n; i++)
    {
      if (e[i].q_head < -1 || e[i].q_head >= sel->n_q_heads)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_SELECTION,
                       "policy '%s' selected block %" G_GINT64_FORMAT " for head %d, but the model has %d query heads",
                       who, e[i].id, e[i].q_head, sel->n_q_heads);
          return FALSE;
        }
      if (!is_available (available, n_available, e[i].id))
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_SELECTION,
                       "policy '%s' selected block %" G_GINT64_FORMAT
                       ", which is not among the %" G_GSIZE_FORMAT " available blocks",
                       who, e[i].id, n_available);
          return FALSE;
        }
    }

  /* Stable sort keeps the policy's order within one id (irrelevant to the result). */
  g_array_sort (sel->added, cmp_entry);
  e = (Entry *) (void *) sel->added->data;
  g_array_set_size (sel->blocks, 0);
  g_array_set_size (sel->masks, 0);
  const gint32 w = sel->words;
  for (guint i = 0; i < n;)
    {
      guint j = i;
      g_array_append_val (sel->blocks, e[i].id);
      g_array_set_size (sel->masks, sel->masks->len + (guint) w);
      guint64 *mask = &g_array_index (sel->masks, guint64, sel->masks->len - (guint) w);
      for (; j < n && e[j].id == e[i].id; j++)
        {
          gint32 h0 = e[j].q_head < 0 ? 0 : e[j].q_head;
          gint32 hn = e[j].q_head < 0 ? sel->n_q_heads : e[j].n_heads;
          for (gint32 h = h0; h < h0 + hn; h++)
            {
              guint64 bit = G_GUINT64_CONSTANT (1) << (h % 64);
              if (mask[h / 64] & bit)
                {
                  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_SELECTION,
                               "policy '%s' selected block %" G_GINT64_FORMAT " twice for query head %d",
                               who, e[i].id, h);
                  return FALSE;
                }
              mask[h / 64] |= bit;
            }
        }
      i = j;
    }
  sel->validated = TRUE;
  return TRUE;
}

gsize
sift_selection_n_blocks (const SiftSelection *sel)
{
  g_return_val_if_fail (sel != NULL && sel->validated, 0);
  return sel->blocks->len;
}

gint64
sift_selection_block (const SiftSelection *sel, gsize i)
{
  g_return_val_if_fail (sel != NULL && sel->validated && i < sel->blocks->len, -1);
  return g_array_index (sel->blocks, gint64, i);
}

gboolean
sift_selection_has (const SiftSelection *sel, gint64 block_id, gint32 q_head)
{
  g_return_val_if_fail (sel != NULL && sel->validated, FALSE);
  g_return_val_if_fail (q_head >= 0 && q_head < sel->n_q_heads, FALSE);
  const gint64 *ids = (const gint64 *) (void *) sel->blocks->data;
  gsize lo = 0, hi = sel->blocks->len;
  while (lo < hi)
    {
      gsize mid = lo + (hi - lo) / 2;
      if (ids[mid] == block_id)
        {
          const guint64 *mask = &g_array_index (sel->masks, guint64, mid * (gsize) sel->words);
          return (mask[q_head / 64] >> (q_head % 64)) & 1;
        }
      if (ids[mid] < block_id)
        lo = mid + 1;
      else
        hi = mid;
    }
  return FALSE;
}

const guint64 *
sift_selection_heads_at (const SiftSelection *sel, gsize i)
{
  g_return_val_if_fail (sel != NULL && sel->validated && i < sel->blocks->len, NULL);
  return &g_array_index (sel->masks, guint64, i * (gsize) sel->words);
}

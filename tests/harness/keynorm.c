/* Test plugin "keynorm": keeps, per kv head, the stored blocks whose
 * largest key norm is highest, within a token budget, and never looks at
 * the query. A harness whose planted keys stand out by norm would let it
 * find needles for free (tests/harness/test-keynorm.c). */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

typedef struct {
  SiftPolicy parent;
  gint64 budget_blocks;
  GArray *norms;            /* float [block][kv_head]: the block's largest key norm */
} KeyNorm;

static const SiftParamSpec keynorm_params[] = {
  SIFT_PARAM_INT ("token_budget", 2048, 1, 1 << 30, "stored tokens kept per kv head"),
  SIFT_PARAM_END,
};

static gboolean
keynorm_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  KeyNorm *kn = (KeyNorm *) self;
  (void) error;
  kn->budget_blocks = MAX (sift_params_get_int (params, "token_budget") / self->shape->block_size, 1);
  kn->norms = g_array_new (FALSE, TRUE, sizeof (float));
  return TRUE;
}

static void
keynorm_finalize (SiftPolicy *self)
{
  g_array_unref (((KeyNorm *) self)->norms);
}

static void
keynorm_reset (SiftPolicy *self)
{
  g_array_set_size (((KeyNorm *) self)->norms, 0);
}

static gboolean
keynorm_offload (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftBlockInfo *block, GError **error)
{
  KeyNorm *kn = (KeyNorm *) self;
  const gint32 kvh = self->shape->n_kv_heads, d = self->shape->head_dim;
  (void) ctx;
  (void) error;
  if ((gint64) kn->norms->len < (block->block_id + 1) * kvh)
    g_array_set_size (kn->norms, (guint) ((block->block_id + 1) * kvh));
  g_autofree float *row = g_new (float, d);
  for (gint32 g = 0; g < kvh; g++)
    {
      float best = 0;
      for (gint32 t = 0; t < block->meta->n_valid; t++)
        {
          sift_view_row_to_f32 (&block->k, g, t, row);
          double n2 = 0;
          for (gint32 i = 0; i < d; i++)
            n2 += (double) row[i] * row[i];
          best = MAX (best, (float) sqrt (n2));
        }
      g_array_index (kn->norms, float, block->block_id * kvh + g) = best;
    }
  return TRUE;
}

/* Per kv head: the budget's worth of available blocks with the largest
 * norms (ties to the lower id), by repeated selection: n is small. */
static gboolean
keynorm_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
                SiftSelection *selected, GError **error)
{
  KeyNorm *kn = (KeyNorm *) self;
  const gint32 kvh = self->shape->n_kv_heads;
  (void) ctx;
  (void) error;
  g_autofree gboolean *taken = g_new (gboolean, MAX (n, 1));
  for (gint32 g = 0; g < kvh; g++)
    {
      memset (taken, 0, MAX (n, 1) * sizeof (gboolean));
      for (gint64 k = 0; k < kn->budget_blocks && k < (gint64) n; k++)
        {
          gsize best = n;
          float best_norm = -1;
          for (gsize i = 0; i < n; i++)
            {
              gint64 at = available[i] * kvh + g;
              float v = at < (gint64) kn->norms->len ? g_array_index (kn->norms, float, at) : 0.0f;
              if (!taken[i] && v > best_norm)
                {
                  best = i;
                  best_norm = v;
                }
            }
          taken[best] = TRUE;
          sift_selection_add_kv_head (selected, available[best], g);
        }
    }
  return TRUE;
}

static const SiftPolicyOps keynorm_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "keynorm",
  .version = "1",
  .description = "test: top blocks by key norm, no query",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = keynorm_params,
  .instance_size = sizeof (KeyNorm),
  .init = keynorm_init,
  .finalize = keynorm_finalize,
  .reset = keynorm_reset,
  .select_blocks = keynorm_select,
  .on_prefill_offload = keynorm_offload,
  .on_decode_offload = keynorm_offload,
};

SIFT_PLUGIN_DEFINE (&keynorm_ops)

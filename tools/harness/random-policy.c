/* The random policies of the baselines (docs/needle.md, "Random
 * baseline"): random stored blocks at a given density, and uniformly
 * random eviction victims at the engine's capacity. A baseline run puts
 * one instance in every layer and phase. */
#include <math.h>

#include "harness.h"

typedef struct {
  SiftPolicy parent;
  double density;            /* fraction of the stored blocks each kv head gets */
  guint64 seed;
} RandomPolicy;

static const SiftParamSpec no_params[] = { SIFT_PARAM_END };

void
harness_random_draw (GRand *rand, gint64 *idx, gint64 n, gint64 k)
{
  for (gint64 i = 0; i < k; i++)
    {
      gint64 j = i + (gint64) g_rand_int_range (rand, 0, (gint32) (n - i));
      gint64 t = idx[i];
      idx[i] = idx[j];
      idx[j] = t;
    }
}

/* round(density * n) of the available blocks for every kv head, drawn
 * from (seed, layer, phase, q_pos). */
static gboolean
random_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
               SiftSelection *selected, GError **error)
{
  RandomPolicy *rp = (RandomPolicy *) self;
  (void) error;
  gint64 k = CLAMP (llround (rp->density * (double) n), 0, (gint64) n);
  if (n == 0 || k == 0)
    return TRUE;
  g_autoptr (GRand) rand = g_rand_new_with_seed_array ((const guint32[]) {
    (guint32) rp->seed, (guint32) (rp->seed >> 32), (guint32) ctx->layer, (guint32) ctx->phase,
    (guint32) ctx->q_pos }, 5);
  g_autofree gint64 *idx = g_new (gint64, n);
  for (gint32 kv = 0; kv < self->shape->n_kv_heads; kv++)
    {
      for (gsize i = 0; i < n; i++)
        idx[i] = (gint64) i;
      harness_random_draw (rand, idx, (gint64) n, k);
      for (gint64 i = 0; i < k; i++)
        sift_selection_add_kv_head (selected, available[idx[i]], kv);
    }
  return TRUE;
}

/* Uniformly random victims, drawn from (seed, layer, phase, q_pos): each
 * unit the engine evicts (a token, or with block granularity a block) gets
 * a distinct random rank, and each candidate token its unit's rank over
 * the unit's candidates, so that a block's score (the engine sums its
 * tokens') is its rank. The engine evicts the lowest, as many as take the
 * layer back to its capacity. */
static gboolean
random_score_eviction (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftEvictCandidates *cand,
                       float *scores, GError **error)
{
  RandomPolicy *rp = (RandomPolicy *) self;
  (void) error;
  const gsize n = cand->n;
  if (n == 0)
    return TRUE;
  const gboolean blocks = cand->granularity == SIFT_EVICT_BLOCK;
  /* Candidates ascend by position, so a block's candidates are consecutive. */
  g_autofree gint64 *unit = g_new (gint64, n), *size = g_new0 (gint64, n), *order = g_new (gint64, n);
  gint64 n_units = 0;
  for (gsize i = 0; i < n; i++)
    {
      if (i == 0 || !blocks || cand->block_ids[i] != cand->block_ids[i - 1])
        n_units++;
      unit[i] = n_units - 1;
      size[n_units - 1]++;
    }
  g_autoptr (GRand) rand = g_rand_new_with_seed_array ((const guint32[]) {
    (guint32) rp->seed, (guint32) (rp->seed >> 32), (guint32) ctx->layer, (guint32) ctx->phase,
    (guint32) ctx->q_pos, 0x45564943u /* "EVIC" */ }, 6);
  for (gint64 u = 0; u < n_units; u++)
    order[u] = u;
  harness_random_draw (rand, order, n_units, n_units);
  g_autofree gint64 *rank = g_new (gint64, n_units);
  for (gint64 r = 0; r < n_units; r++)
    rank[order[r]] = r;
  for (gsize i = 0; i < n; i++)
    scores[i] = (float) rank[unit[i]] / (float) size[unit[i]];
  return TRUE;
}

/* Random blocks at a density (and random victims, when the cache is bounded). */
static const SiftPolicyOps random_select_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "random",
  .version = "1",
  .description = "the needle harness's random baseline: random stored blocks at a given density",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = no_params,
  .instance_size = sizeof (RandomPolicy),
  .select_blocks = random_select,
  .score_eviction = random_score_eviction,
};

/* Every kept block, random victims. */
static const SiftPolicyOps random_evict_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "random-evict",
  .version = "1",
  .description = "the needle harness's random eviction baseline: uniformly random victims at the capacity",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .params = no_params,
  .instance_size = sizeof (RandomPolicy),
  .score_eviction = random_score_eviction,
};

static SiftPolicy *
random_new (const SiftModelShape *shape, double density, guint64 seed, GError **error)
{
  SiftPolicy *p = sift_policy_new (isfinite (density) ? &random_select_ops : &random_evict_ops, NULL, shape, error);
  if (p != NULL)
    {
      ((RandomPolicy *) p)->density = density;
      ((RandomPolicy *) p)->seed = seed;
    }
  return p;
}

gboolean
harness_random_policies_new (const SiftModelShape *shape, double prefill_density, double decode_density,
                             guint64 seed, SiftPolicy ***prefill, SiftPolicy ***decode, GError **error)
{
  const gint32 L = shape->n_layers;
  SiftPolicy **pf = g_new0 (SiftPolicy *, L), **dc = g_new0 (SiftPolicy *, L);
  gboolean ok = TRUE;
  for (gint32 l = 0; ok && l < L; l++)
    ok = (pf[l] = random_new (shape, prefill_density, seed, error)) != NULL
         && (dc[l] = random_new (shape, decode_density, seed + 1, error)) != NULL;
  if (!ok)
    {
      for (gint32 l = 0; l < L; l++)
        {
          sift_policy_free (pf[l]);
          sift_policy_free (dc[l]);
        }
      g_free (pf);
      g_free (dc);
      pf = dc = NULL;
    }
  *prefill = pf;
  *decode = dc;
  return ok;
}

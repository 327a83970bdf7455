/* The random baseline of a cell (docs/needle.md, "Random baseline"): the
 * same question rows answered from a random block selection of the
 * policy's own size, call for call and head for head, over several seeds.
 *
 * While the policy's cell runs, the observer keeps every question call's
 * stored blocks and how many of them the policy attended per query head
 * (harness_calls_*). Afterwards the baseline draws that many blocks at
 * random instead and computes the attention a selection of them gives
 * (the selected blocks plus the tokens not yet stored, as the engine's
 * default pipeline attends), from the model source alone. A block's
 * partial result (its LSE and output) does not depend on which other
 * blocks are chosen, so each block is computed once per row and head and
 * every seed only merges its draw. Only retrieval heads are scored, so
 * only they are computed. */
#include <math.h>
#include <string.h>

#include "harness.h"

struct _HarnessCalls {
  GArray *calls;        /* HarnessCall */
};

typedef struct {
  SiftPhase phase;
  gint32 layer;
  gint64 q_pos;
  gint32 n_q;
  gint64 local_start;   /* first position not in a stored block: attended by every head */
  gint64 n_blocks;
  gint64 *positions;    /* stored positions, block after block (owned) */
  gsize *block_start;   /* [n_blocks + 1] offsets into positions (owned) */
  gint64 *picked;       /* [n_q_heads] blocks the policy attended per head; -1: not known (owned) */
} HarnessCall;

HarnessCalls *
harness_calls_new (void)
{
  HarnessCalls *c = g_new0 (HarnessCalls, 1);
  c->calls = g_array_new (FALSE, TRUE, sizeof (HarnessCall));
  return c;
}

void
harness_calls_free (HarnessCalls *c)
{
  if (c == NULL)
    return;
  for (guint i = 0; i < c->calls->len; i++)
    {
      HarnessCall *k = &g_array_index (c->calls, HarnessCall, i);
      g_free (k->positions);
      g_free (k->block_start);
      g_free (k->picked);
    }
  g_array_unref (c->calls);
  g_free (c);
}

void
harness_calls_add (HarnessCalls *c, const SiftPolicyContext *ctx, const SiftSelection *sel, gboolean known)
{
  HarnessCall k = {
    .phase = ctx->phase, .layer = ctx->layer, .q_pos = ctx->q_pos, .n_q = ctx->n_q,
    .n_blocks = ctx->n_blocks, .local_start = 0,
  };
  gint32 hq = ctx->shape->n_q_heads;
  k.block_start = g_new (gsize, (gsize) ctx->n_blocks + 1);
  gsize total = 0;
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      k.block_start[b] = total;
      total += (gsize) ctx->blocks[b].n_valid;
    }
  k.block_start[ctx->n_blocks] = total;
  k.positions = g_new (gint64, MAX (total, 1));
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      const gint64 *pos = sift_engine_block_positions (ctx->engine, ctx->layer, b);
      memcpy (k.positions + k.block_start[b], pos, (gsize) ctx->blocks[b].n_valid * sizeof (gint64));
      k.local_start = MAX (k.local_start, pos[ctx->blocks[b].n_valid - 1] + 1);
    }
  k.picked = g_new (gint64, hq);
  for (gint32 h = 0; h < hq; h++)
    {
      if (!known)
        k.picked[h] = -1;
      else if (sel == NULL)
        k.picked[h] = ctx->n_blocks;
      else
        {
          k.picked[h] = 0;
          for (gint64 b = 0; b < ctx->n_blocks; b++)
            k.picked[h] += sift_selection_has (sel, b, h);
        }
    }
  g_array_append_val (c->calls, k);
}

/* Attention of one query over positions pos[0..n): its LSE and output
 * (f64 accumulation; the max is taken first so no exponential overflows). */
static double
partial (const float *q, const float *K, const float *V, gsize stride, gsize d, double scale, const gint64 *pos,
         gsize n, double *o)
{
  memset (o, 0, d * sizeof (double));
  if (n == 0)
    return -INFINITY;
  g_autofree double *s = g_new (double, n);
  double m = -INFINITY;
  for (gsize j = 0; j < n; j++)
    {
      const float *k = K + (gsize) pos[j] * stride;
      double dot = 0;
      for (gsize i = 0; i < d; i++)
        dot += (double) q[i] * k[i];
      s[j] = scale * dot;
      m = MAX (m, s[j]);
    }
  double sum = 0;
  for (gsize j = 0; j < n; j++)
    {
      double w = exp (s[j] - m);
      const float *v = V + (gsize) pos[j] * stride;
      sum += w;
      for (gsize i = 0; i < d; i++)
        o[i] += w * v[i];
    }
  for (gsize i = 0; i < d; i++)
    o[i] /= sum;
  return m + log (sum);
}

/* Merges (o2, l2) into (o1, *l1) by LSE (docs: "Numerics"). */
static void
merge (double *o1, double *l1, const double *o2, double l2, gsize d)
{
  if (l2 == -INFINITY)
    return;
  if (*l1 == -INFINITY)
    {
      memcpy (o1, o2, d * sizeof (double));
      *l1 = l2;
      return;
    }
  double m = MAX (*l1, l2), a = exp (*l1 - m), b = exp (l2 - m);
  for (gsize i = 0; i < d; i++)
    o1[i] = (a * o1[i] + b * o2[i]) / (a + b);
  *l1 = m + log (a + b);
}

static gint64
blocks_for (const HarnessCall *k, gint32 h, double density)
{
  if (k->picked[h] >= 0)
    return k->picked[h];
  if (!isfinite (density))
    return k->n_blocks;
  return CLAMP ((gint64) llround (density * (double) k->n_blocks), 0, k->n_blocks);
}

/* Whether the draw holds every needle token stored in this call's blocks
 * (tokens not yet stored count as held, as in the cell's recall). */
static gboolean
draw_holds_needles (const SiftNeedlePlan *plan, const HarnessCall *k, const gint64 *idx, gint64 n_drawn)
{
  for (gsize i = 0; i < plan->n_needles; i++)
    {
      const SiftNeedle *nd = &plan->needles[i];
      if (nd->distractor >= 0 || nd->position >= k->local_start)
        continue;
      gboolean held = FALSE;
      for (gint64 x = 0; x < n_drawn && !held; x++)
        for (gsize j = k->block_start[idx[x]]; j < k->block_start[idx[x] + 1] && !held; j++)
          held = k->positions[j] == nd->position;
      if (!held)
        return FALSE;
    }
  return TRUE;
}

gboolean
harness_baseline_compute (SiftModel *src, const SiftNeedlePlan *plan, const HarnessCalls *calls,
                          gsize n_seeds, guint64 seed, double prefill_density, double decode_density,
                          gint64 row0, gint64 n_rows, HarnessBaseline *out, GError **error)
{
  const SiftModelShape *s = &src->shape;
  const gsize d = (gsize) s->head_dim, hq = (gsize) s->n_q_heads, hkv = (gsize) s->n_kv_heads;
  const gsize rows = (gsize) n_rows, group = hq / hkv;
  g_return_val_if_fail (n_seeds <= HARNESS_BASELINE_MAX_SEEDS, FALSE);
  memset (out, 0, sizeof *out);
  out->n_seeds = n_seeds;
  out->tokens_evicted = NAN;
  if (n_seeds == 0)
    return TRUE;
  const gint64 n_pos = row0 + n_rows;
  const gsize plane = (gsize) s->n_layers * hq * rows * d;
  g_autofree float *outs = g_new0 (float, n_seeds * plane);  /* [seed][layer][hq][rows][d] */
  g_autofree float *Q = g_new (float, (gsize) n_pos * hq * d); /* [pos][hq][d] */
  g_autofree float *K = g_new (float, (gsize) n_pos * hkv * d);
  g_autofree float *V = g_new (float, (gsize) n_pos * hkv * d);
  guint64 held[2] = { 0 }, drawn[2] = { 0 };

  for (gint32 l = 0; l < s->n_layers; l++)
    {
      gboolean any = FALSE;
      for (gsize h = 0; h < hq && !any; h++)
        any = sift_model_synthetic_is_retrieval_head (src, l, (gint32) h);
      if (!any)
        continue;
      for (gint64 c0 = 0; c0 < n_pos; c0 += 4096)
        {
          gint64 m = MIN (4096, n_pos - c0);
          if (!sift_model_qkv_at (src, l, c0, m, Q + (gsize) c0 * hq * d, K + (gsize) c0 * hkv * d,
                                      V + (gsize) c0 * hkv * d, error))
            return FALSE;
        }
      for (guint ci = 0; ci < calls->calls->len; ci++)
        {
          const HarnessCall *k = &g_array_index (calls->calls, HarnessCall, ci);
          if (k->layer != l)
            continue;
          const int ph = k->phase == SIFT_PHASE_DECODE;
          const double density = ph ? decode_density : prefill_density;
          g_autofree double *part_o = g_new (double, (gsize) MAX (k->n_blocks, 1) * d);
          g_autofree double *part_l = g_new (double, (gsize) MAX (k->n_blocks, 1));
          g_autofree gint64 *idx = g_new (gint64, (gsize) MAX (k->n_blocks, 1));
          g_autofree gint64 *local = g_new (gint64, (gsize) MAX (n_pos - k->local_start, 1));
          g_autofree double *local_o = g_new (double, d);
          g_autofree double *acc = g_new (double, d);
          for (gsize h = 0; h < hq; h++)
            {
              if (!sift_model_synthetic_is_retrieval_head (src, l, (gint32) h))
                continue;
              const gsize g = h / group;
              const gint64 n_pick = blocks_for (k, (gint32) h, density);
              for (gint64 p = MAX (k->q_pos, row0); p < k->q_pos + k->n_q && p < n_pos; p++)
                {
                  const float *q = Q + ((gsize) p * hq + h) * d;
                  const float *Kg = K + g * d, *Vg = V + g * d;
                  for (gint64 b = 0; b < k->n_blocks; b++)
                    part_l[b] = partial (q, Kg, Vg, hkv * d, d, s->scale, k->positions + k->block_start[b],
                                         k->block_start[b + 1] - k->block_start[b], part_o + (gsize) b * d);
                  gsize n_local = 0;
                  for (gint64 j = k->local_start; j <= p; j++)
                    local[n_local++] = j;
                  double local_l = partial (q, Kg, Vg, hkv * d, d, s->scale, local, n_local, local_o);
                  for (gsize si = 0; si < n_seeds; si++)
                    {
                      /* One draw per (seed, call, head), the same for every row of the call. */
                      GRand *rand = g_rand_new_with_seed_array (
                        (const guint32[]) { (guint32) seed, (guint32) (seed >> 32), (guint32) si, (guint32) l,
                                            (guint32) k->phase, (guint32) k->q_pos, (guint32) h, 0x52414e44u },
                        8);
                      for (gint64 b = 0; b < k->n_blocks; b++)
                        idx[b] = b;
                      harness_random_draw (rand, idx, k->n_blocks, n_pick);
                      g_rand_free (rand);
                      double lse = local_l;
                      memcpy (acc, local_o, d * sizeof (double));
                      for (gint64 x = 0; x < n_pick; x++)
                        merge (acc, &lse, part_o + (gsize) idx[x] * d, part_l[idx[x]], d);
                      float *o = outs + si * plane + (((gsize) l * hq + h) * rows + (gsize) (p - row0)) * d;
                      for (gsize i = 0; i < d; i++)
                        o[i] = (float) acc[i];
                      if (p == MAX (k->q_pos, row0))
                        {
                          drawn[ph]++;
                          held[ph] += draw_holds_needles (plan, k, idx, n_pick);
                        }
                    }
                }
            }
        }
    }

  /* Score every seed as a cell is scored (harness_score_retrieval). */
  const gint64 q = plan->question_tokens, steps = n_rows - q;
  g_autofree gsize *hits = g_new0 (gsize, rows);
  g_autofree double *chance = g_new0 (double, rows);
  for (gsize si = 0; si < n_seeds; si++)
    {
      gsize pairs = harness_score_retrieval (src, plan, outs + si * plane, row0, n_rows, hits, chance);
      gsize hp = 0, hd = 0;
      for (gint64 r = 0; r < n_rows; r++)
        *(r < q ? &hp : &hd) += hits[r];
      out->prefill_retrieval[si] = pairs > 0 ? (double) hp / (double) (pairs * (gsize) q) : 0.0;
      out->decode_retrieval[si] = pairs > 0 && steps > 0 ? (double) hd / (double) (pairs * (gsize) steps) : NAN;
      out->pass[si] = out->prefill_retrieval[si] > 0.5 && (steps == 0 || out->decode_retrieval[si] > 0.5);
    }
  out->prefill_recall = drawn[0] > 0 ? (double) held[0] / (double) drawn[0] : NAN;
  out->decode_recall = drawn[1] > 0 ? (double) held[1] / (double) drawn[1] : NAN;
  return TRUE;
}

double
harness_baseline_pass_mean (const HarnessBaseline *b)
{
  if (b->n_seeds == 0)
    return NAN;
  gsize n = 0;
  for (gsize i = 0; i < b->n_seeds; i++)
    n += b->pass[i];
  return (double) n / (double) b->n_seeds;
}

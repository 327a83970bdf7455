/* sift bench policy xattn_bsa — density and prefill attention time of
 * XAttention block-sparse prefill against dense attention, chunk by chunk,
 * on configs/large.yaml shapes (32 q heads, 8 kv heads, head_dim 128).
 *
 * Each measured chunk runs what a prefill layer runs: dense causal
 * attention over every earlier key, or the xattn_bsa path — estimation
 * (antidiagonal scoring of the chunk against every stored block, threshold
 * selection, vote) then attention over the selected blocks per head, the
 * way the engine's default pipeline does it (one block at a time, merged by
 * LSE), then the chunk itself causally. Kernels are the library's
 * (sift_attn_dense, sift_attn_merge); the scoring is the plugin's own
 * source. Two baselines: `dense` is one sift_attn_dense call over every
 * key (the kernel at its best), `full` attends every block through the same
 * block-by-block path (what the full policy costs through the engine).
 * Work per kv-head group is independent and identical in kind, so
 * a run measures --heads query heads of one group and scales the times by
 * n_q_heads / heads. Chunks not measured (--sample) are filled in by a
 * least-squares line over the chunk index (cost per chunk grows linearly
 * with its position). docs/policies/xattn_bsa.md describes the input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glib.h>
#include <sift/bench.h>
#include <sift/sift.h>

#include "xattn-score.h"

/* What `sift bench policy` lends this benchmark (set on entry). */
static const SiftBenchHost *bench_host;

typedef struct {
  char *lengths;
  gint q_heads, kv_heads, head_dim, heads;
  gint kv_block, chunk, stride, block, sample, threads;
  gboolean density_only;
  double threshold, vote_threshold, norm;
  gboolean sum_exp, paged;
  gint64 exact_rows;
  char *vote, *granularity, *clock, *antidiagonal;
  char *config;                  /* input from the synthetic source of this config */
  SiftConfig *cfg;
  gint64 min_query_len;
  /* input */
  double sink, locality, heavy, noise;
  gint n_heavy;
  guint seed;
} Options;

/* The input: per position, rotary "locality" dims shared by q and k (their
 * dot product peaks at distance 0 and decays), one channel that lifts sink
 * and heavy-hitter keys for every query, and Gaussian noise elsewhere.
 * Logit units: `locality` at distance 0, `sink` for the first 4 keys,
 * `heavy` for n_heavy random keys, noise of std ~noise^2. */
typedef struct {
  gint32 n_q, d;
  gint64 n;
  float *q;  /* [n_q][n][d] */
  float *k;  /* [1][n][d] */
  float *v;  /* [1][n][d] */
} Input;

static void input_free (Input *in);

static double
gauss (GRand *r)
{
  double u = g_rand_double (r), w = g_rand_double (r);
  return sqrt (-2.0 * log (1.0 - u)) * cos (2.0 * G_PI * w);
}

static Input *
input_alloc (gint32 n_q, gint64 n, gint32 d)
{
  Input *in = g_new0 (Input, 1);
  in->n_q = n_q;
  in->d = d;
  in->n = n;
  in->q = g_new (float, (gsize) n_q * (gsize) n * (gsize) d);
  in->k = g_new (float, (gsize) n * (gsize) d);
  in->v = g_new (float, (gsize) n * (gsize) d);
  return in;
}

static Input *
input_new (const Options *o, gint64 n)
{
  const gint32 d = o->head_dim, R = MIN (32, (d / 2) & ~1), ch = R;
  Input *in = input_alloc (o->heads, n, d);
  GRand *r = g_rand_new_with_seed (o->seed);
  const double rd = sqrt ((double) d);
  const double amp = sqrt (o->locality * rd / (R / 2));
  g_autofree guint8 *lift = g_new0 (guint8, (gsize) n);
  for (gint i = 0; i < o->n_heavy; i++)
    lift[g_rand_int_range (r, 4, (gint32) MIN (n, G_MAXINT32))] = 2;
  for (gint64 t = 0; t < MIN (4, n); t++)
    lift[t] = 1;
  for (gint64 t = 0; t < n; t++)
    {
      float *k = in->k + t * d, *v = in->v + t * d;
      for (gint32 f = 0; f < R / 2; f++)
        {
          double th = pow (10000.0, -2.0 * f / R) * (double) t;
          k[2 * f] = (float) (amp * cos (th));
          k[2 * f + 1] = (float) (amp * sin (th));
        }
      k[ch] = (float) (lift[t] == 1 ? o->sink * rd : lift[t] == 2 ? o->heavy * rd : 0.0);
      for (gint32 e = ch + 1; e < d; e++)
        k[e] = (float) (o->noise * gauss (r));
      for (gint32 e = 0; e < d; e++)
        v[e] = (float) gauss (r);
      for (gint32 h = 0; h < o->heads; h++)
        {
          float *q = in->q + ((gsize) h * (gsize) n + (gsize) t) * (gsize) d;
          memcpy (q, k, (gsize) R * sizeof (float));
          q[ch] = 1.0f;
          for (gint32 e = ch + 1; e < d; e++)
            q[e] = (float) (o->noise * gauss (r));
        }
    }
  g_rand_free (r);
  return in;
}

/* The input from the config's synthetic source (the host's synth_qkv): q heads
 * 0..heads-1 and kv head 0 of layer 0. */
static Input *
input_from_config (const Options *o, gint64 n, GError **error)
{
  Input *in = input_alloc (o->heads, n, o->cfg->shape.head_dim);
  if (!bench_host->synth_qkv (o->cfg, o->heads, n, in->q, in->k, in->v, error))
    {
      input_free (in);
      return NULL;
    }
  return in;
}

static void
input_free (Input *in)
{
  g_free (in->q);
  g_free (in->k);
  g_free (in->v);
  g_free (in);
}

typedef struct {
  double dense_s, est_s, attn_s;
  double full_s;               /* every block through the same block-by-block path (the full policy) */
  double pairs, pairs_dense;   /* (query, key) pairs attended, summed over heads */
  double rel_err;              /* ||sparse - dense|| / ||dense|| */
  double kb_sel, kb_causal;    /* (head, query block, key block) triples selected / causal */
} ChunkResult;

/* Seconds on the chosen clock: wall time, or the CPU time of the whole
 * process (all its threads) — the work done, which a loaded machine does not
 * inflate the way it inflates wall time. */
static gboolean use_cpu_clock = TRUE;

static double
now (void)
{
  struct timespec ts;
  clock_gettime (use_cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* Merges attention of heads [h0, h0 + n) over keys k, v into acc. */
static gboolean
attend_merge (const SiftView *q, gint32 h0, gint32 n, const SiftView *k, const SiftView *v,
              const SiftAttnOpts *opts, SiftView *acc, float *acc_lse, float *tmp, float *tmp_lse,
              GError **error)
{
  SiftView qh = sift_view_heads (q, h0, n);
  SiftView oh = sift_view_htd (tmp, SIFT_DTYPE_F32, n, q->n_tokens, q->head_dim);
  SiftView ah = sift_view_heads (acc, h0, n);
  return sift_attn_dense (&qh, k, v, opts, &oh, tmp_lse, error)
         && sift_attn_merge (&ah, acc_lse + (gsize) h0 * (gsize) q->n_tokens, &oh, tmp_lse, error);
}

/* Rows [r0, r0 + n) of out [H][n_q][d] and lse [H][n_q] from a result
 * computed for those rows only, o [H][n][d] and l [H][n]. */
static void
rows_out (const float *o, const float *l, gint32 H, gint64 n, gint32 d, gint64 r0, gint64 n_q, float *out, float *lse)
{
  for (gint32 h = 0; h < H; h++)
    {
      memcpy (out + ((gsize) h * (gsize) n_q + (gsize) r0) * (gsize) d, o + (gsize) h * (gsize) n * (gsize) d,
              (gsize) n * (gsize) d * sizeof (float));
      memcpy (lse + (gsize) h * (gsize) n_q + (gsize) r0, l + (gsize) h * (gsize) n, (gsize) n * sizeof (float));
    }
}

/* What one default-pipeline call does for chunk rows [r0, r1): every
 * stored block for the heads whose attend[h][e] is set (runs of consecutive
 * heads in one kernel call), then the chunk's keys causally; the result goes
 * to those rows of out / lse ([H][n_q]). Adds the (query, key) pairs. */
static gboolean
attend_rows (const Input *in, const SiftView *q, gint64 q_pos, gint64 r0, gint64 r1, const guint8 *attend,
             gint64 n_blocks, gint32 bs, float scale, float *out, float *lse, double *pairs, GError **error)
{
  const gint32 H = in->n_q, d = in->d;
  const gint64 n = r1 - r0, n_q = q->n_tokens;
  SiftView k_all = sift_view_htd (in->k, SIFT_DTYPE_F32, 1, in->n, d);
  SiftView v_all = sift_view_htd (in->v, SIFT_DTYPE_F32, 1, in->n, d);
  SiftView qr = sift_view_tokens (q, r0, n);
  g_autofree float *acc = g_new0 (float, (gsize) H * (gsize) n * (gsize) d);
  g_autofree float *acc_lse = g_new (float, (gsize) H * (gsize) n);
  g_autofree float *tmp = g_new (float, (gsize) H * (gsize) n * (gsize) d);
  g_autofree float *tmp_lse = g_new (float, (gsize) H * (gsize) n);
  for (gsize i = 0; i < (gsize) H * (gsize) n; i++)
    acc_lse[i] = -INFINITY;
  SiftView acc_v = sift_view_htd (acc, SIFT_DTYPE_F32, H, n, d);
  SiftAttnOpts full = { scale, FALSE, 0 };
  for (gint64 e = 0; e < n_blocks; e++)
    for (gint32 h = 0; h < H;)
      {
        if (!attend[(gsize) h * (gsize) n_blocks + (gsize) e])
          {
            h++;
            continue;
          }
        gint32 h1 = h;
        while (h1 < H && attend[(gsize) h1 * (gsize) n_blocks + (gsize) e])
          h1++;
        SiftView kb = sift_view_tokens (&k_all, e * bs, bs), vb = sift_view_tokens (&v_all, e * bs, bs);
        if (!attend_merge (&qr, h, h1 - h, &kb, &vb, &full, &acc_v, acc_lse, tmp, tmp_lse, error))
          return FALSE;
        *pairs += (double) (h1 - h) * (double) bs * (double) n;
        h = h1;
      }
  SiftView kl = sift_view_tokens (&k_all, q_pos, r1), vl = sift_view_tokens (&v_all, q_pos, r1);
  SiftAttnOpts local = { scale, TRUE, r0 };
  if (!attend_merge (&qr, 0, H, &kl, &vl, &local, &acc_v, acc_lse, tmp, tmp_lse, error))
    return FALSE;
  *pairs += (double) H * ((double) n * (double) r0 + (double) n * (double) (n + 1) / 2);
  rows_out (acc, acc_lse, H, n, d, r0, n_q, out, lse);
  return TRUE;
}

/* attend_rows with paged attention (sift_attn_paged): per run of
 * consecutive heads with the same blocks, one call over those blocks and
 * the chunk's keys up to row r1 (causal: the chunk's keys come last, so
 * query row i sees them up to r0 + i). */
static gboolean
attend_rows_paged (const Input *in, const SiftView *q, gint64 q_pos, gint64 r0, gint64 r1, const guint8 *attend,
                   gint64 n_blocks, gint32 bs, float scale, float *out, float *lse, double *pairs, GError **error)
{
  const gint32 H = in->n_q, d = in->d;
  const gint64 n = r1 - r0, n_q = q->n_tokens;
  SiftView k_all = sift_view_htd (in->k, SIFT_DTYPE_F32, 1, in->n, d);
  SiftView v_all = sift_view_htd (in->v, SIFT_DTYPE_F32, 1, in->n, d);
  SiftView qr = sift_view_tokens (q, r0, n);
  g_autofree SiftView *kb = g_new (SiftView, (gsize) n_blocks + 1);
  g_autofree SiftView *vb = g_new (SiftView, (gsize) n_blocks + 1);
  g_autofree float *o = g_new (float, (gsize) H * (gsize) n * (gsize) d);
  g_autofree float *l = g_new (float, (gsize) H * (gsize) n);
  for (gint32 h = 0; h < H;)
    {
      const guint8 *a = attend + (gsize) h * (gsize) n_blocks;
      gint32 h1 = h + 1;
      while (h1 < H && memcmp (a, attend + (gsize) h1 * (gsize) n_blocks, (gsize) n_blocks) == 0)
        h1++;
      gsize nb = 0;
      for (gint64 e = 0; e < n_blocks; e++)
        if (a[e])
          {
            kb[nb] = sift_view_tokens (&k_all, e * bs, bs);
            vb[nb] = sift_view_tokens (&v_all, e * bs, bs);
            nb++;
          }
      kb[nb] = sift_view_tokens (&k_all, q_pos, r1);
      vb[nb] = sift_view_tokens (&v_all, q_pos, r1);
      SiftAttnOpts opts = { scale, TRUE, (gint64) nb * bs + r0 };
      SiftView qh = sift_view_heads (&qr, h, h1 - h);
      SiftView oh = sift_view_htd (o + (gsize) h * (gsize) n * (gsize) d, SIFT_DTYPE_F32, h1 - h, n, d);
      if (!sift_attn_paged (&qh, kb, vb, nb + 1, &opts, &oh, l + (gsize) h * (gsize) n, error))
        return FALSE;
      *pairs += (double) (h1 - h) * ((double) nb * bs * (double) n + (double) n * (double) r0
                                     + (double) n * (double) (n + 1) / 2);
      h = h1;
    }
  rows_out (o, l, H, n, d, r0, n_q, out, lse);
  return TRUE;
}

static gboolean
run_chunk (const Options *o, const Input *in, gint64 q_pos, gint64 n_q, XattnScorer *scorer,
           ChunkResult *res, GError **error)
{
  const gint32 H = in->n_q, d = in->d, bs = o->kv_block;
  const gint64 kv_end = q_pos + n_q, n_blocks = q_pos / bs;
  const float scale = 1.0f / sqrtf ((float) d);
  SiftView q_all = sift_view_htd (in->q, SIFT_DTYPE_F32, H, in->n, d);
  SiftView q = sift_view_tokens (&q_all, q_pos, n_q);
  SiftView k_all = sift_view_htd (in->k, SIFT_DTYPE_F32, 1, in->n, d);
  SiftView v_all = sift_view_htd (in->v, SIFT_DTYPE_F32, 1, in->n, d);
  gsize out_n = (gsize) H * (gsize) n_q * (gsize) d;
  g_autofree float *dense = g_new (float, out_n);
  g_autofree float *dense_lse = g_new (float, (gsize) H * (gsize) n_q);
  g_autofree float *acc = g_new0 (float, out_n);
  g_autofree float *acc_lse = g_new (float, (gsize) H * (gsize) n_q);

  /* Dense: every earlier key and the chunk, causal. */
  SiftView k_upto = sift_view_tokens (&k_all, 0, kv_end), v_upto = sift_view_tokens (&v_all, 0, kv_end);
  SiftView dense_v = sift_view_htd (dense, SIFT_DTYPE_F32, H, n_q, d);
  SiftAttnOpts causal = { scale, TRUE, q_pos };
  double t0 = now ();
  if (!o->density_only && !sift_attn_dense (&q, &k_upto, &v_upto, &causal, &dense_v, dense_lse, error))
    return FALSE;
  res->dense_s = now () - t0;
  res->pairs_dense = (double) H * ((double) n_q * (double) q_pos + (double) n_q * (double) (n_q + 1) / 2);

  /* xattn_bsa: estimation, selection, vote. */
  t0 = now ();
  XattnGeometry geo = { H, 1, d, o->stride, o->block, scale, (float) o->norm, o->sum_exp };
  /* Per call of the pipeline: rows [r0, r1) and what each head attends. */
  const gsize slice = (gsize) H * (gsize) MAX (n_blocks, 1);
  g_autofree guint8 *attend = NULL;
  g_autofree gint64 *r_lo = NULL, *r_hi = NULL;
  gint64 n_calls = 1;
  if (kv_end < o->min_query_len)
    {
      attend = g_malloc (slice);
      memset (attend, 1, slice);
      r_lo = g_new0 (gint64, 1);
      r_hi = g_new (gint64, 1);
      r_hi[0] = n_q;
    }
  else
    {
      /* As xattn-glue.c: the chunk's last exact_rows queries also go
       * through a stride-1 scorer. */
      const gint64 n_exact = MIN (o->exact_rows, n_q), exact_pos = kv_end - n_exact;
      XattnGeometry exact_geo = { H, 1, d, 1, o->block, scale, 1.0f, FALSE };
      g_autoptr (XattnScorer) exact = n_exact > 0 ? xattn_scorer_new (&exact_geo) : NULL;
      xattn_scorer_begin (scorer, &q, q_pos, n_q);
      if (exact != NULL)
        {
          SiftView q_tail = sift_view_tokens (&q, n_q - n_exact, n_exact);
          xattn_scorer_begin (exact, &q_tail, exact_pos, n_exact);
        }
      for (gint64 e = 0; e < n_blocks; e++)
        {
          SiftView kb = sift_view_tokens (&k_all, e * bs, bs);
          xattn_scorer_stage_keys (scorer, &kb, e * bs, bs);
          if (exact != NULL)
            xattn_scorer_stage_keys (exact, &kb, e * bs, bs);
        }
      SiftView k_local = sift_view_tokens (&k_all, q_pos, n_q);
      xattn_scorer_add_keys (scorer, &k_local, q_pos, n_q);
      if (exact != NULL)
        xattn_scorer_add_keys (exact, &k_local, q_pos, n_q);
      gint64 qb0 = xattn_scorer_first_qb (scorer), n_qb = xattn_scorer_n_qb (scorer);
      gint64 n_kb = xattn_scorer_n_kb (scorer);
      g_autofree float *scores = g_new (float, (gsize) (H * n_qb * n_kb));
      g_autofree guint8 *sel = g_new (guint8, (gsize) (H * n_qb * n_kb));
      g_autofree gint64 *order = g_new (gint64, (gsize) n_kb);
      xattn_scorer_finish (scorer, scores);
      for (gint64 row = 0; row < H * n_qb; row++)
        xattn_select_row (scores + row * n_kb, n_kb, qb0 + row % n_qb, o->threshold, sel + row * n_kb, order);
      if (exact != NULL)
        {
          g_autofree float *mass = g_new (float, (gsize) (H * n_exact * n_kb));
          xattn_scorer_finish_rows (exact, mass);
          xattn_select_exact_rows (mass, H, n_exact, exact_pos, o->block, qb0, n_qb, n_kb, o->threshold, sel);
        }
      for (gint64 row = 0; row < H * n_qb; row++)
        {
          gint64 qb = qb0 + row % n_qb;
          for (gint64 kb = 0; kb <= qb; kb++)
            res->kb_sel += sel[row * n_kb + kb];
          res->kb_causal += (double) (qb + 1);
        }
      g_autofree SiftBlockMeta *meta = g_new (SiftBlockMeta, (gsize) MAX (n_blocks, 1));
      g_autofree gint64 *ids = g_new (gint64, (gsize) MAX (n_blocks, 1));
      for (gint64 e = 0; e < n_blocks; e++)
        {
          meta[e] = (SiftBlockMeta) { .first_token = e * bs, .n_valid = bs, .phase = SIFT_PHASE_PREFILL };
          ids[e] = e;
        }
      XattnPlan plan;
      xattn_plan_init (&plan, H, n_qb, n_blocks);
      xattn_aggregate (&geo, sel, n_qb, n_kb, meta, ids, n_blocks,
                       g_str_equal (o->vote, "majority") ? XATTN_VOTE_MAJORITY : XATTN_VOTE_ANY,
                       o->vote_threshold, FALSE, &plan);
      /* As xattn-glue.c: one call for the chunk, or one per run of query
       * blocks with identical choices. */
      gboolean per_qb = g_str_equal (o->granularity, "query_block");
      attend = g_malloc (slice * (gsize) n_qb);
      r_lo = g_new (gint64, (gsize) n_qb);
      r_hi = g_new (gint64, (gsize) n_qb);
      n_calls = 0;
      for (gint64 i = 0; i < (per_qb ? n_qb : 1);)
        {
          const guint8 *a = per_qb ? plan.qb_attend + (gsize) i * slice : plan.attend;
          gint64 j = i + 1;
          while (per_qb && j < n_qb && memcmp (a, plan.qb_attend + (gsize) j * slice, slice) == 0)
            j++;
          memcpy (attend + (gsize) n_calls * slice, a, slice);
          r_lo[n_calls] = per_qb ? MAX ((qb0 + i) * o->block, q_pos) - q_pos : 0;
          r_hi[n_calls] = per_qb ? MIN ((qb0 + j) * o->block, kv_end) - q_pos : n_q;
          n_calls++;
          i = j;
        }
      xattn_plan_clear (&plan);
    }
  res->est_s = now () - t0;

  /* Attention over the selection, call by call. */
  if (o->density_only)
    {
      for (gint64 c = 0; c < n_calls; c++)
        {
          gint64 n = r_hi[c] - r_lo[c];
          for (gsize i = 0; i < slice; i++)
            res->pairs += attend[(gsize) c * slice + i] ? (double) bs * (double) n : 0.0;
          res->pairs += (double) H * ((double) n * (double) r_lo[c] + (double) n * (double) (n + 1) / 2);
        }
      return TRUE;
    }
  t0 = now ();
  for (gint64 c = 0; c < n_calls; c++)
    if (!(o->paged ? attend_rows_paged : attend_rows) (in, &q, q_pos, r_lo[c], r_hi[c], attend + (gsize) c * slice,
                                                        n_blocks, bs, scale, acc, acc_lse, &res->pairs, error))
      return FALSE;
  res->attn_s = now () - t0;

  /* The full policy's cost on the same path: every block, every head. */
  g_autofree guint8 *all = g_malloc (slice);
  memset (all, 1, slice);
  g_autofree float *full_out = g_new (float, out_n);
  g_autofree float *full_lse = g_new (float, (gsize) H * (gsize) n_q);
  double full_pairs = 0;
  t0 = now ();
  if (!attend_rows (in, &q, q_pos, 0, n_q, all, n_blocks, bs, scale, full_out, full_lse, &full_pairs, error))
    return FALSE;
  res->full_s = now () - t0;

  double num = 0, den = 0;
  for (gsize i = 0; i < out_n; i++)
    {
      num += (acc[i] - dense[i]) * (double) (acc[i] - dense[i]);
      den += dense[i] * (double) dense[i];
    }
  res->rel_err = den > 0 ? sqrt (num / den) : 0;
  return TRUE;
}

/* Sum over every chunk 0..n-1 of a quantity measured at `idx`, from the
 * least-squares line y = a + b * i (exact when every chunk was measured). */
static double
fill_total (const gint64 *idx, const double *y, gsize m, gint64 n)
{
  if ((gint64) m == n)
    {
      double s = 0;
      for (gsize i = 0; i < m; i++)
        s += y[i];
      return s;
    }
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (gsize i = 0; i < m; i++)
    {
      sx += (double) idx[i];
      sy += y[i];
      sxx += (double) idx[i] * (double) idx[i];
      sxy += (double) idx[i] * y[i];
    }
  double den = (double) m * sxx - sx * sx;
  double b = m > 1 && den != 0 ? ((double) m * sxy - sx * sy) / den : 0;
  double a = (sy - b * sx) / (double) m;
  return (double) n * a + b * (double) n * (double) (n - 1) / 2;
}

static gboolean
run_length (const Options *o, gint64 n, GError **error)
{
  g_autoptr (GTimer) gen = g_timer_new ();
  Input *in = o->cfg != NULL ? input_from_config (o, n, error) : input_new (o, n);
  if (in == NULL)
    return FALSE;
  const gint64 n_chunks = (n + o->chunk - 1) / o->chunk;
  gint64 m = o->sample <= 0 ? n_chunks : MIN (o->sample, n_chunks);
  g_autofree gint64 *idx = g_new (gint64, (gsize) m);
  g_autofree double *dense = g_new (double, (gsize) m);
  g_autofree double *full = g_new (double, (gsize) m);
  g_autofree double *sparse = g_new (double, (gsize) m);
  g_autofree double *est = g_new (double, (gsize) m);
  g_autofree double *pairs = g_new (double, (gsize) m);
  g_autofree double *pairs_dense = g_new (double, (gsize) m);
  XattnGeometry geo = { o->heads, 1, o->head_dim, o->stride, o->block, 1.0f / sqrtf ((float) o->head_dim),
                       (float) o->norm, o->sum_exp };
  g_autoptr (XattnScorer) scorer = xattn_scorer_new (&geo);
  double worst_err = 0;
  fprintf (stderr, "  length %" G_GINT64_FORMAT ": input in %.1f s; %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT " chunks\n",
           n, g_timer_elapsed (gen, NULL), m, n_chunks);
  for (gint64 i = 0; i < m; i++)
    {
      /* Evenly spaced, always including the last (the longest) chunk. */
      idx[i] = m == 1 ? n_chunks - 1 : (n_chunks - 1) - (m - 1 - i) * (n_chunks - 1) / (m - 1);
      gint64 q_pos = idx[i] * o->chunk, n_q = MIN ((gint64) o->chunk, n - q_pos);
      ChunkResult r = { 0 };
      if (!run_chunk (o, in, q_pos, n_q, scorer, &r, error))
        {
          input_free (in);
          return FALSE;
        }
      dense[i] = r.dense_s;
      full[i] = r.full_s;
      est[i] = r.est_s;
      sparse[i] = r.est_s + r.attn_s;
      pairs[i] = r.pairs;
      pairs_dense[i] = r.pairs_dense;
      worst_err = MAX (worst_err, r.rel_err);
      fprintf (stderr, "    chunk %4" G_GINT64_FORMAT ": dense %.2f s, full %.2f s, xattn %.2f s (estimate %.2f s), "
               "density %.3f (per query block %.3f)\n", idx[i], r.dense_s, r.full_s, r.est_s + r.attn_s, r.est_s,
               r.pairs / r.pairs_dense, r.kb_causal > 0 ? r.kb_sel / r.kb_causal : 1.0);
    }
  const double scale = (double) o->q_heads / o->heads;
  double t_dense = fill_total (idx, dense, (gsize) m, n_chunks) * scale;
  double t_full = fill_total (idx, full, (gsize) m, n_chunks) * scale;
  double t_sparse = fill_total (idx, sparse, (gsize) m, n_chunks) * scale;
  double t_est = fill_total (idx, est, (gsize) m, n_chunks) * scale;
  double density = fill_total (idx, pairs, (gsize) m, n_chunks) / fill_total (idx, pairs_dense, (gsize) m, n_chunks);
  if (o->density_only)
    printf ("%8" G_GINT64_FORMAT " %7.3f %9s %9s %9s %10.1f %9s %9s %8s  %" G_GINT64_FORMAT "/%" G_GINT64_FORMAT "\n",
            n, density, "-", "-", "-", t_est, "-", "-", "-", m, n_chunks);
  else
    printf ("%8" G_GINT64_FORMAT " %7.3f %9.1f %9.1f %9.1f %10.1f %8.2fx %8.2fx %8.4f  %" G_GINT64_FORMAT "/%" G_GINT64_FORMAT "\n",
            n, density, t_dense, t_full, t_sparse, t_est, t_dense / t_sparse, t_full / t_sparse, worst_err, m, n_chunks);
  fflush (stdout);
  input_free (in);
  return TRUE;
}

SIFT_POLICY_BENCH_DEFINE (xattn_bsa)
{
  bench_host = host;
  Options o = {
    .lengths = NULL, .q_heads = 32, .kv_heads = 8, .head_dim = 128, .heads = 4,
    .kv_block = 128, .chunk = 4096, .stride = 8, .block = 128, .sample = 4, .threads = 1,
    .threshold = 0.9, .vote_threshold = 0.5, .norm = 1.0, .exact_rows = 64, .vote = NULL, .min_query_len = 1024,
    .sink = 8.0, .locality = 4.0, .heavy = 4.0, .noise = 1.0, .n_heavy = 8, .seed = 1,
  };
  const GOptionEntry entries[] = {
    { "lengths", 0, 0, G_OPTION_ARG_STRING, &o.lengths, "Context lengths (default 32768,131072)", "N,..." },
    { "q-heads", 0, 0, G_OPTION_ARG_INT, &o.q_heads, "Query heads of the model (32)", "N" },
    { "kv-heads", 0, 0, G_OPTION_ARG_INT, &o.kv_heads, "KV heads of the model (8)", "N" },
    { "head-dim", 0, 0, G_OPTION_ARG_INT, &o.head_dim, "Head dimension (128)", "N" },
    { "heads", 0, 0, G_OPTION_ARG_INT, &o.heads, "Query heads measured, of one kv group (4); times scale to q-heads", "N" },
    { "kv-block", 0, 0, G_OPTION_ARG_INT, &o.kv_block, "Engine KV block size in tokens (128)", "N" },
    { "chunk", 0, 0, G_OPTION_ARG_INT, &o.chunk, "Prefill chunk size (4096)", "N" },
    { "sample", 0, 0, G_OPTION_ARG_INT, &o.sample, "Chunks measured per length, evenly spaced (4; 0: all)", "N" },
    { "density-only", 0, 0, G_OPTION_ARG_NONE, &o.density_only, "Estimate and select only: density, no attention timing", NULL },
    { "threads", 0, 0, G_OPTION_ARG_INT, &o.threads, "Threads for parallel loops (1; 0: SIFT_THREADS or all)", "N" },
    { "clock", 0, 0, G_OPTION_ARG_STRING, &o.clock, "cpu (process CPU time, all threads) or wall (cpu)", "CLOCK" },
    { "threshold", 0, 0, G_OPTION_ARG_DOUBLE, &o.threshold, "xattn_bsa threshold (0.9)", "X" },
    { "stride", 0, 0, G_OPTION_ARG_INT, &o.stride, "xattn_bsa stride (8)", "S" },
    { "block", 0, 0, G_OPTION_ARG_INT, &o.block, "xattn_bsa block_size (128)", "B" },
    { "paged", 0, 0, G_OPTION_ARG_NONE, &o.paged, "Attend the selection with sift_attn_paged: one call per query-block run and head run (default: block by block, as the engine's pipeline)", NULL },
    { "exact-rows", 0, 0, G_OPTION_ARG_INT64, &o.exact_rows, "xattn_bsa exact_rows (64)", "N" },
    { "norm", 0, 0, G_OPTION_ARG_DOUBLE, &o.norm, "xattn_bsa norm (1)", "X" },
    { "antidiagonal", 0, 0, G_OPTION_ARG_STRING, &o.antidiagonal, "xattn_bsa antidiagonal: sum_exp | mean_logit (sum_exp)", "MODE" },
    { "vote", 0, 0, G_OPTION_ARG_STRING, &o.vote, "xattn_bsa vote: any | majority (any)", "MODE" },
    { "granularity", 0, 0, G_OPTION_ARG_STRING, &o.granularity, "xattn_bsa granularity: query_block | chunk (query_block)", "G" },
    { "vote-threshold", 0, 0, G_OPTION_ARG_DOUBLE, &o.vote_threshold, "xattn_bsa vote_threshold (0.5)", "X" },
    { "min-query-len", 0, 0, G_OPTION_ARG_INT64, &o.min_query_len, "xattn_bsa min_query_len (1024)", "N" },
    { "config", 0, 0, G_OPTION_ARG_FILENAME, &o.config, "Input from this config's synthetic source; its q_heads, kv_heads, head_dim, block_size and chunk_size replace the shape options", "FILE" },
    { "sink", 0, 0, G_OPTION_ARG_DOUBLE, &o.sink, "Input: logit of the 4 sink keys (8)", "X" },
    { "locality", 0, 0, G_OPTION_ARG_DOUBLE, &o.locality, "Input: rotary locality logit at distance 0 (4)", "X" },
    { "heavy", 0, 0, G_OPTION_ARG_DOUBLE, &o.heavy, "Input: logit of heavy-hitter keys (4)", "X" },
    { "n-heavy", 0, 0, G_OPTION_ARG_INT, &o.n_heavy, "Input: heavy-hitter keys (8)", "N" },
    { "noise", 0, 0, G_OPTION_ARG_DOUBLE, &o.noise, "Input: std of q and k noise dims (1)", "X" },
    { "seed", 0, 0, G_OPTION_ARG_INT, &o.seed, "Input seed (1)", "N" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("- XAttention-BSA density and prefill speed vs dense");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  g_autofree char *lengths = NULL, *vote = NULL, *granularity = NULL, *clock_name = NULL;
  if (!g_option_context_parse (ctx, &argc, &argv, &error))
    {
      fprintf (stderr, "sift bench policy xattn_bsa: %s\n", error->message);
      return 2;
    }
  lengths = o.lengths ? o.lengths : g_strdup ("32768,131072");
  vote = o.vote ? o.vote : g_strdup ("any");
  o.vote = vote;
  g_autofree char *antidiagonal = o.antidiagonal ? o.antidiagonal : g_strdup ("sum_exp");
  o.antidiagonal = antidiagonal;
  o.sum_exp = g_str_equal (antidiagonal, "sum_exp");
  granularity = o.granularity ? o.granularity : g_strdup ("query_block");
  o.granularity = granularity;
  clock_name = o.clock ? o.clock : g_strdup ("cpu");
  use_cpu_clock = g_str_equal (clock_name, "cpu");
  g_autoptr (SiftConfig) cfg = NULL;
  g_autofree char *config_path = o.config;
  if (config_path != NULL)
    {
      cfg = sift_config_load (config_path, NULL, &error);
      if (cfg == NULL)
        {
          fprintf (stderr, "sift bench policy xattn_bsa: %s\n", error->message);
          return 2;
        }
      o.cfg = cfg;
      o.q_heads = cfg->shape.n_q_heads;
      o.kv_heads = cfg->shape.n_kv_heads;
      o.head_dim = cfg->shape.head_dim;
      o.kv_block = cfg->shape.block_size;
      o.chunk = cfg->shape.chunk_size;
      o.heads = MIN (o.heads, o.q_heads / o.kv_heads);
    }
  if (o.heads < 1 || o.q_heads < 1 || o.kv_heads < 1 || o.q_heads % o.kv_heads != 0
      || o.heads > o.q_heads / o.kv_heads || o.head_dim < 8 || o.stride < 1 || o.block % o.stride != 0
      || o.kv_block % o.stride != 0 || o.chunk % o.kv_block != 0 || o.threshold < 0 || o.threshold > 1
      || (!g_str_equal (vote, "any") && !g_str_equal (vote, "majority"))
      || (!g_str_equal (granularity, "query_block") && !g_str_equal (granularity, "chunk"))
      || (!o.sum_exp && !g_str_equal (antidiagonal, "mean_logit")) || !(o.norm > 0) || o.exact_rows < 0
      || (!use_cpu_clock && !g_str_equal (clock_name, "wall")))
    {
      fprintf (stderr, "sift bench policy xattn_bsa: impossible options: need 1 <= heads <= q-heads/kv-heads, "
                       "head-dim >= 8, stride dividing block and kv-block, kv-block dividing chunk, "
                       "threshold in [0, 1], vote any|majority, granularity query_block|chunk, antidiagonal sum_exp|mean_logit, "
                       "norm > 0, exact-rows >= 0, clock cpu|wall\n");
      return 2;
    }
  if (o.threads > 0)
    sift_parallel_set_n_threads (o.threads);

  g_auto (GStrv) parts = g_strsplit (lengths, ",", -1);
  printf ("# xattn_bsa vs dense prefill attention: q_heads %d, kv_heads %d, head_dim %d (measured %d q head(s) "
          "of one group, scaled), kv block %d, chunk %d; threshold %.2f, stride %d, block %d, vote %s, "
          "granularity %s, antidiagonal %s, norm %g, exact_rows %" G_GINT64_FORMAT "; attention %s; threads %d, ISA %s, %s seconds\n",
          o.q_heads, o.kv_heads, o.head_dim, o.heads, o.kv_block, o.chunk, o.threshold, o.stride, o.block,
          vote, granularity, o.sum_exp ? "sum_exp" : "mean_logit", o.norm, o.exact_rows,
          o.paged ? "paged (one call per query-block run and head run)" : "block by block",
          sift_parallel_n_threads (), sift_isa_name (sift_isa_active ()),
          use_cpu_clock ? "CPU" : "wall");
  if (cfg != NULL)
    printf ("# input: synthetic source of %s (seed %" G_GUINT64_FORMAT ", its knobs, no needle), layer 0\n",
            config_path, bench_host->synth_seed (cfg));
  else
    printf ("# input: bench generator: sink %.1f, locality %.1f, heavy %.1f x %d, noise %.2f, seed %u\n", o.sink,
            o.locality, o.heavy, o.n_heavy, o.noise, o.seed);
  printf ("%8s %7s %9s %9s %9s %10s %9s %9s %8s  %s\n", "length", "density", "dense_s", "full_s", "xattn_s",
          "estimate_s", "vs_dense", "vs_full", "rel_err", "chunks");
  for (gsize i = 0; parts[i] != NULL; i++)
    {
      char *end = NULL;
      gint64 n = g_ascii_strtoll (parts[i], &end, 10);
      if (end == parts[i] || *end != '\0' || n < o.chunk)
        {
          fprintf (stderr, "sift bench policy xattn_bsa: --lengths: '%s' is not a length >= the chunk (%d)\n",
                   parts[i], o.chunk);
          return 2;
        }
      if (!run_length (&o, n, &error))
        {
          fprintf (stderr, "sift bench policy xattn_bsa: %s\n", error->message);
          return 2;
        }
    }
  return 0;
}

/* The GPU kernels (<sift/cuda.h>) against the CPU kernels on random
 * inputs: dense (prefill, causal or not, with offsets), decode (1..16 rows,
 * long contexts split over the key axis), paged (random blocks, some
 * empty, each of its own layout), merge; GQA 1/4/8, head_dim 64 and 128,
 * f16 and bf16, odd lengths. The CPU reads the same rounded K/V; the GPU
 * also rounds q and the probabilities to K's type, so the bounds are those
 * of docs/kernels.md ("GPU kernels"), per dtype. Outputs start as NaN: every
 * element must be written. Rows that see no key must be exactly o = 0,
 * lse = -inf. Without a GPU the test exits 77 (skipped), after checking
 * the error says so. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

typedef struct {
  gint32 d, kv_heads, group;
  gint64 n_q, n_kv;
  SiftDType dtype;
  gboolean causal;
  gint64 q_offset;
  gboolean token_major; /* q, out and K/V as [tokens][heads][d] */
} Case;

/* Relative L2 error of the output and |lse - ref| / (1 + |ref|), per dtype. */
static double
out_bound (SiftDType t)
{
  return t == SIFT_DTYPE_BF16 ? 1.5e-2 : 3e-3;
}
static double
lse_bound (SiftDType t)
{
  return t == SIFT_DTYPE_BF16 ? 1e-2 : 2.5e-3;
}

static double worst_out[3], worst_lse[3]; /* by dtype: printed at the end */

static void *
to_device (const void *src, gsize bytes)
{
  g_autoptr (GError) error = NULL;
  void *p = sift_cuda_malloc (bytes, &error);
  if (p == NULL || !sift_cuda_memcpy_to_device (p, src, bytes, &error))
    fail_msg ("%s", error->message);
  return p;
}

/* A device buffer of `bytes` filled with NaN (all bits set). */
static void *
nan_device (gsize bytes)
{
  g_autoptr (GError) error = NULL;
  void *p = sift_cuda_malloc (bytes, &error);
  if (p == NULL || !sift_cuda_memset (p, 0xff, bytes, &error))
    fail_msg ("%s", error->message);
  return p;
}

static void
from_device (void *dst, const void *src, gsize bytes)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_synchronize (&error) || !sift_cuda_memcpy_to_host (dst, src, bytes, &error))
    fail_msg ("%s", error->message);
}

static void
random_fill (GRand *r, float *x, gsize n, double lo, double hi)
{
  for (gsize i = 0; i < n; i++)
    x[i] = (float) g_rand_double_range (r, lo, hi);
}

static SiftView
view (void *data, SiftDType t, gint32 heads, gint64 tokens, gint32 d, gboolean token_major)
{
  return token_major ? sift_view_thd (data, t, tokens, heads, d) : sift_view_htd (data, t, heads, tokens, d);
}

/* Compares a GPU result with the CPU's: every element written (no NaN),
 * empty rows exact, the rest within the dtype's bounds. */
static void
compare (const Case *c, const char *what, const float *o, const float *lse, const float *o_ref,
         const float *lse_ref)
{
  gint32 hq = c->kv_heads * c->group;
  gsize nl = (gsize) hq * c->n_q, no = nl * c->d;
  double num = 0, den = 0, lse_err = 0;
  for (gsize e = 0; e < no; e++)
    {
      if (isnan (o[e]))
        fail_msg ("%s: out[%" G_GSIZE_FORMAT "] not written (NaN)", what, e);
      num += ((double) o[e] - o_ref[e]) * ((double) o[e] - o_ref[e]);
      den += (double) o_ref[e] * o_ref[e];
    }
  for (gsize e = 0; e < nl; e++)
    {
      if (lse_ref[e] == -INFINITY)
        {
          if (lse[e] != -INFINITY)
            fail_msg ("%s: row %" G_GSIZE_FORMAT " sees no key but lse %g", what, e, (double) lse[e]);
          /* Row e is (head e / n_q, token e % n_q) in the case's layout. */
          SiftView ov = view ((float *) o, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
          const float *row = sift_view_row (&ov, (gint64) e / c->n_q, (gint64) e % c->n_q);
          for (gint32 i = 0; i < c->d; i++)
            if (row[i] != 0.0f)
              fail_msg ("%s: row %" G_GSIZE_FORMAT " sees no key but out[%d] = %g", what, e, i, (double) row[i]);
          continue;
        }
      if (isnan (lse[e]) || lse[e] == -INFINITY)
        fail_msg ("%s: lse[%" G_GSIZE_FORMAT "] = %g, CPU %g", what, e, (double) lse[e], (double) lse_ref[e]);
      lse_err = MAX (lse_err, fabs ((double) lse[e] - lse_ref[e]) / (1.0 + fabs (lse_ref[e])));
    }
  double rel = den > 0 ? sqrt (num / den) : sqrt (num);
  int ti = c->dtype;
  worst_out[ti] = MAX (worst_out[ti], rel);
  worst_lse[ti] = MAX (worst_lse[ti], lse_err);
  if (!(rel <= out_bound (c->dtype)) || !(lse_err <= lse_bound (c->dtype)))
    fail_msg ("%s d %d kv_heads %d group %d n_q %" G_GINT64_FORMAT " n_kv %" G_GINT64_FORMAT
              " %s causal %d offset %" G_GINT64_FORMAT " token-major %d: out error %.3g (bound %.3g),"
              " lse error %.3g (bound %.3g)",
              what, c->d, c->kv_heads, c->group, c->n_q, c->n_kv, sift_dtype_name (c->dtype),
              c->causal, c->q_offset, c->token_major, rel, out_bound (c->dtype), lse_err,
              lse_bound (c->dtype));
}

/* Host and device copies of one case's inputs. */
typedef struct {
  gsize nq, nl, nkv;
  float *q, *o_ref, *lse_ref, *o, *lse;
  void *k, *v;         /* host, dtype */
  void *dq, *dk, *dv;  /* device */
  SiftView qv, kv, vv, rv;
} Data;

static void
data_init (Data *x, const Case *c, GRand *r)
{
  gint32 hq = c->kv_heads * c->group;
  gsize es = sift_dtype_size (c->dtype);
  x->nl = (gsize) hq * c->n_q;
  x->nq = x->nl * c->d;
  x->nkv = (gsize) c->kv_heads * c->n_kv * c->d;
  x->q = g_new (float, MAX (x->nq, 1));
  x->o_ref = g_new (float, MAX (x->nq, 1));
  x->o = g_new (float, MAX (x->nq, 1));
  x->lse_ref = g_new (float, MAX (x->nl, 1));
  x->lse = g_new (float, MAX (x->nl, 1));
  g_autofree float *tmp = g_new (float, MAX (x->nkv, 1));
  random_fill (r, x->q, x->nq, -2, 2);
  x->k = g_malloc (MAX (x->nkv, 1) * es);
  x->v = g_malloc (MAX (x->nkv, 1) * es);
  random_fill (r, tmp, x->nkv, -2, 2);
  sift_convert (tmp, SIFT_DTYPE_F32, x->k, c->dtype, x->nkv);
  random_fill (r, tmp, x->nkv, -1, 1);
  sift_convert (tmp, SIFT_DTYPE_F32, x->v, c->dtype, x->nkv);
  x->dq = to_device (x->q, MAX (x->nq, 1) * 4);
  x->dk = to_device (x->k, MAX (x->nkv, 1) * es);
  x->dv = to_device (x->v, MAX (x->nkv, 1) * es);
  x->qv = view (x->q, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
  x->kv = view (x->k, c->dtype, c->kv_heads, c->n_kv, c->d, c->token_major);
  x->vv = view (x->v, c->dtype, c->kv_heads, c->n_kv, c->d, c->token_major);
  x->rv = view (x->o_ref, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
}

static void
data_clear (Data *x)
{
  sift_cuda_free (x->dq), sift_cuda_free (x->dk), sift_cuda_free (x->dv);
  g_free (x->q), g_free (x->o_ref), g_free (x->o), g_free (x->lse_ref), g_free (x->lse);
  g_free (x->k), g_free (x->v);
}

/* Runs the GPU call `which` (0 dense, 1 decode) and the CPU one, compares. */
/* SIFT_CUDA_TEST_MAX_KV: cases with more keys are skipped (a run under
 * compute-sanitizer, which is ~100x slower). */
static gboolean
too_long (const Case *c)
{
  const char *env = g_getenv ("SIFT_CUDA_TEST_MAX_KV");
  return env != NULL && c->n_kv > g_ascii_strtoll (env, NULL, 10);
}

static void
check_contiguous (const Case *c, guint32 seed, int which)
{
  if (too_long (c))
    return;
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  Data x;
  data_init (&x, c, r);
  gint32 hq = c->kv_heads * c->group;
  SiftAttnOpts opts = { .causal = c->causal, .q_offset = c->q_offset };
  g_autoptr (GError) error = NULL;
  if (!sift_attn_dense (&x.qv, &x.kv, &x.vv, &opts, &x.rv, x.lse_ref, &error))
    fail_msg ("CPU: %s", error->message);

  float *d_o = nan_device (MAX (x.nq, 1) * 4), *d_lse = nan_device (MAX (x.nl, 1) * 4);
  SiftView dqv = view (x.dq, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
  SiftView dkv = view (x.dk, c->dtype, c->kv_heads, c->n_kv, c->d, c->token_major);
  SiftView dvv = view (x.dv, c->dtype, c->kv_heads, c->n_kv, c->d, c->token_major);
  SiftView dov = view (d_o, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
  gboolean ok = which == 0 ? sift_cuda_attn_dense (&dqv, &dkv, &dvv, &opts, &dov, d_lse, &error)
                           : sift_cuda_attn_decode (&dqv, &dkv, &dvv, &opts, &dov, d_lse, &error);
  if (!ok)
    fail_msg ("GPU: %s", error->message);
  from_device (x.o, d_o, x.nq * 4);
  from_device (x.lse, d_lse, x.nl * 4);
  compare (c, which == 0 ? "dense" : "decode", x.o, x.lse, x.o_ref, x.lse_ref);
  sift_cuda_free (d_o), sift_cuda_free (d_lse);
  data_clear (&x);
}

static const gint32 dims[] = { 64, 128 };
static const gint32 groups[] = { 1, 4, 8 };
static const SiftDType dtypes[] = { SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };

/* Prefill: odd lengths (rows and keys not multiples of the 128-row and
 * 64-key tiles), a chunk against a longer past, causal or not, few rows
 * against many keys (split over the key axis and merged). */
static void
test_dense (void **state)
{
  (void) state;
  static const gint64 shapes[][3] = { /* n_q, n_kv, causal q_offset (n_kv - n_q) */
    { 77, 77, 1 }, { 300, 1000, 1 }, { 129, 513, 0 }, { 17, 4099, 1 }, { 1000, 1000, 1 },
    { 250, 250, 0 }, { 130, 130, 0 }, { 40, 20011, 0 }, { 33, 9001, 1 }, { 64, 64, 1 },
  };
  guint32 seed = 1;
  for (gsize a = 0; a < G_N_ELEMENTS (dims); a++)
    for (gsize b = 0; b < G_N_ELEMENTS (groups); b++)
      for (gsize t = 0; t < G_N_ELEMENTS (dtypes); t++)
        for (gsize s = 0; s < G_N_ELEMENTS (shapes); s++)
          {
            Case c = { dims[a], 2, groups[b], shapes[s][0], shapes[s][1], dtypes[t],
                       (gboolean) shapes[s][2], shapes[s][1] - shapes[s][0], (seed % 3) == 0 };
            check_contiguous (&c, seed++, 0);
          }
}

/* Decode: 1..16 rows against short and long contexts (many splits);
 * groups that are not powers of two (3, 6) and 2 as well, so the K Q^T
 * kernel (up to 8 rows) sees 1, 2, 3, 4, 6 and 8 rows and padding
 * columns in its 8-wide tile. */
static void
test_decode (void **state)
{
  (void) state;
  static const gint32 decode_groups[] = { 1, 2, 3, 4, 6, 8 };
  static const gint64 rows[] = { 1, 3, 16 };
  static const gint64 keys[] = { 1, 100, 5003, 20011 };
  guint32 seed = 1000;
  for (gsize a = 0; a < G_N_ELEMENTS (dims); a++)
    for (gsize b = 0; b < G_N_ELEMENTS (decode_groups); b++)
      for (gsize t = 0; t < G_N_ELEMENTS (dtypes); t++)
        for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
          for (gsize j = 0; j < G_N_ELEMENTS (keys); j++)
            {
              if (keys[j] < rows[i])
                continue;
              gboolean causal = (seed % 2) == 0;
              Case c = { dims[a], MAX (8 / decode_groups[b], 1), decode_groups[b], rows[i], keys[j], dtypes[t], causal,
                         keys[j] - rows[i], (seed % 3) == 0 };
              check_contiguous (&c, seed++, 1);
            }
}

/* Rows before the first key (causal, negative offset) and no key at all. */
static void
test_empty_rows (void **state)
{
  (void) state;
  Case c = { 128, 2, 4, 40, 30, SIFT_DTYPE_BF16, TRUE, -10, FALSE };
  check_contiguous (&c, 7, 0);
  Case d = { 64, 2, 4, 5, 20, SIFT_DTYPE_F16, TRUE, -3, FALSE };
  check_contiguous (&d, 8, 1);
  Case e = { 64, 1, 8, 33, 0, SIFT_DTYPE_F16, FALSE, 0, FALSE };
  check_contiguous (&e, 9, 0);
  /* The same for the K Q^T decode kernel (4 and 8 rows a kv head) and
   * the Hopper prefill kernel (head_dim 128, bf16). */
  Case f = { 64, 2, 4, 1, 20, SIFT_DTYPE_F16, TRUE, -3, FALSE };
  check_contiguous (&f, 10, 1);
  Case g = { 128, 2, 4, 2, 0, SIFT_DTYPE_BF16, FALSE, 0, FALSE };
  check_contiguous (&g, 11, 0);
  Case h = { 128, 1, 8, 33, 0, SIFT_DTYPE_BF16, FALSE, 0, FALSE };
  check_contiguous (&h, 12, 0);
}

/* Paged: the keys in random blocks ([kv_heads][n_b][d], some empty, some
 * token-major, some with padded rows), each block its own device buffer;
 * the CPU reference is sift_attn_dense on the concatenation. */
static void
check_paged (const Case *c, guint32 seed)
{
  if (too_long (c))
    return;
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  Data x;
  data_init (&x, c, r);
  gint32 hq = c->kv_heads * c->group;
  gsize es = sift_dtype_size (c->dtype);
  SiftAttnOpts opts = { .causal = c->causal, .q_offset = c->q_offset };
  g_autoptr (GError) error = NULL;
  if (!sift_attn_dense (&x.qv, &x.kv, &x.vv, &opts, &x.rv, x.lse_ref, &error))
    fail_msg ("CPU: %s", error->message);

  SiftView kb[256], vb[256];
  void *bufs[512];
  gsize n_blocks = 0, n_bufs = 0;
  gint64 t0 = 0, unit = g_rand_boolean (r) ? 128 : g_rand_int_range (r, 1, 300);
  while (t0 < c->n_kv || (n_blocks == 0 && c->n_kv == 0))
    {
      /* Mostly `unit` keys, sometimes fewer (empty or partial blocks). */
      gint64 nb = g_rand_int_range (r, 0, 4) == 0 ? g_rand_int_range (r, 0, (gint32) unit + 1) : unit;
      nb = MIN (nb, c->n_kv - t0);
      if (n_blocks + 2 == G_N_ELEMENTS (kb))
        nb = c->n_kv - t0;
      int layout = g_rand_int_range (r, 0, 3);
      gint64 pad = layout == 2 ? 8 : 0;
      for (int kvi = 0; kvi < 2; kvi++)
        {
          const SiftView *all = kvi == 0 ? &x.kv : &x.vv;
          gsize bytes = (gsize) c->kv_heads * nb * (c->d + pad) * es;
          g_autofree char *host = g_malloc0 (MAX (bytes, 1));
          SiftView hv = layout == 1 ? sift_view_thd (host, c->dtype, nb, c->kv_heads, c->d)
                                    : sift_view_htd (host, c->dtype, c->kv_heads, nb, c->d);
          if (layout == 2)
            {
              hv.token_stride = c->d + pad;
              hv.head_stride = nb * (c->d + pad);
            }
          for (gint32 h = 0; h < c->kv_heads; h++)
            for (gint64 t = 0; t < nb; t++)
              memcpy (sift_view_row (&hv, h, t), sift_view_row (all, h, t0 + t), (gsize) c->d * es);
          void *dev = to_device (host, MAX (bytes, 1));
          bufs[n_bufs++] = dev;
          hv.data = dev;
          (kvi == 0 ? kb : vb)[n_blocks] = hv;
        }
      n_blocks++;
      t0 += nb;
    }

  float *d_o = nan_device (MAX (x.nq, 1) * 4), *d_lse = nan_device (MAX (x.nl, 1) * 4);
  SiftView dqv = view (x.dq, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
  SiftView dov = view (d_o, SIFT_DTYPE_F32, hq, c->n_q, c->d, c->token_major);
  if (!sift_cuda_attn_paged (&dqv, kb, vb, n_blocks, &opts, &dov, d_lse, &error))
    fail_msg ("GPU paged (%" G_GSIZE_FORMAT " blocks): %s", n_blocks, error->message);
  from_device (x.o, d_o, x.nq * 4);
  from_device (x.lse, d_lse, x.nl * 4);
  compare (c, "paged", x.o, x.lse, x.o_ref, x.lse_ref);
  for (gsize b = 0; b < n_bufs; b++)
    sift_cuda_free (bufs[b]);
  sift_cuda_free (d_o), sift_cuda_free (d_lse);
  data_clear (&x);
}

static void
test_paged (void **state)
{
  (void) state;
  static const gint64 shapes[][2] = { { 1, 3000 }, { 5, 777 }, { 16, 20000 }, { 40, 1500 }, { 200, 2000 } };
  guint32 seed = 2000;
  for (gsize a = 0; a < G_N_ELEMENTS (dims); a++)
    for (gsize b = 0; b < G_N_ELEMENTS (groups); b++)
      for (gsize s = 0; s < G_N_ELEMENTS (shapes); s++)
        {
          gboolean causal = (seed % 2) == 0; /* and the dtype from the next bit: every pairing */
          Case c = { dims[a], 2, groups[b], shapes[s][0], shapes[s][1], dtypes[(seed / 2) % 2], causal,
                     shapes[s][1] - shapes[s][0], FALSE };
          check_paged (&c, seed++);
        }
}

/* sift_cuda_attn_merge against sift_attn_merge, with empty partials on
 * either side (lse -inf, o 0). */
static void
test_merge (void **state)
{
  (void) state;
  g_autoptr (GRand) r = g_rand_new_with_seed (42);
  const gint32 heads = 6, d = 128;
  const gint64 tokens = 37;
  gsize no = (gsize) heads * tokens * d, nl = (gsize) heads * tokens;
  g_autofree float *o1 = g_new (float, no), *o2 = g_new (float, no), *l1 = g_new (float, nl);
  g_autofree float *l2 = g_new (float, nl), *res = g_new (float, no), *lres = g_new (float, nl);
  random_fill (r, o1, no, -1, 1);
  random_fill (r, o2, no, -1, 1);
  random_fill (r, l1, nl, -5, 20);
  random_fill (r, l2, nl, -5, 20);
  for (gsize e = 0; e < nl; e += 5)
    {
      float *l = (e / 5) % 2 ? l1 : l2, *o = (e / 5) % 2 ? o1 : o2;
      l[e] = -INFINITY;
      memset (o + e * d, 0, d * sizeof (float));
    }
  float *d1 = to_device (o1, no * 4), *d2 = to_device (o2, no * 4);
  float *dl1 = to_device (l1, nl * 4), *dl2 = to_device (l2, nl * 4);
  SiftView v1 = sift_view_htd (o1, SIFT_DTYPE_F32, heads, tokens, d);
  SiftView v2 = sift_view_htd (o2, SIFT_DTYPE_F32, heads, tokens, d);
  SiftView dv1 = sift_view_htd (d1, SIFT_DTYPE_F32, heads, tokens, d);
  SiftView dv2 = sift_view_htd (d2, SIFT_DTYPE_F32, heads, tokens, d);
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_attn_merge (&dv1, dl1, &dv2, dl2, &error) || !sift_attn_merge (&v1, l1, &v2, l2, &error))
    fail_msg ("%s", error->message);
  from_device (res, d1, no * 4);
  from_device (lres, dl1, nl * 4);
  for (gsize e = 0; e < no; e++)
    assert_true (fabsf (res[e] - o1[e]) <= 1e-5f);
  for (gsize e = 0; e < nl; e++)
    assert_true (l1[e] == lres[e] || fabsf (l1[e] - lres[e]) <= 1e-5f * (1 + fabsf (l1[e])));
  sift_cuda_free (d1), sift_cuda_free (d2), sift_cuda_free (dl1), sift_cuda_free (dl2);
}

/* What the GPU kernels refuse, with the code that says why. */
static void
test_errors (void **state)
{
  (void) state;
  static const struct {
    gint32 q_heads, kv_heads, d;
    gint64 n_q;
    SiftDType kv_dtype;
    gsize misalign;  /* elements added to K/V's data pointer */
    gboolean decode;
    gboolean cuda_domain; /* SIFT_CUDA_ERROR_UNSUPPORTED, else SIFT_ATTN_ERROR_SHAPE */
  } cases[] = {
    { 1, 1, 64, 1, SIFT_DTYPE_F32, 0, TRUE, TRUE },   /* f32 K/V */
    { 1, 1, 96, 1, SIFT_DTYPE_BF16, 0, FALSE, TRUE }, /* head_dim 96 */
    { 1, 1, 64, 1, SIFT_DTYPE_BF16, 1, FALSE, TRUE }, /* rows not 16-byte aligned */
    { 1, 1, 64, 17, SIFT_DTYPE_BF16, 0, TRUE, FALSE }, /* decode of 17 rows */
    { 3, 2, 64, 1, SIFT_DTYPE_BF16, 0, TRUE, FALSE },  /* heads do not divide */
  };
  float *q = nan_device (4 * 96 * 17 * 3), *o = nan_device (4 * 96 * 17 * 3), *l = nan_device (4 * 17 * 3);
  guint16 *kv = nan_device (4 * 2 * 96 * 2);
  SiftAttnOpts opts = { 0 };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, cases[i].q_heads, cases[i].n_q, cases[i].d);
      SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, cases[i].q_heads, cases[i].n_q, cases[i].d);
      SiftView kvv = sift_view_htd (kv + cases[i].misalign, cases[i].kv_dtype, cases[i].kv_heads, 2, cases[i].d);
      gboolean ok = cases[i].decode ? sift_cuda_attn_decode (&qv, &kvv, &kvv, &opts, &ov, l, &error)
                                    : sift_cuda_attn_dense (&qv, &kvv, &kvv, &opts, &ov, l, &error);
      assert_false (ok);
      if (cases[i].cuda_domain)
        assert_true (g_error_matches (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNSUPPORTED));
      else
        assert_true (g_error_matches (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE));
    }
  sift_cuda_free (q), sift_cuda_free (o), sift_cuda_free (l), sift_cuda_free (kv);
}

int
main (void)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    {
      /* The error must say why, in the CUDA domain, as "unavailable". */
      if (!g_error_matches (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNAVAILABLE))
        {
          fprintf (stderr, "sift_cuda_init failed with an unexpected error: %s\n", error->message);
          return 1;
        }
      printf ("skipped: %s\n", error->message);
      return 77;
    }
  printf ("GPU: %s\n", sift_cuda_device_name ());
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_dense),
    cmocka_unit_test (test_decode),
    cmocka_unit_test (test_empty_rows),
    cmocka_unit_test (test_paged),
    cmocka_unit_test (test_merge),
    cmocka_unit_test (test_errors),
  };
  if (g_getenv ("SIFT_TEST_FILTER") != NULL)
    cmocka_set_test_filter (g_getenv ("SIFT_TEST_FILTER"));
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  for (int t = SIFT_DTYPE_F16; t <= SIFT_DTYPE_BF16; t++)
    printf ("worst %s: out relative L2 error %.3g (bound %.3g), lse error %.3g (bound %.3g)\n",
            sift_dtype_name (t), worst_out[t], out_bound (t), worst_lse[t], lse_bound (t));
  return failed;
}

/* Attention kernels against a double-precision reference written here:
 * every kernel (dense, decode, gather) on every ISA this CPU has, random
 * shapes, causal or not, f32/f16/bf16 K and V (the reference reads the same
 * rounded values), bounded by normalized mean squared error. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "attn-private.h"

#define NMSE_BOUND 1e-9 /* f32 accumulation over <= 4096 keys stays far below */

enum { KIND_DENSE, KIND_DECODE, KIND_GATHER };

typedef struct {
  int kind;
  gint32 d, kv_heads, group;
  gint64 n_q, n_kv;
  SiftDType dtype;
  gboolean causal;
  gint64 q_offset;
  gboolean token_major; /* q and out as [tokens][heads][dim] */
  float logit_gain;     /* multiplies q: huge or tiny logits */
  gint threads;
} Case;

typedef struct {
  float *q, *out;       /* [n_q][q_heads][d] or [q_heads][n_q][d] */
  void *k, *v;          /* [kv_heads][n_kv][d] in dtype */
  float *lse;           /* [q_heads][n_q] */
  gint64 *rows;         /* gather: [n_rows] */
  gsize n_rows;
  SiftView qv, kv, vv, ov;
} Data;

static void
data_fill (Data *x, const Case *c, GRand *r)
{
  gint32 hq = c->kv_heads * c->group;
  gsize nq = (gsize) (c->n_q * hq * c->d), nk = (gsize) (c->n_kv * c->kv_heads * c->d);
  gsize es = sift_dtype_size (c->dtype);
  memset (x, 0, sizeof *x);
  x->q = g_new (float, MAX (nq, 1));
  x->out = g_new (float, MAX (nq, 1));
  x->lse = g_new (float, MAX ((gsize) (hq * c->n_q), 1));
  x->k = g_malloc (MAX (nk, 1) * es);
  x->v = g_malloc (MAX (nk, 1) * es);
  float *tmp = g_new (float, MAX (nk, 1));
  for (gsize i = 0; i < nq; i++)
    x->q[i] = (float) g_rand_double_range (r, -1, 1) * c->logit_gain;
  for (gsize i = 0; i < nk; i++)
    tmp[i] = (float) g_rand_double_range (r, -1, 1);
  sift_convert (tmp, SIFT_DTYPE_F32, x->k, c->dtype, nk);
  for (gsize i = 0; i < nk; i++)
    tmp[i] = (float) g_rand_double_range (r, -2, 2);
  sift_convert (tmp, SIFT_DTYPE_F32, x->v, c->dtype, nk);
  g_free (tmp);
  for (gsize i = 0; i < nq; i++)
    x->out[i] = NAN; /* every element must be written */
  if (c->token_major)
    {
      x->qv = sift_view_thd (x->q, SIFT_DTYPE_F32, c->n_q, hq, c->d);
      x->ov = sift_view_thd (x->out, SIFT_DTYPE_F32, c->n_q, hq, c->d);
    }
  else
    {
      x->qv = sift_view_htd (x->q, SIFT_DTYPE_F32, hq, c->n_q, c->d);
      x->ov = sift_view_htd (x->out, SIFT_DTYPE_F32, hq, c->n_q, c->d);
    }
  x->kv = sift_view_htd (x->k, c->dtype, c->kv_heads, c->n_kv, c->d);
  x->vv = sift_view_htd (x->v, c->dtype, c->kv_heads, c->n_kv, c->d);
  if (c->kind == KIND_GATHER)
    {
      /* A random subset in random order, no duplicates. */
      x->rows = g_new (gint64, MAX (c->n_kv, 1));
      for (gint64 i = 0; i < c->n_kv; i++)
        x->rows[i] = i;
      for (gint64 i = c->n_kv - 1; i > 0; i--)
        {
          gint64 j = g_rand_int_range (r, 0, (gint32) i + 1), t = x->rows[i];
          x->rows[i] = x->rows[j];
          x->rows[j] = t;
        }
      x->n_rows = (gsize) (c->n_kv == 0 ? 0 : g_rand_int_range (r, 0, (gint32) c->n_kv + 1));
    }
}

static void
data_clear (Data *x)
{
  g_free (x->q);
  g_free (x->out);
  g_free (x->lse);
  g_free (x->k);
  g_free (x->v);
  g_free (x->rows);
}

/* Reference in double: the obvious two-pass softmax over the visible keys. */
static void
reference (const Case *c, const Data *x, double *o_ref, double *lse_ref)
{
  gint32 hq = c->kv_heads * c->group, d = c->d;
  gint64 nkeys = c->kind == KIND_GATHER ? (gint64) x->n_rows : c->n_kv;
  double scale = 1.0 / sqrt ((double) d);
  double *s = g_new (double, MAX (nkeys, 1));
  float *kr = g_new (float, d), *vr = g_new (float, d);
  for (gint32 h = 0; h < hq; h++)
    for (gint64 i = 0; i < c->n_q; i++)
      {
        const float *q = sift_view_row (&x->qv, h, i);
        double *o = o_ref + ((gsize) h * c->n_q + i) * d;
        gint64 limit = !c->causal || c->q_offset >= c->n_kv ? G_MAXINT64 : c->q_offset + i + 1;
        double m = -INFINITY;
        for (gint64 n = 0; n < nkeys; n++)
          {
            gint64 j = c->kind == KIND_GATHER ? x->rows[n] : n;
            s[n] = -INFINITY;
            if (j >= limit)
              continue;
            sift_view_row_to_f32 (&x->kv, h / c->group, j, kr);
            double dot = 0;
            for (gint32 e = 0; e < d; e++)
              dot += (double) q[e] * kr[e];
            s[n] = dot * scale;
            m = MAX (m, s[n]);
          }
        for (gint32 e = 0; e < d; e++)
          o[e] = 0;
        if (m == -INFINITY)
          {
            lse_ref[h * c->n_q + i] = -INFINITY;
            continue;
          }
        double l = 0;
        for (gint64 n = 0; n < nkeys; n++)
          {
            if (s[n] == -INFINITY)
              continue;
            double p = exp (s[n] - m);
            l += p;
            sift_view_row_to_f32 (&x->vv, h / c->group, c->kind == KIND_GATHER ? x->rows[n] : n, vr);
            for (gint32 e = 0; e < d; e++)
              o[e] += p * vr[e];
          }
        for (gint32 e = 0; e < d; e++)
          o[e] /= l;
        lse_ref[h * c->n_q + i] = m + log (l);
      }
  g_free (s);
  g_free (kr);
  g_free (vr);
}

static gboolean
run_kernel (const Case *c, Data *x, GError **error)
{
  SiftAttnOpts opts = { .causal = c->causal, .q_offset = c->q_offset };
  switch (c->kind)
    {
    case KIND_DENSE:
      return sift_attn_dense (&x->qv, &x->kv, &x->vv, &opts, &x->ov, x->lse, error);
    case KIND_DECODE:
      return sift_attn_decode (&x->qv, &x->kv, &x->vv, &opts, &x->ov, x->lse, error);
    default:
      return sift_attn_gather (&x->qv, &x->kv, &x->vv, x->rows, x->n_rows, &opts, &x->ov, x->lse,
                               error);
    }
}

static const SiftIsa all_isas[] = { SIFT_ISA_SCALAR, SIFT_ISA_AVX2, SIFT_ISA_AVX512 };

/* Runs one case on every ISA this CPU has and checks each against the
 * reference (computed once). */
static void
check_case (const Case *c, guint32 seed)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  Data x;
  data_fill (&x, c, r);
  gint32 hq = c->kv_heads * c->group;
  gsize n_out = (gsize) (hq * c->n_q * c->d);
  double *o_ref = g_new (double, MAX (n_out, 1));
  double *lse_ref = g_new (double, MAX ((gsize) (hq * c->n_q), 1));
  reference (c, &x, o_ref, lse_ref);
  sift_parallel_set_n_threads (c->threads);

  for (gsize k = 0; k < G_N_ELEMENTS (all_isas); k++)
    {
      if (!sift_isa_force (all_isas[k]))
        continue;
      for (gsize i = 0; i < n_out; i++)
        x.out[i] = NAN; /* every element must be written */
      g_autoptr (GError) error = NULL;
      if (!run_kernel (c, &x, &error))
        fail_msg ("kernel failed: %s", error->message);
      double num = 0, den = 0, lse_err = 0;
      for (gint32 h = 0; h < hq; h++)
        for (gint64 i = 0; i < c->n_q; i++)
          {
            const float *o = sift_view_row (&x.ov, h, i);
            const double *ro = o_ref + ((gsize) h * c->n_q + i) * c->d;
            for (gint32 e = 0; e < c->d; e++)
              {
                num += (o[e] - ro[e]) * (o[e] - ro[e]);
                den += ro[e] * ro[e];
              }
            double rl = lse_ref[h * c->n_q + i], l = x.lse[h * c->n_q + i];
            if (rl == -INFINITY)
              {
                if (l != -INFINITY)
                  fail_msg ("row (%d, %" G_GINT64_FORMAT ") sees no key: lse %g, want -inf", h, i, l);
                for (gint32 e = 0; e < c->d; e++)
                  assert_true (o[e] == 0.0f);
              }
            else
              lse_err = MAX (lse_err, fabs (l - rl) / (1.0 + fabs (rl)));
          }
      double nmse = den > 0 ? num / den : num;
      if (!(nmse <= NMSE_BOUND) || !(lse_err <= 2e-6))
        fail_msg ("%s kind %d d %d kv_heads %d group %d n_q %" G_GINT64_FORMAT " n_kv %" G_GINT64_FORMAT
                  " %s causal %d offset %" G_GINT64_FORMAT " gain %g threads %d: nmse %.3g lse error %.3g",
                  sift_isa_name (all_isas[k]), c->kind, c->d, c->kv_heads, c->group, c->n_q,
                  c->n_kv, sift_dtype_name (c->dtype), c->causal, c->q_offset,
                  (double) c->logit_gain, c->threads, nmse, lse_err);
    }
  sift_isa_force (sift_isa_detect ());
  g_free (o_ref);
  g_free (lse_ref);
  data_clear (&x);
}

/* Random cases of one kind, on every ISA. Sizes are sampled so that the
 * reference stays cheap: q_heads * n_q * n_kv * d <= ~2^23. */
static void
random_cases (int kind, guint32 seed, int n_cases)
{
  static const gint32 dims[] = { 64, 96, 128, 256, 40 };
  static const gint32 groups[] = { 1, 4, 8 };
  static const gint64 lens[] = { 1, 2, 17, 64, 65, 200, 511, 1000, 2048, 4096 };
  static const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  for (int n = 0; n < n_cases; n++)
    {
      Case c = {
        .kind = kind,
        .d = dims[g_rand_int_range (r, 0, G_N_ELEMENTS (dims))],
        .kv_heads = g_rand_int_range (r, 1, 3),
        .group = groups[g_rand_int_range (r, 0, G_N_ELEMENTS (groups))],
        .n_kv = lens[g_rand_int_range (r, 0, G_N_ELEMENTS (lens))],
        .dtype = dtypes[n % 3],
        .causal = g_rand_boolean (r),
        .token_major = g_rand_boolean (r),
        .logit_gain = 1.0f,
        .threads = g_rand_int_range (r, 1, 4),
      };
      gint64 budget = (1 << 23) / ((gint64) c.kv_heads * c.group * c.n_kv * c.d);
      gint64 max_q = kind == KIND_DECODE ? SIFT_ATTN_DECODE_MAX_ROWS : 300;
      max_q = CLAMP (budget, 1, max_q);
      c.n_q = g_rand_int_range (r, 1, (gint32) max_q + 1);
      /* Causal offsets: a prefill chunk at the end of the keys, or anywhere. */
      c.q_offset = g_rand_boolean (r) ? c.n_kv - c.n_q : g_rand_int_range (r, -3, (gint32) c.n_kv + 3);
      check_case (&c, seed * 1000 + (guint32) n);
    }
}

static void
test_dense_random (void **state)
{
  (void) state;
  random_cases (KIND_DENSE, 1, 40);
}

static void
test_decode_random (void **state)
{
  (void) state;
  random_cases (KIND_DECODE, 2, 40);
}

/* The decode path's scores take several keys per step (DEC_KEYS) and sum
 * them across lanes together: every key count 1..40 (steps and chunks cut
 * anywhere, the last step repeating its last key), 1..4 rows per kv head
 * (query heads of a group x query rows), causal offsets that mask inside a
 * chunk, each dtype, against the double reference. */
static void
test_decode_steps (void **state)
{
  (void) state;
  static const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  static const gint32 dims[] = { 32, 64, 128 };
  for (gint64 n_kv = 1; n_kv <= 40; n_kv++)
    for (gint32 rows = 1; rows <= 4; rows++)
      {
        Case c = {
          .kind = KIND_DECODE,
          .d = dims[(n_kv + rows) % G_N_ELEMENTS (dims)],
          .kv_heads = 2,
          .group = n_kv % 2 ? rows : 1,
          .n_q = n_kv % 2 ? 1 : rows,
          .n_kv = n_kv,
          .dtype = dtypes[(n_kv * 4 + rows) % G_N_ELEMENTS (dtypes)],
          .causal = rows % 2 == 0,
          .logit_gain = 1.0f,
          .threads = 1,
        };
        c.q_offset = n_kv / 2 - 1;
        check_case (&c, (guint32) (n_kv * 10 + rows));
      }
}

static void
test_gather_random (void **state)
{
  (void) state;
  random_cases (KIND_GATHER, 3, 40);
}

/* Shapes every path must handle whatever the random draw: all head dims and
 * groups, long keys with the split across threads, one kv head. */
static void
test_fixed_shapes (void **state)
{
  (void) state;
  static const gint32 dims[] = { 64, 96, 128, 256 };
  static const gint32 groups[] = { 1, 4, 8 };
  for (gsize di = 0; di < G_N_ELEMENTS (dims); di++)
    for (gsize gi = 0; gi < G_N_ELEMENTS (groups); gi++)
      {
        Case c = { KIND_DECODE, dims[di], 1, groups[gi], 1, 4096, SIFT_DTYPE_F16, TRUE, 4095,
                   FALSE, 1.0f, 2 };
        check_case (&c, 11);
        Case p = { KIND_DENSE, dims[di], 1, groups[gi], 130, 130, SIFT_DTYPE_BF16, TRUE, 0,
                   TRUE, 1.0f, 3 };
        check_case (&p, 12);
      }
}

/* Logits of +-1e3 (one key dominates, exponents far below -126) and of
 * 1e-6 (a plain average of V). */
static void
test_extreme_logits (void **state)
{
  (void) state;
  static const float gains[] = { 3e3f, 1e-6f };
  for (gsize g = 0; g < G_N_ELEMENTS (gains); g++)
    for (int kind = KIND_DENSE; kind <= KIND_GATHER; kind++)
      {
        Case c = { kind, 128, 2, 4, kind == KIND_DECODE ? 3 : 40, 700, SIFT_DTYPE_F32, TRUE,
                   660, FALSE, gains[g], 2 };
        check_case (&c, 21);
      }
}

/* One key: the output is that key's value row and the LSE its logit. No
 * keys, rows that see none, and an empty gather list: output 0, LSE -inf. */
static void
test_single_and_empty (void **state)
{
  (void) state;
  for (int kind = KIND_DENSE; kind <= KIND_GATHER; kind++)
    {
      Case one = { kind, 64, 1, 4, 1, 1, SIFT_DTYPE_F16, FALSE, 0, FALSE, 1.0f, 1 };
      check_case (&one, 31);
      Case none = { kind, 64, 2, 1, 5, 0, SIFT_DTYPE_F32, FALSE, 0, FALSE, 1.0f, 2 };
      check_case (&none, 32);
      Case before = { kind, 64, 2, 1, 5, 50, SIFT_DTYPE_F32, TRUE, -3, FALSE, 1.0f, 2 };
      check_case (&before, 33); /* rows 0..2 see nothing */
      /* Offsets at the ends of gint64: every key, or none, and no overflow. */
      Case all = { kind, 64, 1, 4, 3, 70, SIFT_DTYPE_BF16, TRUE, G_MAXINT64, FALSE, 1.0f, 1 };
      check_case (&all, 34);
      Case nothing = { kind, 64, 1, 4, 3, 70, SIFT_DTYPE_BF16, TRUE, G_MININT64, FALSE, 1.0f, 1 };
      check_case (&nothing, 35);
    }
  for (gsize i = 0; i < G_N_ELEMENTS (all_isas); i++)
    {
      if (!sift_isa_force (all_isas[i]))
        continue;
      /* No query rows: nothing to do, no error (decode needs 1..16). */
      float q[1], o[1], lse[1];
      guint16 kv[64] = { 0 };
      SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, 4, 0, 16);
      SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, 0, 16);
      SiftView kvv = sift_view_htd (kv, SIFT_DTYPE_F16, 1, 4, 16);
      g_autoptr (GError) error = NULL;
      assert_true (sift_attn_dense (&qv, &kvv, &kvv, NULL, &ov, lse, &error));
      assert_true (sift_attn_gather (&qv, &kvv, &kvv, NULL, 0, NULL, &ov, lse, &error));
    }
  sift_isa_force (sift_isa_detect ());
}

/* The same call on the same thread count gives the same bits (partials
 * merge in a fixed order, whatever thread ran them). */
static void
test_deterministic (void **state)
{
  (void) state;
  for (int kind = KIND_DENSE; kind <= KIND_GATHER; kind++)
    {
      Case c = { kind, 128, 1, 4, kind == KIND_DECODE ? 2 : 33, 3000, SIFT_DTYPE_F16, TRUE, 2990,
                 FALSE, 1.0f, 2 };
      g_autoptr (GRand) r = g_rand_new_with_seed (41);
      Data x;
      data_fill (&x, &c, r);
      gsize n = (gsize) (c.group * c.n_q * c.d);
      float *first = g_new (float, n), *lse = g_new (float, (gsize) (c.group * c.n_q));
      sift_parallel_set_n_threads (2);
      for (int rep = 0; rep < 5; rep++)
        {
          assert_true (run_kernel (&c, &x, NULL));
          if (rep == 0)
            {
              memcpy (first, x.out, n * sizeof (float));
              memcpy (lse, x.lse, (gsize) (c.group * c.n_q) * sizeof (float));
            }
          else
            {
              assert_memory_equal (first, x.out, n * sizeof (float));
              assert_memory_equal (lse, x.lse, (gsize) (c.group * c.n_q) * sizeof (float));
            }
        }
      g_free (first);
      g_free (lse);
      data_clear (&x);
    }
}

/* Partials over disjoint key ranges merge to the whole, in any order. */
static void
test_merge (void **state)
{
  (void) state;
  const gint32 hq = 4, d = 64;
  const gint64 nq = 3, nk = 300, cut[] = { 0, 70, 71, 300 }; /* 3 parts */
  g_autoptr (GRand) r = g_rand_new_with_seed (51);
  float *q = g_new (float, hq * nq * d), *k = g_new (float, nk * d), *v = g_new (float, nk * d);
  for (gint64 i = 0; i < hq * nq * d; i++)
    q[i] = (float) g_rand_double_range (r, -2, 2);
  for (gint64 i = 0; i < nk * d; i++)
    {
      k[i] = (float) g_rand_double_range (r, -1, 1);
      v[i] = (float) g_rand_double_range (r, -1, 1);
    }
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, hq, nq, d);
  SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, 1, nk, d);
  SiftView vv = sift_view_htd (v, SIFT_DTYPE_F32, 1, nk, d);
  float o[4][4 * 3 * 64], l[4][4 * 3];
  SiftView ov[4];
  for (int p = 0; p < 4; p++)
    ov[p] = sift_view_htd (o[p], SIFT_DTYPE_F32, hq, nq, d);
  assert_true (sift_attn_dense (&qv, &kv, &vv, NULL, &ov[3], l[3], NULL)); /* whole */
  for (int p = 0; p < 3; p++)
    {
      SiftView kp = sift_view_tokens (&kv, cut[p], cut[p + 1] - cut[p]);
      SiftView vp = sift_view_tokens (&vv, cut[p], cut[p + 1] - cut[p]);
      assert_true (sift_attn_dense (&qv, &kp, &vp, NULL, &ov[p], l[p], NULL));
    }
  /* (a + b) + c and a + (c + b), on copies. */
  float o1[4 * 3 * 64], l1[12], o2[4 * 3 * 64], l2[12], ob[4 * 3 * 64], lb[12];
  SiftView v1 = sift_view_htd (o1, SIFT_DTYPE_F32, hq, nq, d);
  SiftView v2 = sift_view_htd (o2, SIFT_DTYPE_F32, hq, nq, d);
  SiftView vb = sift_view_htd (ob, SIFT_DTYPE_F32, hq, nq, d);
  memcpy (o1, o[0], sizeof o1), memcpy (l1, l[0], sizeof l1);
  assert_true (sift_attn_merge (&v1, l1, &ov[1], l[1], NULL));
  assert_true (sift_attn_merge (&v1, l1, &ov[2], l[2], NULL));
  memcpy (ob, o[2], sizeof ob), memcpy (lb, l[2], sizeof lb);
  assert_true (sift_attn_merge (&vb, lb, &ov[1], l[1], NULL));
  memcpy (o2, o[0], sizeof o2), memcpy (l2, l[0], sizeof l2);
  assert_true (sift_attn_merge (&v2, l2, &vb, lb, NULL));
  for (gsize i = 0; i < G_N_ELEMENTS (o1); i++)
    {
      assert_float_equal (o1[i], o[3][i], 1e-5);
      assert_float_equal (o2[i], o1[i], 1e-5);
    }
  for (gsize i = 0; i < G_N_ELEMENTS (l1); i++)
    {
      assert_float_equal (l1[i], l[3][i], 1e-5);
      assert_float_equal (l2[i], l1[i], 1e-5);
    }
  /* Commutativity: b + a == a + b. */
  memcpy (o2, o[1], sizeof o2), memcpy (l2, l[1], sizeof l2);
  assert_true (sift_attn_merge (&v2, l2, &ov[0], l[0], NULL));
  memcpy (o1, o[0], sizeof o1), memcpy (l1, l[0], sizeof l1);
  assert_true (sift_attn_merge (&v1, l1, &ov[1], l[1], NULL));
  for (gsize i = 0; i < G_N_ELEMENTS (o1); i++)
    assert_float_equal (o2[i], o1[i], 1e-6);
  /* -inf is the identity on either side, bit for bit. */
  float oe[4 * 3 * 64] = { 0 }, le[12];
  for (int i = 0; i < 12; i++)
    le[i] = -INFINITY;
  SiftView ve = sift_view_htd (oe, SIFT_DTYPE_F32, hq, nq, d);
  memcpy (o1, o[0], sizeof o1), memcpy (l1, l[0], sizeof l1);
  assert_true (sift_attn_merge (&v1, l1, &ve, le, NULL));
  assert_memory_equal (o1, o[0], sizeof o1);
  assert_memory_equal (l1, l[0], sizeof l1);
  assert_true (sift_attn_merge (&ve, le, &ov[0], l[0], NULL));
  assert_memory_equal (oe, o[0], sizeof oe);
  assert_memory_equal (le, l[0], sizeof le);
  g_free (q);
  g_free (k);
  g_free (v);
}

/* 2^x of every ISA against exp2 in double: relative error over the range
 * the softmax uses, exact 0 for -inf and below the normal range. */
static void
test_exp2_accuracy (void **state)
{
  (void) state;
  enum { N = 100003 };
  float *x = g_new (float, N), *y = g_new (float, N);
  for (int i = 0; i < N; i++)
    x[i] = -126.0f + 126.0f * (float) i / (N - 1); /* [-126, 0] */
  for (gsize k = 0; k < G_N_ELEMENTS (all_isas); k++)
    {
      const SiftAttnKernels *kern = sift_attn_kernels_get (all_isas[k]);
      if (kern == NULL)
        continue;
      kern->exp2v (x, y, N);
      double worst = 0;
      for (int i = 0; i < N; i++)
        worst = MAX (worst, fabs (y[i] - exp2 (x[i])) / exp2 (x[i]));
      if (worst > 3e-7)
        fail_msg ("%s: exp2 relative error %g", sift_isa_name (all_isas[k]), worst);
      float special[] = { -INFINITY, -1000.0f, -127.5f, 0.0f, -1.0f, -0.5f, 3.0f };
      float out[G_N_ELEMENTS (special)];
      kern->exp2v (special, out, G_N_ELEMENTS (special));
      /* -inf (masked keys) must give exactly 0; below 2^-126 anything that small. */
      assert_true (out[0] == 0.0f && out[1] == 0.0f);
      assert_true (out[2] >= 0.0f && out[2] <= 0x1p-126f);
      assert_float_equal (out[3], 1.0f, 1e-7);
      assert_float_equal (out[4], 0.5f, 1e-7);
      assert_float_equal (out[5], (float) M_SQRT1_2, 2e-7);
      assert_float_equal (out[6], 8.0f, 2e-6);
    }
  g_free (x);
  g_free (y);
}

/* Takes GError ** so the call in `ok` is evaluated before *error is read. */
static void
expect_error (gboolean ok, GError **perror, gint code)
{
  GError *error = *perror;
  assert_false (ok);
  assert_non_null (error);
  assert_true (error->domain == SIFT_ATTN_ERROR);
  if (error->code != code)
    fail_msg ("error code %d, want %d: %s", error->code, code, error->message);
  assert_true (strlen (error->message) > 0);
}

/* Misuse through the public API: an error, never a crash. */
static void
test_misuse (void **state)
{
  (void) state;
  float q[4 * 2 * 16] = { 0 }, o[4 * 2 * 16], lse[8], k[3 * 5 * 16] = { 0 };
  guint16 kh[3 * 5 * 16] = { 0 };
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, 4, 2, 16);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, 2, 16);
  SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, 2, 5, 16);
  SiftView k3 = sift_view_htd (k, SIFT_DTYPE_F32, 3, 5, 16);     /* 3 does not divide 4 */
  SiftView kd = sift_view_htd (k, SIFT_DTYPE_F32, 2, 5, 8);      /* head_dim differs */
  SiftView kn = sift_view_htd (k, SIFT_DTYPE_F32, 2, 4, 16);     /* v has 5 tokens */
  SiftView kq8 = sift_view_htd (kh, SIFT_DTYPE_Q8_0, 2, 5, 16);  /* not a kernel dtype */
  SiftView qh = sift_view_htd (kh, SIFT_DTYPE_F16, 4, 2, 16);    /* q must be f32 */
  SiftView o1 = sift_view_htd (o, SIFT_DTYPE_F32, 4, 1, 16);     /* out rows differ */
  SiftView knull = kv;
  knull.data = NULL;
  gint64 bad_rows[] = { 0, 5 }, rows[] = { 0, 1 };
  SiftAttnOpts nan_scale = { .scale = NAN };
  GError *e = NULL;

  expect_error (sift_attn_dense (NULL, &kv, &kv, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &knull, &kv, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kv, &kv, NULL, &ov, NULL, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kv, &kv, NULL, NULL, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qh, &kv, &kv, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kq8, &kq8, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kv, &kv, &nan_scale, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &k3, &k3, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kd, &kd, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kn, &kv, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_dense (&qv, &kv, &kv, NULL, &o1, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);

  SiftView q0 = sift_view_htd (q, SIFT_DTYPE_F32, 4, 0, 16), o0 = sift_view_htd (o, SIFT_DTYPE_F32, 4, 0, 16);
  expect_error (sift_attn_decode (&q0, &kv, &kv, NULL, &o0, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  float big[17 * 16] = { 0 }, bigo[17 * 16], bigl[17];
  SiftView q17 = sift_view_htd (big, SIFT_DTYPE_F32, 1, 17, 16), o17 = sift_view_htd (bigo, SIFT_DTYPE_F32, 1, 17, 16);
  SiftView k1 = sift_view_htd (k, SIFT_DTYPE_F32, 1, 5, 16);
  expect_error (sift_attn_decode (&q17, &k1, &k1, NULL, &o17, bigl, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_decode (&qv, &k3, &k3, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);

  expect_error (sift_attn_gather (&qv, &kv, &kv, bad_rows, 2, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_gather (&qv, &kv, &kv, NULL, 2, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_gather (&qv, &k3, &k3, rows, 2, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);

  expect_error (sift_attn_merge (&ov, lse, &o1, lse, &e), &e, SIFT_ATTN_ERROR_SHAPE);
  g_clear_error (&e);
  expect_error (sift_attn_merge (&ov, NULL, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);
  expect_error (sift_attn_merge (NULL, lse, &ov, lse, &e), &e, SIFT_ATTN_ERROR_INVALID);
  g_clear_error (&e);

  /* Forcing an ISA the CPU lacks is refused; scalar always works. */
  assert_true (sift_isa_force (SIFT_ISA_SCALAR));
  assert_int_equal (sift_isa_active (), SIFT_ISA_SCALAR);
  assert_true (sift_isa_force (sift_isa_detect ()));
  if (sift_isa_detect () < SIFT_ISA_AVX512)
    assert_false (sift_isa_force (SIFT_ISA_AVX512));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_exp2_accuracy),
    cmocka_unit_test (test_misuse),
    cmocka_unit_test (test_merge),
    cmocka_unit_test (test_single_and_empty),
    cmocka_unit_test (test_extreme_logits),
    cmocka_unit_test (test_deterministic),
    cmocka_unit_test (test_fixed_shapes),
    cmocka_unit_test (test_dense_random),
    cmocka_unit_test (test_decode_random),
    cmocka_unit_test (test_decode_steps),
    cmocka_unit_test (test_gather_random),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

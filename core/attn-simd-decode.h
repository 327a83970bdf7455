/* The streaming decode path of the tiled attention (attn-simd.h), for the
 * few query rows of a decode step; included by attn-simd.h, which defines
 * the vector operations, Plan and Scratch it uses. */

/* Decode path, for R <= MR rows of one kv head and head_dim a multiple of
 * 2 VL: K and V rows are read straight from the cache (converted to f32 in
 * registers, no staging copy) once for all rows. Per chunk of VL keys:
 *   1. scores of every row by dot products, each key's K row loaded once;
 *   2. one max and one rescale of O per row and chunk; the VL exponentials
 *      of a row in one vector;
 *   3. O += P V two vectors of head_dim at a time, the accumulators of all
 *      rows in registers while the chunk's V rows stream through.
 * Same numerics as the tiled path: base 2, m = -inf rows subtract 0. */
#define DEC_PF 2 /* chunks ahead that K/V rows are prefetched */

ALWAYS_INLINE vf
kv_load (const void *row, gsize c, const SiftDType dt)
{
  switch (dt)
    {
    case SIFT_DTYPE_F32: return vload ((const float *) row + c);
    case SIFT_DTYPE_F16: return vcvt_f16 ((const guint16 *) row + c);
    default: return vcvt_bf16 ((const guint16 *) row + c);
    }
}

/* Rows of kv head g in the block a cursor is at: the pointers are worked
 * out when the cursor enters a block, then a row is base + r * step. */
typedef struct {
  gsize b;           /* the block the bases are for; G_MAXSIZE: none yet */
  const char *k, *v; /* row 0 of kv head g in K and V */
  gssize ks, vs;     /* bytes from one row to the next */
} RowBase;

ALWAYS_INLINE void
row_base_sync (RowBase *rb, const SiftAttnArgs *a, const SiftKvCursor *c, gint64 g, gssize es)
{
  if (rb->b == c->b)
    return;
  const SiftView *kb = &a->k_blocks[c->b], *vb = &a->v_blocks[c->b];
  rb->b = c->b;
  rb->k = sift_view_row (kb, g, 0);
  rb->v = sift_view_row (vb, g, 0);
  rb->ks = (gssize) kb->token_stride * es;
  rb->vs = (gssize) vb->token_stride * es;
}

ALWAYS_INLINE void
decode_keys (const Plan *p, gint64 g, const Scratch *s, gint64 kb, gint64 ke, gint32 min_lim,
             const int nr, const int nb, const SiftDType dt)
{
  const SiftAttnArgs *a = p->a;
  const gsize dp = (gsize) p->dp;
  const gsize row_bytes = dp * (dt == SIFT_DTYPE_F32 ? 4 : 2);
  float sc[MR][VL] __attribute__ ((aligned (64)));
  float pr[MR][VL] __attribute__ ((aligned (64)));
  const void *vrow[VL];
  /* Rows of key t and of the key prefetched DEC_PF chunks ahead. */
  SiftKvCursor cur = sift_kv_cursor (a, kb), ahead = sift_kv_cursor (a, kb + DEC_PF * VL);
  RowBase rb = { .b = G_MAXSIZE }, rb_ahead = { .b = G_MAXSIZE };
  const gssize es = dt == SIFT_DTYPE_F32 ? 4 : 2;
  float *const so = s->o, *const sm = s->m, *const sl = s->l;
  for (gint64 j0 = kb; j0 < ke; j0 += VL)
    {
      const int nk = (int) MIN ((gint64) VL, ke - j0);
      /* DEC_KEYS keys per step: each query vector is loaded once for all
       * of them, and the nr x DEC_KEYS dot products are summed across lanes
       * together (vhsum_block, a transposed reduction). Past the chunk's
       * last key the step repeats that key; those scores are masked below. */
      for (int j = 0; j < nk; j += DEC_KEYS)
        {
          const void *krow[DEC_KEYS];
#pragma GCC unroll 4
          for (int k = 0; k < DEC_KEYS; k++)
            {
              const int jj = MIN (j + k, nk - 1);
              const gint64 t = j0 + jj, tn = t + DEC_PF * VL;
              if (j + k < nk && tn < ke)
                {
                  gint64 rn = sift_kv_seek (&ahead, tn);
                  row_base_sync (&rb_ahead, a, &ahead, g, es);
                  prefetch_rows (rb_ahead.k + rn * rb_ahead.ks, rb_ahead.v + rn * rb_ahead.vs,
                                 row_bytes, nr > 1);
                }
              gint64 r = sift_kv_seek (&cur, t);
              row_base_sync (&rb, a, &cur, g, es);
              krow[k] = rb.k + r * rb.ks;
              vrow[jj] = rb.v + r * rb.vs;
            }
          vf acc[MR * DEC_KEYS];
#pragma GCC unroll 16
          for (int n = 0; n < MR * DEC_KEYS; n++)
            acc[n] = vzero ();
          for (gsize c = 0; c < dp; c += VL)
            {
              vf kv[DEC_KEYS];
#pragma GCC unroll 4
              for (int k = 0; k < DEC_KEYS; k++)
                kv[k] = kv_load (krow[k], c, dt);
#pragma GCC unroll 4
              for (int i = 0; i < nr; i++)
                {
                  const vf q = vload (s->qt + (gsize) i * dp + c);
#pragma GCC unroll 4
                  for (int k = 0; k < DEC_KEYS; k++)
                    acc[i * DEC_KEYS + k] = vfma (q, kv[k], acc[i * DEC_KEYS + k]);
                }
            }
          float sums[MR * DEC_KEYS] __attribute__ ((aligned (64)));
          vhsum_block (acc, nr * DEC_KEYS, sums);
#pragma GCC unroll 4
          for (int i = 0; i < nr; i++)
            memcpy (&sc[i][j], &sums[i * DEC_KEYS], DEC_KEYS * sizeof (float));
        }
      const gboolean mask = a->causal && j0 + nk - 1 >= min_lim;
#pragma GCC unroll 4
      for (int i = 0; i < nr; i++)
        {
          for (int j = nk; j < VL; j++)
            sc[i][j] = -INFINITY;
          if (mask)
            for (int j = 0; j < nk; j++)
              if (j0 + j >= s->lim[i])
                sc[i][j] = -INFINITY;
          const float mx = vhmax (vload (sc[i]));
          const float m_old = sm[i];
          const float m_new = MAX (m_old, mx);
          const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
          vf pv = vexp2 (vsub (vload (sc[i]), vset1 (m_sub)));
          vstore (pr[i], pv);
          if (m_new != m_old)
            {
              const float alpha = exp2f (m_old - m_sub);
              float *o = so + (gsize) i * dp;
              for (gsize c = 0; c < dp; c += VL)
                vstore (o + c, vmul (vload (o + c), vset1 (alpha)));
              sl[i] *= alpha;
            }
          sl[i] += vhsum (pv);
          sm[i] = m_new;
        }
      /* nb vectors of head_dim per pass: 4 for one or two rows, so that
       * there are enough independent FMA chains. */
      for (gsize c = 0; c < dp; c += (gsize) nb * VL)
        {
          vf o[MR][4];
#pragma GCC unroll 4
          for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int n = 0; n < nb; n++)
              o[i][n] = vload (so + (gsize) i * dp + c + (gsize) n * VL);
          for (int j = 0; j < nk; j++)
            {
              vf v[4];
#pragma GCC unroll 4
              for (int n = 0; n < nb; n++)
                v[n] = kv_load (vrow[j], c + (gsize) n * VL, dt);
#pragma GCC unroll 4
              for (int i = 0; i < nr; i++)
                {
                  vf pj = vset1 (pr[i][j]);
#pragma GCC unroll 4
                  for (int n = 0; n < nb; n++)
                    o[i][n] = vfma (pj, v[n], o[i][n]);
                }
            }
#pragma GCC unroll 4
          for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int n = 0; n < nb; n++)
              vstore (so + (gsize) i * dp + c + (gsize) n * VL, o[i][n]);
        }
    }
}

#define DECODE_CASE(dt)                                                              \
  switch (R)                                                                         \
    {                                                                                \
    case 1:                                                                          \
      if (wide)                                                                      \
        decode_keys (p, g, s, kb, ke, min_lim, 1, 4, dt);                            \
      else                                                                           \
        decode_keys (p, g, s, kb, ke, min_lim, 1, 2, dt);                            \
      break;                                                                         \
    case 2:                                                                          \
      if (wide)                                                                      \
        decode_keys (p, g, s, kb, ke, min_lim, 2, 4, dt);                            \
      else                                                                           \
        decode_keys (p, g, s, kb, ke, min_lim, 2, 2, dt);                            \
      break;                                                                         \
    case 3:                                                                          \
      if (wide)                                                                      \
        decode_keys (p, g, s, kb, ke, min_lim, 3, DEC_NB_MANY, dt);                  \
      else                                                                           \
        decode_keys (p, g, s, kb, ke, min_lim, 3, 2, dt);                            \
      break;                                                                         \
    default:                                                                         \
      if (wide)                                                                      \
        decode_keys (p, g, s, kb, ke, min_lim, MR, DEC_NB_MANY, dt);                 \
      else                                                                           \
        decode_keys (p, g, s, kb, ke, min_lim, MR, 2, dt);                           \
      break;                                                                         \
    }

/* decode_keys with the row count and dtype as constants. */
static void
decode_run (const Plan *p, gint64 g, const Scratch *s, gint64 kb, gint64 ke, gint32 min_lim,
            gsize R)
{
  const gboolean wide = p->d % (4 * VL) == 0;
  switch (p->a->k->dtype)
    {
    case SIFT_DTYPE_F32: DECODE_CASE (SIFT_DTYPE_F32); break;
    case SIFT_DTYPE_F16: DECODE_CASE (SIFT_DTYPE_F16); break;
    default: DECODE_CASE (SIFT_DTYPE_BF16); break;
    }
}

/* The decode path applies: few rows, dense keys, whole vectors of head_dim. */
static gboolean
decode_applies (const Plan *p, gsize R)
{
  return p->decode && p->mode == MODE_DENSE && R <= MR && p->d == p->dp && p->d % (2 * VL) == 0
         && p->a->k->dtype == p->a->v->dtype; /* one conversion for K and V rows */
}

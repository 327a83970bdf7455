/* The exported helpers of <sift/simd.h>: argument checks, dispatch on
 * sift_isa_active (), and the scalar references. */
#include <string.h>

#include <sift/attn.h>

#include "simd-private.h"

void
sift_score_tile (const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
                 gint64 n_cols, gsize len, float *out)
{
  g_return_if_fail ((rows != NULL && cols != NULL && out != NULL) || n_rows == 0 || n_cols == 0);
#ifdef SIFT_SIMD_X86
  switch (sift_isa_active ())
    {
    case SIFT_ISA_AVX512:
      sift_score_tile_avx512 (rows, row_stride, n_rows, cols, col_stride, n_cols, len, out);
      return;
    case SIFT_ISA_AVX2:
      sift_score_tile_avx2 (rows, row_stride, n_rows, cols, col_stride, n_cols, len, out);
      return;
    default:
      break;
    }
#endif
  sift_score_tile_scalar (rows, row_stride, n_rows, cols, col_stride, n_cols, len, out);
}

void
sift_score_tile_scalar (const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
                        gint64 n_cols, gsize len, float *out)
{
  for (gint64 i = 0; i < n_rows; i++)
    for (gint64 j = 0; j < n_cols; j++)
      {
        const float *a = rows + (gsize) i * row_stride, *b = cols + (gsize) j * col_stride;
        float acc = 0.0f;
        for (gsize t = 0; t < len; t++)
          acc += a[t] * b[t];
        out[i * n_cols + j] = acc;
      }
}

void
sift_row_state_reset (SiftRowState *st, gint32 head_dim)
{
  st->m = -INFINITY;
  st->l = 0.0f;
  memset (st->acc, 0, (gsize) head_dim * sizeof (float));
}

void
sift_row_state_finish (const SiftRowState *st, gint32 head_dim, float *o, float *lse)
{
  const float inv = st->l > 0.0f ? 1.0f / st->l : 0.0f;
#ifdef SIFT_SIMD_X86
  const SiftIsa isa = sift_isa_active ();
  if (isa >= SIFT_ISA_AVX512)
    sift_scale_avx512 (o, st->acc, inv, (gsize) head_dim);
  else if (isa >= SIFT_ISA_AVX2)
    sift_scale_avx2 (o, st->acc, inv, (gsize) head_dim);
  else
#endif
    for (gint32 c = 0; c < head_dim; c++)
      o[c] = st->acc[c] * inv;
  if (lse != NULL)
    *lse = st->l > 0.0f ? st->m + logf (st->l) : -INFINITY;
}

void
sift_attend_row_sparse_scalar (SiftRowState *st, const float *q, gint32 head_dim, float scale,
                               const float *k_base, const float *v_base, gint64 stride, const gint32 *idx, gsize n)
{
  for (gsize x = 0; x < n; x++)
    {
      const float *k = k_base + (gint64) idx[x] * stride;
      const float *v = v_base + (gint64) idx[x] * stride;
      float s = 0.0f;
      for (gint32 c = 0; c < head_dim; c++)
        s += q[c] * k[c];
      s *= scale;
      if (s > st->m)
        {
          /* A new max: what was summed under the old one shrinks by
           * e^(m_old - m_new), so every exponent stays <= 0. */
          const float r = expf (st->m - s);
          st->l *= r;
          for (gint32 c = 0; c < head_dim; c++)
            st->acc[c] *= r;
          st->m = s;
        }
      const float p = expf (s - st->m);
      st->l += p;
      for (gint32 c = 0; c < head_dim; c++)
        st->acc[c] += p * v[c];
    }
}

void
sift_attend_row_sparse (SiftRowState *st, const float *q, gint32 head_dim, float scale, const float *k_base,
                        const float *v_base, gint64 stride, const gint32 *idx, gsize n)
{
  g_return_if_fail (st != NULL && st->acc != NULL && q != NULL && head_dim > 0);
  g_return_if_fail (n == 0 || (k_base != NULL && v_base != NULL && idx != NULL));
#ifdef SIFT_SIMD_X86
  SiftRowSparseFunc fn = sift_row_sparse_func (sift_isa_active (), head_dim);
  if (fn != NULL)
    {
      fn (st, q, scale, k_base, v_base, stride, idx, n);
      return;
    }
#endif
  sift_attend_row_sparse_scalar (st, q, head_dim, scale, k_base, v_base, stride, idx, n);
}

/* TRUE if item a ranks before b: higher score, then lower index; NaN last. */
static gboolean
better (const float *score, gsize a, gsize b)
{
  const float x = score[a], y = score[b];
  if (isnan (x) || isnan (y))
    return isnan (x) == isnan (y) ? a < b : !isnan (x);
  return x > y || (x == y && a < b);
}

/* Moves the k best of idx[0, n) (in `better` order) to idx[0, k), unordered:
 * quickselect, O(n) on average. Every item is distinct under `better` (the
 * index breaks ties), so the partition loops stop. */
static void
select_best (gsize *idx, gsize n, gsize k, const float *score)
{
  gsize lo = 0, hi = n - 1;
  while (lo < hi)
    {
      const gsize pivot = idx[lo + (hi - lo) / 2];
      gsize i = lo, j = hi;
      for (;;)
        {
          while (better (score, idx[i], pivot))
            i++;
          while (better (score, pivot, idx[j]))
            j--;
          if (i >= j)
            break;
          const gsize t = idx[i];
          idx[i++] = idx[j];
          idx[j--] = t;
        }
      /* idx[lo, j] are all better than or equal to idx[j + 1, hi]. */
      if (k - 1 <= j)
        hi = j;
      else
        lo = j + 1;
    }
}

gsize
sift_top_k (const float *score, gsize n, gsize budget, gsize sinks, gsize recent, guint8 *keep)
{
  g_return_val_if_fail (keep != NULL || n == 0, 0);
  g_return_val_if_fail (score != NULL || n == 0, 0);
  if (n == 0)
    return 0;
  memset (keep, 0, n);
  gsize forced = 0;
  for (gsize i = 0; i < n; i++)
    if (i < sinks || i + recent >= n)
      {
        keep[i] = 1;
        forced++;
      }
  const gsize m = budget > forced ? MIN (budget - forced, n - forced) : 0;
  if (m == 0)
    return forced;
  g_autofree gsize *idx = g_new (gsize, n - forced);
  gsize n_free = 0;
  for (gsize i = 0; i < n; i++)
    if (!keep[i])
      idx[n_free++] = i;
  if (m < n_free)
    select_best (idx, n_free, m, score);
  for (gsize j = 0; j < m; j++)
    keep[idx[j]] = 1;
  return forced + m;
}

gsize
sift_lower_bound (const gint64 *a, gsize n, gint64 x)
{
  g_return_val_if_fail (a != NULL || n == 0, 0);
  gsize lo = 0, hi = n;
  while (lo < hi)
    {
      const gsize mid = lo + (hi - lo) / 2;
      if (a[mid] < x)
        lo = mid + 1;
      else
        hi = mid;
    }
  return lo;
}

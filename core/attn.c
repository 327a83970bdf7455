/* Attention: argument checks, ISA dispatch, LSE merge. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <sift/error.h>

#include "attn-private.h"

static SiftIsa detected_isa = SIFT_ISA_SCALAR;
static SiftIsa active_isa = SIFT_ISA_SCALAR;
/* pthread_once rather than g_once: ThreadSanitizer sees pthread's ordering,
 * not GLib's futex-based one, and pool workers reach this first. */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static SiftIsa
cpu_isa (void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init ();
#ifdef SIFT_HAVE_AVX512
  if (__builtin_cpu_supports ("avx512f") && __builtin_cpu_supports ("avx512bw")
      && __builtin_cpu_supports ("avx512vl") && __builtin_cpu_supports ("avx512dq")
      && __builtin_cpu_supports ("fma"))
    return SIFT_ISA_AVX512;
#endif
#ifdef SIFT_HAVE_AVX2
  if (__builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma")
      && __builtin_cpu_supports ("f16c"))
    return SIFT_ISA_AVX2;
#endif
#endif
  return SIFT_ISA_SCALAR;
}

static void
isa_detect_once (void)
{
  detected_isa = cpu_isa ();
  active_isa = detected_isa;
  const char *env = g_getenv ("SIFT_ISA");
  if (env == NULL)
    return;
  if (g_str_equal (env, "scalar"))
    active_isa = SIFT_ISA_SCALAR;
  else if (g_str_equal (env, "avx2") && detected_isa >= SIFT_ISA_AVX2)
    active_isa = SIFT_ISA_AVX2;
  else if (g_str_equal (env, "avx512") && detected_isa >= SIFT_ISA_AVX512)
    active_isa = SIFT_ISA_AVX512;
  else
    g_warning ("SIFT_ISA=%s is unknown or unsupported by this CPU; using %s", env, sift_isa_name (detected_isa));
}

static void
isa_init (void)
{
  pthread_once (&isa_once, isa_detect_once);
}

SiftIsa
sift_isa_detect (void)
{
  isa_init ();
  return detected_isa;
}

SiftIsa
sift_isa_active (void)
{
  isa_init ();
  return active_isa;
}

gboolean
sift_isa_force (SiftIsa isa)
{
  isa_init ();
  if (isa > detected_isa)
    return FALSE;
  active_isa = isa;
  return TRUE;
}

const char *
sift_isa_name (SiftIsa isa)
{
  switch (isa)
    {
    case SIFT_ISA_SCALAR: return "scalar";
    case SIFT_ISA_AVX2: return "avx2";
    case SIFT_ISA_AVX512: return "avx512";
    }
  return "invalid";
}

const SiftAttnKernels *
sift_attn_kernels_get (SiftIsa isa)
{
  if (isa > sift_isa_detect ())
    return NULL;
  switch (isa)
    {
#ifdef SIFT_HAVE_AVX512
    case SIFT_ISA_AVX512: return &sift_attn_kernels_avx512;
#endif
#ifdef SIFT_HAVE_AVX2
    case SIFT_ISA_AVX2: return &sift_attn_kernels_avx2;
#endif
    case SIFT_ISA_SCALAR: return &sift_attn_kernels_scalar;
    default: return NULL;
    }
}

static const SiftAttnKernels *
kernels (void)
{
  return sift_attn_kernels_get (sift_isa_active ());
}

typedef struct {
  float *data[SIFT_ATTN_SCRATCH_N];
  gsize size[SIFT_ATTN_SCRATCH_N]; /* floats */
} Scratch;

static void
scratch_free (gpointer p)
{
  Scratch *s = p;
  for (int i = 0; i < SIFT_ATTN_SCRATCH_N; i++)
    free (s->data[i]);
  g_free (s);
}

static GPrivate scratch_key = G_PRIVATE_INIT (scratch_free);

float *
sift_attn_scratch (int slot, gsize n_floats)
{
  g_assert (slot >= 0 && slot < SIFT_ATTN_SCRATCH_N);
  Scratch *s = g_private_get (&scratch_key);
  if (s == NULL)
    {
      s = g_new0 (Scratch, 1);
      g_private_set (&scratch_key, s);
    }
  if (s->size[slot] < n_floats)
    {
      free (s->data[slot]);
      gsize n = MAX (n_floats, s->size[slot] * 3 / 2);
      s->data[slot] = aligned_alloc (64, (n * sizeof (float) + 63) / 64 * 64);
      g_assert (s->data[slot] != NULL);
      s->size[slot] = n;
    }
  return s->data[slot];
}

/* The CPU kernels dereference every view: each must be host memory (NULL
 * views are left to the argument checks). The checks shared with other
 * backends (sift_attn_prepare*) leave the memory space alone. */
static gboolean
on_host (const SiftView *v, const char *what, GError **error)
{
  if (v == NULL || v->space == SIFT_MEMORY_HOST)
    return TRUE;
  g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
               "%s: view is in device memory; the CPU kernels read host memory only", what);
  return FALSE;
}

static gboolean
all_on_host (const SiftView *q, const SiftView *k, const SiftView *v, const SiftView *out, GError **error)
{
  return on_host (q, "q", error) && on_host (k, "k", error) && on_host (v, "v", error)
         && on_host (out, "out", error);
}

static gboolean
shape_error (GError **error, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

static gboolean
shape_error (GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE, msg);
  g_free (msg);
  return FALSE;
}

/* Checks q, k, v, out and lse agree (each view already checked on its
 * own); fills the kernel arguments. */
static gboolean
prepare_checked (SiftAttnArgs *a, const SiftView *q, const SiftView *k, const SiftView *v,
                 const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  if (q->dtype != SIFT_DTYPE_F32 || out->dtype != SIFT_DTYPE_F32)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                   "q and out must be f32 (got %s and %s)", sift_dtype_name (q->dtype),
                   sift_dtype_name (out->dtype));
      return FALSE;
    }
  if (lse == NULL && q->n_tokens > 0)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "lse is NULL");
      return FALSE;
    }
  if (q->head_dim != k->head_dim || k->head_dim != v->head_dim || out->head_dim != q->head_dim)
    return shape_error (error, "head_dim differs: q %d, k %d, v %d, out %d", q->head_dim,
                        k->head_dim, v->head_dim, out->head_dim);
  if (k->n_heads != v->n_heads || k->n_tokens != v->n_tokens)
    return shape_error (error,
                        "k [%d heads][%" G_GINT64_FORMAT " tokens] and v [%d heads][%" G_GINT64_FORMAT
                        " tokens] differ",
                        k->n_heads, k->n_tokens, v->n_heads, v->n_tokens);
  if (k->n_tokens > G_MAXINT32)
    return shape_error (error, "%" G_GINT64_FORMAT " keys: kernels take at most %d", k->n_tokens,
                        G_MAXINT32);
  if (q->n_heads % k->n_heads != 0)
    return shape_error (error, "%d query heads are not a multiple of %d kv heads", q->n_heads,
                        k->n_heads);
  if (out->n_heads != q->n_heads || out->n_tokens != q->n_tokens)
    return shape_error (error, "out [%d][%" G_GINT64_FORMAT "] does not match q [%d][%" G_GINT64_FORMAT "]",
                        out->n_heads, out->n_tokens, q->n_heads, q->n_tokens);
  float scale = opts ? opts->scale : 0.0f;
  if (!isfinite (scale))
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "scale %g is not finite",
                   (double) scale);
      return FALSE;
    }
  *a = (SiftAttnArgs) {
    .q = q, .k = k, .v = v, .out = out, .lse = lse,
    .scale = scale != 0.0f ? scale : 1.0f / sqrtf ((float) q->head_dim),
    .causal = opts ? opts->causal : FALSE,
    .q_offset = opts ? opts->q_offset : 0,
    .k_blocks = k, .v_blocks = v, .n_blocks = 1,
    .one_block = { 0, k->n_tokens },
  };
  a->block_start = a->one_block;
  return TRUE;
}

/* prepare_checked after checking each view. */
gboolean
sift_attn_prepare (SiftAttnArgs *a, const SiftView *q, const SiftView *k, const SiftView *v,
         const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  if (!sift_view_check (q, "q", error) || !sift_view_check (k, "k", error)
      || !sift_view_check (v, "v", error) || !sift_view_check (out, "out", error))
    return FALSE;
  return prepare_checked (a, q, k, v, opts, out, lse, error);
}

gboolean
sift_attn_dense (const SiftView *q, const SiftView *k, const SiftView *v, const SiftAttnOpts *opts,
                 SiftView *out, float *lse, GError **error)
{
  SiftAttnArgs a;
  if (!all_on_host (q, k, v, out, error) || !sift_attn_prepare (&a, q, k, v, opts, out, lse, error))
    return FALSE;
  kernels ()->dense (&a);
  return TRUE;
}

gboolean
sift_attn_decode (const SiftView *q, const SiftView *k, const SiftView *v, const SiftAttnOpts *opts,
                  SiftView *out, float *lse, GError **error)
{
  SiftAttnArgs a;
  if (!all_on_host (q, k, v, out, error) || !sift_attn_prepare (&a, q, k, v, opts, out, lse, error))
    return FALSE;
  if (q->n_tokens < 1 || q->n_tokens > SIFT_ATTN_DECODE_MAX_ROWS)
    return shape_error (error, "decode takes 1..%d query rows, not %" G_GINT64_FORMAT,
                        SIFT_ATTN_DECODE_MAX_ROWS, q->n_tokens);
  kernels ()->decode (&a);
  return TRUE;
}

gboolean
sift_attn_gather (const SiftView *q, const SiftView *k, const SiftView *v, const gint64 *rows,
                  gsize n_rows, const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  SiftAttnArgs a;
  if (!all_on_host (q, k, v, out, error) || !sift_attn_prepare (&a, q, k, v, opts, out, lse, error))
    return FALSE;
  if (rows == NULL && n_rows > 0)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "rows is NULL");
      return FALSE;
    }
  for (gsize n = 0; n < n_rows; n++)
    if (rows[n] < 0 || rows[n] >= k->n_tokens)
      return shape_error (error, "rows[%" G_GSIZE_FORMAT "] = %" G_GINT64_FORMAT
                          " is outside the %" G_GINT64_FORMAT " keys",
                          n, rows[n], k->n_tokens);
  a.rows = rows;
  a.n_rows = n_rows;
  kernels ()->gather (&a);
  return TRUE;
}

/* Checks the blocks of a paged call and builds the view of their
 * concatenation (shape only) and the key index of each block. */
static gboolean
paged_blocks (const SiftView *k_blocks, const SiftView *v_blocks, gsize n_blocks, gint32 q_heads,
              SiftView *k_all, SiftView *v_all, gint64 *block_start, GError **error)
{
  if (n_blocks > 0 && (k_blocks == NULL || v_blocks == NULL))
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                   "paged: %s is NULL with %" G_GSIZE_FORMAT " blocks",
                   k_blocks == NULL ? "k_blocks" : "v_blocks", n_blocks);
      return FALSE;
    }
  /* No block: a kv head per query head, no key (every row o = 0, lse = -inf). */
  *k_all = sift_view_strided (NULL, SIFT_DTYPE_F32, q_heads, 0, 0, 0, 0);
  block_start[0] = 0;
  for (gsize b = 0; b < n_blocks; b++)
    {
      const SiftView *kb = &k_blocks[b], *vb = &v_blocks[b];
      /* The names are formatted only for the error: per block they cost
       * more than the check (a decode step at 32K passes 256 blocks). */
      if (!sift_view_check (kb, "k", NULL) || !sift_view_check (vb, "v", NULL))
        {
          char kname[48], vname[48];
          g_snprintf (kname, sizeof kname, "k_blocks[%" G_GSIZE_FORMAT "]", b);
          g_snprintf (vname, sizeof vname, "v_blocks[%" G_GSIZE_FORMAT "]", b);
          return sift_view_check (kb, kname, error) && sift_view_check (vb, vname, error);
        }
      if (kb->n_tokens < 0 || kb->n_tokens != vb->n_tokens)
        return shape_error (error, "paged: block %" G_GSIZE_FORMAT " has %" G_GINT64_FORMAT
                            " keys and %" G_GINT64_FORMAT " values",
                            b, kb->n_tokens, vb->n_tokens);
      const SiftView *first = &k_blocks[0];
      if (kb->n_heads != first->n_heads || vb->n_heads != first->n_heads
          || kb->head_dim != first->head_dim || vb->head_dim != first->head_dim)
        return shape_error (error, "paged: block %" G_GSIZE_FORMAT " is k [%d heads][%d dim], v [%d heads][%d dim];"
                            " block 0 is [%d heads][%d dim]",
                            b, kb->n_heads, kb->head_dim, vb->n_heads, vb->head_dim, first->n_heads,
                            first->head_dim);
      if (kb->dtype != first->dtype || vb->dtype != first->dtype)
        {
          g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                       "paged: block %" G_GSIZE_FORMAT " is k %s, v %s; every block must be %s",
                       b, sift_dtype_name (kb->dtype), sift_dtype_name (vb->dtype),
                       sift_dtype_name (first->dtype));
          return FALSE;
        }
      if (kb->n_tokens > G_MAXINT32 - block_start[b])
        return shape_error (error, "paged: more than %d keys in all blocks", G_MAXINT32);
      block_start[b + 1] = block_start[b] + kb->n_tokens;
    }
  if (n_blocks > 0)
    {
      *k_all = k_blocks[0];
      k_all->data = NULL;
      k_all->n_tokens = block_start[n_blocks];
      k_all->head_stride = k_all->token_stride = 0;
    }
  *v_all = *k_all;
  return TRUE;
}

gboolean
sift_attn_prepare_paged (SiftAttnArgs *a, SiftView *k_all, SiftView *v_all, gint64 *block_start,
                         const SiftView *q, const SiftView *k_blocks, const SiftView *v_blocks,
                         gsize n_blocks, const SiftAttnOpts *opts, SiftView *out, float *lse,
                         GError **error)
{
  if (!sift_view_check (q, "q", error) || !sift_view_check (out, "out", error))
    return FALSE;
  if (!paged_blocks (k_blocks, v_blocks, n_blocks, q->n_heads, k_all, v_all, block_start, error))
    return FALSE;
  if (n_blocks == 0)
    k_all->head_dim = v_all->head_dim = q->head_dim;
  if (!prepare_checked (a, q, k_all, v_all, opts, out, lse, error))
    return FALSE;
  a->k_blocks = k_blocks;
  a->v_blocks = v_blocks;
  a->n_blocks = n_blocks;
  a->block_start = block_start;
  return TRUE;
}

gboolean
sift_attn_paged (const SiftView *q, const SiftView *k_blocks, const SiftView *v_blocks,
                 gsize n_blocks, const SiftAttnOpts *opts, SiftView *out, float *lse,
                 GError **error)
{
  if (!on_host (q, "q", error) || !on_host (out, "out", error))
    return FALSE;
  for (gsize b = 0; b < n_blocks && k_blocks != NULL && v_blocks != NULL; b++)
    if (k_blocks[b].space != SIFT_MEMORY_HOST || v_blocks[b].space != SIFT_MEMORY_HOST)
      {
        char name[48];
        g_snprintf (name, sizeof name, "%s_blocks[%" G_GSIZE_FORMAT "]",
                    k_blocks[b].space != SIFT_MEMORY_HOST ? "k" : "v", b);
        return on_host (k_blocks[b].space != SIFT_MEMORY_HOST ? &k_blocks[b] : &v_blocks[b], name, error);
      }
  SiftView k_all, v_all;
  g_autofree gint64 *block_start = g_new (gint64, n_blocks + 1);
  SiftAttnArgs a;
  if (!sift_attn_prepare_paged (&a, &k_all, &v_all, block_start, q, k_blocks, v_blocks, n_blocks,
                                opts, out, lse, error))
    return FALSE;
  if (q->n_tokens <= SIFT_ATTN_DECODE_MAX_ROWS)
    kernels ()->decode (&a);
  else
    kernels ()->dense (&a);
  return TRUE;
}

gboolean
sift_attn_merge (SiftView *o1, float *lse1, const SiftView *o2, const float *lse2, GError **error)
{
  if (!sift_view_check (o1, "o1", error) || !sift_view_check (o2, "o2", error)
      || !on_host (o1, "o1", error) || !on_host (o2, "o2", error))
    return FALSE;
  if (o1->dtype != SIFT_DTYPE_F32 || o2->dtype != SIFT_DTYPE_F32)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "merge takes f32 outputs");
      return FALSE;
    }
  if (o1->n_heads != o2->n_heads || o1->n_tokens != o2->n_tokens || o1->head_dim != o2->head_dim)
    return shape_error (error, "merge: shapes differ");
  if ((lse1 == NULL || lse2 == NULL) && o1->n_tokens > 0)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "merge: lse is NULL");
      return FALSE;
    }
  const gint32 d = o1->head_dim;
  for (gint64 h = 0; h < o1->n_heads; h++)
    for (gint64 t = 0; t < o1->n_tokens; t++)
      {
        float *l1 = &lse1[h * o1->n_tokens + t];
        float l2 = lse2[h * o1->n_tokens + t];
        if (l2 == -INFINITY)
          continue; /* empty partial: identity */
        float *a = sift_view_row (o1, h, t);
        const float *b = sift_view_row (o2, h, t);
        if (*l1 == -INFINITY)
          {
            memcpy (a, b, (gsize) d * sizeof (float));
            *l1 = l2;
            continue;
          }
        float m = MAX (*l1, l2);
        float w1 = expf (*l1 - m), w2 = expf (l2 - m);
        float inv = 1.0f / (w1 + w2);
        for (gint32 c = 0; c < d; c++)
          a[c] = (w1 * a[c] + w2 * b[c]) * inv;
        *l1 = m + logf (w1 + w2);
      }
  return TRUE;
}

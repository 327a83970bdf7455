/* sift bench attention --device cuda: the GPU kernels on the shapes of
 * issue 21's targets (32 query / 8 kv heads, head_dim 128, bf16 K/V), each
 * beside PyTorch's scaled_dot_product_attention on the same shapes, measured
 * in the same command by bench/sdpa.py when python3 can import torch.
 *
 * Prefill: causal, L queries against L keys; TFLOP/s counts the matmuls of
 * the visible half, 2 * L * L * head_dim per query head. Decode: one query
 * row against L keys; GB/s counts the K and V bytes. Times are the median
 * of --repeats samples, each sample CUDA events around `calls` back-to-back
 * calls (sift_cuda_time_calls), as bench/sdpa.py times SDPA's. sift's q
 * and out are f32, SDPA's bf16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sift/sift.h>

#include "bench-attention-cuda.h"

#define Q_HEADS 32
#define KV_HEADS 8
#define HEAD_DIM 128

typedef struct {
  float *q, *out, *lse;  /* device */
  guint16 *k, *v;        /* device, bf16 [KV_HEADS][n_kv][HEAD_DIM] */
  SiftView qv, ov, kv, vv;
} Problem;

/* n random values in [-1, 1) of type t on the device: a pool of 4096
 * drawn values spread in a pattern with no short period (filling GBs value
 * by value from GRand takes longer than the benchmark). */
static gboolean
random_device (void **dst, gsize n, SiftDType t, GRand *r, GError **error)
{
  gsize es = sift_dtype_size (t);
  float pool[4096];
  for (gsize i = 0; i < G_N_ELEMENTS (pool); i++)
    pool[i] = (float) g_rand_double_range (r, -1, 1);
  g_autofree float *f = g_new (float, n);
  for (gsize i = 0; i < n; i++)
    f[i] = pool[(i * 7 + i / 4093) & 4095];
  g_autofree void *h = g_malloc (n * es);
  sift_convert (f, SIFT_DTYPE_F32, h, t, n);
  *dst = sift_cuda_malloc (n * es, error);
  return *dst != NULL && sift_cuda_memcpy_to_device (*dst, h, n * es, error);
}

static void
problem_clear (Problem *p)
{
  sift_cuda_free (p->q), sift_cuda_free (p->out), sift_cuda_free (p->lse);
  sift_cuda_free (p->k), sift_cuda_free (p->v);
  memset (p, 0, sizeof *p);
}

static gboolean
problem_init (Problem *p, gint64 n_q, gint64 n_kv, GRand *r, GError **error)
{
  memset (p, 0, sizeof *p);
  gsize nq = (gsize) Q_HEADS * n_q * HEAD_DIM, nk = (gsize) KV_HEADS * n_kv * HEAD_DIM;
  if (!random_device ((void **) &p->q, nq, SIFT_DTYPE_F32, r, error)
      || !random_device ((void **) &p->k, nk, SIFT_DTYPE_BF16, r, error)
      || !random_device ((void **) &p->v, nk, SIFT_DTYPE_BF16, r, error)
      || (p->out = sift_cuda_malloc (nq * sizeof (float), error)) == NULL
      || (p->lse = sift_cuda_malloc ((gsize) Q_HEADS * n_q * sizeof (float), error)) == NULL)
    {
      problem_clear (p);
      return FALSE;
    }
  p->qv = sift_view_htd (p->q, SIFT_DTYPE_F32, Q_HEADS, n_q, HEAD_DIM);
  p->ov = sift_view_htd (p->out, SIFT_DTYPE_F32, Q_HEADS, n_q, HEAD_DIM);
  p->kv = sift_view_htd (p->k, SIFT_DTYPE_BF16, KV_HEADS, n_kv, HEAD_DIM);
  p->vv = sift_view_htd (p->v, SIFT_DTYPE_BF16, KV_HEADS, n_kv, HEAD_DIM);
  return TRUE;
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x > y) - (x < y);
}

typedef struct {
  Problem *p;
  gboolean decode;
  SiftAttnOpts opts;
} Call;

static gboolean
one_call (gpointer data, GError **error)
{
  Call *c = data;
  Problem *p = c->p;
  return c->decode ? sift_cuda_attn_decode (&p->qv, &p->kv, &p->vv, &c->opts, &p->ov, p->lse, error)
                   : sift_cuda_attn_dense (&p->qv, &p->kv, &p->vv, &c->opts, &p->ov, p->lse, error);
}

/* Median device seconds per call over `repeats` runs of `calls` calls,
 * timed by CUDA events as bench/sdpa.py times SDPA (after one warm-up
 * call); NAN with `error` set if a call fails. */
static double
time_calls (Problem *p, gboolean decode, int repeats, int calls, GError **error)
{
  Call c = { p, decode, { .causal = !decode, .q_offset = p->kv.n_tokens - p->qv.n_tokens } };
  g_autofree double *t = g_new (double, repeats);
  double warm;
  if (!sift_cuda_time_calls (one_call, &c, 1, &warm, error))
    return NAN;
  for (int s = 0; s < repeats; s++)
    if (!sift_cuda_time_calls (one_call, &c, calls, &t[s], error))
      return NAN;
  qsort (t, (gsize) repeats, sizeof (double), cmp_double);
  return t[repeats / 2];
}

/* SDPA's figures: runs the script, keeps its "copy", "prefill L ms" and
 * "decode L ms" lines; a missing python3 or torch leaves the table empty. */
typedef struct {
  double copy_gbps;
  GHashTable *prefill_ms, *decode_ms; /* L -> ms (gint64 keys in doubles' place) */
} Sdpa;

static char *
join_lengths (const GArray *a)
{
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < a->len; i++)
    g_string_append_printf (s, "%s%" G_GINT64_FORMAT, i ? "," : "", g_array_index (a, gint64, i));
  return g_string_free (s, FALSE);
}

static gboolean
sdpa_run (const char *script, const GArray *pre, const GArray *dec, int repeats, Sdpa *out, char **why)
{
  g_autofree char *p = join_lengths (pre), *d = join_lengths (dec);
  g_autofree char *r = g_strdup_printf ("%d", repeats);
  char *argv[] = { "python3", (char *) script, "--prefill", p, "--decode", d, "--repeats", r, NULL };
  g_autofree char *so = NULL, *se = NULL;
  gint status = 0;
  g_autoptr (GError) error = NULL;
  if (!g_spawn_sync (NULL, argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &so, &se, &status, &error))
    {
      *why = g_strdup (error->message);
      return FALSE;
    }
  if (!g_spawn_check_wait_status (status, NULL))
    {
      g_auto (GStrv) lines = g_strsplit (se ? g_strstrip (se) : "", "\n", -1);
      guint n = g_strv_length (lines);
      *why = g_strdup_printf ("%s failed: %s", script, n ? lines[n - 1] : "no message");
      return FALSE;
    }
  g_auto (GStrv) lines = g_strsplit (so, "\n", -1);
  for (char **l = lines; *l; l++)
    {
      gint64 L;
      double v;
      char kind[16];
      if (sscanf (*l, "copy %lf", &v) == 1)
        out->copy_gbps = v;
      else if (sscanf (*l, "%15s %" G_GINT64_FORMAT " %lf", kind, &L, &v) == 3)
        {
          GHashTable *h = g_str_equal (kind, "prefill") ? out->prefill_ms : out->decode_ms;
          g_hash_table_insert (h, g_memdup2 (&L, sizeof L), g_memdup2 (&v, sizeof v));
        }
    }
  return TRUE;
}

static double
sdpa_ms (GHashTable *h, gint64 L)
{
  const double *v = g_hash_table_lookup (h, &L);
  return v ? *v : NAN;
}

gboolean
sift_bench_sdpa_decode (const char *script, const GArray *dec, int repeats, double *copy_gbps, double *ms, char **why)
{
  Sdpa sdpa = { NAN, g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free),
                g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free) };
  g_autoptr (GArray) none = g_array_new (FALSE, FALSE, sizeof (gint64));
  gboolean ok = sdpa_run (script, none, dec, repeats, &sdpa, why);
  *copy_gbps = sdpa.copy_gbps;
  for (guint i = 0; i < dec->len; i++)
    ms[i] = ok ? sdpa_ms (sdpa.decode_ms, g_array_index (dec, gint64, i)) : NAN;
  g_hash_table_unref (sdpa.prefill_ms);
  g_hash_table_unref (sdpa.decode_ms);
  return ok;
}

int
sift_bench_attention_cuda (const GArray *pre, const GArray *dec, int repeats, const char *sdpa_script)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    {
      fprintf (stderr, "sift bench attention --device cuda: %s\n", error->message);
      return 2;
    }
  setvbuf (stdout, NULL, _IOLBF, 0);
  g_autoptr (GDateTime) now = g_date_time_new_now_utc ();
  g_autofree char *when = g_date_time_format_iso8601 (now);
  printf ("device %s; %s; median of %d runs\n", sift_cuda_device_name (), when, repeats);

  Sdpa sdpa = { NAN, g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free),
                g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free) };
  g_autofree char *why = NULL;
  if (sdpa_run (sdpa_script, pre, dec, repeats, &sdpa, &why))
    printf ("PyTorch SDPA (bf16 q/k/v/out) measured by %s; device-to-device copy %.0f GB/s (read + write)\n",
            sdpa_script, sdpa.copy_gbps);
  else
    printf ("PyTorch SDPA not measured: %s\n", why);

  int status = 0;
  g_autoptr (GRand) r = g_rand_new_with_seed (1);
  printf ("\nprefill  causal, %d q heads / %d kv heads, head_dim %d, bf16 K/V, f32 q/out\n", Q_HEADS,
          KV_HEADS, HEAD_DIM);
  printf ("  %8s %10s %10s %10s %10s %8s\n", "tokens", "sift ms", "TFLOP/s", "SDPA ms", "TFLOP/s", "vs SDPA");
  for (guint i = 0; i < pre->len && status == 0; i++)
    {
      gint64 L = g_array_index (pre, gint64, i);
      Problem p;
      double s = problem_init (&p, L, L, r, &error) ? time_calls (&p, FALSE, repeats, 1, &error) : NAN;
      problem_clear (&p);
      if (isnan (s))
        {
          fprintf (stderr, "prefill %" G_GINT64_FORMAT ": %s\n", L, error->message);
          status = 1;
          break;
        }
      double flops = 2.0 * (double) L * (double) L * HEAD_DIM * Q_HEADS;
      double ms = sdpa_ms (sdpa.prefill_ms, L);
      printf ("  %8" G_GINT64_FORMAT " %10.2f %10.1f %10.2f %10.1f %7.2fx\n", L, s * 1e3, flops / s * 1e-12, ms,
              flops / (ms * 1e-3) * 1e-12, ms * 1e-3 / s);
    }

  printf ("\ndecode   1 query row, %d q heads / %d kv heads, head_dim %d, bf16 K/V\n", Q_HEADS, KV_HEADS,
          HEAD_DIM);
  printf ("  %8s %10s %10s %10s %10s %8s %8s\n", "tokens", "sift us", "KV GB/s", "SDPA us", "KV GB/s",
          "vs SDPA", "of copy");
  for (guint i = 0; i < dec->len && status == 0; i++)
    {
      gint64 L = g_array_index (dec, gint64, i);
      Problem p;
      double s = problem_init (&p, 1, L, r, &error) ? time_calls (&p, TRUE, repeats, 50, &error) : NAN;
      problem_clear (&p);
      if (isnan (s))
        {
          fprintf (stderr, "decode %" G_GINT64_FORMAT ": %s\n", L, error->message);
          status = 1;
          break;
        }
      double bytes = 2.0 * (double) L * KV_HEADS * HEAD_DIM * 2;
      double ms = sdpa_ms (sdpa.decode_ms, L);
      printf ("  %8" G_GINT64_FORMAT " %10.1f %10.0f %10.1f %10.0f %7.2fx %7.0f%%\n", L, s * 1e6,
              bytes / s * 1e-9, ms * 1e3, bytes / (ms * 1e-3) * 1e-9, ms * 1e-3 / s,
              100.0 * bytes / s * 1e-9 / sdpa.copy_gbps);
    }
  g_hash_table_unref (sdpa.prefill_ms);
  g_hash_table_unref (sdpa.decode_ms);
  return status;
}

/* The dense reference for a cell's question rows. A model whose q, k, v
 * depend on earlier layers' outputs gets the reference its own forward pass
 * defines: the same prompt and decode steps through the same runner with
 * dense attention in every layer (the full policy's path), over an f32
 * store. A positional model (q, k, v a function of the position alone, as
 * the synthetic model's) gets the same numbers from one dense call per
 * layer over the question rows: no prefill of the whole prompt. */
#include <errno.h>
#include <string.h>

#include <glib/gstdio.h>

#include "harness.h"

typedef struct {
  const SiftModelShape *shape;
  gint64 row0, n_rows;
  float *ref;               /* [n_layers][n_q_heads][n_rows][head_dim] */
} Capture;

static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Capture *c = user_data;
  (void) lse;
  harness_capture_rows (c->shape, ctx, out, c->row0, c->n_rows, c->ref, NULL);
}

void
harness_capture_rows (const SiftModelShape *s, const SiftPolicyContext *ctx, const SiftView *out,
                      gint64 row0, gint64 n_rows, float *dst, gint32 *seen_layers)
{
  gsize d = (gsize) s->head_dim;
  for (gint32 i = 0; i < ctx->n_q; i++)
    {
      gint64 r = ctx->q_pos + i - row0;
      if (r < 0 || r >= n_rows)
        continue;
      for (gint32 h = 0; h < s->n_q_heads; h++)
        sift_view_row_to_f32 (out, h, i, dst + (((gsize) ctx->layer * s->n_q_heads + h) * n_rows + r) * d);
      if (seen_layers != NULL)
        seen_layers[r]++;
    }
}

/* An f32 store of the config's kind (a file store keeps the reference's
 * KV out of memory too). */
static SiftStore *
reference_store (const SiftConfig *cfg, GError **error)
{
  const SiftModelShape *s = &cfg->shape;
  const char *out_dir = sift_harness_config (cfg)->out_dir;
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  g_autofree char *path = g_build_filename (out_dir, "kv-reference.store", NULL);
  SiftStoreConfig sc = {
    .dtype = SIFT_DTYPE_F32, .n_kv_heads = s->n_kv_heads, .block_size = s->block_size, .head_dim = s->head_dim,
    .path = path, .keep = FALSE, .direct = off->store_direct,
  };
  if (g_strcmp0 (off->store, "file") != 0)
    return sift_store_host_new (&sc, error);
  if (g_mkdir_with_parents (out_dir, 0755) != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot create %s: %s", out_dir,
                   g_strerror (errno));
      return NULL;
    }
  return sift_store_file_new (&sc, error);
}

gboolean
harness_dense_reference_runner (const SiftConfig *cfg, SiftModel *model, gint64 length, gint64 steps, gint64 row0,
                         gint64 n_rows, float *ref, GError **error)
{
  g_autoptr (SiftStore) store = reference_store (cfg, error);
  if (store == NULL)
    return FALSE;
  SiftEngineConfig ec = {
    .shape = cfg->shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = sift_offload_config (cfg)->ring_slots,
    .pipeline = SIFT_PIPELINE_RING,
  };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, error);
  if (engine == NULL)
    return FALSE;
  /* NULL policies: dense attention over every block in both phases. */
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, model, NULL, NULL, error);
  if (runner == NULL)
    return FALSE;
  Capture c = { .shape = &cfg->shape, .row0 = row0, .n_rows = n_rows, .ref = ref };
  SiftRunnerObserver obs = { .attention = on_attention };
  sift_runner_set_observer (runner, &obs, &c);
  if (!sift_runner_prefill (runner, length, NULL, NULL, error))
    return FALSE;
  for (gint64 s = 0; s < steps; s++)
    if (!sift_runner_decode (runner, 1, NULL, NULL, error))
      return FALSE;
  return TRUE;
}

gboolean
harness_dense_reference_direct (const SiftModelShape *shape, SiftModel *model, gint64 row0, gint64 n_rows,
                                float *ref, GError **error)
{
  const gsize d = (gsize) shape->head_dim, hq = (gsize) shape->n_q_heads, hkv = (gsize) shape->n_kv_heads;
  const gint64 n_pos = row0 + n_rows, step = 4096;
  g_autofree float *Q = g_new (float, (gsize) MIN (step, n_pos) * hq * d);
  g_autofree float *q_rows = g_new (float, (gsize) n_rows * hq * d);
  g_autofree float *K = g_new (float, (gsize) n_pos * hkv * d);
  g_autofree float *V = g_new (float, (gsize) n_pos * hkv * d);
  g_autofree float *lse = g_new (float, hq * (gsize) n_rows);
  for (gint32 l = 0; l < shape->n_layers; l++)
    {
      for (gint64 c0 = 0; c0 < n_pos; c0 += step)
        {
          gint64 m = MIN (step, n_pos - c0);
          if (!sift_model_qkv_at (model, l, c0, m, Q, K + (gsize) c0 * hkv * d, V + (gsize) c0 * hkv * d, error))
            return FALSE;
          for (gint64 p = MAX (c0, row0); p < c0 + m; p++)
            memcpy (q_rows + (gsize) (p - row0) * hq * d, Q + (gsize) (p - c0) * hq * d, hq * d * sizeof (float));
        }
      SiftView qv = sift_view_thd (q_rows, SIFT_DTYPE_F32, n_rows, shape->n_q_heads, shape->head_dim);
      SiftView kv = sift_view_thd (K, SIFT_DTYPE_F32, n_pos, shape->n_kv_heads, shape->head_dim);
      SiftView vv = sift_view_thd (V, SIFT_DTYPE_F32, n_pos, shape->n_kv_heads, shape->head_dim);
      SiftView ov = sift_view_htd (ref + (gsize) l * hq * (gsize) n_rows * d, SIFT_DTYPE_F32, shape->n_q_heads,
                                   n_rows, shape->head_dim);
      SiftAttnOpts opts = { .causal = TRUE, .q_offset = row0, .scale = shape->scale };
      if (!sift_attn_dense (&qv, &kv, &vv, &opts, &ov, lse, error))
        return FALSE;
    }
  return TRUE;
}

gboolean
harness_dense_reference (const SiftConfig *cfg, SiftModel *model, gint64 length, gint64 steps, gint64 row0,
                         gint64 n_rows, float *ref, GError **error)
{
  if (sift_model_is_positional (model))
    return harness_dense_reference_direct (&cfg->shape, model, row0, n_rows, ref, error);
  return harness_dense_reference_runner (cfg, model, length, steps, row0, n_rows, ref, error);
}

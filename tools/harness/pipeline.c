/* A run's machinery: store, engine (with eviction), one policy instance
 * per layer and phase, and the runner over a model; and greedy generation
 * through it. Shared by the needle cells and `sift generate`. */
#include <errno.h>
#include <string.h>

#include "harness.h"

static SiftStore *
make_store (const SiftConfig *cfg, const SiftModelShape *shape, const char *path, GError **error)
{
  SiftStoreConfig sc = {
    .dtype = sift_kv_config (cfg)->store_dtype, .n_kv_heads = shape->n_kv_heads, .block_size = shape->block_size,
    .head_dim = shape->head_dim, .path = path, .keep = sift_offload_config (cfg)->store_keep, .direct = sift_offload_config (cfg)->store_direct,
  };
  return g_strcmp0 (sift_offload_config (cfg)->store, "file") == 0 ? sift_store_file_new (&sc, error) : sift_store_host_new (&sc, error);
}

char *
harness_store_path (const SiftConfig *cfg, const char *name, GError **error)
{
  if (g_strcmp0 (sift_offload_config (cfg)->store, "file") == 0 && g_mkdir_with_parents (sift_harness_config (cfg)->out_dir, 0755) != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot create %s: %s", sift_harness_config (cfg)->out_dir,
                   g_strerror (errno));
      return NULL;
    }
  return g_build_filename (sift_harness_config (cfg)->out_dir, name, NULL);
}

static gboolean
layer_forced_dense (const SiftPolicySetup *setup, gint32 l)
{
  for (gsize i = 0; i < setup->n_dense_layers; i++)
    if (setup->dense_layers[i] == l)
      return TRUE;
  return FALSE;
}

gboolean
harness_pipeline_init_with (HarnessPipeline *p, const SiftConfig *cfg, SiftModel *model, SiftPolicy **prefill,
                            SiftPolicy **decode, const char *store_path, GError **error)
{
  memset (p, 0, sizeof *p);
  const SiftModelShape *shape = &model->shape;
  p->n_layers = shape->n_layers;
  p->prefill = prefill;
  p->decode = decode;
  p->store = make_store (cfg, shape, store_path, error);
  SiftEngineConfig ec = {
    .shape = *shape, .compute_dtype = sift_kv_config (cfg)->compute_dtype, .n_slots = sift_offload_config (cfg)->ring_slots, .pipeline = sift_offload_config (cfg)->pipeline,
    .device = sift_offload_config (cfg)->device,
  };
  /* kv.capacity_tokens bounds the cache: the engine evicts (docs/eviction.md). */
  SiftEvictConfig ev = { sift_kv_config (cfg)->capacity_tokens, sift_kv_config (cfg)->evict_granularity, sift_kv_config (cfg)->protect_sinks, sift_kv_config (cfg)->protect_recent };
  if (p->store != NULL)
    p->engine = sift_engine_new (&ec, p->store, error);
  if (p->engine != NULL && sift_engine_set_eviction (p->engine, &ev, error)
      && sift_engine_set_resident (p->engine, sift_offload_config (cfg)->resident, error))
    {
      sift_engine_set_force_copy (p->engine, sift_offload_config (cfg)->force_copy);
      p->runner = sift_runner_new (p->engine, model, prefill, decode, error);
    }
  if (p->runner == NULL)
    harness_pipeline_clear (p);
  return p->runner != NULL;
}

gboolean
harness_pipeline_init (HarnessPipeline *p, const SiftConfig *cfg, const SiftPolicySetup *setup, SiftModel *model,
                       const char *store_path, GError **error)
{
  const SiftModelShape *shape = &model->shape;
  if (setup->prefill.ops == NULL || setup->decode.ops == NULL)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "%s: setup '%s' has unresolved policies",
                   cfg->file, setup->label);
      memset (p, 0, sizeof *p);
      return FALSE;
    }
  /* One instance per layer and phase, so no policy has to key state by layer. */
  SiftPolicy **prefill = g_new0 (SiftPolicy *, shape->n_layers), **decode = g_new0 (SiftPolicy *, shape->n_layers);
  gboolean ok = TRUE;
  for (gint32 l = 0; ok && l < shape->n_layers; l++)
    if (!layer_forced_dense (setup, l))
      ok = (prefill[l] = sift_policy_new (setup->prefill.ops, setup->prefill.params, shape, error)) != NULL
           && (decode[l] = sift_policy_new (setup->decode.ops, setup->decode.params, shape, error)) != NULL;
  if (!ok)
    {
      HarnessPipeline failed = { .n_layers = shape->n_layers, .prefill = prefill, .decode = decode };
      harness_pipeline_clear (&failed);
      memset (p, 0, sizeof *p);
      return FALSE;
    }
  return harness_pipeline_init_with (p, cfg, model, prefill, decode, store_path, error);
}

void
harness_pipeline_clear (HarnessPipeline *p)
{
  g_clear_pointer (&p->runner, sift_runner_free);
  for (gint32 l = 0; l < p->n_layers; l++)
    {
      if (p->prefill != NULL)
        sift_policy_free (p->prefill[l]);
      if (p->decode != NULL)
        sift_policy_free (p->decode[l]);
    }
  g_clear_pointer (&p->prefill, g_free);
  g_clear_pointer (&p->decode, g_free);
  g_clear_pointer (&p->engine, sift_engine_free);
  g_clear_pointer (&p->store, sift_store_free);
}

guint64
harness_pipeline_tokens_evicted (const HarnessPipeline *p)
{
  guint64 n = 0;
  for (int ph = 0; ph < 2; ph++)
    {
      SiftCounters c;
      sift_engine_counters (p->engine, -1, ph == 0 ? SIFT_PHASE_PREFILL : SIFT_PHASE_DECODE, &c);
      n += c.tokens_evicted;
    }
  return n;
}

static gint32
argmax (const float *x, gint32 n)
{
  gint32 best = 0;
  for (gint32 i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

gboolean
harness_generate (SiftRunner *runner, SiftModel *model, const SiftTokenizer *tok, const gint32 *prompt,
                  gint64 n_prompt, gint64 max_new, HarnessGeneration *out, GError **error)
{
  g_return_val_if_fail (model->n_vocab > 0 && n_prompt > 0 && max_new >= 1, FALSE);
  memset (out, 0, sizeof *out);
  out->ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  out->text = g_string_new ("");
  g_autofree float *logits = g_new (float, model->n_vocab);
  gint64 t0 = g_get_monotonic_time ();
  if (!sift_runner_prefill (runner, n_prompt, prompt, logits, error))
    return FALSE;
  gint64 t1 = g_get_monotonic_time ();
  for (gint64 i = 0; i < max_new; i++)
    {
      gint32 next = argmax (logits, model->n_vocab);
      g_array_append_val (out->ids, next);
      if (tok != NULL)
        {
          if (sift_tokenizer_is_eog (tok, next))
            {
              out->stopped = TRUE;
              break;
            }
          sift_tokenizer_piece (tok, next, FALSE, out->text);
        }
      if (i + 1 == max_new)
        break;
      if (!sift_runner_decode (runner, 1, &next, logits, error))
        return FALSE;
      out->n_decoded++;
    }
  gint64 t2 = g_get_monotonic_time ();
  out->prefill_seconds = (double) (t1 - t0) / G_USEC_PER_SEC;
  out->decode_seconds = (double) (t2 - t1) / G_USEC_PER_SEC;
  return TRUE;
}

void
harness_generation_clear (HarnessGeneration *g)
{
  if (g->ids != NULL)
    g_array_unref (g->ids);
  if (g->text != NULL)
    g_string_free (g->text, TRUE);
  memset (g, 0, sizeof *g);
}

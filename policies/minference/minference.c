/* The minference policy: MInference's vertical-slash sparse prefill
 * (Jiang et al., NeurIPS 2024) as a sift plugin.
 *
 * Prefill only, no block selection: every stored block streams through the
 * ring slots; the policy changes only how attention is computed. Each
 * chunk estimates its pattern from its own last `last_q` rows against every
 * key so far (stored blocks, then the chunk), so a whole-prompt chunk is
 * MInference exactly. See docs/policies/minference.md. */
#include <math.h>

#include <sift/plugin.h>

#include "pattern-file.h"
#include "vs.h"

typedef struct {
  SiftPolicy parent;
  VsEstimateOpts est;
  gint64 vertical_size, slash_size;
  double budget;
  VsPatternFile patterns;
  /* The kernel's buffers, kept for every layer and chunk (vs.h: VsWork);
   * a call that finds it taken uses its own. */
  GMutex work_lock;
  VsWork *work;
} MinferencePolicy;

static const SiftParamSpec minference_params[] = {
  SIFT_PARAM_INT ("last_q", 64, 1, 4096,
    "query rows (the chunk's last) the pattern is estimated from"),
  SIFT_PARAM_INT ("vertical_size", 1000, 1, G_MAXINT32,
    "key columns kept per head (sinks included), unless budget > 0"),
  SIFT_PARAM_INT ("slash_size", 6096, 1, G_MAXINT32,
    "diagonals kept per head (recent included), unless budget > 0"),
  SIFT_PARAM_FLOAT ("budget", 0.0, 0, 1,
    "> 0: adaptive sizes, a fraction of the sequence split max(31, 0.2 b) columns / max(101, 0.8 b) diagonals"),
  SIFT_PARAM_INT ("num_sink_tokens", 30, 0, G_MAXINT32,
    "first key columns always kept"),
  SIFT_PARAM_INT ("num_recent_diags", 100, 1, G_MAXINT32,
    "nearest diagonals always kept (distance 0 is the token itself)"),
  SIFT_PARAM_INT ("tile_rows", 4, 1, VS_TILE_MAX,
    "query rows per kernel tile: a slash diagonal covers this many keys per row (MInference's GPU kernel: 64)"),
  SIFT_PARAM_STRING ("pattern_file", "",
    "per-head patterns, MInference's JSON (or YAML) format; heads not listed use the sizes above"),
  SIFT_PARAM_END,
};

static gboolean
minference_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  MinferencePolicy *p = (MinferencePolicy *) self;
  p->est.tile = (gint32) sift_params_get_int (params, "tile_rows");
  p->est.last_q = (gint32) sift_params_get_int (params, "last_q");
  p->est.num_sink = sift_params_get_int (params, "num_sink_tokens");
  p->est.num_recent = sift_params_get_int (params, "num_recent_diags");
  p->vertical_size = sift_params_get_int (params, "vertical_size");
  p->slash_size = sift_params_get_int (params, "slash_size");
  p->budget = sift_params_get_float (params, "budget");
  const char *file = sift_params_get_string (params, "pattern_file");
  if (file != NULL && file[0] != '\0'
      && !vs_pattern_file_load (&p->patterns, file, self->shape->n_layers, self->shape->n_q_heads, error))
    return FALSE;
  g_mutex_init (&p->work_lock);
  p->work = vs_work_new ();
  return TRUE;
}

static void
minference_finalize (SiftPolicy *self)
{
  MinferencePolicy *p = (MinferencePolicy *) self;
  vs_pattern_file_clear (&p->patterns);
  if (p->work != NULL)
    {
      vs_work_free (p->work);
      g_mutex_clear (&p->work_lock);
    }
}

/* Sizes of each query head of `layer` for an n-key sequence. */
static void
head_sizes (const MinferencePolicy *p, gint32 layer, gint32 n_heads, gint64 n, VsSizes *sizes)
{
  for (gint32 h = 0; h < n_heads; h++)
    {
      const VsHeadPattern *hp = vs_pattern_file_get (&p->patterns, layer, h);
      if (hp)
        vs_sizes (n, hp->vertical, hp->slash, 0.0, p->est.num_sink, p->est.num_recent, &sizes[h].vertical,
                  &sizes[h].slash);
      else
        vs_sizes (n, p->vertical_size, p->slash_size, p->budget, p->est.num_sink, p->est.num_recent,
                  &sizes[h].vertical, &sizes[h].slash);
    }
}

/* The layer's stored blocks through an engine stream (up to n_slots loads
 * in flight), then the chunk's own keys. */
typedef struct {
  const SiftPolicyContext *ctx;
} EngineSource;

static gboolean
engine_source (gpointer source, gboolean want_v, VsBlockFunc fn, gpointer data, GError **error)
{
  const SiftPolicyContext *ctx = ((EngineSource *) source)->ctx;
  SiftEngine *engine = ctx->engine;
  SiftStream *stream = sift_engine_stream_begin (engine, ctx->layer, NULL, (gsize) ctx->n_blocks,
                                                 want_v ? SIFT_LOAD_KV : SIFT_LOAD_K);
  SiftStreamBlock b;
  while (sift_engine_stream_next (stream, &b, 1, error) > 0)
    fn (data, &b.k, want_v ? &b.v : NULL, ctx->blocks[b.block_id].first_token);
  if (!sift_engine_stream_end (stream))
    return FALSE;
  SiftView k, v;
  sift_engine_local_kv (engine, ctx, &k, &v);
  fn (data, &k, want_v ? &v : NULL, ctx->q_pos);
  return TRUE;
}

static gboolean
minference_prefill (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse,
                    GError **error)
{
  MinferencePolicy *p = (MinferencePolicy *) self;
  const SiftModelShape *shape = ctx->shape;
  const gint64 n = ctx->q_pos + ctx->n_q;
  g_autofree VsSizes *sizes = g_new (VsSizes, shape->n_q_heads);
  head_sizes (p, ctx->layer, shape->n_q_heads, n, sizes);
  if (vs_sizes_dense (sizes, shape->n_q_heads, n))
    return sift_engine_attend_default (ctx->engine, ctx, NULL, out, lse, error);
  EngineSource src = { ctx };
  const float scale = sift_attn_scale (shape->scale, shape->head_dim);
  VsStats stats = { 0 };
  const gboolean mine = g_mutex_trylock (&p->work_lock);
  const gboolean ok = vs_chunk_prefill (&ctx->q, ctx->q_pos, shape->n_kv_heads, scale, &p->est, sizes,
                                        mine ? p->work : NULL, engine_source, &src, out, lse, &stats, error);
  if (mine)
    g_mutex_unlock (&p->work_lock);
  if (!ok)
    return FALSE;
  sift_engine_count_attended (ctx->engine, ctx, (guint64) stats.keys_attended);
  return TRUE;
}

static const SiftPolicyOps minference_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "minference",
  .version = "1.0",
  .description = "MInference vertical-slash sparse prefill: per-head columns and diagonals estimated from the last queries",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL,
  .params = minference_params,
  .instance_size = sizeof (MinferencePolicy),
  .init = minference_init,
  .finalize = minference_finalize,
  .compute_chunked_prefill = minference_prefill,
};

SIFT_PLUGIN_DEFINE (&minference_ops)

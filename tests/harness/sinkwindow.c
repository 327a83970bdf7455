/* Test plugin "sinkwindow": attention sinks + a recent window, selected by
 * block, the sanity check of the needle harness. It must fail needles that
 * lie outside what it keeps and pass those inside. */
#include <sift/plugin.h>

typedef struct {
  SiftPolicy parent;
  gint64 sink_tokens;
  gint64 window_tokens;
} SinkWindow;

static const SiftParamSpec sinkwindow_params[] = {
  SIFT_PARAM_INT ("sink_tokens", 4, 0, 1 << 20, "first tokens always kept"),
  SIFT_PARAM_INT ("window_tokens", 256, 0, 1 << 30, "tokens before the query rows always kept"),
  SIFT_PARAM_END,
};

static gboolean
sinkwindow_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  SinkWindow *sw = (SinkWindow *) self;
  (void) error;
  sw->sink_tokens = sift_params_get_int (params, "sink_tokens");
  sw->window_tokens = sift_params_get_int (params, "window_tokens");
  return TRUE;
}

/* Keeps a block holding any token < sink_tokens or >= q_pos - window_tokens. */
static gboolean
sinkwindow_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
                   SiftSelection *selected, GError **error)
{
  SinkWindow *sw = (SinkWindow *) self;
  (void) error;
  for (gsize i = 0; i < n; i++)
    {
      const SiftBlockMeta *b = &ctx->blocks[available[i]];
      if (b->first_token < sw->sink_tokens || b->first_token + b->n_valid > ctx->q_pos - sw->window_tokens)
        sift_selection_add (selected, available[i]);
    }
  return TRUE;
}

static const SiftPolicyOps sinkwindow_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "sinkwindow",
  .version = "1",
  .description = "test: attention sinks + recent window by block",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = sinkwindow_params,
  .instance_size = sizeof (SinkWindow),
  .init = sinkwindow_init,
  .select_blocks = sinkwindow_select,
};

SIFT_PLUGIN_DEFINE (&sinkwindow_ops)

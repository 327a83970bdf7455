/* Quest end to end through the engine and runner: per-head selections save
 * compute, not just transfer. Each query head's decode output must equal a
 * dense reference (in double, from the model source's own q, k, v) over
 * exactly the stored blocks that head selected plus the unstored tokens;
 * heads that did not select a loaded block must not have attended it. Run
 * with Quest's bounds from its offload hooks and from the engine (blocks
 * the hooks never showed it), which must agree. Blocks read in place
 * count as the union of the selections; copied through the ring, a block
 * loads only the kv heads whose query heads selected it, with the same
 * outputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

enum { NL = 2, NQ = 4, NKV = 2, D = 16, BS = 8, CHUNK = 32, PROMPT = 100, TOP_K = 3 };

static const SiftModelShape shape = { NL, NQ, NKV, D, BS, CHUNK, 0.25f };

typedef struct {
  gint64 n_blocks;
  guint8 has[NL][64][NQ];        /* decode step's selection: [layer][block][q head] */
  gboolean seen_sel[NL];
  float out[NL][NQ][D];          /* decode step's attention output */
  float lse[NL][NQ];
  gboolean seen_out[NL];
} Capture;

static void
on_selection (gpointer user_data, const SiftPolicyContext *ctx, const SiftSelection *sel)
{
  Capture *c = user_data;
  if (ctx->phase != SIFT_PHASE_DECODE)
    return;
  c->n_blocks = ctx->n_blocks;
  g_assert (ctx->n_blocks <= 64);
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    for (gint32 h = 0; h < NQ; h++)
      c->has[ctx->layer][b][h] = sift_selection_has (sel, b, h);
  c->seen_sel[ctx->layer] = TRUE;
}

static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Capture *c = user_data;
  if (ctx->phase != SIFT_PHASE_DECODE)
    return;
  for (gint32 h = 0; h < NQ; h++)
    {
      memcpy (c->out[ctx->layer][h], sift_view_row (out, h, 0), sizeof (float) * D);
      c->lse[ctx->layer][h] = lse[h * ctx->n_q];
    }
  c->seen_out[ctx->layer] = TRUE;
}

static SiftPolicy *
quest_new (SiftRegistry *registry)
{
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "quest", &error);
  assert_non_null (info);
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, NULL);
  assert_true (sift_params_set_text (params, "top_k", "3", NULL));
  assert_true (sift_params_set_text (params, "dense_layers", "[]", NULL));
  SiftPolicy *p = sift_policy_new (info->ops, params, &shape, &error);
  assert_non_null (p);
  return p;
}

/* Prefills PROMPT tokens (dense; through Quest's hooks when hooks_see_prompt)
 * and runs one decode step with Quest in every layer; copy: the ring copies
 * every load instead of reading the store in place. */
static void
run (gboolean hooks_see_prompt, gboolean copy, Capture *c, SiftCounters *decode_counters)
{
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  SiftStoreConfig sc = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = NKV, .block_size = BS, .head_dim = D };
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  assert_non_null (store);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  assert_non_null (engine);
  sift_engine_set_force_copy (engine, copy);
  assert_true (sift_engine_maps (engine) == !copy);
  g_autoptr (SiftModel) source = sift_model_random_new (&shape, 7);
  g_autoptr (SiftPolicy) quest = quest_new (registry);
  SiftPolicy *per_layer[NL] = { quest, quest };
  /* Quest in prefill with prefill=false attends every block: dense, but its hooks see the prompt. */
  g_autoptr (SiftRunner) runner
    = sift_runner_new (engine, source, hooks_see_prompt ? per_layer : NULL, per_layer, &error);
  assert_non_null (runner);
  SiftRunnerObserver obs = { on_attention, on_selection };
  sift_runner_set_observer (runner, &obs, c);
  if (!sift_runner_prefill (runner, PROMPT, NULL, NULL, &error) || !sift_runner_decode (runner, 1, NULL, NULL, &error))
    fail_msg ("%s", error->message);
  assert_true (c->seen_sel[0] && c->seen_sel[1] && c->seen_out[0] && c->seen_out[1]);
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, decode_counters);
}

/* Dense attention in double over the positions `keys` of one head. */
static void
reference (const float *q, const float *k, const float *v, gint32 g, const guint8 *keys, gint64 n_keys,
           double *out, double *lse)
{
  double m = -INFINITY, sum = 0.0;
  for (gint64 j = 0; j < n_keys; j++)
    if (keys[j])
      {
        double s = 0.0;
        for (gint32 i = 0; i < D; i++)
          s += (double) q[i] * k[((gsize) j * NKV + (gsize) g) * D + (gsize) i];
        m = fmax (m, s * shape.scale);
      }
  memset (out, 0, sizeof (double) * D);
  for (gint64 j = 0; j < n_keys; j++)
    if (keys[j])
      {
        double s = 0.0;
        for (gint32 i = 0; i < D; i++)
          s += (double) q[i] * k[((gsize) j * NKV + (gsize) g) * D + (gsize) i];
        double w = exp (s * shape.scale - m);
        sum += w;
        for (gint32 i = 0; i < D; i++)
          out[i] += w * v[((gsize) j * NKV + (gsize) g) * D + (gsize) i];
      }
  for (gint32 i = 0; i < D; i++)
    out[i] /= sum;
  *lse = m + log (sum);
}

static void
per_head_selection (gboolean copy)
{
  Capture c = { 0 };
  SiftCounters counters;
  run (TRUE, copy, &c, &counters);
  const gint64 n_tok = PROMPT + 1;
  g_autoptr (SiftModel) source = sift_model_random_new (&shape, 7);
  g_autofree float *q = g_new (float, (gsize) n_tok * NQ * D);
  g_autofree float *k = g_new (float, (gsize) n_tok * NKV * D);
  g_autofree float *v = g_new (float, (gsize) n_tok * NKV * D);
  gboolean groups_differ = FALSE;
  guint64 attended = 0, union_blocks = 0, kv_head_blocks = 0;
  for (gint32 l = 0; l < NL; l++)
    {
      assert_true (sift_model_qkv_at (source, l, 0, n_tok, q, k, v, NULL));
      assert_int_equal (c.n_blocks, (PROMPT + BS - 1) / BS); /* the partial last block is stored */
      for (gint64 b = 0; b < c.n_blocks; b++)
        {
          groups_differ |= c.has[l][b][0] != c.has[l][b][NQ / NKV];
          gboolean any = FALSE;
          for (gint32 g = 0; g < NKV; g++)
            {
              gboolean group = FALSE;
              for (gint32 h = g * (NQ / NKV); h < (g + 1) * (NQ / NKV); h++)
                group |= c.has[l][b][h];
              kv_head_blocks += group;
              any |= group;
            }
          union_blocks += any;
        }
      for (gint32 h = 0; h < NQ; h++)
        {
          guint8 keys[PROMPT + 1] = { 0 };
          gint64 n_sel = 0;
          for (gint64 t = 0; t < PROMPT; t++)
            keys[t] = c.has[l][t / BS][h];
          for (gint64 b = 0; b < c.n_blocks; b++)
            n_sel += c.has[l][b][h];
          assert_int_equal (n_sel, TOP_K);
          keys[PROMPT] = 1; /* the decode row itself, in the decode buffer */
          for (gint64 t = 0; t <= PROMPT; t++)
            attended += keys[t];
          double want[D], want_lse;
          reference (q + ((gsize) PROMPT * NQ + (gsize) h) * D, k, v, h / (NQ / NKV), keys, n_tok, want, &want_lse);
          for (gint32 i = 0; i < D; i++)
            assert_true (fabs (c.out[l][h][i] - want[i]) <= 1e-5 * (1.0 + fabs (want[i])));
          assert_true (fabs (c.lse[l][h] - want_lse) <= 1e-5 * (1.0 + fabs (want_lse)));
        }
    }
  /* Otherwise the test could not tell per-head from shared selection. */
  assert_true (groups_differ);
  /* Compute: each head attended its own blocks only. Transfer: read in
   * place, the union of whole blocks once; copied, each block's kv heads
   * that some query head of theirs selected. */
  assert_int_equal (counters.tokens_attended, attended);
  if (copy)
    assert_int_equal (counters.bytes_loaded, kv_head_blocks * (guint64) (2 * BS * D * sizeof (float)));
  else
    assert_int_equal (counters.bytes_loaded, union_blocks * (guint64) (2 * NKV * BS * D * sizeof (float)));
  assert_true (union_blocks <= (guint64) NL * TOP_K * NKV);
  /* Otherwise a copy of every head would pass the count above. */
  assert_true (kv_head_blocks < union_blocks * NKV);
}

static void
test_per_head_selection_saves_compute (void **state)
{
  (void) state;
  per_head_selection (FALSE);
}

static void
test_copied_loads_only_selected_kv_heads (void **state)
{
  (void) state;
  per_head_selection (TRUE);
}

/* Quest placed in decode only (another policy runs the prefill) still sees
 * the prompt's blocks through on_prefill_offload: the runner calls every
 * layer policy's hooks. It selects what Quest in both phases selects, and
 * reads no prompt key again. */
static void
test_bounds_without_hooks_match (void **state)
{
  (void) state;
  Capture a = { 0 }, b = { 0 };
  SiftCounters ca, cb;
  run (TRUE, FALSE, &a, &ca);
  run (FALSE, FALSE, &b, &cb);
  assert_memory_equal (a.has, b.has, sizeof a.has);
  assert_memory_equal (a.out, b.out, sizeof a.out);
  assert_true (cb.bytes_loaded == ca.bytes_loaded);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_per_head_selection_saves_compute),
    cmocka_unit_test (test_copied_loads_only_selected_kv_heads),
    cmocka_unit_test (test_bounds_without_hooks_match),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

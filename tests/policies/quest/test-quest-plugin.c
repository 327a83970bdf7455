/* The quest plugin as the host sees it (loaded from the build tree through
 * the registry): its selections against a brute-force oracle on random
 * keys, sinks and recent blocks, the dense threshold and dense layers, the
 * prefill option, and reset. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "quest-oracle.h"

enum { NQ = 8, NKV = 2, GROUP = NQ / NKV, D = 16, BS = 8, NL = 2 };

static const SiftModelShape shape = { NL, NQ, NKV, D, BS, 4 * BS, 0.25f };

typedef struct {
  gint64 n_blocks;
  gint32 last_valid;           /* valid tokens of the last block */
  float *keys;                 /* [NL][n_blocks][NKV][BS][D] */
  SiftBlockMeta *metas;        /* [n_blocks] */
  float q[NQ * 3 * D];         /* [NQ][rows][D] */
  gint32 n_rows;
} Fixture;

static SiftRegistry *registry; /* the build tree's policies, for the whole group */

static int
group_setup (void **state)
{
  (void) state;
  registry = sift_registry_new (NULL);
  return 0;
}

static int
group_teardown (void **state)
{
  (void) state;
  g_clear_pointer (&registry, sift_registry_free);
  return 0;
}

static const SiftPolicyOps *
quest_ops (void)
{
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "quest", &error);
  if (info == NULL)
    fail_msg ("%s", error->message);
  return info->ops;
}

static float
normal (GRand *rng)
{
  double u = g_rand_double_range (rng, 1e-12, 1.0), v = g_rand_double (rng);
  return (float) (sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v));
}

static Fixture *
fixture_new (guint32 seed, gint64 n_blocks, gint32 last_valid, gint32 n_rows)
{
  g_autoptr (GRand) rng = g_rand_new_with_seed (seed);
  Fixture *f = g_new0 (Fixture, 1);
  f->n_blocks = n_blocks;
  f->last_valid = last_valid;
  f->n_rows = n_rows;
  gsize n_keys = (gsize) NL * n_blocks * NKV * BS * D;
  f->keys = g_new (float, n_keys);
  for (gsize i = 0; i < n_keys; i++)
    f->keys[i] = normal (rng) * (float) (1 + (i / (NKV * BS * D)) % 3); /* blocks of different spread */
  f->metas = g_new (SiftBlockMeta, n_blocks);
  for (gint64 b = 0; b < n_blocks; b++)
    f->metas[b] = (SiftBlockMeta) { .first_token = b * BS, .n_valid = b == n_blocks - 1 ? last_valid : BS, .phase = SIFT_PHASE_PREFILL };
  for (gsize i = 0; i < G_N_ELEMENTS (f->q); i++)
    f->q[i] = normal (rng);
  return f;
}

static void
fixture_free (Fixture *f)
{
  g_free (f->keys);
  g_free (f->metas);
  g_free (f);
}

static float *
block_keys (const Fixture *f, gint32 layer, gint64 b)
{
  return f->keys + ((gsize) layer * f->n_blocks + (gsize) b) * NKV * BS * D;
}

static SiftPolicyContext
context (const Fixture *f, SiftPhase phase, gint32 layer)
{
  SiftPolicyContext ctx = { 0 };
  ctx.phase = phase;
  ctx.layer = layer;
  ctx.block_size = BS;
  ctx.kv_len = (f->n_blocks - 1) * BS + f->last_valid;
  ctx.q_pos = ctx.kv_len;
  ctx.n_q = f->n_rows;
  ctx.q = sift_view_htd ((float *) f->q, SIFT_DTYPE_F32, NQ, f->n_rows, D);
  ctx.shape = &shape;
  ctx.blocks = f->metas;
  ctx.n_blocks = f->n_blocks;
  return ctx;
}

/* Offloads every block of every layer through the policy's hooks (prefill
 * hook for even blocks, decode hook for odd: both must record bounds). */
static void
offload_all (SiftPolicy *policy, const Fixture *f)
{
  for (gint32 l = 0; l < NL; l++)
    for (gint64 b = 0; b < f->n_blocks; b++)
      {
        SiftPolicyContext ctx = context (f, b % 2 ? SIFT_PHASE_DECODE : SIFT_PHASE_PREFILL, l);
        SiftBlockInfo info = { .struct_size = sizeof (SiftBlockInfo), .block_id = b, .meta = &f->metas[b],
                               .k = sift_view_htd (block_keys (f, l, b), SIFT_DTYPE_F32, NKV, BS, D),
                               .v = sift_view_htd (block_keys (f, l, b), SIFT_DTYPE_F32, NKV, BS, D) };
        GError *error = NULL;
        gboolean (*hook) (SiftPolicy *, const SiftPolicyContext *, const SiftBlockInfo *, GError **)
          = b % 2 ? policy->ops->on_decode_offload : policy->ops->on_prefill_offload;
        assert_true (hook (policy, &ctx, &info, &error));
      }
}

/* A policy from "name=value" settings over the defaults. */
static SiftPolicy *
make_policy (const char *const *settings)
{
  const SiftPolicyOps *ops = quest_ops ();
  g_autoptr (SiftParams) params = sift_params_new (ops->params, NULL);
  assert_non_null (params);
  for (gsize i = 0; settings[i] != NULL; i++)
    {
      g_auto (GStrv) kv = g_strsplit (settings[i], "=", 2);
      g_autoptr (GError) error = NULL;
      if (!sift_params_set_text (params, kv[0], kv[1], &error))
        fail_msg ("%s: %s", settings[i], error->message);
    }
  g_autoptr (GError) error = NULL;
  SiftPolicy *policy = sift_policy_new (ops, params, &shape, &error);
  if (policy == NULL)
    fail_msg ("%s", error->message);
  return policy;
}

/* Runs select_blocks over every stored block and validates the answer. */
static SiftSelection *
select_all (SiftPolicy *policy, const SiftPolicyContext *ctx, GError **error)
{
  g_autofree gint64 *avail = g_new (gint64, ctx->n_blocks + 1);
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    avail[b] = b;
  g_autoptr (SiftSelection) sel = sift_selection_new (NQ, NKV);
  if (!policy->ops->select_blocks (policy, ctx, avail, (gsize) ctx->n_blocks, sel, error))
    return NULL;
  assert_true (sift_selection_validate (sel, avail, (gsize) ctx->n_blocks, "quest", NULL));
  return g_steal_pointer (&sel);
}

/* The oracle's keep mask [NQ][n_blocks]: per q head the bound from the raw
 * keys (largest over rows, or of the mean row), reduced per ranking, picked
 * by sorting everything. */
static guint8 *
oracle_select (const Fixture *f, gint32 layer, gint32 n_rank, gboolean mean_reduce, gboolean mean_query,
               gsize budget, gsize sinks, gsize recent)
{
  const gsize n = (gsize) f->n_blocks;
  g_autofree float *hb = g_new (float, NQ * n);
  for (gint32 h = 0; h < NQ; h++)
    {
      float mean[D] = { 0 };
      for (gint32 r = 0; r < f->n_rows; r++)
        for (gint32 i = 0; i < D; i++)
          mean[i] += f->q[((gsize) h * f->n_rows + (gsize) r) * D + (gsize) i] / (float) f->n_rows;
      for (gsize b = 0; b < n; b++)
        {
          const float *k = block_keys (f, layer, (gint64) b) + (gsize) (h / GROUP) * BS * D;
          double best = -INFINITY;
          for (gint32 r = mean_query ? -1 : 0; r < (mean_query ? 0 : f->n_rows); r++)
            best = fmax (best, oracle_bound (r < 0 ? mean : f->q + ((gsize) h * f->n_rows + (gsize) r) * D, k,
                                             f->metas[b].n_valid, D, D));
          hb[(gsize) h * n + b] = (float) best;
        }
    }
  gint32 per = NQ / n_rank;
  guint8 *mask = g_new0 (guint8, NQ * n);
  g_autofree float *score = g_new (float, n);
  g_autofree guint8 *keep = g_new (guint8, n);
  for (gint32 r = 0; r < n_rank; r++)
    {
      for (gsize b = 0; b < n; b++)
        {
          double acc = mean_reduce ? 0.0 : -INFINITY;
          for (gint32 h = r * per; h < (r + 1) * per; h++)
            acc = mean_reduce ? acc + hb[(gsize) h * n + b] / per : fmax (acc, hb[(gsize) h * n + b]);
          score[b] = (float) acc;
        }
      oracle_pick (score, n, budget, sinks, recent, keep);
      for (gint32 h = r * per; h < (r + 1) * per; h++)
        memcpy (mask + (gsize) h * n, keep, n);
    }
  return mask;
}

static void
assert_selection_is (const SiftSelection *sel, const guint8 *mask, gsize n)
{
  for (gint32 h = 0; h < NQ; h++)
    for (gsize b = 0; b < n; b++)
      if (sift_selection_has (sel, (gint64) b, h) != mask[(gsize) h * n + b])
        fail_msg ("head %d block %" G_GSIZE_FORMAT ": selected %d, oracle %d", h, b,
                  sift_selection_has (sel, (gint64) b, h), mask[(gsize) h * n + b]);
}

static void
test_ops (void **state)
{
  (void) state;
  const SiftPolicyOps *ops = quest_ops ();
  assert_true (sift_policy_ops_check (ops, "quest", NULL));
  assert_string_equal (ops->name, "quest");
  assert_true (ops->flags & SIFT_POLICY_SUPPORTS_DECODE);
  assert_true (ops->flags & SIFT_POLICY_SUPPORTS_PREFILL);
  assert_true (ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION);
  const char *names[] = { "mode", "gqa_reduce", "token_budget", "top_k", "sink_blocks", "recent_blocks",
                          "dense_threshold_blocks", "dense_layers", "prefill" };
  for (gsize i = 0; i < G_N_ELEMENTS (names); i++)
    {
      gboolean found = FALSE;
      for (const SiftParamSpec *p = ops->params; p->name != NULL; p++)
        found |= g_str_equal (p->name, names[i]);
      assert_true (found);
    }
  /* sift's additions are off by default: the paper keeps no sink or recent page. */
  for (const SiftParamSpec *p = ops->params; p->name != NULL; p++)
    if (g_str_equal (p->name, "sink_blocks") || g_str_equal (p->name, "recent_blocks"))
      assert_int_equal (p->default_int, 0);
}

/* Every mode and reduction, decode with 1 and 3 rows: the selection per
 * (block, q head) equals the oracle's, on both layers. */
static void
test_selection_matches_oracle (void **state)
{
  (void) state;
  static const struct {
    const char *mode, *reduce;
    gint32 n_rank;
  } modes[] = { { "mode=per_kv_head", "gqa_reduce=max", NKV }, { "mode=per_kv_head", "gqa_reduce=mean", NKV },
                { "mode=shared", "gqa_reduce=max", 1 },        { "mode=shared", "gqa_reduce=mean", 1 },
                { "mode=per_q_head", "gqa_reduce=max", NQ } };
  for (guint32 seed = 1; seed <= 6; seed++)
    for (gsize m = 0; m < G_N_ELEMENTS (modes); m++)
      {
        Fixture *f = fixture_new (seed * 7 + (guint32) m, 37, 1 + (gint32) seed % BS, seed % 2 ? 1 : 3);
        const char *settings[] = { modes[m].mode, modes[m].reduce, "top_k=9", "sink_blocks=2", "recent_blocks=1",
                                   "dense_layers=[]", NULL };
        SiftPolicy *policy = make_policy (settings);
        offload_all (policy, f);
        for (gint32 l = 0; l < NL; l++)
          {
            SiftPolicyContext ctx = context (f, SIFT_PHASE_DECODE, l);
            g_autoptr (SiftSelection) sel = select_all (policy, &ctx, NULL);
            assert_non_null (sel);
            g_autofree guint8 *want
              = oracle_select (f, l, modes[m].n_rank, g_str_has_suffix (modes[m].reduce, "mean"), FALSE, 9, 2, 1);
            assert_selection_is (sel, want, (gsize) f->n_blocks);
            /* Per-head selections differ between groups here (else the test proves nothing). */
            if (modes[m].n_rank > 1 && l == 0 && seed == 1)
              {
                gboolean differ = FALSE;
                for (gint64 b = 0; b < f->n_blocks; b++)
                  differ |= sift_selection_has (sel, b, 0) != sift_selection_has (sel, b, GROUP);
                assert_true (differ);
              }
          }
        sift_policy_free (policy);
        fixture_free (f);
      }
}

/* A token budget of 5 blocks keeps 5 blocks per head, the first and last
 * included when sink_blocks and recent_blocks ask for them (sift's
 * options; off by default, as in the paper). */
static void
test_token_budget_sinks_recent (void **state)
{
  (void) state;
  Fixture *f = fixture_new (3, 30, BS, 1);
  const char *settings[] = { "token_budget=40", "dense_layers=[1]", "sink_blocks=1", "recent_blocks=1",
                             NULL }; /* 40 / BS = 5 */
  SiftPolicy *policy = make_policy (settings);
  offload_all (policy, f);
  SiftPolicyContext ctx = context (f, SIFT_PHASE_DECODE, 0);
  g_autoptr (SiftSelection) sel = select_all (policy, &ctx, NULL);
  for (gint32 h = 0; h < NQ; h++)
    {
      gint32 count = 0;
      for (gint64 b = 0; b < f->n_blocks; b++)
        count += sift_selection_has (sel, b, h);
      assert_int_equal (count, 5);
      assert_true (sift_selection_has (sel, 0, h));
      assert_true (sift_selection_has (sel, f->n_blocks - 1, h));
    }
  g_autofree guint8 *want = oracle_select (f, 0, NKV, FALSE, FALSE, 5, 1, 1);
  assert_selection_is (sel, want, (gsize) f->n_blocks);

  /* Layer 1 is forced dense: every block for every head. */
  SiftPolicyContext ctx1 = context (f, SIFT_PHASE_DECODE, 1);
  g_autoptr (SiftSelection) dense = select_all (policy, &ctx1, NULL);
  assert_int_equal (sift_selection_n_blocks (dense), f->n_blocks);
  for (gint32 h = 0; h < NQ; h++)
    for (gint64 b = 0; b < f->n_blocks; b++)
      assert_true (sift_selection_has (dense, b, h));
  sift_policy_free (policy);
  fixture_free (f);
}

/* At most dense_threshold_blocks stored blocks: every block; one more: a selection. */
static void
test_dense_threshold (void **state)
{
  (void) state;
  for (gint64 n_blocks = 11; n_blocks <= 12; n_blocks++)
    {
      Fixture *f = fixture_new (4, n_blocks, BS, 1);
      const char *settings[] = { "top_k=3", "dense_threshold_blocks=11", "dense_layers=[]", NULL };
      SiftPolicy *policy = make_policy (settings);
      offload_all (policy, f);
      SiftPolicyContext ctx = context (f, SIFT_PHASE_DECODE, 0);
      g_autoptr (SiftSelection) sel = select_all (policy, &ctx, NULL);
      gint64 count = 0;
      for (gint64 b = 0; b < n_blocks; b++)
        count += sift_selection_has (sel, b, 0);
      assert_int_equal (count, n_blocks == 11 ? 11 : 3);
      sift_policy_free (policy);
      fixture_free (f);
    }
}

/* In prefill: with prefill=false every block; with prefill=true the
 * selection of the chunk's mean query. */
static void
test_prefill_option (void **state)
{
  (void) state;
  Fixture *f = fixture_new (5, 25, BS, 3);
  const char *off[] = { "top_k=4", "dense_layers=[]", NULL };
  const char *on[] = { "top_k=4", "dense_layers=[]", "prefill=true", NULL };
  SiftPolicy *p_off = make_policy (off), *p_on = make_policy (on);
  offload_all (p_off, f);
  offload_all (p_on, f);
  SiftPolicyContext ctx = context (f, SIFT_PHASE_PREFILL, 1);
  g_autoptr (SiftSelection) all = select_all (p_off, &ctx, NULL);
  assert_int_equal (sift_selection_n_blocks (all), f->n_blocks);
  g_autoptr (SiftSelection) sel = select_all (p_on, &ctx, NULL);
  g_autofree guint8 *want = oracle_select (f, 1, NKV, FALSE, TRUE, 4, 0, 0);
  assert_selection_is (sel, want, (gsize) f->n_blocks);
  sift_policy_free (p_off);
  sift_policy_free (p_on);
  fixture_free (f);
}

/* Reset forgets every block's bounds: selecting needs them again. */
static void
test_reset_clears_metadata (void **state)
{
  (void) state;
  Fixture *f = fixture_new (6, 20, 3, 1);
  const char *settings[] = { "top_k=4", "dense_layers=[]", NULL };
  SiftPolicy *policy = make_policy (settings);
  offload_all (policy, f);
  SiftPolicyContext ctx = context (f, SIFT_PHASE_DECODE, 0);
  g_autoptr (SiftSelection) before = select_all (policy, &ctx, NULL);
  assert_non_null (before);

  sift_policy_reset (policy);
  for (gint32 l = 0; l < NL; l++)
    {
      g_autoptr (GError) error = NULL;
      SiftPolicyContext c = context (f, SIFT_PHASE_DECODE, l);
      assert_null (select_all (policy, &c, &error));
      assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY));
      assert_non_null (strstr (error->message, "no key bounds for block 0"));
    }
  offload_all (policy, f);
  g_autoptr (SiftSelection) after = select_all (policy, &ctx, NULL);
  g_autofree guint8 *want = oracle_select (f, 0, NKV, FALSE, FALSE, 4, 0, 0);
  assert_selection_is (after, want, (gsize) f->n_blocks);
  sift_policy_free (policy);
  fixture_free (f);
}

/* A token budget under one block is refused at init, naming both numbers. */
static void
test_init_rejects_budget_below_block (void **state)
{
  (void) state;
  const SiftPolicyOps *ops = quest_ops ();
  g_autoptr (SiftParams) params = sift_params_new (ops->params, NULL);
  assert_true (sift_params_set_text (params, "token_budget", "7", NULL));
  g_autoptr (GError) error = NULL;
  assert_null (sift_policy_new (ops, params, &shape, &error));
  assert_true (g_error_matches (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT));
  assert_non_null (strstr (error->message, "token_budget 7"));
  assert_non_null (strstr (error->message, "block_size 8"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_ops),
    cmocka_unit_test (test_selection_matches_oracle),
    cmocka_unit_test (test_token_budget_sinks_recent),
    cmocka_unit_test (test_dense_threshold),
    cmocka_unit_test (test_prefill_option),
    cmocka_unit_test (test_reset_clears_metadata),
    cmocka_unit_test (test_init_rejects_budget_below_block),
  };
  return cmocka_run_group_tests (tests, group_setup, group_teardown);
}

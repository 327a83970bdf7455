/* Per-kv-head selections through the engine on the GPU, where the ring
 * packs each kv head's blocks into shared slots (engine/attend.c):
 * - a rule that gives each kv head blocks of its own, the prompt's partial
 *   last block among them, equals the double-precision reference over
 *   exactly each head's blocks, with the selection in one group of slots
 *   and streamed through fewer slots than it needs, from a pinned host
 *   store (the bytes loaded are the selected (block, kv head) pairs' rows,
 *   nothing more) and from a file store (staged loads);
 * - Quest (per kv head) on the GPU engine selects what it selects on the
 *   CPU engine, step by step, and its outputs agree within the GPU
 *   kernels' bound; its bytes follow its budget.
 * Exits 77 (skipped) without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/cuda.h>

#include "../engine/helpers.h"

/* ---- A rule per kv head ------------------------------------------------- */

/* Block b for kv head g: every third block from an offset of its own, and
 * block 0 for every head. Heads reach different depths. */
static gboolean
rule (gint64 b, gint32 g)
{
  return b == 0 || (b + 2 * g) % 3 == 0;
}

typedef struct {
  SiftPolicy parent;
  guint64 pairs;   /* decode: (block, kv head) pairs selected */
} RulePolicy;

static gboolean
rule_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *avail, gsize n, SiftSelection *sel,
             GError **error)
{
  (void) error;
  RulePolicy *p = (RulePolicy *) self;
  for (gsize i = 0; i < n; i++)
    for (gint32 g = 0; g < ctx->shape->n_kv_heads; g++)
      if (rule (avail[i], g))
        {
          sift_selection_add_kv_head (sel, avail[i], g);
          p->pairs += ctx->phase == SIFT_PHASE_DECODE;
        }
  return TRUE;
}

static const SiftPolicyOps rule_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-rule-kv",
  .version = "1",
  .description = "blocks per kv head by a rule",
  .flags = SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (RulePolicy),
  .select_blocks = rule_select,
};

static gboolean
rule_keep (gint64 b, gint32 h, gpointer data)
{
  const SiftModelShape *s = data;
  return rule (b, h / (s->n_q_heads / s->n_kv_heads));
}

/* file: a file store (loads staged through pinned memory: the kv heads
 * of a packed slot must still come from their own blocks). */
static void
packed_case (gint32 slots, gboolean file)
{
  const SiftModelShape shape = { 2, 8, 4, 64, 16, 64, 0.0f };
  const gint64 prompt = 16 * 30 + 5; /* the partial last block is stored */
  const gint32 steps = 40;
  TestCase c = { 2, 8, 4, 64, 16, 64, slots, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F16, SIFT_PIPELINE_RING, prompt, steps,
                 TEST_POL_NULL };
  g_autoptr (GError) error = NULL;
  g_autofree char *path = file ? test_tmp_path ("packed") : NULL;
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F16, path);
  g_autoptr (SiftStore) store = file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F16, slots, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CUDA };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_assert_no_error (error);
  g_autoptr (SiftModel) src = test_source_new (&shape, 5, SIFT_DTYPE_F16);
  g_autoptr (SiftPolicy) policy = sift_policy_new (&rule_ops, NULL, &shape, &error);
  g_assert_no_error (error);
  SiftPolicy *dec[2] = { policy, policy };
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, NULL, dec, &error);
  g_assert_no_error (error);
  TestChecker *check = test_checker_new (src, test_case_tokens (&c));
  check->prompt = prompt;
  sift_runner_set_observer (runner, &test_checker_observer, check);
  g_assert_true (sift_runner_prefill (runner, prompt, NULL, NULL, &error)); /* dense */
  g_assert_no_error (error);
  check->keep = rule_keep;
  check->keep_data = (gpointer) &shape;
  SiftCounters before, after;
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &before);
  for (gint32 i = 0; i < steps; i++)
    {
      g_assert_true (sift_runner_decode (runner, test_rows_of_step (i), NULL, NULL, &error));
      g_assert_no_error (error);
    }
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &after);
  const double tol = test_tolerance (SIFT_DTYPE_F16);
  if (check->max_err > tol || check->max_lse_err > tol)
    fail_msg ("%d slots: max error %.3g, lse %.3g (tolerance %g)", slots, check->max_err, check->max_lse_err, tol);
  assert_int_equal (check->calls, 2 * ((prompt + shape.chunk_size - 1) / shape.chunk_size + steps));
  /* Every decode call packed (more blocks than any kv head's share). */
  assert_int_equal (engine->n_packed, (guint64) (2 * steps));
  /* Loads in place: each selected (block, kv head) pair's K and V rows
   * once (a staged load reads its whole block from the file). */
  const guint64 head_bytes = 2 * (guint64) shape.block_size * (guint64) shape.head_dim * 2;
  if (!file)
    assert_int_equal (after.bytes_loaded - before.bytes_loaded, ((RulePolicy *) policy)->pairs * head_bytes);
  else
    assert_true (after.bytes_loaded - before.bytes_loaded >= ((RulePolicy *) policy)->pairs * head_bytes);
  test_checker_free (check);
}

/* 30 + 3 stored blocks per layer: a kv head's share is 11-12 blocks plus
 * the partial one. 16 slots hold the packed selection at once; 4 stream it
 * in groups of 2. */
static void
test_packed_one_group (void **state)
{
  (void) state;
  packed_case (16, FALSE);
}

static void
test_packed_streamed (void **state)
{
  (void) state;
  packed_case (4, FALSE);
}

static void
test_packed_staged (void **state)
{
  (void) state;
  packed_case (16, TRUE);
  packed_case (4, TRUE);
}

/* ---- Quest on the GPU against Quest on the CPU --------------------------- */

enum { QL = 2, QQ = 8, QKV = 4, QD = 64, QBS = 16, QPROMPT = 16 * 40 + 7, QSTEPS = 30, QTOPK = 5, QMAXB = 48 };

typedef struct {
  guint8 has[QSTEPS + 1][QL][QMAXB][QQ]; /* per decode step: [layer][block][q head] */
  float out[QSTEPS + 1][QL][QQ][QD];     /* per decode step, the first row */
  gint32 step[QL];
} Trace;

static void
trace_selection (gpointer data, const SiftPolicyContext *ctx, const SiftSelection *sel)
{
  Trace *t = data;
  if (ctx->phase != SIFT_PHASE_DECODE)
    return;
  g_assert_cmpint (ctx->n_blocks, <=, QMAXB);
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    for (gint32 h = 0; h < QQ; h++)
      t->has[t->step[ctx->layer]][ctx->layer][b][h] = sift_selection_has (sel, b, h);
}

static void
trace_attention (gpointer data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  (void) lse;
  Trace *t = data;
  if (ctx->phase != SIFT_PHASE_DECODE)
    return;
  for (gint32 h = 0; h < QQ; h++)
    memcpy (t->out[t->step[ctx->layer]][ctx->layer][h], sift_view_row (out, h, 0), sizeof (float) * QD);
  t->step[ctx->layer]++;
}

static void
quest_run (SiftDevice device, Trace *t, SiftCounters *decode, guint64 *n_packed)
{
  const SiftModelShape shape = { QL, QQ, QKV, QD, QBS, 64, 0.0f };
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "quest", &error);
  g_assert_no_error (error);
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, NULL);
  g_autofree char *top_k = g_strdup_printf ("%d", QTOPK);
  g_assert_true (sift_params_set_text (params, "top_k", top_k, NULL));
  g_assert_true (sift_params_set_text (params, "dense_layers", "[]", NULL));
  g_autoptr (SiftPolicy) quest = sift_policy_new (info->ops, params, &shape, &error);
  g_assert_no_error (error);
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F16, NULL);
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  /* The same f16 keys on both: the CPU computes in f32 from them, the GPU in f16. */
  SiftEngineConfig ec = { shape, device == SIFT_DEVICE_CUDA ? SIFT_DTYPE_F16 : SIFT_DTYPE_F32, 8, SIFT_PIPELINE_RING, 0,
                          device };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_assert_no_error (error);
  g_autoptr (SiftModel) src = test_source_new (&shape, 9, SIFT_DTYPE_F16);
  SiftPolicy *per[QL] = { quest, quest };
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, per, per, &error);
  g_assert_no_error (error);
  SiftRunnerObserver obs = { trace_attention, trace_selection };
  sift_runner_set_observer (runner, &obs, t);
  g_assert_true (sift_runner_prefill (runner, QPROMPT, NULL, NULL, &error));
  g_assert_no_error (error);
  for (gint32 i = 0; i <= QSTEPS; i++)
    {
      g_assert_true (sift_runner_decode (runner, 1, NULL, NULL, &error));
      g_assert_no_error (error);
    }
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, decode);
  *n_packed = engine->n_packed;
}

static void
test_quest_matches_cpu (void **state)
{
  (void) state;
  g_autofree Trace *cpu = g_new0 (Trace, 1), *gpu = g_new0 (Trace, 1);
  SiftCounters cc, gc;
  guint64 cpu_packed = 0, gpu_packed = 0;
  quest_run (SIFT_DEVICE_CPU, cpu, &cc, &cpu_packed);
  quest_run (SIFT_DEVICE_CUDA, gpu, &gc, &gpu_packed);
  assert_int_equal (cpu->step[0], QSTEPS + 1);
  assert_int_equal (gpu->step[1], QSTEPS + 1);
  /* The same selection at every step (Quest's bounds from the same keys)... */
  assert_memory_equal (cpu->has, gpu->has, sizeof cpu->has);
  /* ...per kv head, each group its own blocks, QTOPK of them... */
  guint64 pairs = 0;
  gboolean differ = FALSE;
  for (gint32 s = 0; s <= QSTEPS; s++)
    for (gint32 l = 0; l < QL; l++)
      for (gint32 g = 0; g < QKV; g++)
        {
          gint32 n = 0;
          for (gint32 b = 0; b < QMAXB; b++)
            {
              const gint32 h0 = g * (QQ / QKV);
              for (gint32 h = h0 + 1; h < h0 + QQ / QKV; h++)
                assert_int_equal (gpu->has[s][l][b][h], gpu->has[s][l][b][h0]);
              n += gpu->has[s][l][b][h0];
              differ |= gpu->has[s][l][b][h0] != gpu->has[s][l][b][0];
            }
          assert_int_equal (n, QTOPK);
          pairs += (guint64) n;
        }
  assert_true (differ);
  /* ...and the outputs agree within the GPU kernels' f16 bound. */
  const double tol = test_tolerance (SIFT_DTYPE_F16);
  for (gint32 s = 0; s <= QSTEPS; s++)
    for (gint32 l = 0; l < QL; l++)
      for (gint32 h = 0; h < QQ; h++)
        {
          double ref = 1e-3, diff = 0;
          for (gint32 i = 0; i < QD; i++)
            {
              ref = MAX (ref, fabs (cpu->out[s][l][h][i]));
              diff = MAX (diff, fabs (cpu->out[s][l][h][i] - gpu->out[s][l][h][i]));
            }
          if (diff / ref > tol)
            fail_msg ("step %d layer %d head %d: GPU differs from CPU by %.3g (tolerance %g)", s, l, h, diff / ref, tol);
        }
  /* The GPU went through the packed slots (wherever the kv heads' picks
   * differ), the CPU never; the GPU's bytes are the budget's: QTOPK blocks
   * per kv head, those heads' rows only. */
  assert_int_equal (cpu_packed, 0);
  assert_true (gpu_packed > 0);
  assert_int_equal (gc.bytes_loaded, pairs * 2 * QBS * QD * 2);
  assert_int_equal (gc.tokens_attended, cc.tokens_attended);
}

int
main (void)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    {
      g_print ("skipped: %s\n", error->message);
      return 77;
    }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_packed_one_group),
    cmocka_unit_test (test_packed_streamed),
    cmocka_unit_test (test_packed_staged),
    cmocka_unit_test (test_quest_matches_cpu),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

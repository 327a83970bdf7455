/* Subquadratic policy glue against a fake engine: prefill chunk by chunk
 * and decode step by step must give the whole-sequence forward's rows;
 * landmarks kept incrementally must equal recomputed block means; a decode
 * step must touch O(window + log T) rows. The fake engine keeps the whole
 * sequence in f32 and serves slots, local buffer and row gathers from it,
 * counting what the policy reads. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "sq-plugin.h"

enum { N_SLOTS = 2 };

struct _SiftEngine {
  gint32 kvh, d, bs;
  gint64 seq;              /* the whole sequence */
  float *k, *v;            /* [kvh][seq][d] */
  gint64 n_stored;
  GArray *blocks;          /* SiftBlockMeta */
  float *slot_k[N_SLOTS], *slot_v[N_SLOTS]; /* [kvh][bs][d] */
  gint32 slot_valid[N_SLOTS];
  gboolean slot_busy[N_SLOTS];
  gint64 rows_gathered, blocks_loaded;
  guint64 attended, summaries;
};

void
sift_engine_count_attended (SiftEngine *e, const SiftPolicyContext *ctx, guint64 tokens)
{
  (void) ctx;
  e->attended += tokens;
}

void
sift_engine_count_summaries (SiftEngine *e, const SiftPolicyContext *ctx, guint64 rows)
{
  (void) ctx;
  e->summaries += rows;
}

gint32
sift_engine_n_slots (SiftEngine *e)
{
  (void) e;
  return N_SLOTS;
}

gboolean
sift_engine_load_block (SiftEngine *e, gint32 layer, gint64 id, gint32 slot, SiftLoadWhat what, GError **error)
{
  (void) layer;
  (void) what;
  (void) error;
  assert_true (slot >= 0 && slot < N_SLOTS && !e->slot_busy[slot]);
  assert_true (id >= 0 && id < (gint64) e->blocks->len);
  const SiftBlockMeta *m = &g_array_index (e->blocks, SiftBlockMeta, id);
  for (gint32 g = 0; g < e->kvh; g++)
    for (gint32 t = 0; t < m->n_valid; t++)
      {
        memcpy (e->slot_k[slot] + ((gsize) g * e->bs + t) * e->d, e->k + ((gsize) g * e->seq + m->first_token + t) * e->d,
                (gsize) e->d * sizeof (float));
        memcpy (e->slot_v[slot] + ((gsize) g * e->bs + t) * e->d, e->v + ((gsize) g * e->seq + m->first_token + t) * e->d,
                (gsize) e->d * sizeof (float));
      }
  e->slot_valid[slot] = m->n_valid;
  e->slot_busy[slot] = TRUE;
  e->blocks_loaded++;
  return TRUE;
}

gboolean
sift_engine_wait_slot (SiftEngine *e, gint32 slot, GError **error)
{
  (void) error;
  assert_true (e->slot_busy[slot]);
  return TRUE;
}

void
sift_engine_slot_kv (SiftEngine *e, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out)
{
  *k = sift_view_htd (e->slot_k[slot], SIFT_DTYPE_F32, e->kvh, e->bs, e->d);
  *v = sift_view_htd (e->slot_v[slot], SIFT_DTYPE_F32, e->kvh, e->bs, e->d);
  if (n_valid_out)
    *n_valid_out = e->slot_valid[slot];
}

void
sift_engine_slot_done (SiftEngine *e, gint32 slot)
{
  e->slot_busy[slot] = FALSE;
}

void
sift_engine_local_kv (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *k, SiftView *v)
{
  assert_int_equal (ctx->kv_len, e->n_stored);
  gint64 n = ctx->q_pos + ctx->n_q - ctx->kv_len;
  *k = sift_view_strided (e->k + ctx->kv_len * e->d, SIFT_DTYPE_F32, e->kvh, n, e->d, e->seq * e->d, e->d);
  *v = sift_view_strided (e->v + ctx->kv_len * e->d, SIFT_DTYPE_F32, e->kvh, n, e->d, e->seq * e->d, e->d);
}

gboolean
sift_engine_gather_rows (SiftEngine *e, gint32 layer, const gint64 *pos, gsize n, SiftView *k_out,
                         SiftView *v_out, GError **error)
{
  (void) layer;
  (void) error;
  for (gsize x = 0; x < n; x++)
    {
      assert_true (pos[x] >= 0 && pos[x] < e->n_stored); /* the policy gathers stored rows only */
      for (gint32 g = 0; g < e->kvh; g++)
        {
          memcpy (sift_view_row (k_out, g, (gint64) x), e->k + ((gsize) g * e->seq + pos[x]) * e->d,
                  (gsize) e->d * sizeof (float));
          memcpy (sift_view_row (v_out, g, (gint64) x), e->v + ((gsize) g * e->seq + pos[x]) * e->d,
                  (gsize) e->d * sizeof (float));
        }
    }
  e->rows_gathered += (gint64) n;
  return TRUE;
}

/* ---- Driver ------------------------------------------------------------- */

typedef struct {
  SqConfig config;
  SiftDType lm_dtype;
  gint32 qh, kvh, d, kv_block, chunk, decode_rows;
  gint64 prompt, n_decode;
  gboolean skip_prefill_hooks; /* another policy ran prefill: landmarks catch up */
  double tol;
} Setup;

static float
rnd (guint32 *s)
{
  *s = *s * 1664525u + 1013904223u;
  return (float) ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void
offload (SqPolicy *p, SiftEngine *e, SiftPhase phase, gint64 n, gboolean call_hook)
{
  SiftBlockMeta m = { .first_token = e->n_stored, .n_valid = (gint32) n, .phase = phase };
  g_array_append_val (e->blocks, m);
  SiftPolicyContext ctx = { .phase = phase, .layer = 0, .block_size = e->bs, .kv_len = e->n_stored, .engine = e };
  SiftBlockInfo info = {
    .block_id = e->blocks->len - 1,
    .meta = &g_array_index (e->blocks, SiftBlockMeta, e->blocks->len - 1),
    .k = sift_view_strided (e->k + e->n_stored * e->d, SIFT_DTYPE_F32, e->kvh, e->bs, e->d, e->seq * e->d, e->d),
    .v = sift_view_strided (e->v + e->n_stored * e->d, SIFT_DTYPE_F32, e->kvh, e->bs, e->d, e->seq * e->d, e->d),
  };
  g_autoptr (GError) error = NULL;
  if (call_hook)
    assert_true (sq_policy_offload (p, &ctx, &info, &error));
  assert_null (error);
  e->n_stored += n;
}

/* Runs the policy over prompt + decode against the engine and checks every
 * row against sq_forward over the whole sequence; returns the policy. */
static SqPolicy *
run (const Setup *s, SiftEngine *e, gint64 *max_step_rows)
{
  const gint64 seq = s->prompt + s->n_decode;
  const gint32 d = s->d;
  guint32 seed = 99;
  g_autofree float *q = g_new (float, (gsize) s->qh * seq * d);
  e->kvh = s->kvh;
  e->d = d;
  e->bs = s->kv_block;
  e->seq = seq;
  e->k = g_new (float, (gsize) s->kvh * seq * d);
  e->v = g_new (float, (gsize) s->kvh * seq * d);
  e->blocks = g_array_new (FALSE, FALSE, sizeof (SiftBlockMeta));
  for (int x = 0; x < N_SLOTS; x++)
    {
      e->slot_k[x] = g_new (float, (gsize) s->kvh * s->kv_block * d);
      e->slot_v[x] = g_new (float, (gsize) s->kvh * s->kv_block * d);
    }
  for (gint64 x = 0; x < (gint64) s->qh * seq * d; x++)
    q[x] = 2.0f * rnd (&seed);
  for (gint64 x = 0; x < (gint64) s->kvh * seq * d; x++)
    {
      e->k[x] = 2.0f * rnd (&seed);
      e->v[x] = rnd (&seed);
    }

  /* The reference: the whole sequence at once. */
  g_autofree float *ref = g_new (float, (gsize) s->qh * seq * d);
  g_autofree float *ref_lse = g_new (float, (gsize) s->qh * seq);
  SiftView vq = sift_view_htd (q, SIFT_DTYPE_F32, s->qh, seq, d);
  SiftView vk = sift_view_htd (e->k, SIFT_DTYPE_F32, s->kvh, seq, d);
  SiftView vv = sift_view_htd (e->v, SIFT_DTYPE_F32, s->kvh, seq, d);
  SiftView vr = sift_view_htd (ref, SIFT_DTYPE_F32, s->qh, seq, d);
  g_autoptr (GError) error = NULL;
  assert_true (sq_forward (&s->config, &vq, &vk, &vv, &vr, ref_lse, &error));

  SiftModelShape shape = { 1, s->qh, s->kvh, d, s->kv_block, s->chunk, 0.0f };
  SqPolicy *p = g_new0 (SqPolicy, 1);
  p->parent.shape = g_memdup2 (&shape, sizeof shape);
  assert_true (sq_policy_setup (p, &s->config, s->lm_dtype, &error));

  g_autofree float *out = g_new (float, (gsize) s->qh * MAX (s->chunk, s->decode_rows) * d);
  g_autofree float *lse = g_new (float, (gsize) s->qh * MAX (s->chunk, s->decode_rows));
  double err = 0.0;
  gint64 pos = 0, step = 0;
  *max_step_rows = 0;
  while (pos < seq)
    {
      gboolean prefill = pos < s->prompt;
      gint64 n = prefill ? MIN (s->chunk, s->prompt - pos) : MIN (s->decode_rows, seq - pos);
      SiftPolicyContext ctx = {
        .phase = prefill ? SIFT_PHASE_PREFILL : SIFT_PHASE_DECODE,
        .chunk_index = step++,
        .block_size = s->kv_block,
        .kv_len = e->n_stored,
        .q_pos = pos,
        .n_q = (gint32) n,
        .q = sift_view_strided (q + pos * d, SIFT_DTYPE_F32, s->qh, n, d, seq * d, d),
        .shape = p->parent.shape,
        .blocks = (const SiftBlockMeta *) e->blocks->data,
        .n_blocks = e->blocks->len,
        .engine = e,
      };
      SiftView vo = sift_view_htd (out, SIFT_DTYPE_F32, s->qh, n, d);
      gint64 rows0 = e->rows_gathered + e->blocks_loaded * s->kv_block;
      assert_true (sq_policy_compute (p, &ctx, &vo, lse, &error));
      assert_null (error);
      if (!prefill)
        *max_step_rows = MAX (*max_step_rows, e->rows_gathered + e->blocks_loaded * s->kv_block - rows0);
      for (gint32 h = 0; h < s->qh; h++)
        for (gint64 r = 0; r < n; r++)
          {
            for (gint32 x = 0; x < d; x++)
              err = MAX (err, fabs (out[(h * n + r) * d + x] - ref[(h * seq + pos + r) * d + x]));
            err = MAX (err, fabs (lse[h * n + r] - ref_lse[h * seq + pos + r]));
          }
      pos += n;
      /* Prefill stores the chunk block by block (the last possibly partial);
       * decode stores a full buffer. */
      if (prefill)
        while (e->n_stored < pos)
          offload (p, e, SIFT_PHASE_PREFILL, MIN (s->kv_block, pos - e->n_stored), !s->skip_prefill_hooks);
      else
        while (pos - e->n_stored >= s->kv_block)
          offload (p, e, SIFT_PHASE_DECODE, s->kv_block, TRUE);
    }
  if (err > s->tol)
    fail_msg ("chunked prefill + decode differ from the whole-sequence forward by %g (> %g)", err, s->tol);
  return p;
}

static void
engine_clear (SiftEngine *e)
{
  g_free (e->k);
  g_free (e->v);
  g_array_unref (e->blocks);
  for (int x = 0; x < N_SLOTS; x++)
    {
      g_free (e->slot_k[x]);
      g_free (e->slot_v[x]);
    }
}

static void
policy_free (SqPolicy *p)
{
  sq_policy_clear (p);
  g_free ((gpointer) p->parent.shape);
  g_free (p);
}

static Setup
small_setup (void)
{
  Setup s = {
    .lm_dtype = SIFT_DTYPE_F32, .qh = 4, .kvh = 2, .d = 32, .kv_block = 16, .chunk = 32,
    .decode_rows = 1, .prompt = 150, .n_decode = 70, .tol = 2e-5,
  };
  sq_config_default (&s.config);
  s.config.window = 20;
  s.config.block_size = 8;
  return s;
}

static void
test_decode_equals_prefill_rows (void **state)
{
  (void) state;
  Setup s = small_setup ();
  SiftEngine e = { 0 };
  gint64 step_rows;
  SqPolicy *p = run (&s, &e, &step_rows);
  /* A step reads its window's blocks and O(log T) scattered rows, never T. */
  gint64 bound = (s.config.window / s.kv_block + 2) * s.kv_block + 2 * 8 + 1;
  if (step_rows > bound)
    fail_msg ("a decode step read %" G_GINT64_FORMAT " rows (bound %" G_GINT64_FORMAT ")", step_rows, bound);
  policy_free (p);
  engine_clear (&e);
}

/* Density counts the sequence's tokens each row attends; the landmarks
 * (block means) are counted apart, so attended never exceeds the causal
 * rows' keys (issue 22: landmarks counted as tokens put density above 1).
 * The reference: the core's candidate lists, which test-sq-core checks
 * against a brute-force reading of the rules. */
static void
test_density_counts_sequence_tokens (void **state)
{
  (void) state;
  Setup s = small_setup ();
  SiftEngine e = { 0 };
  gint64 step_rows;
  SqPolicy *p = run (&s, &e, &step_rows);
  const gint64 seq = s.prompt + s.n_decode;
  SqStamp stamp;
  sq_stamp_init (&stamp);
  g_autofree gint64 *cand = g_new (gint64, sq_max_token_candidates (&s.config, seq) + sq_max_landmark_candidates (&s.config, seq));
  guint64 tokens = 0, landmarks = 0, causal = 0;
  for (gint64 i = 0; i < seq; i++)
    {
      sq_stamp_next (&stamp, seq);
      tokens += sq_token_candidates (&s.config, i, seq, &stamp, cand);
      sq_stamp_next (&stamp, seq);
      landmarks += sq_landmark_candidates (&s.config, i, seq, &stamp, cand);
      causal += (guint64) i + 1;
    }
  sq_stamp_clear (&stamp);
  assert_true (landmarks > 0);
  assert_int_equal (e.attended, tokens * (guint64) s.qh);
  assert_int_equal (e.summaries, landmarks * (guint64) s.qh);
  assert_true (e.attended <= causal * (guint64) s.qh);
  policy_free (p);
  engine_clear (&e);
}

static void
test_multi_row_decode_and_gqa (void **state)
{
  (void) state;
  Setup s = small_setup ();
  s.decode_rows = 3;
  s.qh = 6;
  s.kvh = 3;
  s.kv_block = 8;
  s.chunk = 24;
  SiftEngine e = { 0 };
  gint64 step_rows;
  policy_free (run (&s, &e, &step_rows));
  engine_clear (&e);
}

static void
test_incremental_landmarks_equal_recomputed (void **state)
{
  (void) state;
  for (int variant = 0; variant < 3; variant++)
    {
      Setup s = small_setup ();
      if (variant == 1)
        s.skip_prefill_hooks = TRUE; /* stored rows folded through the row gather */
      if (variant == 2)
        {
          s.lm_dtype = SIFT_DTYPE_F16;
          s.tol = 3e-3;
        }
      SiftEngine e = { 0 };
      gint64 step_rows;
      SqPolicy *p = run (&s, &e, &step_rows);
      gint64 seq = e.seq, nb = seq / s.config.block_size;
      g_autofree float *lk = g_new (float, (gsize) s.kvh * (nb + 1) * s.d);
      g_autofree float *lv = g_new (float, (gsize) s.kvh * (nb + 1) * s.d);
      SiftView vk = sift_view_htd (e.k, SIFT_DTYPE_F32, s.kvh, seq, s.d);
      SiftView vv = sift_view_htd (e.v, SIFT_DTYPE_F32, s.kvh, seq, s.d);
      sq_landmarks_compute (&vk, &vv, s.config.block_size, lk, lv);
      gint64 n_blocks = (seq + s.config.block_size - 1) / s.config.block_size;
      double tol = s.lm_dtype == SIFT_DTYPE_F16 ? 1e-3 : 1e-6;
      gint64 complete = 0;
      for (gint64 b = 0; b < n_blocks; b++)
        for (gint32 g = 0; g < s.kvh; g++)
          {
            float k[64], v[64];
            if (!sq_policy_landmark (p, 0, b, g, k, v))
              continue;
            complete++;
            for (gint32 x = 0; x < s.d; x++)
              {
                assert_true (fabs (k[x] - lk[(g * n_blocks + b) * s.d + x]) <= tol);
                assert_true (fabs (v[x] - lv[(g * n_blocks + b) * s.d + x]) <= tol);
              }
          }
      /* Every block wholly stored is complete in memory. */
      assert_int_equal (complete, (e.n_stored / s.config.block_size) * s.kvh);
      policy_free (p);
      engine_clear (&e);
    }
}

static void
test_block_size_one_and_globals (void **state)
{
  (void) state;
  static const gint64 far[] = { 3, 100000, 77 };
  for (int variant = 0; variant < 3; variant++)
    {
      Setup s = small_setup ();
      if (variant == 0)
        s.config.block_size = 1;
      if (variant == 1)
        {
          s.config.globals = NULL; /* empty list */
          s.config.n_globals = 0;
        }
      if (variant == 2)
        {
          s.config.globals = far; /* one past any sequence, one mid-way */
          s.config.n_globals = G_N_ELEMENTS (far);
          s.config.sort_candidates = TRUE;
        }
      SiftEngine e = { 0 };
      gint64 step_rows;
      policy_free (run (&s, &e, &step_rows));
      engine_clear (&e);
    }
}

static void
test_reset_starts_over (void **state)
{
  (void) state;
  Setup s = small_setup ();
  SiftEngine e = { 0 };
  gint64 step_rows;
  SqPolicy *p = run (&s, &e, &step_rows);
  sq_policy_reset (p);
  float k[64], v[64];
  assert_false (sq_policy_landmark (p, 0, 0, 0, k, v));
  policy_free (p);
  engine_clear (&e);
}

static void
test_setup_errors (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 4, 2, 32, 16, 32, 0.0f };
  SqPolicy p = { .parent.shape = &shape };
  SqConfig c;
  sq_config_default (&c);
  g_autoptr (GError) error = NULL;
  c.causal = FALSE;
  assert_false (sq_policy_setup (&p, &c, SIFT_DTYPE_F32, &error));
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID));
  g_clear_error (&error);
  c.causal = TRUE;
  assert_false (sq_policy_setup (&p, &c, SIFT_DTYPE_BF16, &error));
  assert_non_null (strstr (error->message, "bf16"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_decode_equals_prefill_rows),
    cmocka_unit_test (test_density_counts_sequence_tokens),
    cmocka_unit_test (test_multi_row_decode_and_gqa),
    cmocka_unit_test (test_incremental_landmarks_equal_recomputed),
    cmocka_unit_test (test_block_size_one_and_globals),
    cmocka_unit_test (test_reset_starts_over),
    cmocka_unit_test (test_setup_errors),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

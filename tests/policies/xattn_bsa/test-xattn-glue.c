/* xattn_bsa select_blocks against a scripted engine: the engine calls a
 * policy may make (n_slots, load_block, wait_slot, slot_kv, slot_done,
 * local_kv) are defined here over in-memory keys, and record what the
 * policy did. Checks: K-only loads of every stored block, at most n_slots
 * in flight, every slot released (also after a failed load), the answer
 * equals scoring + selection + vote run directly, thresholds 1 and the
 * minimum length select everything. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "xattn-bsa-private.h"

#define MAX_SLOTS 8

enum { SLOT_FREE, SLOT_LOADING, SLOT_READY };

struct _SiftEngine {
  gint32 n_slots, bs, n_kv, d;
  gint64 n_tokens;
  float *k;                     /* [n_kv][n_tokens][d] */
  int state[MAX_SLOTS];
  gint64 slot_block[MAX_SLOTS];
  float *slot_k;                /* [n_slots][n_kv][bs][d] */
  /* what the policy did */
  int loads, loads_not_k, max_in_flight, bad_protocol;
  int *loaded;                  /* [n_blocks] loads per block */
  gint64 fail_block;            /* load of this block fails (-1: none) */
  /* attend_default calls: rows and the (head, block) pairs selected */
  gint64 n_blocks;
  int n_calls;
  gint64 call_q_pos[64], call_n_q[64];
  guint8 *call_pairs;           /* [64][n_q_heads = 4][n_blocks] */
};

gint32
sift_engine_n_slots (SiftEngine *e)
{
  return e->n_slots;
}

static int
in_flight (SiftEngine *e)
{
  int n = 0;
  for (int i = 0; i < e->n_slots; i++)
    n += e->state[i] != SLOT_FREE;
  return n;
}

gboolean
sift_engine_load_block (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what,
                        GError **error)
{
  (void) layer;
  if (slot < 0 || slot >= e->n_slots || e->state[slot] != SLOT_FREE)
    {
      e->bad_protocol++;
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "slot %d busy", slot);
      return FALSE;
    }
  e->loads++;
  e->loads_not_k += what != SIFT_LOAD_K;
  e->loaded[block_id]++;
  e->state[slot] = SLOT_LOADING;
  e->slot_block[slot] = block_id;
  e->max_in_flight = MAX (e->max_in_flight, in_flight (e));
  return TRUE;
}

gboolean
sift_engine_wait_slot (SiftEngine *e, gint32 slot, GError **error)
{
  if (e->state[slot] != SLOT_LOADING)
    {
      e->bad_protocol++;
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "slot %d not loading", slot);
      return FALSE;
    }
  gint64 b = e->slot_block[slot];
  if (b == e->fail_block)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "injected read error for block %" G_GINT64_FORMAT, b);
      return FALSE;
    }
  float *dst = e->slot_k + (gsize) slot * (gsize) e->n_kv * (gsize) e->bs * (gsize) e->d;
  for (gint32 h = 0; h < e->n_kv; h++)
    memcpy (dst + (gsize) h * (gsize) e->bs * (gsize) e->d,
            e->k + ((gsize) h * (gsize) e->n_tokens + (gsize) (b * e->bs)) * (gsize) e->d,
            (gsize) e->bs * (gsize) e->d * sizeof (float));
  e->state[slot] = SLOT_READY;
  return TRUE;
}

void
sift_engine_slot_kv (SiftEngine *e, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out)
{
  if (e->state[slot] != SLOT_READY)
    e->bad_protocol++;
  *k = sift_view_htd (e->slot_k + (gsize) slot * (gsize) e->n_kv * (gsize) e->bs * (gsize) e->d,
                      SIFT_DTYPE_F32, e->n_kv, e->bs, e->d);
  *v = *k; /* a K-only load has no V; the policy must not read it */
  if (n_valid_out != NULL)
    *n_valid_out = e->bs;
}

void
sift_engine_slot_done (SiftEngine *e, gint32 slot)
{
  if (e->state[slot] == SLOT_FREE)
    e->bad_protocol++;
  e->state[slot] = SLOT_FREE;
}

void
sift_engine_local_kv (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *k, SiftView *v)
{
  SiftView all = sift_view_htd (e->k, SIFT_DTYPE_F32, e->n_kv, e->n_tokens, e->d);
  *k = sift_view_tokens (&all, ctx->q_pos, ctx->n_q);
  *v = *k;
}

/* Records the call and writes a recognisable result: out rows hold their
 * absolute position + 10000 x head, lse the number of blocks the head attends. */
gboolean
sift_engine_attend_default (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection,
                            SiftView *out, float *lse, GError **error)
{
  assert_true (e->n_calls < 64);
  int c = e->n_calls++;
  e->call_q_pos[c] = ctx->q_pos;
  e->call_n_q[c] = ctx->n_q;
  assert_int_equal (ctx->q.n_tokens, ctx->n_q);
  assert_int_equal (out->n_tokens, ctx->n_q);
  g_autofree gint64 *ids = g_new (gint64, (gsize) MAX (e->n_blocks, 1));
  for (gint64 b = 0; b < e->n_blocks; b++)
    ids[b] = b;
  if (selection != NULL
      && !sift_selection_validate ((SiftSelection *) selection, ids, (gsize) e->n_blocks, "xattn_bsa", error))
    return FALSE;
  for (gint32 h = 0; h < 4; h++)
    {
      int count = 0;
      for (gint64 b = 0; b < e->n_blocks; b++)
        {
          guint8 has = selection == NULL || sift_selection_has (selection, b, h);
          e->call_pairs[((gsize) c * 4 + (gsize) h) * (gsize) e->n_blocks + (gsize) b] = has;
          count += has;
        }
      for (gint64 t = 0; t < ctx->n_q; t++)
        {
          float *row = sift_view_row (out, h, t);
          for (gint32 i = 0; i < out->head_dim; i++)
            row[i] = (float) (ctx->q_pos + t + 10000 * h);
          lse[h * ctx->n_q + t] = (float) count;
        }
    }
  return TRUE;
}

/* ---- Fixture -------------------------------------------------------------- */

typedef struct {
  SiftModelShape shape;
  SiftEngine engine;
  float *q;              /* [n_q_heads][n_q][d] */
  SiftBlockMeta *meta;
  gint64 *ids;
  gint64 n_blocks, q_pos, n_q;
  SiftPolicyContext ctx;
} Fixture;

static void
fixture_init (Fixture *f, gint32 n_slots, gint64 n_blocks, gint64 n_q)
{
  memset (f, 0, sizeof *f);
  f->shape = (SiftModelShape) { 1, 4, 2, 16, 8, 32, 0.25f };
  f->n_blocks = n_blocks;
  f->q_pos = n_blocks * f->shape.block_size;
  f->n_q = n_q;
  SiftEngine *e = &f->engine;
  e->n_slots = n_slots;
  e->bs = f->shape.block_size;
  e->n_kv = f->shape.n_kv_heads;
  e->d = f->shape.head_dim;
  e->n_tokens = f->q_pos + n_q;
  e->fail_block = -1;
  GRand *r = g_rand_new_with_seed (21);
  gsize nk = (gsize) e->n_kv * (gsize) e->n_tokens * (gsize) e->d;
  e->k = g_new (float, nk);
  for (gsize i = 0; i < nk; i++)
    e->k[i] = (float) g_rand_double_range (r, -2, 2);
  gsize nq = (gsize) f->shape.n_q_heads * (gsize) n_q * (gsize) e->d;
  f->q = g_new (float, nq);
  for (gsize i = 0; i < nq; i++)
    f->q[i] = (float) g_rand_double_range (r, -2, 2);
  g_rand_free (r);
  e->slot_k = g_new (float, (gsize) n_slots * (gsize) e->n_kv * (gsize) e->bs * (gsize) e->d);
  e->loaded = g_new0 (int, (gsize) MAX (n_blocks, 1));
  e->n_blocks = n_blocks;
  e->call_pairs = g_new0 (guint8, (gsize) 64 * 4 * (gsize) MAX (n_blocks, 1));
  f->meta = g_new (SiftBlockMeta, (gsize) MAX (n_blocks, 1));
  f->ids = g_new (gint64, (gsize) MAX (n_blocks, 1));
  for (gint64 b = 0; b < n_blocks; b++)
    {
      f->meta[b] = (SiftBlockMeta) { .first_token = b * e->bs, .n_valid = e->bs, .phase = SIFT_PHASE_PREFILL };
      f->ids[b] = b;
    }
  f->ctx = (SiftPolicyContext) {
    .phase = SIFT_PHASE_PREFILL, .layer = 0, .chunk_index = f->q_pos / f->shape.chunk_size,
    .block_size = e->bs, .kv_len = f->q_pos, .q_pos = f->q_pos, .n_q = (gint32) n_q,
    .q = sift_view_htd (f->q, SIFT_DTYPE_F32, f->shape.n_q_heads, n_q, e->d),
    .shape = &f->shape, .blocks = f->meta, .n_blocks = n_blocks, .engine = e,
  };
}

static void
fixture_clear (Fixture *f)
{
  g_free (f->engine.k);
  g_free (f->engine.slot_k);
  g_free (f->engine.loaded);
  g_free (f->engine.call_pairs);
  g_free (f->q);
  g_free (f->meta);
  g_free (f->ids);
}

/* What the host does before init: a zeroed instance with its shape. */
static SiftPolicy *
policy_alloc (const SiftModelShape *shape)
{
  SiftPolicy *p = g_malloc0 (sizeof (XattnBsa));
  p->shape = shape;
  return p;
}

static SiftPolicy *
policy_new (const SiftModelShape *shape, const XattnBsaConfig *cfg)
{
  SiftPolicy *p = policy_alloc (shape);
  g_autoptr (GError) error = NULL;
  assert_true (xattn_bsa_configure (p, cfg, &error));
  return p;
}

static void
policy_free (SiftPolicy *p)
{
  xattn_bsa_finalize (p);
  g_free (p);
}

static gboolean
run_select (Fixture *f, const XattnBsaConfig *cfg, SiftSelection *sel, GError **error)
{
  SiftPolicy *p = policy_new (&f->shape, cfg);
  gboolean ok = xattn_bsa_select_blocks (p, &f->ctx, f->ids, (gsize) f->n_blocks, sel, error);
  policy_free (p);
  return ok;
}

static const XattnBsaConfig base_cfg = { 0.3, 4, 16, XATTN_VOTE_ANY, 0.5, 0, XATTN_GRANULARITY_QUERY_BLOCK, 1.0, FALSE, 0, FALSE };

static void
test_glue_matches_direct (void **state)
{
  (void) state;
  /* Each vote, without and with last_block. */
  const XattnVote votes[] = { XATTN_VOTE_ANY, XATTN_VOTE_MAJORITY };
  for (gsize vi = 0; vi < 2 * G_N_ELEMENTS (votes); vi++)
    {
      Fixture f;
      fixture_init (&f, 3, 12, 40);
      XattnBsaConfig cfg = base_cfg;
      cfg.vote = votes[vi % G_N_ELEMENTS (votes)];
      cfg.last_block = vi >= G_N_ELEMENTS (votes);
      g_autoptr (SiftSelection) sel = sift_selection_new (f.shape.n_q_heads, f.shape.n_kv_heads);
      g_autoptr (GError) error = NULL;
      assert_true (run_select (&f, &cfg, sel, &error));
      assert_true (sift_selection_validate (sel, f.ids, (gsize) f.n_blocks, "xattn_bsa", &error));

      /* The protocol: every stored block's K loaded once, K only, at most
       * n_slots in flight, every slot free again. */
      assert_int_equal (f.engine.loads, f.n_blocks);
      assert_int_equal (f.engine.loads_not_k, 0);
      assert_int_equal (f.engine.bad_protocol, 0);
      assert_true (f.engine.max_in_flight <= f.engine.n_slots);
      assert_int_equal (f.engine.max_in_flight, f.engine.n_slots);
      for (gint64 b = 0; b < f.n_blocks; b++)
        assert_int_equal (f.engine.loaded[b], 1);
      assert_int_equal (in_flight (&f.engine), 0);

      /* The answer: what scoring + selection + vote give on the same keys. */
      XattnGeometry geo = { 4, 2, 16, (gint32) cfg.stride, (gint32) cfg.block, 0.25f, 1.0f, FALSE };
      g_autoptr (XattnScorer) s = xattn_scorer_new (&geo);
      xattn_scorer_begin (s, &f.ctx.q, f.q_pos, f.n_q);
      SiftView all = sift_view_htd (f.engine.k, SIFT_DTYPE_F32, 2, f.engine.n_tokens, 16);
      xattn_scorer_add_keys (s, &all, 0, f.engine.n_tokens);
      gint64 qb0 = xattn_scorer_first_qb (s), n_qb = xattn_scorer_n_qb (s), n_kb = xattn_scorer_n_kb (s);
      g_autofree float *scores = g_new (float, (gsize) (4 * n_qb * n_kb));
      g_autofree guint8 *chosen = g_new (guint8, (gsize) (4 * n_qb * n_kb));
      g_autofree gint64 *order = g_new (gint64, (gsize) n_kb);
      xattn_scorer_finish (s, scores);
      for (gint64 row = 0; row < 4 * n_qb; row++)
        xattn_select_row (scores + row * n_kb, n_kb, qb0 + row % n_qb, cfg.threshold, chosen + row * n_kb, order);
      XattnPlan plan;
      xattn_plan_init (&plan, 4, n_qb, f.n_blocks);
      xattn_aggregate (&geo, chosen, n_qb, n_kb, f.meta, f.ids, f.n_blocks, cfg.vote, cfg.vote_threshold, cfg.last_block, &plan);
      gsize n_attend = 0;
      for (gint32 h = 0; h < 4; h++)
        for (gint64 b = 0; b < f.n_blocks; b++)
          {
            assert_int_equal (sift_selection_has (sel, b, h), plan.attend[h * f.n_blocks + b]);
            n_attend += plan.attend[h * f.n_blocks + b];
          }
      print_message ("vote %d, last_block %d: %zu of %d (head, block) pairs attended\n", (int) cfg.vote,
                     cfg.last_block, n_attend, (int) (4 * f.n_blocks));
      /* Not trivially everything, not trivially only the forced blocks
       * (the first, and with last_block the last, for each head). */
      assert_true (n_attend > (gsize) (4 * (cfg.last_block ? 2 : 1)) && n_attend < (gsize) (4 * f.n_blocks));
      xattn_plan_clear (&plan);
      fixture_clear (&f);
    }
}

/* exact_rows: the chunk's last rows go through a stride-1 scorer too. A
 * one-token needle (key 37, engine block 4) that only the chunk's last
 * query asks for, in q head 0, with a logit the antidiagonal estimate
 * dilutes below a low threshold: head 0 attends its block only with exact
 * rows, and the answer equals estimate + exact rows + vote run directly. */
static void
test_glue_exact_rows (void **state)
{
  (void) state;
  const gint64 needle = 37;
  guint8 has_needle[2];
  for (int with = 0; with < 2; with++)
    {
      Fixture f;
      fixture_init (&f, 3, 12, 40);
      float *kn = f.engine.k + (gsize) needle * 16;             /* kv head 0 */
      float *qn = f.q + (gsize) (f.n_q - 1) * 16;                /* q head 0, last row */
      for (int i = 0; i < 16; i++)
        {
          kn[i] = i == 0 ? 7.0f : 0.0f;
          qn[i] = i == 0 ? 7.0f : 0.0f;                          /* logit 0.25 x 49 = 12.25 */
        }
      XattnBsaConfig cfg = base_cfg;
      cfg.threshold = 0.2;
      cfg.exact_rows = with ? 5 : 0;
      g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
      g_autoptr (GError) error = NULL;
      assert_true (run_select (&f, &cfg, sel, &error));
      assert_true (sift_selection_validate (sel, f.ids, (gsize) f.n_blocks, "xattn_bsa", &error));
      has_needle[with] = sift_selection_has (sel, needle / 8, 0);

      /* Direct: estimate, selection, exact rows, vote. */
      XattnGeometry geo = { 4, 2, 16, (gint32) cfg.stride, (gint32) cfg.block, 0.25f, 1.0f, FALSE };
      XattnGeometry geo1 = geo;
      geo1.stride = 1;
      g_autoptr (XattnScorer) s = xattn_scorer_new (&geo);
      g_autoptr (XattnScorer) s1 = xattn_scorer_new (&geo1);
      xattn_scorer_begin (s, &f.ctx.q, f.q_pos, f.n_q);
      const gint64 n_exact = cfg.exact_rows, exact_pos = f.q_pos + f.n_q - n_exact;
      SiftView tail = sift_view_tokens (&f.ctx.q, f.n_q - n_exact, MAX (n_exact, 1));
      if (n_exact > 0)
        xattn_scorer_begin (s1, &tail, exact_pos, n_exact);
      SiftView all = sift_view_htd (f.engine.k, SIFT_DTYPE_F32, 2, f.engine.n_tokens, 16);
      xattn_scorer_add_keys (s, &all, 0, f.engine.n_tokens);
      if (n_exact > 0)
        xattn_scorer_add_keys (s1, &all, 0, f.engine.n_tokens);
      gint64 qb0 = xattn_scorer_first_qb (s), n_qb = xattn_scorer_n_qb (s), n_kb = xattn_scorer_n_kb (s);
      g_autofree float *scores = g_new (float, (gsize) (4 * n_qb * n_kb));
      g_autofree guint8 *chosen = g_new (guint8, (gsize) (4 * n_qb * n_kb));
      g_autofree gint64 *order = g_new (gint64, (gsize) n_kb);
      xattn_scorer_finish (s, scores);
      for (gint64 row = 0; row < 4 * n_qb; row++)
        xattn_select_row (scores + row * n_kb, n_kb, qb0 + row % n_qb, cfg.threshold, chosen + row * n_kb, order);
      if (n_exact > 0)
        {
          g_autofree float *mass = g_new (float, (gsize) (4 * n_exact * n_kb));
          xattn_scorer_finish_rows (s1, mass);
          xattn_select_exact_rows (mass, 4, n_exact, exact_pos, cfg.block, qb0, n_qb, n_kb, cfg.threshold, chosen);
        }
      XattnPlan plan;
      xattn_plan_init (&plan, 4, n_qb, f.n_blocks);
      xattn_aggregate (&geo, chosen, n_qb, n_kb, f.meta, f.ids, f.n_blocks, cfg.vote, cfg.vote_threshold, cfg.last_block, &plan);
      for (gint32 h = 0; h < 4; h++)
        for (gint64 b = 0; b < f.n_blocks; b++)
          assert_int_equal (sift_selection_has (sel, b, h), plan.attend[h * f.n_blocks + b]);
      xattn_plan_clear (&plan);
      fixture_clear (&f);
    }
  assert_false (has_needle[0]);
  assert_true (has_needle[1]);
}

static void
test_glue_select_everything (void **state)
{
  (void) state;
  /* threshold 1: every (block, head), after a full estimate. */
  Fixture f;
  fixture_init (&f, 2, 10, 24);
  XattnBsaConfig cfg = base_cfg;
  cfg.threshold = 1.0;
  g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
  g_autoptr (GError) error = NULL;
  assert_true (run_select (&f, &cfg, sel, &error));
  assert_true (sift_selection_validate (sel, f.ids, (gsize) f.n_blocks, "xattn_bsa", &error));
  assert_int_equal (sift_selection_n_blocks (sel), f.n_blocks);
  for (gint64 b = 0; b < f.n_blocks; b++)
    for (gint32 h = 0; h < 4; h++)
      assert_true (sift_selection_has (sel, b, h));
  assert_int_equal (f.engine.loads, f.n_blocks);
  fixture_clear (&f);

  /* Below min_query_len: everything, and not a byte loaded. */
  fixture_init (&f, 2, 10, 24);
  cfg = base_cfg;
  cfg.min_query_len = f.q_pos + f.n_q + 1;
  g_autoptr (SiftSelection) sel2 = sift_selection_new (4, 2);
  assert_true (run_select (&f, &cfg, sel2, &error));
  assert_true (sift_selection_validate (sel2, f.ids, (gsize) f.n_blocks, "xattn_bsa", &error));
  assert_int_equal (sift_selection_n_blocks (sel2), f.n_blocks);
  assert_int_equal (f.engine.loads, 0);
  fixture_clear (&f);
}

static void
test_glue_load_failure (void **state)
{
  (void) state;
  const gint64 fail_at[] = { 0, 4, 9 };
  for (gsize i = 0; i < G_N_ELEMENTS (fail_at); i++)
    {
      Fixture f;
      fixture_init (&f, 3, 10, 24);
      f.engine.fail_block = fail_at[i];
      g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
      g_autoptr (GError) error = NULL;
      assert_false (run_select (&f, &base_cfg, sel, &error));
      assert_true (g_error_matches (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO));
      assert_non_null (strstr (error->message, "injected"));
      /* Every slot released: the engine can carry on. */
      assert_int_equal (in_flight (&f.engine), 0);
      assert_int_equal (f.engine.bad_protocol, 0);
      fixture_clear (&f);
    }
}

static void
test_glue_rejects_bad_stride (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 4, 2, 16, 12, 48, 0.25f };
  SiftPolicy *p = policy_alloc (&shape);
  g_autoptr (GError) error = NULL;
  XattnBsaConfig cfg = base_cfg;
  cfg.stride = 8;   /* does not divide kv.block_size 12 */
  cfg.block = 128;
  assert_false (xattn_bsa_configure (p, &cfg, &error));
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID));
  assert_non_null (strstr (error->message, "kv.block_size 12"));
  g_clear_error (&error);
  cfg.stride = 3;   /* divides 12, not 128 */
  assert_false (xattn_bsa_configure (p, &cfg, &error));
  assert_non_null (strstr (error->message, "block_size 128"));
  g_free (p);
}

/* compute_chunked_prefill after select_blocks: the rows it hands the
 * pipeline, the selection per call and where the results land. */
static void
check_compute (XattnGranularity granularity, gint64 min_query_len)
{
  Fixture f;
  fixture_init (&f, 3, 12, 40); /* q_pos 96: query blocks 6 (rows 0..15), 7 (16..31), 8 (32..39) */
  XattnBsaConfig cfg = base_cfg;
  cfg.granularity = granularity;
  cfg.min_query_len = min_query_len;
  SiftPolicy *p = policy_new (&f.shape, &cfg);
  XattnBsa *self = (XattnBsa *) p;
  g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
  g_autoptr (GError) error = NULL;
  assert_true (xattn_bsa_select_blocks (p, &f.ctx, f.ids, (gsize) f.n_blocks, sel, &error));
  g_autofree float *o = g_new (float, (gsize) (4 * f.n_q * 16));
  g_autofree float *lse = g_new (float, (gsize) (4 * f.n_q));
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, f.n_q, 16);
  assert_true (xattn_bsa_compute_prefill (p, &f.ctx, &ov, lse, &error));

  /* The calls tile the chunk's rows in order. */
  gint64 next = f.q_pos;
  for (int c = 0; c < f.engine.n_calls; c++)
    {
      assert_int_equal (f.engine.call_q_pos[c], next);
      next += f.engine.call_n_q[c];
    }
  assert_int_equal (next, f.q_pos + f.n_q);
  if (min_query_len > f.q_pos + f.n_q || granularity == XATTN_GRANULARITY_CHUNK)
    assert_int_equal (f.engine.n_calls, 1);
  else
    {
      /* One call per run of query blocks with equal choices; here they differ. */
      gsize slice = 4 * (gsize) f.n_blocks;
      int runs = 1;
      for (gint64 i = 1; i < self->plan.n_qb; i++)
        runs += memcmp (self->plan.qb_attend + i * slice, self->plan.qb_attend + (i - 1) * slice, slice) != 0;
      assert_int_equal (f.engine.n_calls, runs);
      assert_true (runs > 1);
    }

  /* Each row's head attended what its query block's plan says (dense:
   * everything), and its results landed in its own row. */
  for (int c = 0; c < f.engine.n_calls; c++)
    for (gint64 pos = f.engine.call_q_pos[c]; pos < f.engine.call_q_pos[c] + f.engine.call_n_q[c]; pos++)
      for (gint32 h = 0; h < 4; h++)
        {
          int count = 0;
          for (gint64 b = 0; b < f.n_blocks; b++)
            {
              guint8 want = 1;
              if (self->plan_state == XATTN_PLAN_SPARSE)
                want = granularity == XATTN_GRANULARITY_CHUNK
                         ? self->plan.attend[h * f.n_blocks + b]
                         : self->plan.qb_attend[((pos / 16 - self->plan_qb0) * 4 + h) * f.n_blocks + b];
              assert_int_equal (f.engine.call_pairs[((gsize) c * 4 + (gsize) h) * (gsize) f.n_blocks + (gsize) b], want);
              count += want;
            }
          gint64 t = pos - f.q_pos;
          assert_true (o[(h * f.n_q + t) * 16 + 5] == (float) (pos + 10000 * h));
          assert_true (lse[h * f.n_q + t] == (float) count);
        }
  policy_free (p);
  fixture_clear (&f);
}

static void
test_glue_compute (void **state)
{
  (void) state;
  check_compute (XATTN_GRANULARITY_QUERY_BLOCK, 0);
  check_compute (XATTN_GRANULARITY_CHUNK, 0);
  check_compute (XATTN_GRANULARITY_QUERY_BLOCK, 1 << 20);

  /* compute without select_blocks for that chunk is refused. */
  Fixture f;
  fixture_init (&f, 2, 4, 16);
  SiftPolicy *p = policy_new (&f.shape, &base_cfg);
  g_autofree float *o = g_new (float, (gsize) (4 * f.n_q * 16));
  g_autofree float *lse = g_new (float, (gsize) (4 * f.n_q));
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, f.n_q, 16);
  g_autoptr (GError) error = NULL;
  assert_false (xattn_bsa_compute_prefill (p, &f.ctx, &ov, lse, &error));
  assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE));
  policy_free (p);
  fixture_clear (&f);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_glue_matches_direct),
    cmocka_unit_test (test_glue_exact_rows),
    cmocka_unit_test (test_glue_select_everything),
    cmocka_unit_test (test_glue_load_failure),
    cmocka_unit_test (test_glue_rejects_bad_stride),
    cmocka_unit_test (test_glue_compute),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

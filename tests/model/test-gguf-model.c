/* A GGUF model behind the model protocol v2, driven by the runner and the
 * engine (host and file stores; f32, f16 and q8_0 blocks; ring and
 * cross-layer pipelines, blocks read in place and copied; chunks shorter
 * than the prompt): the logits of resident naive attention
 * (dense-attention.h), within each store dtype's rounding. The weights are
 * f32: with quantized weights the model quantizes its activations too
 * (q8_0 codes), and an attention output a few ulp away from the
 * reference's flips a code now and then, which moves a logit by ~0.02
 * whatever the KV dtype (seen on AVX2, 4+ layers); the bounds below would
 * then measure those flips, not the store's rounding. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "gguf-model.h"
#include "dense-attention.h"
#include "helpers.h"
#include "random-model.h"

static char *tmpdir;

/* n_layers 5: more layers than the engine's prefill buffer pairs, so
 * layers 2-4 write their chunks where layers 0 and 1 wrote theirs. */
static void
through_engine (gint32 n_layers)
{
  GgufRandomModel spec;
  gguf_random_model_init (&spec, "qwen2", GGUF_TENSOR_F32, 5);
  spec.n_layers = n_layers;
  g_autofree char *path = g_build_filename (tmpdir, "m.gguf", NULL);
  assert_true (gguf_random_model_write (&spec, path, NULL));
  const gint64 n_prompt = 21, n_decode = 5;
  gint32 tokens[26];
  for (int t = 0; t < 26; t++)
    tokens[t] = (t * 37 + 11) % spec.n_vocab;
  g_autoptr (LlamaModel) direct = llama_model_open (path, NULL);
  g_autofree float *want_prefill = run (direct, tokens, n_prompt, n_prompt, n_prompt);
  g_autofree float *want = run (direct, tokens, n_prompt + n_decode, n_prompt, 1);
  struct {
    const char *store;
    SiftDType dtype;
    SiftPipeline pipeline;
    double tol;
  } cases[] = {
    /* Measured (5 layers, AVX2): f32 1e-6, f16 5e-4, q8_0 1.3e-2. */
    { "host", SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 1e-4 },  /* read in place */
    { "file", SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 1e-4 },  /* copied through 3 ring slots */
    { "file", SIFT_DTYPE_F16, SIFT_PIPELINE_CROSS_LAYER, 5e-3 },
    { "host", SIFT_DTYPE_Q8_0, SIFT_PIPELINE_RING, 5e-2 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftModel) model = sift_model_gguf_new (path, 4, 8, 0, &error);
      assert_non_null (model);
      g_autofree char *store_path = g_build_filename (tmpdir, "kv.store", NULL);
      SiftStoreConfig sc = { .dtype = cases[i].dtype, .n_kv_heads = model->shape.n_kv_heads,
                             .block_size = 4, .head_dim = model->shape.head_dim, .path = store_path };
      g_autoptr (SiftStore) store = g_str_equal (cases[i].store, "file") ? sift_store_file_new (&sc, &error)
                                                                         : sift_store_host_new (&sc, &error);
      assert_non_null (store);
      SiftEngineConfig ec = { .shape = model->shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3,
                              .pipeline = cases[i].pipeline };
      g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
      assert_non_null (engine);
      g_autoptr (SiftRunner) runner = sift_runner_new (engine, model, NULL, NULL, &error);
      assert_non_null (runner);
      g_autofree float *logits = g_new (float, spec.n_vocab);
      if (!sift_runner_prefill (runner, n_prompt, tokens, logits, &error))
        fail_msg ("%s", error->message);
      double d = max_diff (logits, want_prefill, (gsize) spec.n_vocab);
      if (d > cases[i].tol)
        fail_msg ("%s %s prefill: max |logit difference| %g", cases[i].store, sift_dtype_name (cases[i].dtype), d);
      for (gint64 s = 0; s < n_decode; s++)
        if (!sift_runner_decode (runner, 1, tokens + n_prompt + s, s + 1 == n_decode ? logits : NULL, &error))
          fail_msg ("%s", error->message);
      /* The last decode step read token 25: its logits are those of 26 tokens. */
      d = max_diff (logits, want, (gsize) spec.n_vocab);
      if (d > cases[i].tol)
        fail_msg ("%s %s decode: max |logit difference| %g", cases[i].store, sift_dtype_name (cases[i].dtype), d);
    }
}

static void
test_through_engine (void **state)
{
  (void) state;
  through_engine (2);
}

static void
test_through_engine_shared_prefill (void **state)
{
  (void) state;
  through_engine (5);
}

int
main (void)
{
  sift_parallel_set_n_threads (2);
  tmpdir = g_dir_make_tmp ("sift-gguf-model-XXXXXX", NULL);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_through_engine),
    cmocka_unit_test (test_through_engine_shared_prefill),
  };
  int status = cmocka_run_group_tests (tests, NULL, NULL);
  g_autofree char *m = g_build_filename (tmpdir, "m.gguf", NULL), *kv = g_build_filename (tmpdir, "kv.store", NULL);
  g_remove (m);
  g_remove (kv);
  g_rmdir (tmpdir);
  g_free (tmpdir);
  return status;
}

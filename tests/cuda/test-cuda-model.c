/* The Llama forward pass on the GPU (llama_model_use_gpu: f16 weights,
 * f16 activations into cuBLAS, f32 results) against the CPU's forward
 * pass of the same file, both through the same double-precision dense
 * attention (tests/model/dense-attention.h): the last logits of a prefill
 * then single-token steps agree within GPU_TOL of their range, and their
 * argmax agrees (or is a near-tie within GPU_TOL). The shipped model
 * (models/sift-needle-14m-f16.gguf, F16) on the three prompts of
 * models/ref, also against transformers' logits there; random models of
 * every architecture and other weight types (dequantised to f16 on upload).
 * Exits 77 (skipped) without a GPU or cuBLAS. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sift/cuda.h>
#include <sift/sift.h>

#include "dense-attention.h"
#include "helpers.h"
#include "llama.h"
#include "random-model.h"

/* GPU against CPU logits: a fraction of the CPU logits' range (max - min).
 * Rounding each product's operand to f16 (11 bits) bounds a product's
 * relative error near 2^-11; measured figures are printed (docs/testing.md). */
#define GPU_TOL 1e-2
/* Against transformers' float32 logits (models/ref): the CPU pass is within
 * 1e-3 of their range (test-shipped); the GPU's f16 operands add GPU_TOL. */
#define REF_TOL (GPU_TOL + 1e-3)

/* The models folder: SIFT_TEST_MODELS in the environment (a build run on
 * another machine's checkout), else the source tree's. */
static const char *
models_dir (void)
{
  const char *d = g_getenv ("SIFT_TEST_MODELS");
  return d != NULL ? d : SIFT_TEST_MODELS;
}

/* Max |gpu - ref| over the range of ref, printed with `what`; fails past
 * tol, or when the argmax differs by more than a near-tie. */
static double
assert_close (const float *gpu, const float *cpu, gint32 n, double tol, const char *what)
{
  float lo = cpu[0], hi = cpu[0];
  double worst = 0;
  for (gint32 i = 0; i < n; i++)
    {
      lo = MIN (lo, cpu[i]), hi = MAX (hi, cpu[i]);
      worst = MAX (worst, fabs ((double) gpu[i] - cpu[i]));
      if (!isfinite (gpu[i]))
        fail_msg ("%s: logit %d is %g", what, i, gpu[i]);
    }
  const double range = hi - lo, rel = worst / range;
  const gint32 ag = argmax (gpu, n), ac = argmax (cpu, n);
  print_message ("%s: max |gpu - ref| %.3g, %.3g of the range %.3g; argmax %d / %d\n", what, worst, rel, range, ag,
                 ac);
  if (rel > tol)
    fail_msg ("%s: logits differ by %.3g of their range (tolerance %g)", what, rel, tol);
  if (ag != ac && (cpu[ac] - cpu[ag]) / range > tol)
    fail_msg ("%s: argmax %d on the GPU, %d in the reference, %.3g of the range apart", what, ag, ac,
              (cpu[ac] - cpu[ag]) / range);
  return rel;
}

/* The file's logits on the CPU and on the GPU for tokens [0, n): a first
 * step of n - 4 tokens (a prefill), then steps of one (decode). */
static void
compare_file (const char *path, const gint32 *tokens, gint64 n, const float *ref, const char *what)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (LlamaModel) cpu = llama_model_open (path, &error);
  g_autoptr (LlamaModel) gpu = llama_model_open (path, &error);
  g_assert_no_error (error);
  assert_true (llama_model_use_gpu (gpu, &error));
  g_assert_no_error (error);
  assert_true (llama_model_on_gpu (gpu));
  const gint32 nv = llama_model_config (cpu)->n_vocab;
  const gint64 first = MAX (n - 4, 1);
  g_autofree float *lc = run (cpu, tokens, n, first, 1), *lg = run (gpu, tokens, n, first, 1);
  assert_close (lg, lc, nv, GPU_TOL, what);
  if (ref != NULL)
    {
      g_autofree char *w = g_strdup_printf ("%s against transformers", what);
      assert_close (lg, ref, nv, REF_TOL, w);
    }
}

static GArray *
read_ref (int prompt, const char *ext, gboolean decimals)
{
  g_autofree char *name = g_strdup_printf ("prompt%d.%s", prompt, ext);
  g_autofree char *path = g_build_filename (models_dir (), "ref", name, NULL);
  g_autofree char *text = NULL;
  g_autoptr (GError) error = NULL;
  if (!g_file_get_contents (path, &text, NULL, &error))
    fail_msg ("%s", error->message);
  GArray *a = g_array_new (FALSE, FALSE, decimals ? sizeof (float) : sizeof (gint32));
  g_auto (GStrv) words = g_strsplit_set (text, " \t\n,", -1);
  for (char **w = words; *w != NULL; w++)
    if (**w != '\0')
      {
        if (decimals)
          {
            float f = (float) g_ascii_strtod (*w, NULL);
            g_array_append_val (a, f);
          }
        else
          {
            gint32 id = (gint32) g_ascii_strtoll (*w, NULL, 10);
            g_array_append_val (a, id);
          }
      }
  return a;
}

/* The shipped model, F16 weights uploaded as they are. */
static void
test_shipped (void **state)
{
  (void) state;
  g_autofree char *path = g_build_filename (models_dir (), "sift-needle-14m-f16.gguf", NULL);
  for (int p = 0; p < 3; p++)
    {
      g_autoptr (GArray) ids = read_ref (p, "ids", FALSE), ref = read_ref (p, "logits", TRUE);
      g_autofree char *what = g_strdup_printf ("shipped prompt%d (%u tokens)", p, ids->len);
      compare_file (path, (const gint32 *) (void *) ids->data, ids->len, (const float *) (void *) ref->data, what);
    }
}

/* Random models: each architecture (qwen2's biases, qwen3's q/k norms run
 * on the host after the GPU's projections) and weight types that are
 * dequantised to f16 on upload. */
static void
test_random_models (void **state)
{
  (void) state;
  const struct {
    const char *arch;
    GgufTensorType type;
  } cases[] = {
    { "llama", GGUF_TENSOR_F32 }, { "llama", GGUF_TENSOR_Q8_0 }, { "qwen2", GGUF_TENSOR_BF16 },
    { "qwen3", GGUF_TENSOR_Q4_K }, { "llama", GGUF_TENSOR_Q6_K }, { "qwen2", GGUF_TENSOR_Q4_0 },
  };
  gint32 tokens[40];
  for (gsize i = 0; i < G_N_ELEMENTS (tokens); i++)
    tokens[i] = (gint32) ((i * 37 + 11) % 384);
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      GgufRandomModel rm;
      gguf_random_model_init (&rm, cases[i].arch, cases[i].type, 100 + i);
      rm.tied = i % 2 == 1;
      g_autofree char *path = g_strdup_printf ("%s/sift-test-gpu-model-%d-%" G_GSIZE_FORMAT ".gguf", g_get_tmp_dir (),
                                               (int) getpid (), i);
      g_autoptr (GError) error = NULL;
      assert_true (gguf_random_model_write (&rm, path, &error));
      g_assert_no_error (error);
      g_autofree char *what = g_strdup_printf ("random %s %s%s", cases[i].arch, gguf_tensor_type_name (cases[i].type),
                                               rm.tied ? " tied" : "");
      compare_file (path, tokens, G_N_ELEMENTS (tokens), NULL, what);
      unlink (path);
    }
}

int
main (void)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_blas_init (&error))
    {
      g_print ("skipped: %s\n", error->message);
      return 77;
    }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_shipped),
    cmocka_unit_test (test_random_models),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

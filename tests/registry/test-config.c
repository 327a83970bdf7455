/* The YAML config: every error kind from a fixture with its expected text
 * (fixtures/NAME.expected: file:line:col: message, source line, caret),
 * through the API and through `sift config check`; defaults, --set,
 * merging and the resolved YAML. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sys/wait.h>
#include <sift/config.h>
#include <sift/error.h>
#include <sift/registry.h>

#include "config-private.h"
#include "harness-config.h"

static const struct {
  const char *name;
  gint code;          /* SIFT_CONFIG_ERROR unless plugin is set */
  gboolean plugin;    /* SIFT_PLUGIN_ERROR */
} fixtures[] = {
  { "bad-choice", SIFT_CONFIG_ERROR_RANGE, FALSE },
  { "broken-plugin", SIFT_PLUGIN_ERROR_ABI, TRUE },
  { "chunk-size", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "dense-layer", SIFT_CONFIG_ERROR_RANGE, FALSE },
  { "duplicate-key", SIFT_CONFIG_ERROR_DUPLICATE_KEY, FALSE },
  { "duplicate-label", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "empty-policies", SIFT_CONFIG_ERROR_MISSING, FALSE },
  { "kv-heads", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "missing-name", SIFT_CONFIG_ERROR_MISSING, FALSE },
  { "not-mapping", SIFT_CONFIG_ERROR_TYPE, FALSE },
  { "out-of-range", SIFT_CONFIG_ERROR_RANGE, FALSE },
  { "param-choice", SIFT_CONFIG_ERROR_PARAM, FALSE },
  { "param-range", SIFT_CONFIG_ERROR_PARAM, FALSE },
  { "param-type", SIFT_CONFIG_ERROR_PARAM, FALSE },
  { "param-undeclared", SIFT_CONFIG_ERROR_PARAM, FALSE },
  { "phase", SIFT_CONFIG_ERROR_PHASE, FALSE },
  { "policy-and-policies", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "q8-head-dim", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "question-tokens", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "rope-dims", SIFT_CONFIG_ERROR_INVALID, FALSE },
  { "syntax", SIFT_CONFIG_ERROR_SYNTAX, FALSE },
  { "tab-caret", SIFT_CONFIG_ERROR_RANGE, FALSE },
  { "unknown-key", SIFT_CONFIG_ERROR_UNKNOWN_KEY, FALSE },
  { "unknown-policy", SIFT_CONFIG_ERROR_UNKNOWN_POLICY, FALSE },
  { "unknown-section", SIFT_CONFIG_ERROR_UNKNOWN_KEY, FALSE },
  { "wrong-type", SIFT_CONFIG_ERROR_TYPE, FALSE },
  { "wrong-type-list", SIFT_CONFIG_ERROR_TYPE, FALSE },
};

/* The test plugins, the build tree's Full policy and the broken plugins;
 * nothing installed. */
static SiftRegistry *
test_registry (void)
{
  g_setenv ("SIFT_POLICY_PATH", "", TRUE);
  g_setenv ("SIFT_POLICY_SYSTEM_PATH", "", TRUE);
  const char *dirs[] = { GOOD_DIR, FULL_DIR, BROKEN_DIR, NULL };
  return sift_registry_new (dirs);
}

/* The good test plugin and every shipped policy: the configs in configs/
 * name the shipped ones. */
static SiftRegistry *
shipped_registry (void)
{
  g_setenv ("SIFT_POLICY_PATH", "", TRUE);
  g_setenv ("SIFT_POLICY_SYSTEM_PATH", "", TRUE);
  g_autofree char *dirs = g_strdup (GOOD_DIR ":" POLICY_DIRS);
  g_auto (GStrv) list = g_strsplit (dirs, ":", -1);
  return sift_registry_new ((const char *const *) list);
}

static char *
expected_text (const char *name)
{
  g_autofree char *path = g_strdup_printf ("%s/%s.expected", FIXTURES_DIR, name);
  char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, NULL))
    fail_msg ("cannot read %s", path);
  g_strchomp (text);
  return text;
}

static void
assert_contains (const char *haystack, const char *needle, const char *what)
{
  if (strstr (haystack, needle) == NULL)
    fail_msg ("%s:\n%s\n--- does not contain ---\n%s", what, haystack, needle);
}

static void
test_fixtures_api (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = test_registry ();
  for (gsize i = 0; i < G_N_ELEMENTS (fixtures); i++)
    {
      g_autofree char *path = g_strdup_printf ("%s/%s.yaml", FIXTURES_DIR, fixtures[i].name);
      g_autofree char *want = expected_text (fixtures[i].name);
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftConfig) config = sift_config_load (path, registry, &error);
      if (config != NULL)
        fail_msg ("%s loaded without error", path);
      GQuark domain = fixtures[i].plugin ? SIFT_PLUGIN_ERROR : SIFT_CONFIG_ERROR;
      if (error->domain != domain || error->code != fixtures[i].code)
        fail_msg ("%s: got %s %d (%s), wanted code %d", path, g_quark_to_string (error->domain), error->code,
                  error->message, fixtures[i].code);
      assert_true (g_str_has_prefix (error->message, FIXTURES_DIR "/"));
      assert_contains (error->message, want, path);
    }
}

static void
test_fixtures_cli (void **state)
{
  (void) state;
  for (gsize i = 0; i < G_N_ELEMENTS (fixtures); i++)
    {
      g_autofree char *path = g_strdup_printf ("%s/%s.yaml", FIXTURES_DIR, fixtures[i].name);
      g_autofree char *want = expected_text (fixtures[i].name);
      const char *argv[] = { SIFT_EXE, "config", "check", path, "--policy-path", GOOD_DIR, "--policy-path",
                             FULL_DIR, "--policy-path", BROKEN_DIR, NULL };
      g_auto (GStrv) env = g_get_environ ();
      env = g_environ_setenv (env, "SIFT_POLICY_PATH", "", TRUE);
      env = g_environ_setenv (env, "SIFT_POLICY_SYSTEM_PATH", "", TRUE);
      g_autofree char *out = NULL, *err = NULL;
      gint status = 0;
      g_autoptr (GError) error = NULL;
      if (!g_spawn_sync (NULL, (char **) argv, env, G_SPAWN_DEFAULT, NULL, NULL, &out, &err, &status, &error))
        fail_msg ("cannot run %s: %s", SIFT_EXE, error->message);
      assert_true (WIFEXITED (status));
      if (WEXITSTATUS (status) != 2)
        fail_msg ("%s: exit %d, wanted 2; stderr: %s", path, WEXITSTATUS (status), err);
      assert_string_equal (out, "");
      assert_contains (err, want, path);
    }
}

/* `sift config check a b --set ...`: files merged in order, then the
 * assignments; the resolved YAML on stdout. */
static void
test_cli_merge (void **state)
{
  (void) state;
  g_autofree char *dir = g_dir_make_tmp ("sift-cli-XXXXXX", NULL);
  g_autofree char *a = g_build_filename (dir, "a.yaml", NULL);
  g_autofree char *b = g_build_filename (dir, "b.yaml", NULL);
  assert_true (g_file_set_contents (a, "kv: {block_size: 32, chunk_size: 64}\npolicy: {label: one}\n", -1, NULL));
  assert_true (g_file_set_contents (b, "kv: {block_size: 16}\npolicies: [{label: two, decode: good}]\n", -1, NULL));
  const char *argv[] = { SIFT_EXE, "config", "check", a, b, "--set", "policies.two.decode.params.stride=5",
                         "--set", "harness.out=elsewhere", "--policy-path", GOOD_DIR, "--policy-path", FULL_DIR, NULL };
  g_auto (GStrv) env = g_environ_setenv (g_get_environ (), "SIFT_POLICY_PATH", "", TRUE);
  env = g_environ_setenv (env, "SIFT_POLICY_SYSTEM_PATH", "", TRUE);
  g_autofree char *out = NULL, *err = NULL;
  gint status = 0;
  assert_true (g_spawn_sync (NULL, (char **) argv, env, G_SPAWN_DEFAULT, NULL, NULL, &out, &err, &status, NULL));
  if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
    fail_msg ("exit %d: %s", WEXITSTATUS (status), err);
  assert_contains (out, "  block_size: 16\n  chunk_size: 64\n", "merged kv");
  assert_contains (out, "  - label: one\n", "first setup");
  assert_contains (out, "  - label: two\n    prefill: full\n    decode:\n      name: good\n      params:\n        stride: 5\n",
                   "second setup");
  assert_contains (out, "offload:\n  store: host\n  # path: (unset)\n",
                   "an unset store path stays unset (the harness puts it in the output directory it uses)");
  assert_contains (out, "  out: elsewhere\n", "harness.out set");
  g_unlink (a);
  g_unlink (b);
  g_rmdir (dir);
}

/* Every fixture on disk is in the table above, and has its .expected. */
static void
test_fixtures_complete (void **state)
{
  (void) state;
  g_autoptr (GDir) dir = g_dir_open (FIXTURES_DIR, 0, NULL);
  assert_non_null (dir);
  const char *name;
  guint n = 0;
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      if (!g_str_has_suffix (name, ".yaml"))
        continue;
      g_autofree char *stem = g_strndup (name, strlen (name) - 5);
      gboolean listed = FALSE;
      for (gsize i = 0; i < G_N_ELEMENTS (fixtures); i++)
        listed = listed || strcmp (fixtures[i].name, stem) == 0;
      if (!listed)
        fail_msg ("fixture %s is not in the test's table", name);
      n++;
    }
  assert_int_equal (n, G_N_ELEMENTS (fixtures));
}

/* The defaults of the key tables (docs/config.md), written out here. */
static void
test_defaults (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = test_registry ();
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) c = sift_config_load_string ("empty.yaml", "", registry, &error);
  if (c == NULL)
    fail_msg ("%s", error->message);
  assert_string_equal (c->file, "empty.yaml");
  assert_string_equal (c->source, "synthetic");
  assert_int_equal (c->shape.n_layers, 2);
  assert_int_equal (c->shape.n_q_heads, 8);
  assert_int_equal (c->shape.n_kv_heads, 2);
  assert_int_equal (c->shape.head_dim, 64);
  assert_int_equal (c->shape.block_size, 64);
  assert_int_equal (c->shape.chunk_size, 512);
  assert_float_equal (c->shape.scale, 0.125, 1e-7);
  assert_int_equal (sift_synthetic_seed (c), 1);
  assert_int_equal (sift_synthetic_config (c)->sink_tokens, 4);
  assert_float_equal (sift_synthetic_config (c)->sink_strength, 11.5, 0);
  assert_float_equal (sift_synthetic_config (c)->locality, 2.0, 0);
  assert_float_equal (sift_synthetic_config (c)->locality_scale, 64.0, 0);
  assert_int_equal (sift_synthetic_config (c)->heavy_hitters, 8);
  assert_float_equal (sift_synthetic_config (c)->heavy_hitter_strength, 9.5, 0);
  assert_int_equal (sift_synthetic_config (c)->rope_dims, 32);
  assert_float_equal (sift_synthetic_config (c)->rope_base, 10000.0, 0);
  assert_float_equal (sift_synthetic_config (c)->retrieval_heads, 0.25, 0);
  assert_float_equal (sift_synthetic_config (c)->needle_strength, 16.0, 0);
  assert_float_equal (sift_synthetic_config (c)->noise, 0.8, 0);
  assert_float_equal (sift_synthetic_config (c)->drift, 6.0, 0);
  assert_float_equal (sift_synthetic_config (c)->drift_scale, 64.0, 0);
  assert_int_equal (sift_kv_config (c)->store_dtype, SIFT_DTYPE_F16);
  assert_int_equal (sift_kv_config (c)->compute_dtype, SIFT_DTYPE_F32);
  assert_int_equal (sift_kv_config (c)->capacity_tokens, 0);
  assert_string_equal (sift_offload_config (c)->store, "host");
  assert_null (sift_offload_config (c)->store_path); /* derived from the output directory at run time */
  assert_false (sift_offload_config (c)->store_keep);
  assert_false (sift_offload_config (c)->store_direct);
  assert_int_equal (sift_offload_config (c)->ring_slots, 4);
  assert_int_equal (sift_offload_config (c)->pipeline, SIFT_PIPELINE_RING);
  const SiftHarnessConfig *h = sift_harness_config (c);
  assert_int_equal (h->n_lengths, 3);
  assert_int_equal (h->lengths[0], 1024);
  assert_int_equal (h->lengths[2], 4096);
  assert_int_equal (h->n_depths, 5);
  assert_float_equal (h->depths[1], 0.25, 0);
  assert_int_equal (h->length_spacing, SIFT_SPACING_EXPLICIT);
  assert_int_equal (h->needle, SIFT_NEEDLE_SINGLE);
  assert_int_equal (h->n_distractors, 3);
  assert_int_equal (h->n_values, 3);
  assert_int_equal (h->n_queries, 2);
  assert_int_equal (h->question_tokens, 4);
  assert_int_equal (h->decode_steps, 8);
  assert_float_equal (h->min_accuracy, 0.0, 0);
  assert_int_equal (h->seed, 1);
  assert_string_equal (h->out_dir, "sift-out");
  /* One setup, full in both phases, resolved. */
  assert_int_equal (c->setups->len, 1);
  const SiftPolicySetup *s = c->setups->pdata[0];
  assert_string_equal (s->label, "full");
  assert_string_equal (s->prefill.name, "full");
  assert_string_equal (s->decode.name, "full");
  assert_non_null (s->prefill.ops);
  assert_non_null (s->decode.params);
  assert_int_equal (s->n_dense_layers, 0);
}

static void
test_values_and_params (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = test_registry ();
  g_autoptr (GError) error = NULL;
  const char *text = "model: {source: random, head_dim: 128, scale: 0.5, seed: 18446744073709551615}\n"
                     "kv: {store_dtype: q8_0, compute_dtype: bf16}\n"
                     "offload: {store: file, keep: yes, pipeline: cross_layer}\n"
                     "harness: {out: /tmp/x, needle: multikey, depths: [0, 1], length_spacing: sigmoid,\n"
                     "          length_min: 100, length_max: 900}\n"
                     "policies:\n"
                     "  - prefill: full\n"
                     "    decode: {name: good, params: {stride: 4, layers: [3, 5], score: mean}}\n"
                     "    dense_layers: [0, 1]\n"
                     "  - {label: second, decode: good}\n";
  g_autoptr (SiftConfig) c = sift_config_load_string ("values.yaml", text, registry, &error);
  if (c == NULL)
    fail_msg ("%s", error->message);
  assert_string_equal (c->source, "random");
  assert_float_equal (c->shape.scale, 0.5, 0);
  assert_true (sift_synthetic_seed (c) == G_MAXUINT64);
  assert_int_equal (sift_kv_config (c)->store_dtype, SIFT_DTYPE_Q8_0);
  assert_int_equal (sift_kv_config (c)->compute_dtype, SIFT_DTYPE_BF16);
  assert_null (sift_offload_config (c)->store_path); /* follows harness.out (/tmp/x) when the harness runs */
  assert_true (sift_offload_config (c)->store_keep);
  assert_int_equal (sift_offload_config (c)->pipeline, SIFT_PIPELINE_CROSS_LAYER);
  assert_int_equal (sift_harness_config (c)->needle, SIFT_NEEDLE_MULTIKEY);
  assert_int_equal (sift_harness_config (c)->length_spacing, SIFT_SPACING_SIGMOID);
  assert_int_equal (c->setups->len, 2);
  const SiftPolicySetup *a = c->setups->pdata[0], *b = c->setups->pdata[1];
  assert_string_equal (a->label, "full+good");
  assert_int_equal (sift_params_get_int (a->decode.params, "stride"), 4);
  assert_string_equal (sift_params_get_string (a->decode.params, "score"), "mean");
  gsize n;
  assert_int_equal (sift_params_get_int_list (a->decode.params, "layers", &n)[1], 5);
  assert_float_equal (sift_params_get_float (a->decode.params, "ratio"), 0.5, 0);
  assert_int_equal (a->n_dense_layers, 2);
  assert_string_equal (b->label, "second");
  assert_int_equal (sift_params_get_int (b->decode.params, "stride"), 2);

  /* --set: one setup by label, every setup through policy.*. */
  assert_true (sift_config_set (c, "policies.second.decode.params.stride=7", registry, &error));
  assert_int_equal (sift_params_get_int (b->decode.params, "stride"), 7);
  assert_int_equal (sift_params_get_int (a->decode.params, "stride"), 4);
  assert_true (sift_config_set (c, "policy.decode.params.ratio=0.25", registry, &error));
  assert_float_equal (sift_params_get_float (a->decode.params, "ratio"), 0.25, 0);
  assert_float_equal (sift_params_get_float (b->decode.params, "ratio"), 0.25, 0);
  assert_true (sift_config_set (c, "harness.lengths=[1024, 2048]", registry, &error));
  assert_true (sift_config_set (c, "model.synthetic.noise=0.5", registry, &error));
  assert_float_equal (sift_synthetic_config (c)->noise, 0.5, 0);
  assert_true (sift_config_set (c, "policies.second.decode=full", registry, &error));
  assert_null (b->decode.params == NULL ? NULL : sift_params_specs (b->decode.params));
  assert_string_equal (b->label, "second");
  /* policy.*.params.P goes only to setups whose policy declares P... */
  assert_true (sift_config_set (c, "policy.decode.params.stride=9", registry, &error));
  assert_int_equal (sift_params_get_int (a->decode.params, "stride"), 9);
  g_autofree char *yaml = sift_config_to_yaml (c);
  assert_contains (yaml, "  - label: second\n    prefill: full\n    decode: full\n", "full untouched");
  if (error != NULL)
    fail_msg ("%s", error->message);
  /* ... and is an error when no setup's policy does. */
  assert_false (sift_config_set (c, "policy.prefill.params.stride=3", registry, &error));
  assert_int_equal (error->code, SIFT_CONFIG_ERROR_PARAM);
  assert_contains (error->message, "policy.prefill.params.stride: policy 'full': undeclared parameter 'stride'",
                   "no setup declares it");
}

/* Without a registry names and params are kept as written, unchecked. */
static void
test_no_registry (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) c = sift_config_load_string (
    "raw.yaml", "policy: {decode: {name: someday, params: {k: 3, l: [1, 2]}}}\n", NULL, &error);
  if (c == NULL)
    fail_msg ("%s", error->message);
  const SiftPolicySetup *s = c->setups->pdata[0];
  assert_null (s->decode.ops);
  assert_null (s->decode.params);
  assert_true (sift_config_set (c, "policy.decode.params.k=4", NULL, &error));
  g_autofree char *yaml = sift_config_to_yaml (c);
  assert_contains (yaml, "    decode:\n      name: someday\n      params:\n        l: [1, 2]\n        k: 4\n", "raw");
  /* Syntax is still checked. */
  assert_false (sift_config_set (c, "policy.decode=Not A Name", NULL, &error));
  assert_int_equal (error->code, SIFT_CONFIG_ERROR_TYPE);
}

/* --set errors are located in the assignment itself. */
static void
test_set_errors (void **state)
{
  (void) state;
  static const struct {
    const char *assignment;
    gint code;
    const char *text;
  } cases[] = {
    { "kv.block_size=abc", SIFT_CONFIG_ERROR_TYPE,
      "--set:1:15: kv.block_size: expected an integer, got 'abc'\nkv.block_size=abc\n              ^" },
    { "kv.blok_size=1", SIFT_CONFIG_ERROR_UNKNOWN_KEY,
      "--set:1:4: unknown key 'blok_size' in kv; did you mean 'block_size'?\nkv.blok_size=1\n   ^" },
    { "kvv.block_size=1", SIFT_CONFIG_ERROR_UNKNOWN_KEY, "--set:1:1: unknown section 'kvv'; did you mean 'kv'?" },
    { "kv.block_size=100", SIFT_CONFIG_ERROR_INVALID,
      "--set:1:15: kv.chunk_size = 512 is not a multiple of kv.block_size = 100" },
    { "offload.ring_slots=1", SIFT_CONFIG_ERROR_RANGE, "--set:1:20: offload.ring_slots: 1 is out of range [2, 1024]" },
    { "harness.lengths=[1,x]", SIFT_CONFIG_ERROR_TYPE, "--set:1:20: harness.lengths[1]: expected an integer, got 'x'" },
    { "harness.lengths=[1", SIFT_CONFIG_ERROR_SYNTAX, "--set:1:19: invalid YAML" },
    { "policy.decode.params.strid=1", SIFT_CONFIG_ERROR_PARAM,
      "--set:1:22: policy.decode.params.strid: policy 'good': undeclared parameter 'strid'; did you mean 'stride'?" },
    { "policy.decode.params.stride=0", SIFT_CONFIG_ERROR_PARAM,
      "--set:1:29: policy.decode.params.stride: policy 'good': parameter 'stride' = 0 is out of range [1, 64]" },
    { "policies.nope.decode=full", SIFT_CONFIG_ERROR_UNKNOWN_KEY, "--set:1:10: no setup labelled 'nope'" },
    { "policy.prefill=good_decode", SIFT_CONFIG_ERROR_PHASE,
      "--set:1:16: policy.prefill: policy 'good_decode' does not support prefill (it supports only decode)" },
    { "policy.decode=nothere", SIFT_CONFIG_ERROR_UNKNOWN_POLICY, "--set:1:15: policy.decode: no policy named 'nothere'" },
    { "kv.block_size", SIFT_CONFIG_ERROR_SYNTAX, "--set:1:1: expected KEY=VALUE" },
    { "kv.block_size=", SIFT_CONFIG_ERROR_TYPE, "--set:1:15: " },
    { "kv.block_size.x=1", SIFT_CONFIG_ERROR_UNKNOWN_KEY, "--set:1:15: kv.block_size is not a section" },
  };
  g_autoptr (SiftRegistry) registry = test_registry ();
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftConfig) c = sift_config_load_string ("base.yaml", "policy: {decode: good}\n", registry, &error);
      assert_non_null (c);
      assert_false (sift_config_set (c, cases[i].assignment, registry, &error));
      if (error->domain != SIFT_CONFIG_ERROR || error->code != cases[i].code)
        fail_msg ("%s: got code %d (%s), wanted %d", cases[i].assignment, error->code, error->message, cases[i].code);
      assert_contains (error->message, cases[i].text, cases[i].assignment);
    }
}

/* Assignments apply together and are checked once. */
/* sift_config_locate places a later check's message at the key written
 * last among those named, and at the file when they all hold defaults. */
static void
test_locate (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load_string ("t.yaml", "harness:\n  seed: 3\n  lengths: [64, 128]\n",
                                                        NULL, &error);
  assert_non_null (cfg);
  const char *keys[] = { "harness.question_tokens", "harness.lengths", NULL };
  g_autofree char *at = sift_config_locate (cfg, keys, "too short");
  assert_string_equal (at, "t.yaml:3:12: too short\n  lengths: [64, 128]\n           ^");
  assert_true (sift_config_set (cfg, "harness.question_tokens=9", NULL, &error));
  g_autofree char *later = sift_config_locate (cfg, keys, "too short");
  assert_true (g_str_has_prefix (later, "--set:1:25: too short\n"));
  const char *defaults[] = { "model.synthetic.noise", "kv.block_size", NULL };
  g_autofree char *plain = sift_config_locate (cfg, defaults, "m");
  assert_string_equal (plain, "t.yaml: m");
  const char *unknown[] = { "harness.nosuch", "model", "policies", NULL };
  g_autofree char *none = sift_config_locate (cfg, unknown, "m");
  assert_string_equal (none, "t.yaml: m");
  /* Which keys were written: by the file, by --set, or neither. */
  assert_true (sift_config_is_set (cfg, "harness.lengths"));
  assert_true (sift_config_is_set (cfg, "harness.question_tokens"));
  assert_false (sift_config_is_set (cfg, "harness.depths"));
  assert_false (sift_config_is_set (cfg, "model.layers"));
  assert_false (sift_config_is_set (cfg, "harness.nosuch"));
  assert_false (sift_config_is_set (cfg, "model"));
}

static void
test_apply_together (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = test_registry ();
  g_autoptr (SiftConfig) c = sift_config_new_default (registry, NULL);
  const char *const sets[] = { "kv.block_size=100", "kv.chunk_size=500", NULL };
  g_autoptr (GError) error = NULL;
  assert_true (sift_config_apply (c, sets, registry, &error));
  assert_int_equal (c->shape.block_size, 100);
  assert_int_equal (c->shape.chunk_size, 500);
}

/* A later file overrides keys and adds its setups. */
static void
test_merge (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = test_registry ();
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = g_dir_make_tmp ("sift-config-XXXXXX", NULL);
  g_autofree char *a = g_build_filename (dir, "a.yaml", NULL);
  g_autofree char *b = g_build_filename (dir, "b.yaml", NULL);
  assert_true (g_file_set_contents (a, "kv: {block_size: 32}\npolicy: {label: dense}\n", -1, NULL));
  assert_true (g_file_set_contents (b, "kv: {chunk_size: 64}\npolicies: [{decode: good}]\n", -1, NULL));
  g_autoptr (SiftConfig) c = sift_config_load (a, registry, &error);
  assert_non_null (c);
  assert_true (sift_config_merge_file (c, b, registry, &error));
  assert_int_equal (c->shape.block_size, 32);
  assert_int_equal (c->shape.chunk_size, 64);
  assert_int_equal (c->setups->len, 2);
  assert_string_equal (((SiftPolicySetup *) c->setups->pdata[0])->label, "dense");
  assert_string_equal (((SiftPolicySetup *) c->setups->pdata[1])->label, "full+good");
  assert_string_equal (c->file, a);
  /* Merging the same setups again: their labels collide. */
  assert_false (sift_config_merge_file (c, b, registry, &error));
  assert_int_equal (error->code, SIFT_CONFIG_ERROR_INVALID);
  assert_contains (error->message, "b.yaml:2:12: policies[0]: two setups are labelled 'full+good'", "merge");
  g_clear_error (&error);
  g_autofree char *missing = g_build_filename (dir, "missing.yaml", NULL);
  assert_null (sift_config_load (missing, registry, &error));
  assert_int_equal (error->code, SIFT_CONFIG_ERROR_IO);
  assert_contains (error->message, "missing.yaml: cannot read", "io");
  g_unlink (a);
  g_unlink (b);
  g_rmdir (dir);
}

/* The resolved YAML reads back into the same config; shipped configs load. */
static void
test_round_trip (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = shipped_registry ();
  const char *files[] = { SOURCE_DIR "/configs/default.yaml", SOURCE_DIR "/configs/full.yaml" };
  for (gsize i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftConfig) c = sift_config_load (files[i], registry, &error);
      if (c == NULL)
        fail_msg ("%s", error->message);
      assert_true (sift_config_set (c, "policies.full.decode={name: good, params: {layers: [1], score: mean}}",
                                    registry, &error));
      g_autofree char *yaml = sift_config_to_yaml (c);
      g_autoptr (SiftConfig) again = sift_config_load_string ("resolved.yaml", yaml, registry, &error);
      if (again == NULL)
        fail_msg ("%s\n%s", error->message, yaml);
      g_autofree char *yaml2 = sift_config_to_yaml (again);
      /* Only the first line (naming the file it came from) differs. */
      assert_string_equal (strchr (yaml, '\n'), strchr (yaml2, '\n'));
      assert_contains (yaml, "      params:\n        stride: 2\n", "resolved params");
    }
}

/* docs/config.md documents every key of every table, registered or
 * core's, with the table's default; each default is a value its own key
 * accepts. */
static void
document_table (const Key *table, const char *prefix, const char *doc, SiftConfig *config)
{
  for (const Key *k = table; k->name; k++)
    {
      g_autofree char *path = prefix ? g_strdup_printf ("%s.%s", prefix, k->name) : g_strdup (k->name);
      g_autofree char *quoted = g_strdup_printf ("`%s`", path);
      if (strstr (doc, quoted) == NULL)
        fail_msg ("docs/config.md does not document %s", quoted);
      if (k->def != NULL)
        {
          /* Its row, "| `path` | type | default | ...", gives the table's default. */
          g_autofree char *row_start = g_strdup_printf ("| `%s` |", path);
          const char *row = strstr (doc, row_start);
          if (row == NULL)
            fail_msg ("docs/config.md has no table row for %s", path);
          g_auto (GStrv) cells = g_strsplit (row, "|", 5);
          assert_true (g_strv_length (cells) == 5);
          g_autofree char *documented = g_strdup (g_strstrip (cells[3]));
          if (documented[0] == '`' && documented[strlen (documented) - 1] == '`')
            documented[strlen (documented) - 1] = '\0';
          if (strcmp (documented + (documented[0] == '`'), k->def) != 0)
            fail_msg ("docs/config.md gives %s the default '%s', its key table '%s'", path,
                      documented + (documented[0] == '`'), k->def);
        }
      if (k->type == KEY_SETUP)
        document_table (sift_config_setup_keys, path, doc, NULL);
      if (config != NULL && k->def != NULL && k->type != KEY_SETUP && k->type != KEY_SETUPS)
        {
          g_autoptr (GError) error = NULL;
          g_autofree char *set = g_strdup_printf ("%s=%s", path, k->def);
          if (!sift_config_set (config, set, NULL, &error))
            fail_msg ("the default of %s does not pass its own key: %s", path, error->message);
        }
    }
}

static void
test_documented (void **state)
{
  (void) state;
  g_autofree char *doc = NULL;
  assert_true (g_file_get_contents (SOURCE_DIR "/docs/config.md", &doc, NULL, NULL));
  g_autoptr (SiftConfig) config = sift_config_new_default (NULL, NULL);
  document_table (sift_config_root_keys, NULL, doc, NULL);
  g_autoptr (GPtrArray) sections = sift_config_sections ();
  for (guint i = 0; i < sections->len; i++)
    {
      const SiftConfigSection *section = sections->pdata[i];
      g_autofree char *quoted = g_strdup_printf ("`%s`", section->path);
      if (strstr (doc, quoted) == NULL)
        fail_msg ("docs/config.md does not document the section %s", quoted);
      document_table (section->keys, section->path, doc, config);
    }
}

/* ---- A section registered by its owner ---------------------------------------- */

typedef struct {
  gint64 level;
  int mode;
  char *name;
  double *weights;
  gsize n_weights;
} Demo;

static const SiftConfigEnumValue demo_modes[] = { { "slow", 0 }, { "fast", 1 }, { NULL, 0 } };
static const SiftConfigKey demo_keys[] = {
  { "level", SIFT_CONFIG_KEY_INT, G_STRUCT_OFFSET (Demo, level), 0, 1, 10, NULL, "3", "a level" },
  { "mode", SIFT_CONFIG_KEY_ENUM, G_STRUCT_OFFSET (Demo, mode), 0, SIFT_CONFIG_NO_RANGE, demo_modes, "fast", "how" },
  { "name", SIFT_CONFIG_KEY_STRING, G_STRUCT_OFFSET (Demo, name), 0, SIFT_CONFIG_NO_RANGE, NULL, NULL, "a name" },
  { "weights", SIFT_CONFIG_KEY_FLOAT_LIST, G_STRUCT_OFFSET (Demo, weights), G_STRUCT_OFFSET (Demo, n_weights), 0, 1,
    NULL, "[0.5, 0.25]", "weights" },
  { NULL },
};

/* Across sections: a fast demo needs at least two layers of the model. */
static gboolean
demo_check (const SiftConfig *config, gconstpointer values, GError **error)
{
  const Demo *d = values;
  if (d->mode == 1 && d->level > config->shape.n_layers)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "demo.deep.level", "model.layers", NULL },
                             "demo.deep.level = %" G_GINT64_FORMAT " is above model.layers = %d", d->level,
                             config->shape.n_layers);
  return TRUE;
}

static const SiftConfigSection demo_section = {
  "demo.deep", 700, "a test section", sizeof (Demo), demo_keys, demo_check,
};

static void
expect_error (const char *text, gint code, const char *message)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) c = sift_config_load_string ("d.yaml", text, NULL, &error);
  assert_null (c);
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, code));
  if (!g_str_has_prefix (error->message, message))
    fail_msg ("expected '%s...', got '%s'", message, error->message);
}

static void
test_registered_section (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  /* Before registration the section is unknown, and a config made then has none. */
  g_autoptr (SiftConfig) before = sift_config_new_default (NULL, &error);
  assert_non_null (before);
  assert_null (sift_config_get_section (before, &demo_section));
  expect_error ("model: {layers: 4}\ndemo:\n  deep: {level: 2}\n", SIFT_CONFIG_ERROR_UNKNOWN_KEY,
                "d.yaml:2:1: unknown section 'demo'");

  sift_config_register_section (&demo_section);
  sift_config_register_section (&demo_section); /* twice: once */
  g_autoptr (SiftConfig) c = sift_config_load_string ("d.yaml", "model: {layers: 4}\ndemo:\n  deep: {level: 2, name: x}\n",
                                                      NULL, &error);
  if (c == NULL)
    fail_msg ("%s", error->message);
  const Demo *d = sift_config_get_section (c, &demo_section);
  assert_int_equal (d->level, 2);
  assert_int_equal (d->mode, 1);              /* the table's default */
  assert_string_equal (d->name, "x");
  assert_int_equal (d->n_weights, 2);
  assert_float_equal (d->weights[1], 0.25, 0);
  /* --set reaches it, and a copy has its own values. */
  assert_true (sift_config_set (c, "demo.deep.weights=[1]", NULL, &error));
  g_autoptr (SiftConfig) copy = sift_config_copy (c);
  Demo *e = sift_config_edit_section (copy, &demo_section);
  e->level = 9;
  assert_int_equal (d->level, 2);
  assert_int_equal (d->n_weights, 1);
  assert_int_equal (e->n_weights, 1);
  assert_string_equal (e->name, "x");
  g_autofree char *yaml = sift_config_to_yaml (c);
  assert_non_null (strstr (yaml, "demo:\n  deep:\n    level: 2\n    mode: fast\n    name: x\n    weights: [1.0]\n"));

  /* Validated like core's keys: type, range, choices, unknown keys, the owner's check. */
  expect_error ("demo:\n  deep:\n    level: 11\n", SIFT_CONFIG_ERROR_RANGE,
                "d.yaml:3:12: demo.deep.level: 11 is out of range [1, 10]");
  expect_error ("demo:\n  deep:\n    mode: slo\n", SIFT_CONFIG_ERROR_RANGE,
                "d.yaml:3:11: demo.deep.mode: 'slo' is not one of slow | fast; did you mean 'slow'?");
  expect_error ("demo:\n  deep:\n    levle: 2\n", SIFT_CONFIG_ERROR_UNKNOWN_KEY,
                "d.yaml:3:5: unknown key 'levle' in demo.deep; did you mean 'level'?");
  expect_error ("demo:\n  deep: 3\n", SIFT_CONFIG_ERROR_TYPE, "d.yaml:2:9: demo.deep: expected a mapping, got a scalar");
  expect_error ("model:\n  layers: 2\ndemo:\n  deep:\n    level: 5\n", SIFT_CONFIG_ERROR_INVALID,
                "d.yaml:5:12: demo.deep.level = 5 is above model.layers = 2");
  /* An unknown section is still an error naming the file and line. */
  expect_error ("kv: {block_size: 64}\nharnes:\n  lengths: [1]\n", SIFT_CONFIG_ERROR_UNKNOWN_KEY,
                "d.yaml:2:1: unknown section 'harnes'; did you mean 'harness'?");
}

/* ---- Model sources registered by the models ---------------------------------- */

static void
test_registered_model_source (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  /* The models' sources (registered with the harness's sections), listed
   * in the error for one that is not among them. */
  expect_error ("model: {source: demo, layers: 4}\n", SIFT_CONFIG_ERROR_RANGE,
                "d.yaml:1:17: model.source: 'demo' is not one of synthetic | random | gguf\n");
  static const SiftConfigModelSource demo = { "demo", "a test source", FALSE };
  sift_config_register_model_source (&demo);
  sift_config_register_model_source (&demo); /* twice: once */
  g_autoptr (SiftConfig) c = sift_config_load_string ("d.yaml", "model: {source: demo, layers: 4}\n", NULL, &error);
  if (c == NULL)
    fail_msg ("%s", error->message);
  assert_string_equal (c->source, "demo");
  g_autoptr (SiftConfig) d = sift_config_load_string ("d.yaml", "model: {layers: 4}\n", NULL, &error);
  if (d == NULL)
    fail_msg ("%s", error->message);
  assert_string_equal (d->source, "synthetic"); /* the default the synthetic model registered */
  expect_error ("model: {source: dem, layers: 4}\n", SIFT_CONFIG_ERROR_RANGE,
                "d.yaml:1:17: model.source: 'dem' is not one of synthetic | random | gguf | demo; did you mean 'demo'?");
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_fixtures_complete),
    cmocka_unit_test (test_fixtures_api),
    cmocka_unit_test (test_fixtures_cli),
    cmocka_unit_test (test_cli_merge),
    cmocka_unit_test (test_defaults),
    cmocka_unit_test (test_values_and_params),
    cmocka_unit_test (test_no_registry),
    cmocka_unit_test (test_set_errors),
    cmocka_unit_test (test_locate),
    cmocka_unit_test (test_apply_together),
    cmocka_unit_test (test_merge),
    cmocka_unit_test (test_round_trip),
    cmocka_unit_test (test_documented),
    cmocka_unit_test (test_registered_section),
    cmocka_unit_test (test_registered_model_source),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

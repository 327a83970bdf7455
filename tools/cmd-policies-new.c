/* sift policies new NAME [DIR]: writes a skeleton policy plugin into DIR
 * (default ./NAME): NAME.c (the ops table, one declared parameter, an
 * example select_blocks), test-NAME.c (loads the built plugin; checks its
 * selection against the rule written out by hand, and its attention
 * through the engine against attention computed directly over the tokens
 * that rule keeps), meson.build (finds sift through pkg-config, installs
 * into its policydir) and meson_options.txt. Nothing is overwritten.
 *
 * The template is embedded below, one string per line, so the installed
 * sift needs no data files. Placeholders: @NAME@ the policy name, @IDENT@
 * the name as a C identifier, @TYPE@ in CamelCase, @SIFT_VERSION@ this
 * sift's version. tests/sdk builds what this writes against an installed
 * sift and runs its test; docs/writing-a-policy.md explains every line. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <sift/registry.h>
#include <sift/version.h>

#include "cli.h"
#include "commands.h"

/* NAME.c */
static const char *const template_policy_c[] = {
  "/* @NAME@: a sift sparse-attention policy.",
  " *",
  " * Written by `sift policies new` as a starting point: it keeps the",
  " * attention sinks' block and the `recent_blocks` newest stored blocks.",
  " * Replace select_blocks with your rule; docs/writing-a-policy.md (in sift's",
  " * source) walks through every method, and plugins/streaming is a complete",
  " * example. A policy includes only the plugin SDK, <sift/plugin.h>. */",
  "#include <sift/plugin.h>",
  "",
  "typedef struct {",
  "  SiftPolicy parent;     /* first: the host fills it */",
  "  gint64 recent_blocks;  /* newest stored blocks every query attends */",
  "} @TYPE@Policy;",
  "",
  "/* Declared parameters: the host validates YAML against this table and",
  " * `sift policies info @NAME@` prints it. */",
  "static const SiftParamSpec @IDENT@_params[] = {",
  "  SIFT_PARAM_INT (\"recent_blocks\", 8, 0, 1 << 20,",
  "                  \"newest stored blocks every query attends\"),",
  "  SIFT_PARAM_END,",
  "};",
  "",
  "static gboolean",
  "@IDENT@_init (SiftPolicy *self, const SiftParams *params, GError **error)",
  "{",
  "  @TYPE@Policy *p = (@TYPE@Policy *) self;",
  "  (void) error; /* values are already checked against @IDENT@_params */",
  "  p->recent_blocks = sift_params_get_int (params, \"recent_blocks\");",
  "  return TRUE;",
  "}",
  "",
  "/* `available` holds the layer's stored block ids, ascending; add a subset.",
  " * sift_selection_add_q_head / _kv_head select for one head only. */",
  "static gboolean",
  "@IDENT@_select_blocks (SiftPolicy *self, const SiftPolicyContext *ctx,",
  "    const gint64 *available, gsize n_available, SiftSelection *selected, GError **error)",
  "{",
  "  @TYPE@Policy *p = (@TYPE@Policy *) self;",
  "  (void) ctx;",
  "  (void) error;",
  "  gsize first_recent = n_available > (gsize) p->recent_blocks ? n_available - (gsize) p->recent_blocks : 0;",
  "  for (gsize i = 0; i < n_available; i++)",
  "    if (i == 0 || i >= first_recent)",
  "      sift_selection_add (selected, available[i]);",
  "  return TRUE;",
  "}",
  "",
  "static const SiftPolicyOps @IDENT@_ops = {",
  "  SIFT_POLICY_OPS_HEADER,",
  "  .name = \"@NAME@\",",
  "  .version = \"0.1\",",
  "  .description = \"sink block + the newest stored blocks (edit me)\",",
  "  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE",
  "           | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,",
  "  .params = @IDENT@_params,",
  "  .instance_size = sizeof (@TYPE@Policy),",
  "  .init = @IDENT@_init,",
  "  /* Optional, NULL here: finalize (free what init allocated), reset (clear",
  "   * per-sequence state), compute_chunked_prefill / _decode (NULL: the",
  "   * engine's default pipeline), on_prefill_offload / on_decode_offload. */",
  "  .select_blocks = @IDENT@_select_blocks,",
  "};",
  "",
  "SIFT_PLUGIN_DEFINE (&@IDENT@_ops)",
  NULL,
};

/* test-NAME.c */
static const char *const template_test_c[] = {
  "/* Tests of the @NAME@ policy, run by `meson test` with SIFT_POLICY_PATH set",
  " * to the build folder (see meson.build):",
  " *  - its selection on a hand-made context, against kept () below;",
  " *  - its attention through sift's engine, against attention computed",
  " *    directly from the model's q, k, v over exactly the tokens kept ()",
  " *    keeps (plus the tokens not stored yet, which the engine always",
  " *    attends); with every block kept that is plain dense attention.",
  " * When you change select_blocks, change kept () to the rule you mean. */",
  "#include <math.h>",
  "#include <stdio.h>",
  "#include <stdlib.h>",
  "",
  "#include <sift/sift.h>",
  "",
  "#define CHECK(cond)                                                            \\",
  "  do {                                                                         \\",
  "    if (!(cond)) {                                                             \\",
  "      fprintf (stderr, \"%s:%d: check failed: %s\\n\", __FILE__, __LINE__, #cond); \\",
  "      exit (1);                                                                \\",
  "    }                                                                          \\",
  "  } while (0)",
  "#define CHECK_OK(call, error)                                                  \\",
  "  do {                                                                         \\",
  "    if (!(call)) {                                                             \\",
  "      fprintf (stderr, \"%s:%d: %s: %s\\n\", __FILE__, __LINE__, #call,          \\",
  "               (error) ? (error)->message : \"failed\");                         \\",
  "      exit (1);                                                                \\",
  "    }                                                                          \\",
  "  } while (0)",
  "",
  "/* The rule, written out again: block `id` of a call is kept when it is the",
  " * first block or one of the `recent` newest stored blocks. */",
  "static gboolean",
  "kept (const SiftPolicyContext *ctx, gint64 id, gint64 recent)",
  "{",
  "  return id == 0 || id >= ctx->n_blocks - recent;",
  "}",
  "",
  "static SiftPolicy *",
  "policy_new (SiftRegistry *reg, const SiftModelShape *shape, gint64 recent)",
  "{",
  "  GError *error = NULL;",
  "  const SiftPolicyInfo *info = sift_registry_lookup (reg, \"@NAME@\", &error);",
  "  CHECK_OK (info != NULL, error);",
  "  CHECK_OK (sift_policy_ops_check (info->ops, info->file, &error), error);",
  "  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &error);",
  "  CHECK_OK (params != NULL, error);",
  "  /* The host refuses out-of-range values before init sees them. */",
  "  CHECK (!sift_params_set_text (params, \"recent_blocks\", \"-1\", &error));",
  "  g_clear_error (&error);",
  "  g_autofree char *text = g_strdup_printf (\"%\" G_GINT64_FORMAT, recent);",
  "  CHECK_OK (sift_params_set_text (params, \"recent_blocks\", text, &error), error);",
  "  SiftPolicy *policy = sift_policy_new (info->ops, params, shape, &error);",
  "  CHECK_OK (policy != NULL, error);",
  "  return policy;",
  "}",
  "",
  "static void",
  "test_selection (SiftRegistry *reg)",
  "{",
  "  GError *error = NULL;",
  "  SiftModelShape shape = { .n_layers = 1, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 8,",
  "                           .block_size = 16, .chunk_size = 16 };",
  "  g_autoptr (SiftPolicy) policy = policy_new (reg, &shape, 3);",
  "  /* 1..10 stored full blocks of 16 tokens; the query row follows them. */",
  "  for (gint64 n = 1; n <= 10; n++)",
  "    {",
  "      SiftBlockMeta blocks[10];",
  "      gint64 available[10];",
  "      for (gint64 i = 0; i < n; i++)",
  "        {",
  "          blocks[i] = (SiftBlockMeta) { .first_token = 16 * i, .n_valid = 16, .phase = SIFT_PHASE_PREFILL };",
  "          available[i] = i;",
  "        }",
  "      SiftPolicyContext ctx = { .phase = SIFT_PHASE_DECODE, .block_size = 16, .kv_len = 16 * n,",
  "                                .q_pos = 16 * n, .n_q = 1, .shape = &shape, .blocks = blocks,",
  "                                .n_blocks = n };",
  "      g_autoptr (SiftSelection) sel = sift_selection_new (shape.n_q_heads, shape.n_kv_heads);",
  "      CHECK_OK (policy->ops->select_blocks (policy, &ctx, available, (gsize) n, sel, &error), error);",
  "      /* What the engine checks after every call: ids from `available`, no repeats. */",
  "      CHECK_OK (sift_selection_validate (sel, available, (gsize) n, policy->ops->name, &error), error);",
  "      gsize k = 0;",
  "      for (gint64 id = 0; id < n; id++)",
  "        if (kept (&ctx, id, 3))",
  "          {",
  "            CHECK (k < sift_selection_n_blocks (sel) && sift_selection_block (sel, k) == id);",
  "            k++;",
  "          }",
  "      CHECK (k == sift_selection_n_blocks (sel));",
  "    }",
  "}",
  "",
  "/* ---- Through the engine, against dense attention ------------------------ */",
  "",
  "typedef struct {",
  "  SiftModelSource *source;",
  "  gint64 recent;",
  "  double worst;  /* largest |o - o_ref| / max |o_ref| over calls */",
  "} Reference;",
  "",
  "/* Runner observer: the engine's output for this call against attention",
  " * over the kept blocks' tokens and the tokens not stored yet. */",
  "static void",
  "check_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)",
  "{",
  "  Reference *ref = user_data;",
  "  const SiftModelShape *s = ctx->shape;",
  "  GError *error = NULL;",
  "  gint64 n_kv = ctx->q_pos + ctx->n_q;",
  "  g_autofree float *q = g_new (float, (gsize) n_kv * s->n_q_heads * s->head_dim);",
  "  g_autofree float *k = g_new (float, (gsize) n_kv * s->n_kv_heads * s->head_dim);",
  "  g_autofree float *v = g_new (float, (gsize) n_kv * s->n_kv_heads * s->head_dim);",
  "  CHECK_OK (sift_model_source_qkv (ref->source, ctx->layer, 0, n_kv, q, k, v, &error), error);",
  "",
  "  g_autofree gint64 *rows = g_new (gint64, n_kv);",
  "  gsize n_rows = 0;",
  "  for (gint64 b = 0; b < ctx->n_blocks; b++)",
  "    for (gint64 t = 0; kept (ctx, b, ref->recent) && t < ctx->blocks[b].n_valid; t++)",
  "      rows[n_rows++] = ctx->blocks[b].first_token + t;",
  "  for (gint64 t = ctx->kv_len; t < n_kv; t++)",
  "    rows[n_rows++] = t;",
  "",
  "  SiftView q_all = sift_view_thd (q, SIFT_DTYPE_F32, n_kv, s->n_q_heads, s->head_dim);",
  "  SiftView qv = sift_view_tokens (&q_all, ctx->q_pos, ctx->n_q);",
  "  SiftView kv = sift_view_thd (k, SIFT_DTYPE_F32, n_kv, s->n_kv_heads, s->head_dim);",
  "  SiftView vv = sift_view_thd (v, SIFT_DTYPE_F32, n_kv, s->n_kv_heads, s->head_dim);",
  "  g_autofree float *o = g_new (float, (gsize) s->n_q_heads * ctx->n_q * s->head_dim);",
  "  g_autofree float *l = g_new (float, (gsize) s->n_q_heads * ctx->n_q);",
  "  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, s->n_q_heads, ctx->n_q, s->head_dim);",
  "  SiftAttnOpts opts = { .scale = s->scale, .causal = TRUE, .q_offset = ctx->q_pos };",
  "  CHECK_OK (sift_attn_gather (&qv, &kv, &vv, rows, n_rows, &opts, &ov, l, &error), error);",
  "",
  "  double max_ref = 0, max_diff = 0;",
  "  for (gint32 h = 0; h < s->n_q_heads; h++)",
  "    for (gint32 i = 0; i < ctx->n_q; i++)",
  "      {",
  "        const float *got = sift_view_row (out, h, i), *want = sift_view_row (&ov, h, i);",
  "        for (gint32 d = 0; d < s->head_dim; d++)",
  "          {",
  "            max_ref = fmax (max_ref, fabs (want[d]));",
  "            max_diff = fmax (max_diff, fabs (got[d] - want[d]));",
  "          }",
  "        float lw = l[h * ctx->n_q + i];",
  "        CHECK (fabs (lse[h * ctx->n_q + i] - lw) <= 1e-4 * fmax (1.0, fabs (lw)));",
  "      }",
  "  ref->worst = fmax (ref->worst, max_diff / fmax (max_ref, 1e-30));",
  "}",
  "",
  "/* Prefills 150 tokens (ending in a partial block) and decodes 20 (crossing",
  " * a block boundary) with the policy in both phases of both layers; returns",
  " * the fraction of KV tokens attended. */",
  "static double",
  "run_engine (SiftRegistry *reg, gint64 recent)",
  "{",
  "  GError *error = NULL;",
  "  SiftModelShape shape = { .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32,",
  "                           .block_size = 16, .chunk_size = 32, .scale = 1.0f / sqrtf (32.0f) };",
  "  /* One instance per layer, as the needle harness does. */",
  "  g_autoptr (SiftPolicy) p0 = policy_new (reg, &shape, recent);",
  "  g_autoptr (SiftPolicy) p1 = policy_new (reg, &shape, recent);",
  "  SiftPolicy *per_layer[] = { p0, p1 };",
  "  SiftStoreConfig store_config = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = shape.n_kv_heads,",
  "                                   .block_size = shape.block_size, .head_dim = shape.head_dim };",
  "  g_autoptr (SiftStore) store = sift_store_host_new (&store_config, &error);",
  "  CHECK_OK (store != NULL, error);",
  "  SiftEngineConfig engine_config = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3,",
  "                                     .pipeline = SIFT_PIPELINE_RING };",
  "  g_autoptr (SiftEngine) engine = sift_engine_new (&engine_config, store, &error);",
  "  CHECK_OK (engine != NULL, error);",
  "  g_autoptr (SiftModelSource) source = sift_model_random_new (&shape, 7);",
  "  g_autoptr (SiftRunner) runner = sift_runner_new (engine, source, per_layer, per_layer, &error);",
  "  CHECK_OK (runner != NULL, error);",
  "",
  "  Reference ref = { .source = source, .recent = recent };",
  "  SiftRunnerObserver observer = { .attention = check_attention };",
  "  sift_runner_set_observer (runner, &observer, &ref);",
  "  CHECK_OK (sift_runner_prefill (runner, 150, &error), error);",
  "  for (int i = 0; i < 20; i++)",
  "    CHECK_OK (sift_runner_decode (runner, 1, &error), error);",
  "  if (ref.worst > 1e-5)",
  "    {",
  "      fprintf (stderr, \"recent_blocks %\" G_GINT64_FORMAT \": output differs from the reference by %g\\n\",",
  "               recent, ref.worst);",
  "      exit (1);",
  "    }",
  "  SiftCounters pf, dc;",
  "  sift_engine_counters (engine, -1, SIFT_PHASE_PREFILL, &pf);",
  "  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &dc);",
  "  return (double) (pf.tokens_attended + dc.tokens_attended) / (double) (pf.tokens_available + dc.tokens_available);",
  "}",
  "",
  "int",
  "main (void)",
  "{",
  "  g_autoptr (SiftRegistry) reg = sift_registry_new (NULL);",
  "  test_selection (reg);",
  "  CHECK (run_engine (reg, 1 << 20) == 1.0);  /* every block kept: dense attention */",
  "  CHECK (run_engine (reg, 2) < 1.0);         /* fewer blocks, still exact over them */",
  "  printf (\"ok\\n\");",
  "  return 0;",
  "}",
  NULL,
};

/* meson.build */
static const char *const template_meson_build[] = {
  "# An out-of-tree sift policy: builds against an installed sift found with",
  "# pkg-config, and installs into sift's policy directory (or -Dpolicydir=DIR).",
  "project('@NAME@', 'c',",
  "  version: '1.0',",
  "  meson_version: '>= 1.0.0',",
  "  default_options: ['c_std=gnu11', 'warning_level=3', 'werror=true'])",
  "",
  "sift_dep = dependency('sift', version: '>= 0.1.0')",
  "",
  "policydir = get_option('policydir')",
  "if policydir == ''",
  "  policydir = sift_dep.get_variable(pkgconfig: 'policydir')",
  "endif",
  "",
  "plugin = shared_module('@NAME@', '@NAME@.c',",
  "  dependencies: sift_dep,",
  "  install: true,",
  "  install_dir: policydir)",
  "",
  "m_dep = meson.get_compiler('c').find_library('m', required: false)",
  "test('@NAME@', executable('test-@NAME@', 'test-@NAME@.c', dependencies: [sift_dep, m_dep]),",
  "     depends: plugin,",
  "     env: {'SIFT_POLICY_PATH': meson.current_build_dir(), 'SIFT_POLICY_SYSTEM_PATH': ''})",
  NULL,
};

/* meson_options.txt */
static const char *const template_meson_options[] = {
  "option('policydir', type: 'string', value: '',",
  "       description: 'Where to install the plugin (default: the policydir of sift.pc)')",
  NULL,
};

typedef struct {
  const char *file;             /* @NAME@ replaced */
  const char *const *lines;
} TemplateFile;

static const TemplateFile template_files[] = {
  { "@NAME@.c", template_policy_c },
  { "test-@NAME@.c", template_test_c },
  { "meson.build", template_meson_build },
  { "meson_options.txt", template_meson_options },
};

typedef struct {
  const char *key;
  const char *value;
} Subst;

static char *
expand (const char *text, const Subst *subs, gsize n_subs)
{
  GString *s = g_string_new (text);
  for (gsize i = 0; i < n_subs; i++)
    g_string_replace (s, subs[i].key, subs[i].value, 0);
  return g_string_free (s, FALSE);
}

/* Policy names are [a-z0-9_-]+ (policy.h); the skeleton also uses the name
 * for C identifiers and file names, so it must start with a letter. */
static gboolean
valid_name (const char *name)
{
  if (!g_ascii_islower (name[0]) || strlen (name) > 64)
    return FALSE;
  for (const char *p = name; *p; p++)
    if (!g_ascii_islower (*p) && !g_ascii_isdigit (*p) && *p != '-' && *p != '_')
      return FALSE;
  return TRUE;
}

static char *
camel_case (const char *name)
{
  GString *s = g_string_new (NULL);
  gboolean upper = TRUE;
  for (const char *p = name; *p; p++)
    {
      if (*p == '-' || *p == '_')
        upper = TRUE;
      else
        {
          g_string_append_c (s, upper ? g_ascii_toupper (*p) : *p);
          upper = FALSE;
        }
    }
  return g_string_free (s, FALSE);
}

int
sift_cmd_policies_new (int argc, char **argv)
{
  GOptionEntry entries[] = { G_OPTION_ENTRY_NULL };
  if (!sift_cli_parse ("policies new", "NAME [DIR] - write a skeleton policy plugin into DIR (default ./NAME)",
                       entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  if (argc < 2 || argc > 3)
    {
      fprintf (stderr, "Usage: sift policies new NAME [DIR]\n");
      return SIFT_EXIT_USAGE;
    }
  const char *name = argv[1];
  const char *dir = argc == 3 ? argv[2] : name;
  if (!valid_name (name))
    {
      fprintf (stderr, "sift policies new: invalid policy name '%s': use lower-case letters, digits, '-' and '_', "
                       "starting with a letter (at most 64)\n", name);
      return SIFT_EXIT_USAGE;
    }

  /* Same name as a policy on the search path: one would shadow the other
   * (or both load and clash), so say so before the user builds on it. */
  const SiftCliOptions no_options = { 0 };
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&no_options);
  const SiftPolicyInfo *existing = sift_registry_lookup (registry, name, NULL);
  if (existing != NULL)
    fprintf (stderr, "sift policies new: warning: a policy named '%s' already exists (%s); "
                     "choose another name unless you mean to replace it\n", name, existing->file);

  g_autofree char *ident = g_strdelimit (g_strdup (name), "-", '_');
  g_autofree char *type = camel_case (name);
  const Subst subs[] = {
    { "@NAME@", name }, { "@IDENT@", ident }, { "@TYPE@", type }, { "@SIFT_VERSION@", SIFT_VERSION_STRING },
  };

  /* Refuse before writing anything, so a clash leaves DIR as it was. */
  g_autoptr (GPtrArray) paths = g_ptr_array_new_with_free_func (g_free);
  for (gsize i = 0; i < G_N_ELEMENTS (template_files); i++)
    {
      g_autofree char *file = expand (template_files[i].file, subs, G_N_ELEMENTS (subs));
      char *path = g_build_filename (dir, file, NULL);
      g_ptr_array_add (paths, path);
      if (g_file_test (path, G_FILE_TEST_EXISTS))
        {
          fprintf (stderr, "sift policies new: %s already exists; not overwriting anything\n", path);
          return SIFT_EXIT_USAGE;
        }
    }
  if (g_mkdir_with_parents (dir, 0755) != 0)
    {
      fprintf (stderr, "sift policies new: cannot create %s: %s\n", dir, g_strerror (errno));
      return SIFT_EXIT_FAILED;
    }
  for (gsize i = 0; i < G_N_ELEMENTS (template_files); i++)
    {
      g_autofree char *lines = g_strjoinv ("\n", (char **) template_files[i].lines);
      g_autofree char *text = expand (lines, subs, G_N_ELEMENTS (subs));
      g_autofree char *with_newline = g_strconcat (text, "\n", NULL);
      g_autoptr (GError) error = NULL;
      const char *path = paths->pdata[i];
      if (!g_file_set_contents (path, with_newline, -1, &error))
        {
          fprintf (stderr, "sift policies new: %s\n", error->message);
          return SIFT_EXIT_FAILED;
        }
      printf ("wrote %s\n", path);
    }
  printf ("\nBuild and test it against the installed sift (found through pkg-config):\n"
          "  cd %s && meson setup build && meson test -C build\n"
          "Then select it in YAML (decode: %s) with SIFT_POLICY_PATH=$PWD/build, or `meson install -C build`.\n",
          dir, name);
  return SIFT_EXIT_OK;
}

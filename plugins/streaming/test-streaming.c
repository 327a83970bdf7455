/* Loads the built plugin through sift's registry (SIFT_POLICY_PATH points at
 * the build folder) and checks its selection against the rule written out
 * by hand: sink blocks and window blocks, nothing else. */
#include <stdio.h>
#include <stdlib.h>

#include <sift/sift.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf (stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit (1);                                                                \
    }                                                                          \
  } while (0)

int
main (void)
{
  GError *error = NULL;
  SiftRegistry *reg = sift_registry_new (NULL);
  const SiftPolicyInfo *info = sift_registry_lookup (reg, "streaming", &error);
  if (info == NULL)
    {
      fprintf (stderr, "%s\n", error->message);
      return 1;
    }

  SiftParams *params = sift_params_new (info->ops->params, &error);
  CHECK (params != NULL);
  CHECK (sift_params_set_text (params, "sink_tokens", "4", &error));
  CHECK (sift_params_set_text (params, "window_tokens", "64", &error));

  SiftModelShape shape = { .n_layers = 1, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                           .block_size = 16, .chunk_size = 16 };
  SiftPolicy *policy = sift_policy_new (info->ops, params, &shape, &error);
  CHECK (policy != NULL);

  /* Ten full blocks of 16 tokens; the query sits at position 160. */
  SiftBlockMeta blocks[10];
  gint64 available[10];
  for (int i = 0; i < 10; i++)
    {
      blocks[i] = (SiftBlockMeta) { .first_token = 16 * i, .n_valid = 16, .phase = SIFT_PHASE_PREFILL };
      available[i] = i;
    }
  SiftPolicyContext ctx = { .phase = SIFT_PHASE_DECODE, .block_size = 16, .kv_len = 160,
                            .q_pos = 160, .n_q = 1, .shape = &shape, .blocks = blocks,
                            .n_blocks = 10 };
  SiftSelection *sel = sift_selection_new (4, 2);
  CHECK (policy->ops->select_blocks (policy, &ctx, available, 10, sel, &error));
  CHECK (sift_selection_validate (sel, available, 10, "streaming", &error));

  /* Window [96, 160) is blocks 6..9; the sinks (tokens 0..3) are in block 0. */
  gint64 expect[] = { 0, 6, 7, 8, 9 };
  CHECK (sift_selection_n_blocks (sel) == G_N_ELEMENTS (expect));
  for (gsize i = 0; i < G_N_ELEMENTS (expect); i++)
    CHECK (sift_selection_block (sel, i) == expect[i]);

  sift_selection_free (sel);
  sift_policy_free (policy);
  sift_params_free (params);
  sift_registry_free (reg);
  printf ("1 passed, 0 failed\n");
  return 0;
}

/* sift needle [--config FILE]... [--set K=V]... [--model FILE.gguf] [--out DIR] [--policy-path DIR]...
 * The needle-in-a-haystack grid (docs/needle.md). */
#include <stdio.h>

#include <glib.h>

#include "cli.h"
#include "commands.h"
#include "gguf-model.h"
#include "harness/harness.h"

int
sift_cmd_needle (int argc, char **argv)
{
  SiftCliOptions cli = { 0 };
  g_autofree char *out_dir = NULL, *model = NULL;
  gboolean progress = FALSE;
  GOptionEntry entries[] = {
    SIFT_CLI_CONFIG_ENTRY (&cli),
    SIFT_CLI_SET_ENTRY (&cli),
    { "model", 'm', 0, G_OPTION_ARG_FILENAME, &model,
      "Run the grid on this GGUF model with text needles (model.source gguf, model.path FILE)", "FILE" },
    { "out", 'o', 0, G_OPTION_ARG_FILENAME, &out_dir, "Write records and heatmaps to DIR (default: harness.out)",
      "DIR" },
    SIFT_CLI_POLICY_PATH_ENTRY (&cli),
    { "progress", 0, 0, G_OPTION_ARG_NONE, &progress, "Draw the progress line even when stderr is not a terminal",
      NULL },
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("needle", "- run the needle-in-a-haystack grid", entries, &argc, &argv))
    {
      sift_cli_options_clear (&cli);
      return SIFT_EXIT_USAGE;
    }
  if (argc > 1)
    {
      /* `sift needle configs/x.yaml` would silently run the default config. */
      fprintf (stderr, "sift needle: unexpected argument '%s' (a config file is given with --config FILE)\n", argv[1]);
      sift_cli_options_clear (&cli);
      return SIFT_EXIT_USAGE;
    }
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&cli);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) config = sift_cli_load_config (&cli, registry, sift_cli_default_config (), &error);
  sift_cli_options_clear (&cli);
  if (config == NULL)
    return sift_cli_fail ("needle", error);
  if (model != NULL)
    {
      g_free (config->source);
      config->source = g_strdup ("gguf");
      SiftGgufConfig *gguf = sift_config_edit_section (config, &sift_gguf_config_section);
      g_free (gguf->path);
      gguf->path = g_strdup (model);
    }
  HarnessOptions opts = { .out_dir = out_dir, .table = stdout, .log = stderr, .force_progress = progress };
  gboolean below = FALSE;
  if (!harness_needle_run (config, &opts, &below, &error))
    {
      /* A grid the model cannot hold, or records that cannot be resumed:
       * the input needs fixing, like a config error. */
      if (g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID)
          || g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_RECORDS))
        {
          fprintf (stderr, "sift needle: %s\n", error->message);
          return SIFT_EXIT_USAGE;
        }
      return sift_cli_fail ("needle", error);
    }
  return below ? SIFT_EXIT_BELOW : SIFT_EXIT_OK;
}

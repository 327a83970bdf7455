/* sift config check FILE... [--set KEY=VALUE]...: prints the resolved
 * config, or the errors (exit 2). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

int
sift_cmd_config (int argc, char **argv)
{
  SiftCliOptions opts = { 0 };
  GOptionEntry entries[] = {
    SIFT_CLI_POLICY_PATH_ENTRY (&opts),
    SIFT_CLI_SET_ENTRY (&opts),
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("config", "check FILE... - check YAML configs and print the resolved one", entries, &argc,
                       &argv))
    return SIFT_EXIT_USAGE;
  if (argc < 3 || strcmp (argv[1], "check") != 0)
    {
      fprintf (stderr, "Usage: sift config check FILE... [--set KEY=VALUE]... [--policy-path DIR]...\n");
      sift_cli_options_clear (&opts);
      return SIFT_EXIT_USAGE;
    }
  /* The files are the positional arguments: --config's storage takes them. */
  opts.configs = g_strdupv (argv + 2);
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&opts);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) config = sift_cli_load_config (&opts, registry, NULL, &error);
  sift_cli_options_clear (&opts);
  if (config == NULL)
    return sift_cli_fail ("config", error);
  g_autofree char *yaml = sift_config_to_yaml (config);
  fputs (yaml, stdout);
  return SIFT_EXIT_OK;
}

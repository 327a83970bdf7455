/* sift — command-line entry: dispatches to a subcommand. */
#include <locale.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "cli.h"
#include "harness-config.h"
#include "commands.h"

typedef struct {
  const char *name;
  int (*run) (int argc, char **argv);
  const char *summary;
} Command;

static const Command commands[] = {
  { "needle", sift_cmd_needle, "run the needle-in-a-haystack grid" },
  { "policies", sift_cmd_policies, "list policies, or show one's parameters" },
  { "config", sift_cmd_config, "check a YAML config" },
  { "bench", sift_cmd_bench, "benchmarks: peak, attention, offload, policy" },
  { "model", sift_cmd_model, "describe a GGUF model (model info FILE.gguf)" },
  { "generate", sift_cmd_generate, "generate text from a GGUF model through the engine" },
  { "version", sift_cmd_version, "print the version" },
};

static void
usage (FILE *to)
{
  fprintf (to, "Usage: sift COMMAND [ARGS...]\n\nCommands:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (commands); i++)
    fprintf (to, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf (to, "\nRun 'sift COMMAND --help' for a command's options.\n");
}

int
main (int argc, char **argv)
{
  setlocale (LC_ALL, "");
  /* The config sections of the model sources and the harness (libsift has
   * registered the engine's). */
  sift_harness_config_register ();
  if (argc < 2 || strcmp (argv[1], "--help") == 0 || strcmp (argv[1], "-h") == 0)
    {
      usage (argc < 2 ? stderr : stdout);
      return argc < 2 ? 2 : 0;
    }
  if (strcmp (argv[1], "--version") == 0)
    return sift_cmd_version (argc - 1, argv + 1);
  for (gsize i = 0; i < G_N_ELEMENTS (commands); i++)
    if (strcmp (argv[1], commands[i].name) == 0)
      return sift_cli_done (commands[i].name, commands[i].run (argc - 1, argv + 1));
  fprintf (stderr, "sift: unknown command '%s'\n\n", argv[1]);
  usage (stderr);
  return 2;
}

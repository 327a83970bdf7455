/* Helpers shared by the sift subcommands: the option storage every command
 * parses (--policy-path, --config, --set), the policy registry built from
 * it, configs loaded from it, and errors printed with the exit status
 * they call for.
 *
 *   SiftCliOptions opts = { 0 };
 *   GOptionEntry entries[] = {
 *     SIFT_CLI_POLICY_PATH_ENTRY (&opts), SIFT_CLI_CONFIG_ENTRY (&opts), SIFT_CLI_SET_ENTRY (&opts),
 *     G_OPTION_ENTRY_NULL,
 *   };
 *   if (!sift_cli_parse ("needle", "[--config FILE]...", entries, &argc, &argv))
 *     return SIFT_EXIT_USAGE;
 *   g_autoptr (SiftRegistry) registry = sift_cli_registry (&opts);
 *   g_autoptr (GError) error = NULL;
 *   g_autoptr (SiftConfig) config = sift_cli_load_config (&opts, registry, sift_cli_default_config (), &error);
 *   if (config == NULL)
 *     return sift_cli_fail ("needle", error);
 *   ...
 *   sift_cli_options_clear (&opts);
 */
#pragma once

#include <glib.h>
#include <sift/config.h>
#include <sift/registry.h>

G_BEGIN_DECLS

enum {
  SIFT_EXIT_OK = 0,
  SIFT_EXIT_BELOW = 1,   /* ran, but the result is below the configured target */
  SIFT_EXIT_USAGE = 2,   /* usage, config or plugin error */
  SIFT_EXIT_FAILED = 3,  /* a run failed (engine, store, model, harness error) */
};

typedef struct {
  char **policy_paths;   /* --policy-path DIR, repeatable: searched before SIFT_POLICY_PATH */
  char **configs;        /* --config FILE, repeatable: later files merge over earlier ones */
  char **sets;           /* --set KEY=VALUE, repeatable: applied after every file, checked once */
} SiftCliOptions;

#define SIFT_CLI_POLICY_PATH_ENTRY(opts)                                                             \
  { "policy-path", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &(opts)->policy_paths,                         \
    "Search DIR for policy plugins before SIFT_POLICY_PATH (repeatable)", "DIR" }
#define SIFT_CLI_CONFIG_ENTRY(opts)                                                                  \
  { "config", 'c', 0, G_OPTION_ARG_FILENAME_ARRAY, &(opts)->configs,                                 \
    "YAML config; several are merged in order, their policy setups side by side (repeatable)", "FILE" }
#define SIFT_CLI_SET_ENTRY(opts)                                                                     \
  { "set", 's', 0, G_OPTION_ARG_FILENAME_ARRAY, &(opts)->sets, /* bytes as given: YAML checks them */ \
    "Override a key: kv.block_size=128, policy.decode.params.token_budget=1024, "                    \
    "policies.LABEL.decode=quest (repeatable)", "KEY=VALUE" }

void sift_cli_options_clear (SiftCliOptions *opts);

/* Parses argv (argv[0] is the command's name) against entries; on a usage
 * error prints it with a hint to stderr and returns FALSE (exit
 * SIFT_EXIT_USAGE). --help prints the help and exits 0. */
gboolean sift_cli_parse (const char *command, const char *parameter_string, const GOptionEntry *entries,
                         int *argc, char ***argv);

/* The registry: opts->policy_paths, then SIFT_POLICY_PATH, then the
 * installed policy directory (for a sift run from its build tree: the build
 * tree's policy directories, unless SIFT_POLICY_SYSTEM_PATH is set). */
SiftRegistry *sift_cli_registry (const SiftCliOptions *opts);

/* Loads opts->configs (the first, then each later one merged over it), or
 * default_file when none is given (or the built-in defaults when that is
 * NULL too), then applies opts->sets; policies resolved in registry. */
SiftConfig *sift_cli_load_config (const SiftCliOptions *opts, SiftRegistry *registry, const char *default_file,
                                  GError **error);

/* configs/default.yaml: $SIFT_DEFAULT_CONFIG, else the source tree's copy
 * when it exists (an uninstalled build), else the installed example. */
const char *sift_cli_default_config (void);

/* Prints the error to stderr and returns its exit status: config and plugin
 * errors verbatim ("file:line:col: message", source line, caret) with
 * SIFT_EXIT_USAGE; others as "sift COMMAND: message" with SIFT_EXIT_FAILED. */
int sift_cli_fail (const char *command, const GError *error);

/* Flushes stdout (main calls it after every command): a command whose
 * output could not be written (a full disk, a closed pipe) says so and
 * returns SIFT_EXIT_FAILED, or its own status when that already fails. */
int sift_cli_done (const char *command, int status);

G_END_DECLS

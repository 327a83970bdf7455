/* Helpers shared by the sift subcommands (see cli.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sift/error.h>

#include "cli.h"
#include "sift-paths.h"

void
sift_cli_options_clear (SiftCliOptions *opts)
{
  g_clear_pointer (&opts->policy_paths, g_strfreev);
  g_clear_pointer (&opts->configs, g_strfreev);
  g_clear_pointer (&opts->sets, g_strfreev);
}

gboolean
sift_cli_parse (const char *command, const char *parameter_string, const GOptionEntry *entries, int *argc,
                char ***argv)
{
  g_autoptr (GOptionContext) ctx = g_option_context_new (parameter_string);
  g_autofree char *prgname = g_strdup_printf ("sift %s", command);
  g_set_prgname (prgname);
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx, argc, argv, &error))
    {
      fprintf (stderr, "sift %s: %s\nRun 'sift %s --help' for the options.\n", command, error->message, command);
      return FALSE;
    }
  return TRUE;
}

/* Run from the build tree (not installed), sift uses the build tree's
 * policies in place of the installed directory, unless
 * SIFT_POLICY_SYSTEM_PATH says otherwise. */
static void
use_build_tree_policies (void)
{
  if (g_getenv ("SIFT_POLICY_SYSTEM_PATH") != NULL || SIFT_BUILD_POLICY_PATH[0] == '\0')
    return;
  g_autofree char *self = g_file_read_link ("/proc/self/exe", NULL);
  if (self != NULL && strcmp (self, SIFT_BUILD_EXE) == 0)
    g_setenv ("SIFT_POLICY_SYSTEM_PATH", SIFT_BUILD_POLICY_PATH, TRUE);
}

SiftRegistry *
sift_cli_registry (const SiftCliOptions *opts)
{
  use_build_tree_policies ();
  return sift_registry_new ((const char *const *) opts->policy_paths);
}

SiftConfig *
sift_cli_load_config (const SiftCliOptions *opts, SiftRegistry *registry, const char *default_file,
                      GError **error)
{
  g_autoptr (SiftConfig) config = NULL;
  if (opts->configs != NULL && opts->configs[0] != NULL)
    {
      config = sift_config_load (opts->configs[0], registry, error);
      for (gsize i = 1; config != NULL && opts->configs[i] != NULL; i++)
        if (!sift_config_merge_file (config, opts->configs[i], registry, error))
          return NULL;
    }
  else if (default_file != NULL)
    config = sift_config_load (default_file, registry, error);
  else
    config = sift_config_new_default (registry, error);
  if (config == NULL)
    return NULL;
  if (!sift_config_apply (config, (const char *const *) opts->sets, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

const char *
sift_cli_default_config (void)
{
  static char *path;
  if (path != NULL)
    return path;
  const char *env = g_getenv ("SIFT_DEFAULT_CONFIG");
  if (env != NULL && *env != '\0')
    path = g_strdup (env);
  else if (g_file_test (SIFT_SOURCE_CONFIG_DIR "/default.yaml", G_FILE_TEST_IS_REGULAR))
    path = g_strdup (SIFT_SOURCE_CONFIG_DIR "/default.yaml");
  else
    path = g_strdup (SIFT_CONFIG_DIR "/default.yaml");
  return path;
}

int
sift_cli_fail (const char *command, const GError *error)
{
  if (error->domain == SIFT_CONFIG_ERROR || error->domain == SIFT_PLUGIN_ERROR || error->domain == G_OPTION_ERROR)
    {
      fprintf (stderr, "%s\n", error->message);
      return SIFT_EXIT_USAGE;
    }
  fprintf (stderr, "sift %s: %s\n", command, error->message);
  return SIFT_EXIT_FAILED;
}

int
sift_cli_done (const char *command, int status)
{
  int err = fflush (stdout) != 0 ? errno : 0;
  if (err == 0 && !ferror (stdout))
    return status;
  /* An earlier write may have failed: its errno is gone by now. */
  fprintf (stderr, "sift %s: cannot write the output: %s\n", command,
           err != 0 ? g_strerror (err) : "a write to standard output failed");
  return status != SIFT_EXIT_OK ? status : SIFT_EXIT_FAILED;
}

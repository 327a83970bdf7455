/* sift policies [list | info NAME]: what the search path provides;
 * `sift policies new` is in cmd-policies-new.c. */
#include <stdio.h>
#include <string.h>

#include <sift/params.h>
#include <sift/registry.h>

#include "cli.h"
#include "commands.h"

static char *
phases (guint32 flags)
{
  const char *p = (flags & SIFT_POLICY_SUPPORTS_PREFILL) ? "prefill" : NULL;
  const char *d = (flags & SIFT_POLICY_SUPPORTS_DECODE) ? "decode" : NULL;
  return g_strdup_printf ("%s%s%s", p ? p : "", p && d ? "," : "", d ? d : "");
}

static const char *
flag_text (guint32 flags)
{
  gboolean sel = (flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) != 0;
  gboolean acc = (flags & SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION) != 0;
  return sel && acc ? "selects-blocks,accumulated-attention"
         : sel      ? "selects-blocks"
         : acc      ? "accumulated-attention"
                    : "-";
}

static const char *
type_text (SiftParamType type)
{
  static const char *const names[] = { "int", "float", "bool", "string", "choice", "int-list" };
  return (guint) type < G_N_ELEMENTS (names) ? names[type] : "?";
}

static void
print_failures (GPtrArray *failures)
{
  for (guint i = 0; i < failures->len; i++)
    fprintf (stderr, "sift policies: warning: %s\n", ((GError *) failures->pdata[i])->message);
}

static int
list (SiftRegistry *registry)
{
  g_autoptr (GPtrArray) failures = g_ptr_array_new_with_free_func ((GDestroyNotify) g_error_free);
  g_autoptr (GPtrArray) infos = sift_registry_list (registry, failures, NULL);
  print_failures (failures);
  if (infos->len == 0)
    {
      g_autofree char *dirs = g_strjoinv (G_SEARCHPATH_SEPARATOR_S, (char **) sift_registry_search_path (registry));
      fprintf (stderr, "sift policies: no policies found in %s\n", *dirs ? dirs : "(empty search path)");
      return SIFT_EXIT_OK;
    }
  printf ("%-14s %-15s %-15s %-8s %s\n", "NAME", "PHASES", "FLAGS", "VERSION", "DESCRIPTION");
  for (guint i = 0; i < infos->len; i++)
    {
      const SiftPolicyInfo *info = infos->pdata[i];
      g_autofree char *ph = phases (info->ops->flags);
      printf ("%-14s %-15s %-15s %-8s %s\n", info->ops->name, ph, flag_text (info->ops->flags),
              info->ops->version ? info->ops->version : "-", info->ops->description ? info->ops->description : "");
      printf ("%-14s %s\n", "", info->file);
    }
  return SIFT_EXIT_OK;
}

static int
info (SiftRegistry *registry, const char *name)
{
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, name, &error);
  if (info == NULL)
    return sift_cli_fail ("policies", error);
  const SiftPolicyOps *ops = info->ops;
  g_autofree char *ph = phases (ops->flags);
  printf ("%s %s: %s\n", ops->name, ops->version ? ops->version : "", ops->description ? ops->description : "");
  printf ("  file:     %s\n", info->file);
  printf ("  phases:   %s\n", ph);
  printf ("  flags:    %s\n", flag_text (ops->flags));
  printf ("  abi:      %u.%u (ops table %u bytes)\n", ops->abi_major, ops->abi_minor, ops->struct_size);
  printf ("  methods: ");
  struct { const char *name; gboolean set; } methods[] = {
    { "init", ops->init != NULL }, { "finalize", ops->finalize != NULL }, { "reset", ops->reset != NULL },
    { "select_blocks", ops->select_blocks != NULL },
    { "compute_chunked_prefill", ops->compute_chunked_prefill != NULL },
    { "compute_chunked_decode", ops->compute_chunked_decode != NULL },
    { "on_prefill_offload", ops->on_prefill_offload != NULL },
    { "on_decode_offload", ops->on_decode_offload != NULL },
    { "score_eviction", ops->score_eviction != NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (methods); i++)
    if (methods[i].set)
      printf (" %s", methods[i].name);
  printf ("\n");
  if (ops->params == NULL || ops->params[0].name == NULL)
    {
      printf ("  params:   none\n");
      return SIFT_EXIT_OK;
    }
  printf ("  params:\n    %-20s %-9s %-12s %-22s %s\n", "NAME", "TYPE", "DEFAULT", "RANGE", "DOC");
  for (const SiftParamSpec *p = ops->params; p->name; p++)
    {
      g_autofree char *range = NULL;
      g_autofree char *def = sift_param_spec_default_text (p);
      if (p->type == SIFT_PARAM_TYPE_CHOICE)
        range = g_strjoinv ("|", (char **) p->choices);
      else if (p->type == SIFT_PARAM_TYPE_FLOAT)
        range = g_strdup_printf ("[%g, %g]", p->min, p->max);
      else if (p->type == SIFT_PARAM_TYPE_INT || p->type == SIFT_PARAM_TYPE_INT_LIST)
        range = g_strdup_printf ("[%.0f, %.0f]", p->min, p->max);
      else
        range = g_strdup ("-");
      printf ("    %-20s %-9s %-12s %-22s %s\n", p->name, type_text (p->type), def, range, p->doc ? p->doc : "");
    }
  return SIFT_EXIT_OK;
}

int
sift_cmd_policies (int argc, char **argv)
{
  if (argc >= 2 && strcmp (argv[1], "new") == 0)
    return sift_cmd_policies_new (argc - 1, argv + 1);
  SiftCliOptions opts = { 0 };
  GOptionEntry entries[] = {
    SIFT_CLI_POLICY_PATH_ENTRY (&opts),
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("policies", "[list | info NAME | new NAME [DIR]] - the policies on the search path", entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&opts);
  sift_cli_options_clear (&opts);
  if (argc < 2 || (strcmp (argv[1], "list") == 0 && argc == 2))
    return list (registry);
  if (strcmp (argv[1], "info") == 0 && argc == 3)
    return info (registry, argv[2]);
  fprintf (stderr, "Usage: sift policies [list | info NAME] [--policy-path DIR]...\n       sift policies new NAME [DIR]\n");
  return SIFT_EXIT_USAGE;
}

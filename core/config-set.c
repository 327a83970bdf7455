/* --set: "section.key=value" assignments, checked like the file. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

/* ---- --set ---------------------------------------------------------------------- */

/* One path component of an assignment, with its column for errors. */
typedef struct {
  char *name;
  Origin at;
} Part;

static Setup *
find_setup (Config *cfg, const Part *label, GError **error)
{
  g_autoptr (GPtrArray) labels = g_ptr_array_new ();
  for (guint i = 0; i < cfg->pub.setups->len; i++)
    {
      Setup *s = cfg->pub.setups->pdata[i];
      if (strcmp (s->pub.label, label->name) == 0)
        return s;
      g_ptr_array_add (labels, s->pub.label);
    }
  g_autofree char *hint = sift_config_suggestion (label->name, (const char *const *) labels->pdata, labels->len);
  g_ptr_array_add (labels, NULL);
  g_autofree char *all = g_strjoinv (", ", (char **) labels->pdata);
  FAIL (UNKNOWN_KEY, &label->at, "no setup labelled '%s' (setups: %s)%s", label->name, all, hint);
  return NULL;
}

static const Key *
find_key (const Key *table, const Part *part, const char *path, GError **error)
{
  for (const Key *k = table; k->name; k++)
    if (strcmp (k->name, part->name) == 0)
      return k;
  g_autofree char *hint = sift_config_key_suggestion (part->name, table);
  if (path == NULL)
    FAIL (UNKNOWN_KEY, &part->at, "unknown section '%s'%s", part->name, hint);
  else
    FAIL (UNKNOWN_KEY, &part->at, "unknown key '%s' in %s%s", part->name, path, hint);
  return NULL;
}

static gboolean
declares (const SiftParams *params, const char *name)
{
  for (const SiftParamSpec *spec = sift_params_specs (params); spec != NULL && spec->name; spec++)
    if (strcmp (spec->name, name) == 0)
      return TRUE;
  return FALSE;
}

/* policy.X... (every setup) or policies.LABEL.X... (one setup). */
static gboolean
set_in_setup (Ctx *c, Setup *s, Part *parts, gsize n, yaml_node_t *value, const char *path, gboolean *skipped,
              GError **error)
{
  if (n == 0)
    {
      FAIL (MISSING, &parts[-1].at, "%s: name a key of the setup (label, prefill, decode, dense_layers, capacity_tokens)", path);
      return FALSE;
    }
  const Key *k = find_key (sift_config_setup_keys, &parts[0], path, error);
  if (k == NULL)
    return FALSE;
  g_autofree char *sub = g_strdup_printf ("%s.%s", path, k->name);
  if (n == 1)
    return sift_config_assign_setup (c, s, k, value, sub, error);
  int phase = k->type != KEY_CHOICE ? -1 : k->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1;
  if (phase < 0 || strcmp (parts[1].name, "params") != 0 || n != 3)
    {
      const Part *bad = phase < 0 || strcmp (parts[1].name, "params") != 0 ? &parts[1] : &parts[n > 3 ? 3 : 1];
      FAIL (UNKNOWN_KEY, &bad->at, "%s: only %s.params.NAME can be set below %s", sub, sub, k->name);
      return FALSE;
    }
  RawParam *r = g_new0 (RawParam, 1);
  g_autofree char *ppath = g_strdup_printf ("%s.params.%s", sub, parts[2].name);
  if (!sift_config_param_text (c, value, ppath, &r->text, error))
    {
      g_free (r);
      return FALSE;
    }
  r->key = g_strdup (parts[2].name);
  r->key_at = parts[2].at;
  r->value_at = sift_config_origin_of (c, value);
  SiftPolicyChoice *choice = sift_config_setup_choice (s, phase);
  if (skipped != NULL && choice->params != NULL && !declares (choice->params, r->key))
    {
      /* policy.X.params.P: setups whose policy lacks P are left alone. */
      *skipped = TRUE;
      sift_config_raw_param_free (r);
      return TRUE;
    }
  if (choice->params != NULL && !sift_config_apply_param (choice, sub, r, error))
    {
      sift_config_raw_param_free (r);
      return FALSE;
    }
  sift_config_raw_put (s->raw[phase], r);
  return TRUE;
}

/* section.key... = value: walks down the registered sections to the key
 * (a section takes a mapping). */
static gboolean
set_in_sections (Ctx *c, const Part *part, gsize n, yaml_node_t *value, GError **error)
{
  g_autofree char *path = NULL;
  for (gsize i = 0; i < n; i++)
    {
      gpointer values = NULL;
      const Key *k = sift_config_find_key (c->cfg, path, part[i].name, &values);
      char *longer = path ? g_strdup_printf ("%s.%s", path, part[i].name) : g_strdup (part[i].name);
      if (k != NULL && i + 1 < n)
        {
          FAIL (UNKNOWN_KEY, &part[i + 1].at, "%s is not a section; it has no key '%s'", longer, part[i + 1].name);
          g_free (longer);
          return FALSE;
        }
      if (k != NULL)
        {
          gboolean ok = sift_config_assign (c, k, values, TRUE, value, longer, error);
          g_free (longer);
          return ok;
        }
      if (!sift_config_is_section (c->cfg, path, part[i].name))
        {
          g_autofree char *hint = sift_config_path_suggestion (c->cfg, path, part[i].name);
          if (path == NULL)
            FAIL (UNKNOWN_KEY, &part[i].at, "unknown section '%s'%s", part[i].name, hint);
          else
            FAIL (UNKNOWN_KEY, &part[i].at, "unknown key '%s' in %s%s", part[i].name, path, hint);
          g_free (longer);
          return FALSE;
        }
      g_free (path);
      path = longer;
    }
  if (value->type != YAML_MAPPING_NODE)
    {
      Origin at = sift_config_origin_of (c, value);
      FAIL (TYPE, &at, "%s: expected a mapping, got %s", path, sift_config_node_kind (value));
      return FALSE;
    }
  return sift_config_parse_mapping (c, value, NULL, NULL, path, error);
}

static gboolean
set_one (Config *cfg, const char *assignment, SiftRegistry *registry, GError **error)
{
  const Source *src = sift_config_add_source (cfg, "--set", assignment);
  const char *eq = strchr (assignment, '=');
  Origin whole = { src, 1, 1, ++cfg->seq };
  if (eq == NULL || eq == assignment)
    {
      FAIL (SYNTAX, &whole, "expected KEY=VALUE (e.g. kv.block_size=128)");
      return FALSE;
    }
  /* Split the key into parts, each with its column. */
  g_autoptr (GArray) parts = g_array_new (FALSE, TRUE, sizeof (Part));
  for (const char *p = assignment; p < eq;)
    {
      const char *dot = memchr (p, '.', (gsize) (eq - p));
      const char *end = dot ? dot : eq;
      Part part = { g_strndup (p, (gsize) (end - p)), { src, 1, (gint) (p - assignment) + 1, ++cfg->seq } };
      g_array_append_val (parts, part);
      p = end + 1;
      if (*part.name == '\0')
        {
          g_autofree char *key = g_strndup (assignment, (gsize) (eq - assignment));
          FAIL (SYNTAX, &part.at, "'%s' has an empty component", key);
          for (guint i = 0; i < parts->len; i++)
            g_free (g_array_index (parts, Part, i).name);
          return FALSE;
        }
    }
  Part *part = (Part *) (void *) parts->data;
  gsize n = parts->len;

  yaml_document_t doc;
  gint col_offset = (gint) (eq + 1 - assignment);
  gboolean loaded = sift_config_load_document (src, eq + 1, col_offset, &doc, error);
  gboolean ok = loaded;
  yaml_node_t *value = ok ? yaml_document_get_root_node (&doc) : NULL;
  Ctx c = { cfg, src, &doc, col_offset, registry, NULL, NULL };
  if (ok && value == NULL)
    {
      Origin at = { src, 1, col_offset + 1, ++cfg->seq };
      FAIL (TYPE, &at, "no value after '='");
      ok = FALSE;
    }
  g_autofree char *path = NULL;
  const Key *k = NULL;
  for (const Key *r = sift_config_root_keys; ok && r->name != NULL; r++)
    if (strcmp (r->name, part[0].name) == 0)
      k = r;
  if (ok && k == NULL)
    ok = set_in_sections (&c, part, n, value, error);
  else if (ok && n == 1)
    {
      /* policy=VALUE / policies=VALUE: replace every setup. */
      g_ptr_array_set_size (cfg->pub.setups, 0);
      cfg->implied_setup = FALSE;
      ok = sift_config_parse_setups_key (&c, k, value, value, error);
      g_free ((gpointer) c.setup_key_at);
    }
  else if (ok && k->type == KEY_SETUP)
    {
      /* A parameter goes to every setup whose policy declares it; when
       * none does, the first setup reports it (with the nearest name). */
      guint applied = 0;
      for (guint i = 0; ok && i < cfg->pub.setups->len; i++)
        {
          gboolean skipped = FALSE;
          ok = set_in_setup (&c, cfg->pub.setups->pdata[i], part + 1, n - 1, value, "policy", &skipped, error);
          applied += ok && !skipped;
        }
      if (ok && applied == 0)
        ok = set_in_setup (&c, cfg->pub.setups->pdata[0], part + 1, n - 1, value, "policy", NULL, error);
    }
  else if (ok)
    {
      Setup *s = n >= 2 ? find_setup (cfg, &part[1], error) : NULL;
      path = n >= 2 ? g_strdup_printf ("policies.%s", part[1].name) : NULL;
      ok = s != NULL && set_in_setup (&c, s, part + 2, n - 2, value, path, NULL, error);
    }
  for (guint i = 0; i < parts->len; i++)
    g_free (part[i].name);
  if (loaded)
    yaml_document_delete (&doc);
  return ok;
}

gboolean
sift_config_apply (SiftConfig *config, const char *const *assignments, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL, FALSE);
  for (gsize i = 0; assignments != NULL && assignments[i] != NULL; i++)
    if (!set_one ((Config *) config, assignments[i], registry, error))
      return FALSE;
  return sift_config_validate ((Config *) config, registry, error);
}

gboolean
sift_config_set (SiftConfig *config, const char *assignment, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL && assignment != NULL, FALSE);
  const char *const one[] = { assignment, NULL };
  return sift_config_apply (config, one, registry, error);
}

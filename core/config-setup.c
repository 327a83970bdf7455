/* The config's policy setups: `policy` / `policies`, each phase's choice
 * and raw params, resolved against the registry. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

/* ---- Setups ----------------------------------------------------------------- */

void
sift_config_raw_param_free (gpointer data)
{
  RawParam *r = data;
  g_free (r->key);
  g_free (r->text);
  g_free (r);
}

static void
choice_clear (SiftPolicyChoice *choice)
{
  g_clear_pointer (&choice->name, g_free);
  g_clear_pointer (&choice->params, sift_params_free);
  choice->ops = NULL;
}

Setup *
sift_config_setup_new (const char *where)
{
  Setup *s = g_new0 (Setup, 1);
  s->where = g_strdup (where);
  /* The setup table's defaults (the label is derived when validated). */
  for (const Key *k = sift_config_setup_keys; k->name != NULL; k++)
    if (k->type == KEY_CHOICE)
      G_STRUCT_MEMBER (SiftPolicyChoice, s, k->offset).name = g_strdup (k->def);
    else if (k->type != KEY_LABEL)
      sift_config_key_default (k, s);
  for (int p = 0; p < 2; p++)
    s->raw[p] = g_ptr_array_new_with_free_func (sift_config_raw_param_free);
  return s;
}

void
sift_config_setup_free (gpointer data)
{
  Setup *s = data;
  g_free (s->pub.label);
  g_free (s->where);
  choice_clear (&s->pub.prefill);
  choice_clear (&s->pub.decode);
  g_free (s->pub.dense_layers);
  for (int p = 0; p < 2; p++)
    g_ptr_array_unref (s->raw[p]);
  g_free (s);
}

SiftPolicyChoice *
sift_config_setup_choice (Setup *s, int phase)
{
  return phase == 0 ? &s->pub.prefill : &s->pub.decode;
}

/* Sets one raw param on a resolved choice, with the error at its node. */
gboolean
sift_config_apply_param (const SiftPolicyChoice *choice, const char *path, const RawParam *r, GError **error)
{
  GError *local = NULL;
  if (sift_params_set_text (choice->params, r->key, r->text, &local))
    return TRUE;
  const Origin *at = local->code == SIFT_CONFIG_ERROR_PARAM ? &r->key_at : &r->value_at;
  FAIL (PARAM, at, "%s.params.%s: policy '%s': %s", path, r->key, choice->name, local->message);
  g_error_free (local);
  return FALSE;
}

/* Looks the choice's policy up, checks its phase and validates its params. */
gboolean
sift_config_resolve_choice (Setup *s, int phase, SiftRegistry *registry, const char *fallback, GError **error)
{
  SiftPolicyChoice *choice = sift_config_setup_choice (s, phase);
  const Origin *at = s->choice_at[phase].src ? &s->choice_at[phase] : NULL;
  g_autofree char *path = g_strdup_printf ("%s.%s", s->where, sift_config_phase_names[phase]);
  GError *local = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, choice->name, &local);
  if (info == NULL)
    {
      if (g_error_matches (local, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN))
        sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_UNKNOWN_POLICY, at, fallback, "%s: %s", path,
                 local->message);
      else
        sift_config_fail_at (error, local->domain, local->code, at, fallback, "%s: policy '%s' cannot be loaded: %s", path,
                 choice->name, local->message);
      g_error_free (local);
      return FALSE;
    }
  guint32 need = phase == 0 ? SIFT_POLICY_SUPPORTS_PREFILL : SIFT_POLICY_SUPPORTS_DECODE;
  if (!(info->ops->flags & need))
    {
      sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_PHASE, at, fallback,
               "%s: policy '%s' does not support %s (it supports only %s)", path, choice->name,
               sift_config_phase_names[phase], sift_config_phase_names[1 - phase]);
      return FALSE;
    }
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &local);
  if (params == NULL)
    {
      sift_config_fail_at (error, local->domain, local->code, at, fallback, "%s: %s: %s", path, info->file, local->message);
      g_error_free (local);
      return FALSE;
    }
  g_clear_pointer (&choice->params, sift_params_free);
  choice->params = g_steal_pointer (&params);
  choice->ops = info->ops;
  for (guint i = 0; i < s->raw[phase]->len; i++)
    if (!sift_config_apply_param (choice, path, s->raw[phase]->pdata[i], error))
      return FALSE;
  return TRUE;
}

/* A YAML node as param text: a scalar, or a flow list of scalars. */
gboolean
sift_config_param_text (Ctx *c, yaml_node_t *node, const char *path, char **out, GError **error)
{
  if (node->type == YAML_SCALAR_NODE)
    {
      *out = g_strdup (sift_config_scalar (node));
      return TRUE;
    }
  Origin at = sift_config_origin_of (c, node);
  if (node->type != YAML_SEQUENCE_NODE)
    {
      FAIL (PARAM, &at, "%s: expected a scalar or a list, got a mapping", path);
      return FALSE;
    }
  GString *s = g_string_new ("[");
  for (yaml_node_item_t *i = node->data.sequence.items.start; i < node->data.sequence.items.top; i++)
    {
      yaml_node_t *item = yaml_document_get_node (c->doc, *i);
      if (item->type != YAML_SCALAR_NODE)
        {
          Origin item_at = sift_config_origin_of (c, item);
          FAIL (PARAM, &item_at, "%s: list elements must be scalars, got %s", path, sift_config_node_kind (item));
          g_string_free (s, TRUE);
          return FALSE;
        }
      g_string_append_printf (s, "%s%s", i == node->data.sequence.items.start ? "" : ", ", sift_config_scalar (item));
    }
  g_string_append_c (s, ']');
  *out = g_string_free (s, FALSE);
  return TRUE;
}

void
sift_config_raw_put (GPtrArray *raw, RawParam *r)
{
  for (guint i = 0; i < raw->len; i++)
    if (strcmp (((RawParam *) raw->pdata[i])->key, r->key) == 0)
      {
        g_ptr_array_remove_index (raw, i);
        break;
      }
  g_ptr_array_add (raw, r);
}

static gboolean
parse_params (Ctx *c, Setup *s, int phase, yaml_node_t *map, const char *path, GError **error)
{
  if (map->type != YAML_MAPPING_NODE)
    {
      Origin at = sift_config_origin_of (c, map);
      FAIL (TYPE, &at, "%s.params: expected a mapping of parameter names to values, got %s", path,
            sift_config_node_kind (map));
      return FALSE;
    }
  /* name -> its key node: many parameters cost linear time, not quadratic. */
  g_autoptr (GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
    {
      yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
      yaml_node_t *value = yaml_document_get_node (c->doc, p->value);
      Origin key_at = sift_config_origin_of (c, key);
      if (key->type != YAML_SCALAR_NODE)
        {
          FAIL (TYPE, &key_at, "%s.params: parameter names are scalars, got %s", path, sift_config_node_kind (key));
          return FALSE;
        }
      const yaml_node_t *prev = g_hash_table_lookup (seen, sift_config_scalar (key));
      if (prev != NULL)
        {
          FAIL (DUPLICATE_KEY, &key_at, "%s.params: duplicate parameter '%s' (first given at line %d)", path,
                sift_config_scalar (key), (int) prev->start_mark.line + 1);
          return FALSE;
        }
      g_hash_table_insert (seen, (gpointer) sift_config_scalar (key), key);
      g_autofree char *ppath = g_strdup_printf ("%s.params.%s", path, sift_config_scalar (key));
      RawParam *r = g_new0 (RawParam, 1);
      if (!sift_config_param_text (c, value, ppath, &r->text, error))
        {
          g_free (r);
          return FALSE;
        }
      r->key = g_strdup (sift_config_scalar (key));
      r->key_at = key_at;
      r->value_at = sift_config_origin_of (c, value);
      g_ptr_array_add (s->raw[phase], r); /* emptied by parse_choice; the names are distinct */
    }
  return TRUE;
}

/* prefill: NAME, or {name: NAME, params: {...}}: replaces the phase's choice. */
static gboolean
parse_choice (Ctx *c, Setup *s, int phase, yaml_node_t *node, const char *path, GError **error)
{
  yaml_node_t *name = NULL, *params = NULL;
  Origin at = sift_config_origin_of (c, node);
  if (node->type == YAML_SCALAR_NODE)
    name = node;
  else if (node->type == YAML_MAPPING_NODE)
    {
      static const char *const keys[] = { "name", "params" };
      for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++)
        {
          yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
          Origin key_at = sift_config_origin_of (c, key);
          const char *k = sift_config_scalar (key);
          yaml_node_t **slot = k && strcmp (k, "name") == 0 ? &name : k && strcmp (k, "params") == 0 ? &params : NULL;
          if (slot == NULL)
            {
              g_autofree char *hint = k ? sift_config_suggestion (k, keys, 2) : g_strdup ("");
              FAIL (UNKNOWN_KEY, &key_at, "%s: unknown key '%s' (a policy takes name and params)%s", path,
                    k ? k : sift_config_node_kind (key), hint);
              return FALSE;
            }
          if (*slot != NULL)
            {
              FAIL (DUPLICATE_KEY, &key_at, "%s: duplicate key '%s'", path, k);
              return FALSE;
            }
          *slot = yaml_document_get_node (c->doc, p->value);
        }
      if (name == NULL)
        {
          FAIL (MISSING, &at, "%s: a policy mapping needs 'name'", path);
          return FALSE;
        }
    }
  else
    {
      FAIL (TYPE, &at, "%s: expected a policy name or {name: ..., params: {...}}, got a list", path);
      return FALSE;
    }
  g_autofree char *what = g_strdup_printf ("%s.name", path);
  if (!sift_config_expect_scalar (c, name, node == name ? path : what, "a policy name", error))
    return FALSE;
  Origin name_at = sift_config_origin_of (c, name);
  if (!sift_policy_name_valid (sift_config_scalar (name)))
    {
      FAIL (TYPE, &name_at, "%s: '%s' is not a policy name ([a-z0-9_-]+)", path, sift_config_scalar (name));
      return FALSE;
    }
  SiftPolicyChoice *choice = sift_config_setup_choice (s, phase);
  choice_clear (choice);
  choice->name = g_strdup (sift_config_scalar (name));
  g_ptr_array_set_size (s->raw[phase], 0);
  s->choice_at[phase] = name_at;
  if (params != NULL && !parse_params (c, s, phase, params, path, error))
    return FALSE;
  if (c->registry != NULL)
    return sift_config_resolve_choice (s, phase, c->registry, NULL, error);
  return TRUE;
}

gboolean
sift_config_assign_setup (Ctx *c, Setup *s, const Key *k, yaml_node_t *node, const char *path, GError **error)
{
  if (k->type == KEY_CHOICE)
    return parse_choice (c, s, k->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1, node, path, error);
  if (!sift_config_assign (c, k, s, FALSE, node, path, error))
    return FALSE;
  if (k->type == KEY_LABEL)
    {
      s->label_given = TRUE;
      s->label_at = sift_config_origin_of (c, node);
    }
  else
    s->dense_at = sift_config_origin_of (c, node);
  return TRUE;
}

static void
add_setup (Config *cfg, Setup *s)
{
  if (cfg->implied_setup)
    {
      g_ptr_array_set_size (cfg->pub.setups, 0);
      cfg->implied_setup = FALSE;
    }
  g_ptr_array_add (cfg->pub.setups, s);
}

static gboolean
parse_setup (Ctx *c, yaml_node_t *node, const char *path, GError **error)
{
  if (node->type != YAML_MAPPING_NODE)
    {
      Origin at = sift_config_origin_of (c, node);
      FAIL (TYPE, &at, "%s: expected a mapping (label, prefill, decode, dense_layers, capacity_tokens), got %s", path,
            sift_config_node_kind (node));
      return FALSE;
    }
  Setup *s = sift_config_setup_new (path);
  s->at = sift_config_origin_of (c, node);
  add_setup (c->cfg, s);
  return sift_config_parse_mapping (c, node, sift_config_setup_keys, s, path, error);
}

gboolean
sift_config_parse_setups_key (Ctx *c, const Key *k, yaml_node_t *key, yaml_node_t *value, GError **error)
{
  Origin key_at = sift_config_origin_of (c, key);
  if (c->setup_key != NULL)
    {
      FAIL (INVALID, &key_at, "give either 'policy' (one setup) or 'policies' (a list), not both ('%s' is at line %d)",
            c->setup_key, c->setup_key_at->line);
      return FALSE;
    }
  c->setup_key = k->name;
  c->setup_key_at = g_memdup2 (&key_at, sizeof key_at);
  if (k->type == KEY_SETUP)
    return parse_setup (c, value, "policy", error);
  if (value->type != YAML_SEQUENCE_NODE)
    {
      Origin at = sift_config_origin_of (c, value);
      FAIL (TYPE, &at, "policies: expected a list of setups, got %s", sift_config_node_kind (value));
      return FALSE;
    }
  if (value->data.sequence.items.top == value->data.sequence.items.start)
    {
      Origin at = sift_config_origin_of (c, value);
      FAIL (MISSING, &at, "policies: the list is empty; give at least one setup");
      return FALSE;
    }
  gsize i = 0;
  for (yaml_node_item_t *it = value->data.sequence.items.start; it < value->data.sequence.items.top; it++, i++)
    {
      g_autofree char *path = g_strdup_printf ("policies[%" G_GSIZE_FORMAT "]", i);
      if (!parse_setup (c, yaml_document_get_node (c->doc, *it), path, error))
        return FALSE;
    }
  return TRUE;
}

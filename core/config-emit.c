/* The resolved config as YAML, written from the same key tables. */
#include <string.h>

#include "config-private.h"
#include "params-private.h"

static void
indent (GString *out, int depth)
{
  for (int i = 0; i < depth; i++)
    g_string_append (out, "  ");
}

static void
emit_value (GString *out, const Key *k, gconstpointer base)
{
  gconstpointer field = (const char *) base + k->offset;
  switch ((int) k->type)
    {
    case KEY_INT: g_string_append_printf (out, "%" G_GINT64_FORMAT, *(const gint64 *) field); break;
    case KEY_INT32: g_string_append_printf (out, "%d", *(const gint32 *) field); break;
    case KEY_UINT64: g_string_append_printf (out, "%" G_GUINT64_FORMAT, *(const guint64 *) field); break;
    case KEY_FLOAT:
      {
        g_autofree char *t = sift_float_to_text (*(const double *) field);
        g_string_append (out, t);
        break;
      }
    case KEY_BOOL: g_string_append (out, *(const gboolean *) field ? "true" : "false"); break;
    case KEY_STRING:
    case KEY_SOURCE:
    case KEY_LABEL:
      {
        const char *s = *(char *const *) field;
        g_autofree char *t = sift_yaml_quote (s ? s : "");
        g_string_append (out, t);
        break;
      }
    case KEY_ENUM:
      for (gsize i = 0; k->values[i].name; i++)
        if (k->values[i].value == *(const int *) field)
          g_string_append (out, k->values[i].name);
      break;
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST:
      {
        gconstpointer values = *(const gconstpointer *) field;
        gsize n = *(const gsize *) (gconstpointer) ((const char *) base + k->count_offset);
        g_string_append_c (out, '[');
        for (gsize i = 0; i < n; i++)
          {
            if (i)
              g_string_append (out, ", ");
            if (k->type == KEY_INT_LIST)
              g_string_append_printf (out, "%" G_GINT64_FORMAT, ((const gint64 *) values)[i]);
            else
              {
                g_autofree char *t = sift_float_to_text (((const double *) values)[i]);
                g_string_append (out, t);
              }
          }
        g_string_append_c (out, ']');
        break;
      }
    default:
      g_assert_not_reached ();
    }
}

static void
emit_choice (GString *out, const char *key, const Setup *s, int phase, int depth)
{
  const SiftPolicyChoice *choice = phase == 0 ? &s->pub.prefill : &s->pub.decode;
  gboolean has_params = choice->params ? sift_params_specs (choice->params) != NULL
                                           && sift_params_specs (choice->params)[0].name != NULL
                                       : s->raw[phase]->len > 0;
  indent (out, depth);
  if (!has_params)
    {
      g_string_append_printf (out, "%s: %s\n", key, choice->name);
      return;
    }
  g_string_append_printf (out, "%s:\n", key);
  indent (out, depth + 1);
  g_string_append_printf (out, "name: %s\n", choice->name);
  indent (out, depth + 1);
  g_string_append (out, "params:\n");
  if (choice->params != NULL)
    for (const SiftParamSpec *spec = sift_params_specs (choice->params); spec->name; spec++)
      {
        g_autofree char *t = sift_params_to_text (choice->params, spec->name);
        indent (out, depth + 2);
        g_string_append_printf (out, "%s: %s\n", spec->name, t);
      }
  else
    for (guint i = 0; i < s->raw[phase]->len; i++)
      {
        const RawParam *r = s->raw[phase]->pdata[i];
        indent (out, depth + 2);
        g_string_append_printf (out, "%s: %s\n", r->key, r->text);
      }
}

static void
emit_setups (GString *out, const SiftConfig *config)
{
  g_string_append (out, "policies:\n");
  for (guint i = 0; i < config->setups->len; i++)
    {
      const Setup *s = config->setups->pdata[i];
      g_string_append (out, "  - ");
      for (const Key *sk = sift_config_setup_keys; sk->name; sk++)
        {
          if (sk != sift_config_setup_keys)
            indent (out, 2);
          if (sk->type == KEY_CHOICE)
            {
              g_string_truncate (out, out->len - 4);
              emit_choice (out, sk->name, s, sk->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1, 2);
              continue;
            }
          g_string_append_printf (out, "%s: ", sk->name);
          emit_value (out, sk, s);
          g_string_append_c (out, '\n');
        }
    }
}

static void
emit_key (GString *out, const Config *cfg, const Key *k, gconstpointer values, int depth)
{
  indent (out, depth);
  if (KEY_HOLDS_STRING (k) && *(char *const *) (gconstpointer) ((const char *) values + k->offset) == NULL)
    {
      g_string_append_printf (out, "# %s: (unset)\n", k->name);
      return;
    }
  g_string_append_printf (out, "%s: ", k->name);
  if (values == (gconstpointer) cfg && k->offset == G_STRUCT_OFFSET (Config, scale))
    {
      /* model.scale as resolved (0 given: 1/sqrt(head_dim)). */
      g_autofree char *t = sift_float_to_text (cfg->pub.shape.scale);
      g_string_append (out, t);
    }
  else
    emit_value (out, k, values);
  g_string_append_c (out, '\n');
}

/* The next component of a section path below `path` (NULL: the top), or NULL. */
static char *
child_of (const char *section_path, const char *path)
{
  const char *below = section_path;
  if (path != NULL)
    {
      gsize len = strlen (path);
      if (strncmp (section_path, path, len) != 0 || section_path[len] != '.')
        return NULL;
      below = section_path + len + 1;
    }
  return g_strndup (below, strcspn (below, "."));
}

/* The keys at `path`, then its sections, each in section order. */
static void
emit_section (GString *out, const Config *cfg, const char *path, int depth)
{
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      if (strcmp (in->section->path, path) == 0)
        for (const Key *k = in->section->keys; k->name; k++)
          emit_key (out, cfg, k, in->values, depth);
    }
  g_autoptr (GPtrArray) done = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      char *child = child_of (in->section->path, path);
      if (child == NULL || g_ptr_array_find_with_equal_func (done, child, g_str_equal, NULL))
        {
          g_free (child);
          continue;
        }
      g_ptr_array_add (done, child);
      g_autofree char *sub = g_strdup_printf ("%s.%s", path, child);
      indent (out, depth);
      g_string_append_printf (out, "%s:\n", child);
      emit_section (out, cfg, sub, depth + 1);
    }
}

char *
sift_config_to_yaml (const SiftConfig *config)
{
  g_return_val_if_fail (config != NULL, NULL);
  const Config *cfg = (const Config *) config;
  GString *out = g_string_new (NULL);
  g_string_append_printf (out, "# sift config, resolved from %s\n", config->file);
  /* Sections by order; the policy setups between those below 500 and the rest. */
  g_autoptr (GPtrArray) done = g_ptr_array_new_with_free_func (g_free);
  gboolean setups_written = FALSE;
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      char *top = child_of (in->section->path, NULL);
      if (g_ptr_array_find_with_equal_func (done, top, g_str_equal, NULL))
        {
          g_free (top);
          continue;
        }
      g_ptr_array_add (done, top);
      if (!setups_written && in->section->order >= 500)
        {
          emit_setups (out, config);
          setups_written = TRUE;
        }
      g_string_append_printf (out, "%s:\n", top);
      emit_section (out, cfg, top, 1);
    }
  if (!setups_written)
    emit_setups (out, config);
  return g_string_free (out, FALSE);
}

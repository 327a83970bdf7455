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
  switch (k->type)
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
emit_table (GString *out, const Key *table, gconstpointer base, const SiftConfig *config, int depth)
{
  for (const Key *k = table; k->name; k++)
    {
      if (k->type == KEY_SETUP)
        continue; /* written as `policies` */
      if (k->type == KEY_SETUPS)
        {
          g_string_append (out, "policies:\n");
          for (guint i = 0; i < config->setups->len; i++)
            {
              const Setup *s = config->setups->pdata[i];
              indent (out, depth);
              g_string_append (out, "  - ");
              for (const Key *sk = sift_config_setup_keys; sk->name; sk++)
                {
                  if (sk != sift_config_setup_keys)
                    indent (out, depth + 2);
                  if (sk->type == KEY_CHOICE)
                    {
                      g_string_truncate (out, out->len - 2 * (gsize) (depth + 2));
                      emit_choice (out, sk->name, s, sk->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1,
                                   depth + 2);
                      continue;
                    }
                  g_string_append_printf (out, "%s: ", sk->name);
                  emit_value (out, sk, s);
                  g_string_append_c (out, '\n');
                }
            }
          continue;
        }
      indent (out, depth);
      if (k->type == KEY_SECTION)
        {
          g_string_append_printf (out, "%s:\n", k->name);
          emit_table (out, k->section, base, config, depth + 1);
          continue;
        }
      if (k->offset == G_STRUCT_OFFSET (Config, store_path) && config->store_path == NULL)
        {
          /* Unset: derived from the output directory in use, so not pinned here. */
          g_autofree char *d = g_build_filename (config->harness.out_dir, "kv.store", NULL);
          g_string_append_printf (out, "# %s: %s  (default: <harness.out>/kv.store)\n", k->name, d);
          continue;
        }
      g_string_append_printf (out, "%s: ", k->name);
      if (k->offset == G_STRUCT_OFFSET (Config, scale))
        {
          g_autofree char *t = sift_float_to_text (config->shape.scale);
          g_string_append (out, t);
        }
      else if (k->offset == G_STRUCT_OFFSET (Config, store_path))
        {
          g_autofree char *t = sift_yaml_quote (config->store_path);
          g_string_append (out, t);
        }
      else
        emit_value (out, k, base);
      g_string_append_c (out, '\n');
    }
}

char *
sift_config_to_yaml (const SiftConfig *config)
{
  g_return_val_if_fail (config != NULL, NULL);
  GString *out = g_string_new (NULL);
  g_string_append_printf (out, "# sift config, resolved from %s\n", config->file);
  emit_table (out, sift_config_root_keys, config, config, 0);
  return g_string_free (out, FALSE);
}

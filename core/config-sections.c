/* Config sections: the tables their owners register, each config's values
 * for them, defaults from the tables' text, and lookups by dotted path. */
#include <stdlib.h>
#include <string.h>

#include "config-private.h"

static GMutex registered_lock;
static GPtrArray *registered; /* const SiftConfigSection *, in registration order */

/* One owner's section, also where a process holds two copies of its table:
 * a test that links libsift statically beside plugins that load the shared
 * library runs both copies' constructors.  A path alone is not enough (core
 * and engine/ each own keys under "kv"), so the order, the size of the
 * values and the first key must agree too. */
static gboolean
same_section (const SiftConfigSection *a, const SiftConfigSection *b)
{
  return a == b
         || (strcmp (a->path, b->path) == 0 && a->order == b->order && a->size == b->size
             && g_strcmp0 (a->keys[0].name, b->keys[0].name) == 0);
}

void
sift_config_register_section (const SiftConfigSection *section)
{
  g_return_if_fail (section != NULL && section->path != NULL && section->keys != NULL && section->size > 0);
  g_mutex_lock (&registered_lock);
  if (registered == NULL)
    registered = g_ptr_array_new ();
  /* Registering a section twice registers it once, also when the second is
   * another copy of the same owner's table (same_section). */
  gboolean known = FALSE;
  for (guint i = 0; i < registered->len && !known; i++)
    known = same_section (registered->pdata[i], section);
  if (!known)
    g_ptr_array_add (registered, (gpointer) section);
  g_mutex_unlock (&registered_lock);
}

/* ---- Model sources ---------------------------------------------------------- */

static GPtrArray *model_sources; /* const SiftConfigModelSource *, in registration order */

void
sift_config_register_model_source (const SiftConfigModelSource *source)
{
  g_return_if_fail (source != NULL && source->name != NULL && source->name[0] != '\0');
  g_mutex_lock (&registered_lock);
  if (model_sources == NULL)
    model_sources = g_ptr_array_new ();
  gboolean known = FALSE;
  for (guint i = 0; i < model_sources->len && !known; i++)
    known = strcmp (((const SiftConfigModelSource *) model_sources->pdata[i])->name, source->name) == 0;
  if (!known)
    g_ptr_array_add (model_sources, (gpointer) source);
  g_mutex_unlock (&registered_lock);
}

EnumValue *
sift_config_model_sources (void)
{
  g_mutex_lock (&registered_lock);
  guint n = model_sources != NULL ? model_sources->len : 0;
  EnumValue *values = g_new0 (EnumValue, n + 1);
  for (guint i = 0; i < n; i++)
    values[i] = (EnumValue) { ((const SiftConfigModelSource *) model_sources->pdata[i])->name, (int) i };
  g_mutex_unlock (&registered_lock);
  return values;
}

/* The name of the registered default source, or NULL. */
static const char *
model_source_default (void)
{
  const char *name = NULL;
  g_mutex_lock (&registered_lock);
  for (guint i = 0; model_sources != NULL && i < model_sources->len && name == NULL; i++)
    {
      const SiftConfigModelSource *s = model_sources->pdata[i];
      if (s->is_default)
        name = s->name;
    }
  g_mutex_unlock (&registered_lock);
  return name;
}

static gint
by_order (gconstpointer a, gconstpointer b)
{
  const SiftConfigSection *x = *(const SiftConfigSection *const *) a, *y = *(const SiftConfigSection *const *) b;
  return (x->order > y->order) - (x->order < y->order);
}

GPtrArray *
sift_config_sections (void)
{
  GPtrArray *all = g_ptr_array_new ();
  for (gsize i = 0; i < sift_config_n_core_sections; i++)
    g_ptr_array_add (all, (gpointer) &sift_config_core_sections[i]);
  g_mutex_lock (&registered_lock);
  for (guint i = 0; registered != NULL && i < registered->len; i++)
    g_ptr_array_add (all, registered->pdata[i]);
  g_mutex_unlock (&registered_lock);
  g_ptr_array_sort (all, by_order); /* stable: core's first among equals */
  return all;
}

/* ---- Values ------------------------------------------------------------------ */

static gboolean
is_core (const SiftConfigSection *section)
{
  return section >= sift_config_core_sections && section < sift_config_core_sections + sift_config_n_core_sections;
}

static gpointer
parse_list (const Key *k, const char *text, gsize *n_out)
{
  gboolean integer = k->type == KEY_INT_LIST;
  g_autofree char *inner = g_strstrip (g_strdup (text));
  g_assert (inner[0] == '[' && inner[strlen (inner) - 1] == ']');
  inner[strlen (inner) - 1] = '\0';
  g_auto (GStrv) items = g_strsplit (inner + 1, ",", -1);
  gsize n = 0;
  gsize elem = integer ? sizeof (gint64) : sizeof (double);
  guint8 *values = g_malloc0 (elem * (g_strv_length (items) + 1));
  for (gsize i = 0; items[i] != NULL; i++)
    {
      g_strstrip (items[i]);
      if (items[i][0] == '\0')
        continue;
      if (integer)
        ((gint64 *) (void *) values)[n++] = g_ascii_strtoll (items[i], NULL, 10);
      else
        ((double *) (void *) values)[n++] = g_ascii_strtod (items[i], NULL);
    }
  *n_out = n;
  if (n == 0)
    g_clear_pointer (&values, g_free);
  return values;
}

void
sift_config_key_default (const Key *k, gpointer values)
{
  gpointer field = (char *) values + k->offset;
  const char *def = k->def;
  g_assert (def != NULL || KEY_HOLDS_STRING (k));
  switch ((int) k->type)
    {
    case KEY_INT: *(gint64 *) field = g_ascii_strtoll (def, NULL, 10); break;
    case KEY_INT32: *(gint32 *) field = (gint32) g_ascii_strtoll (def, NULL, 10); break;
    case KEY_UINT64: *(guint64 *) field = g_ascii_strtoull (def, NULL, 10); break;
    case KEY_FLOAT: *(double *) field = g_ascii_strtod (def, NULL); break;
    case KEY_BOOL: *(gboolean *) field = strcmp (def, "true") == 0; break;
    case KEY_STRING:
      g_free (*(char **) field);
      *(char **) field = g_strdup (def);
      break;
    case KEY_SOURCE:
      g_free (*(char **) field);
      *(char **) field = g_strdup (model_source_default ());
      break;
    case KEY_ENUM:
      {
        gsize i = 0;
        while (k->values[i].name != NULL && strcmp (k->values[i].name, def) != 0)
          i++;
        g_assert (k->values[i].name != NULL); /* a default is one of its values */
        *(int *) field = k->values[i].value;
        break;
      }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST:
      g_free (*(gpointer *) field);
      *(gpointer *) field = parse_list (k, def, (gsize *) (void *) ((char *) values + k->count_offset));
      break;
    default:
      g_assert_not_reached ();
    }
}

void
sift_config_section_init (const SiftConfigSection *section, gpointer values)
{
  g_return_if_fail (section != NULL && values != NULL);
  for (const Key *k = section->keys; k->name != NULL; k++)
    sift_config_key_default (k, values);
}

void
sift_config_section_clear (const SiftConfigSection *section, gpointer values)
{
  g_return_if_fail (section != NULL);
  if (values == NULL)
    return;
  for (const Key *k = section->keys; k->name != NULL; k++)
    if (KEY_HOLDS_STRING (k) || k->type == KEY_INT_LIST || k->type == KEY_FLOAT_LIST)
      g_clear_pointer ((gpointer *) (void *) ((char *) values + k->offset), g_free);
}

/* Strings and lists of a copied struct become its own. */
static void
section_own (const SiftConfigSection *section, gpointer values)
{
  for (const Key *k = section->keys; k->name != NULL; k++)
    {
      gpointer *field = (gpointer *) (void *) ((char *) values + k->offset);
      if (KEY_HOLDS_STRING (k))
        *field = g_strdup (*field);
      else if (k->type == KEY_INT_LIST || k->type == KEY_FLOAT_LIST)
        {
          gsize n = *(gsize *) (void *) ((char *) values + k->count_offset);
          gsize elem = k->type == KEY_INT_LIST ? sizeof (gint64) : sizeof (double);
          *field = *field != NULL ? g_memdup2 (*field, elem * n) : NULL;
        }
    }
}

void
sift_config_instances_init (Config *cfg)
{
  g_autoptr (GPtrArray) all = sift_config_sections ();
  cfg->instances = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; i < all->len; i++)
    {
      const SiftConfigSection *section = all->pdata[i];
      Instance *in = g_new0 (Instance, 1);
      in->section = section;
      in->owned = !is_core (section);
      in->values = in->owned ? g_malloc0 (section->size) : (gpointer) cfg;
      sift_config_section_init (section, in->values);
      g_ptr_array_add (cfg->instances, in);
    }
}

void
sift_config_instances_free (Config *cfg)
{
  for (guint i = 0; cfg->instances != NULL && i < cfg->instances->len; i++)
    {
      Instance *in = cfg->instances->pdata[i];
      sift_config_section_clear (in->section, in->values);
      if (in->owned)
        g_free (in->values);
    }
  g_clear_pointer (&cfg->instances, g_ptr_array_unref);
}

/* The copy's instances, with each remembered origin moved to the copy's value. */
void
sift_config_instances_copy (Config *to, const Config *from)
{
  to->instances = g_ptr_array_new_with_free_func (g_free);
  to->origins = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  for (guint i = 0; i < from->instances->len; i++)
    {
      const Instance *src = from->instances->pdata[i];
      Instance *in = g_new0 (Instance, 1);
      in->section = src->section;
      in->owned = src->owned;
      in->values = in->owned ? g_memdup2 (src->values, src->section->size) : (gpointer) to;
      section_own (in->section, in->values); /* core's: the fields copied with the Config */
      g_ptr_array_add (to->instances, in);
    }
  GHashTableIter it;
  gpointer addr, origin;
  g_hash_table_iter_init (&it, from->origins);
  while (g_hash_table_iter_next (&it, &addr, &origin))
    for (guint i = 0; i < from->instances->len; i++)
      {
        const Instance *src = from->instances->pdata[i];
        gsize size = src->owned ? src->section->size : sizeof (Config);
        const char *base = src->values;
        if ((const char *) addr >= base && (const char *) addr < base + size)
          {
            const Instance *dst = to->instances->pdata[i];
            g_hash_table_insert (to->origins, (char *) dst->values + ((const char *) addr - base),
                                 g_memdup2 (origin, sizeof (Origin)));
            break;
          }
      }
}

gconstpointer
sift_config_get_section (const SiftConfig *config, const SiftConfigSection *section)
{
  g_return_val_if_fail (config != NULL && section != NULL, NULL);
  const Config *cfg = (const Config *) config;
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      if (same_section (in->section, section))
        return in->values;
    }
  return NULL;
}

gpointer
sift_config_edit_section (SiftConfig *config, const SiftConfigSection *section)
{
  return (gpointer) sift_config_get_section (config, section);
}

/* ---- Lookups by path ---------------------------------------------------------- */

const Key *
sift_config_find_key (const Config *cfg, const char *path, const char *name, gpointer *values)
{
  for (guint i = 0; path != NULL && i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      if (strcmp (in->section->path, path) != 0)
        continue;
      for (const Key *k = in->section->keys; k->name != NULL; k++)
        if (strcmp (k->name, name) == 0)
          {
            if (values != NULL)
              *values = in->values;
            return k;
          }
    }
  return NULL;
}

gboolean
sift_config_is_section (const Config *cfg, const char *path, const char *name)
{
  g_autofree char *full = path != NULL ? g_strdup_printf ("%s.%s", path, name) : g_strdup (name);
  gsize len = strlen (full);
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const char *p = ((const Instance *) cfg->instances->pdata[i])->section->path;
      if (strncmp (p, full, len) == 0 && (p[len] == '\0' || p[len] == '.'))
        return TRUE;
    }
  return FALSE;
}

char *
sift_config_path_suggestion (const Config *cfg, const char *path, const char *name)
{
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  gsize len = path != NULL ? strlen (path) : 0;
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const SiftConfigSection *section = ((const Instance *) cfg->instances->pdata[i])->section;
      if (g_strcmp0 (section->path, path) == 0)
        for (const Key *k = section->keys; k->name != NULL; k++)
          g_ptr_array_add (names, g_strdup (k->name));
      /* The next component of a section below path. */
      const char *below = path == NULL ? section->path
                          : strncmp (section->path, path, len) == 0 && section->path[len] == '.' ? section->path + len + 1
                          : NULL;
      if (below != NULL)
        g_ptr_array_add (names, g_strndup (below, strcspn (below, ".")));
    }
  for (const Key *k = sift_config_root_keys; path == NULL && k->name != NULL; k++)
    g_ptr_array_add (names, g_strdup (k->name));
  return sift_config_suggestion (name, (const char *const *) names->pdata, names->len);
}

gpointer
sift_config_value_at (const Config *cfg, const char *path, const Key **key)
{
  const char *dot = strrchr (path, '.');
  if (dot == NULL)
    return NULL;
  g_autofree char *section = g_strndup (path, (gsize) (dot - path));
  gpointer values = NULL;
  const Key *k = sift_config_find_key (cfg, section, dot + 1, &values);
  if (k == NULL)
    return NULL;
  if (key != NULL)
    *key = k;
  return (char *) values + k->offset;
}

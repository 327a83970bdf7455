/* The policy registry: scans the search path, opens modules on demand.
 *
 * Scanning only lists file names; a module is opened when a lookup needs
 * it (the module whose file name matches the policy name first, then the
 * others) or when a listing asks for everything. Opened modules are kept in
 * a process-wide table, reference-counted across registries and made
 * resident, so ops tables stay valid however long a policy lives. */
#include <elf.h>
#include <link.h>
#include <string.h>

#include <gmodule.h>
#include <sift/registry.h>

#include "nearest.h"
#include "registry-private.h"

#ifndef SIFT_POLICY_DIR
#error "SIFT_POLICY_DIR must be defined by the build"
#endif

#if __SIZEOF_POINTER__ == 8
#define ELF_CLASS_HOST ELFCLASS64
#else
#define ELF_CLASS_HOST ELFCLASS32
#endif

/* ---- Process-wide table of opened modules -------------------------------- */

typedef struct {
  int ref;                         /* registries holding it; under loaded_lock */
  char *path;
  GModule *module;                 /* resident */
  const SiftPolicyOps *const *ops; /* NULL-terminated, checked */
} Loaded;

static GMutex loaded_lock;
static GHashTable *loaded_table; /* path -> Loaded * */

static void
loaded_unref (Loaded *l)
{
  g_mutex_lock (&loaded_lock);
  if (--l->ref == 0)
    {
      g_hash_table_remove (loaded_table, l->path);
      /* Resident: closing drops GLib's reference, the code stays mapped. */
      g_module_close (l->module);
      g_free (l->path);
      g_free (l);
    }
  g_mutex_unlock (&loaded_lock);
}

static gboolean
check_module (GModule *module, const char *path, const SiftPolicyOps *const **ops_out, GError **error)
{
  gpointer symbol = NULL;
  if (!g_module_symbol (module, SIFT_PLUGIN_ENTRY_SYMBOL, &symbol) || symbol == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_NOT_PLUGIN,
                   "%s: not a sift plugin (no entry symbol '%s'; define it with SIFT_PLUGIN_DEFINE)", path,
                   SIFT_PLUGIN_ENTRY_SYMBOL);
      return FALSE;
    }
  /* dlsym's object pointer to a function pointer: ISO C needs the copy. */
  SiftPluginEntryFunc entry;
  G_STATIC_ASSERT (sizeof entry == sizeof symbol);
  memcpy (&entry, &symbol, sizeof entry);
  const SiftPolicyOps *const *ops = entry ();
  if (ops == NULL || ops[0] == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, "%s: the plugin lists no policies", path);
      return FALSE;
    }
  for (gsize i = 0; ops[i] != NULL; i++)
    {
      if (!sift_policy_ops_check (ops[i], path, error))
        return FALSE;
      for (gsize j = 0; j < i; j++)
        if (strcmp (ops[i]->name, ops[j]->name) == 0)
          {
            g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_DUPLICATE,
                         "%s: policy '%s' is listed twice in one plugin", path, ops[i]->name);
            return FALSE;
          }
    }
  *ops_out = ops;
  return TRUE;
}

/* The loader maps a shared object's segments as its program headers say;
 * one that reaches past the end of a truncated file faults with SIGBUS
 * inside dlopen. Checks that every segment and header lies within the
 * file first. Not an ELF file, or one of another class, is left to the
 * loader, whose message says so. */
static gboolean
check_elf_extent (const char *path, GError **error)
{
  g_autoptr (GMappedFile) map = g_mapped_file_new (path, FALSE, NULL);
  if (map == NULL)
    return TRUE; /* the loader reports why it cannot be read */
  const guint8 *data = (const guint8 *) g_mapped_file_get_contents (map);
  const gsize size = g_mapped_file_get_length (map);
  ElfW (Ehdr) eh;
  if (size < sizeof eh || memcmp (data, ELFMAG, SELFMAG) != 0 || data[EI_CLASS] != ELF_CLASS_HOST)
    return TRUE;
  memcpy (&eh, data, sizeof eh);
  const guint64 ph_end = (guint64) eh.e_phoff + (guint64) eh.e_phnum * eh.e_phentsize;
  gboolean ok = eh.e_phentsize == sizeof (ElfW (Phdr)) && ph_end <= size;
  guint64 end = ph_end;
  for (gsize i = 0; ok && i < eh.e_phnum; i++)
    {
      ElfW (Phdr) ph;
      memcpy (&ph, data + eh.e_phoff + i * sizeof ph, sizeof ph);
      if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC)
        continue;
      end = (guint64) ph.p_offset + ph.p_filesz;
      ok = end >= ph.p_offset && end <= size;
    }
  if (ok)
    return TRUE;
  g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_OPEN,
               "%s: cannot open: truncated or corrupt shared object (its headers reach byte %" G_GUINT64_FORMAT
               ", the file has %" G_GSIZE_FORMAT " bytes)", path, end, size);
  return FALSE;
}

/* Opens and checks a module, or takes another reference to it. */
static Loaded *
loaded_get (const char *path, GError **error)
{
  g_mutex_lock (&loaded_lock);
  if (loaded_table == NULL)
    loaded_table = g_hash_table_new (g_str_hash, g_str_equal);
  Loaded *l = g_hash_table_lookup (loaded_table, path);
  if (l != NULL)
    {
      l->ref++;
      g_mutex_unlock (&loaded_lock);
      return l;
    }
  GError *local = NULL;
  if (!check_elf_extent (path, error))
    {
      g_mutex_unlock (&loaded_lock);
      return NULL;
    }
  GModule *module = g_module_open_full (path, G_MODULE_BIND_LAZY | G_MODULE_BIND_LOCAL, &local);
  if (module == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_OPEN, "%s: cannot open: %s", path,
                   local ? local->message : g_module_error ());
      g_clear_error (&local);
      g_mutex_unlock (&loaded_lock);
      return NULL;
    }
  const SiftPolicyOps *const *ops = NULL;
  if (!check_module (module, path, &ops, error))
    {
      g_module_close (module);
      g_mutex_unlock (&loaded_lock);
      return NULL;
    }
  g_module_make_resident (module);
  l = g_new0 (Loaded, 1);
  l->ref = 1;
  l->path = g_strdup (path);
  l->module = module;
  l->ops = ops;
  g_hash_table_insert (loaded_table, l->path, l);
  g_mutex_unlock (&loaded_lock);
  return l;
}

/* ---- Registry ------------------------------------------------------------ */

typedef enum {
  MODULE_UNTRIED,
  MODULE_LOADED,
  MODULE_FAILED,
} ModuleState;

typedef struct {
  char *path;
  char *stem;          /* file name without lib/sift-/policy- prefixes and suffix, '-' as '_' */
  ModuleState state;
  Loaded *loaded;      /* MODULE_LOADED */
  GError *error;       /* MODULE_FAILED */
  GPtrArray *infos;    /* SiftPolicyInfo *, owned */
} Module;

struct _SiftRegistry {
  GStrv search_path;
  GPtrArray *modules;     /* Module *, search order */
  GHashTable *by_name;    /* policy name -> SiftPolicyInfo * (borrowed from its module) */
  GHashTable *ambiguous;  /* policy name -> GError * (SIFT_PLUGIN_ERROR_DUPLICATE) */
};

static void
module_free (gpointer data)
{
  Module *m = data;
  if (m->loaded != NULL)
    loaded_unref (m->loaded);
  g_clear_error (&m->error);
  g_ptr_array_unref (m->infos);
  g_free (m->path);
  g_free (m->stem);
  g_free (m);
}

static char *
normalize (const char *name)
{
  char *s = g_strdup (name);
  g_strdelimit (s, "-", '_');
  return s;
}

static char *
stem_of (const char *basename)
{
  g_autofree char *s = g_strndup (basename, strlen (basename) - strlen ("." G_MODULE_SUFFIX));
  const char *p = s;
  static const char *const prefixes[] = { "lib", "sift-", "sift_", "policy-", "policy_" };
  for (gsize i = 0; i < G_N_ELEMENTS (prefixes); i++)
    if (g_str_has_prefix (p, prefixes[i]) && strlen (p) > strlen (prefixes[i]))
      p += strlen (prefixes[i]);
  return normalize (p);
}

static gint
cmp_str (gconstpointer a, gconstpointer b)
{
  return strcmp (*(const char *const *) a, *(const char *const *) b);
}

/* A table's string keys, sorted (borrowed). */
static GPtrArray *
sorted_keys (GHashTable *table)
{
  GPtrArray *names = g_ptr_array_new ();
  GHashTableIter it;
  gpointer key;
  g_hash_table_iter_init (&it, table);
  while (g_hash_table_iter_next (&it, &key, NULL))
    g_ptr_array_add (names, key);
  g_ptr_array_sort (names, cmp_str);
  return names;
}

static void
scan_dir (SiftRegistry *r, const char *dir, GHashTable *seen)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  if (d == NULL)
    return;
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    if (g_str_has_suffix (name, "." G_MODULE_SUFFIX) && strlen (name) > strlen ("." G_MODULE_SUFFIX))
      g_ptr_array_add (names, g_strdup (name));
  g_ptr_array_sort (names, cmp_str);
  for (guint i = 0; i < names->len; i++)
    {
      const char *base = names->pdata[i];
      g_autofree char *path = g_build_filename (dir, base, NULL);
      if (g_hash_table_contains (seen, base) || g_file_test (path, G_FILE_TEST_IS_DIR))
        continue;
      g_hash_table_add (seen, g_strdup (base));
      Module *m = g_new0 (Module, 1);
      m->path = g_steal_pointer (&path);
      m->stem = stem_of (base);
      m->infos = g_ptr_array_new_with_free_func (g_free);
      g_ptr_array_add (r->modules, m);
    }
}

const char *
sift_registry_installed_dir (void)
{
  return SIFT_POLICY_DIR;
}

SiftRegistry *
sift_registry_new (const char *const *extra_dirs)
{
  SiftRegistry *r = g_new0 (SiftRegistry, 1);
  g_autoptr (GStrvBuilder) path = g_strv_builder_new ();
  g_autoptr (GHashTable) dirs = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);

  g_autoptr (GPtrArray) all = g_ptr_array_new_with_free_func (g_free);
  for (gsize i = 0; extra_dirs != NULL && extra_dirs[i] != NULL; i++)
    g_ptr_array_add (all, g_strdup (extra_dirs[i]));
  const char *env = g_getenv ("SIFT_POLICY_PATH");
  if (env != NULL)
    {
      g_auto (GStrv) parts = g_strsplit (env, G_SEARCHPATH_SEPARATOR_S, -1);
      for (gsize i = 0; parts[i] != NULL; i++)
        g_ptr_array_add (all, g_strdup (parts[i]));
    }
  /* SIFT_POLICY_SYSTEM_PATH, when set, replaces the installed directory
   * (empty: none), so tests never see an installed sift's policies. */
  const char *system = g_getenv ("SIFT_POLICY_SYSTEM_PATH");
  if (system != NULL)
    {
      g_auto (GStrv) parts = g_strsplit (system, G_SEARCHPATH_SEPARATOR_S, -1);
      for (gsize i = 0; parts[i] != NULL; i++)
        g_ptr_array_add (all, g_strdup (parts[i]));
    }
  else
    g_ptr_array_add (all, g_strdup (SIFT_POLICY_DIR));

  for (guint i = 0; i < all->len; i++)
    {
      const char *dir = all->pdata[i];
      if (*dir == '\0' || g_hash_table_contains (dirs, dir))
        continue;
      g_hash_table_add (dirs, g_strdup (dir));
      g_strv_builder_add (path, dir);
    }
  r->search_path = g_strv_builder_end (path);
  r->modules = g_ptr_array_new_with_free_func (module_free);
  r->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  r->ambiguous = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, (GDestroyNotify) g_error_free);

  g_autoptr (GHashTable) seen = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  for (gsize i = 0; r->search_path[i] != NULL; i++)
    scan_dir (r, r->search_path[i], seen);
  return r;
}

void
sift_registry_free (SiftRegistry *registry)
{
  if (registry == NULL)
    return;
  g_hash_table_unref (registry->by_name);
  g_hash_table_unref (registry->ambiguous);
  g_ptr_array_unref (registry->modules);
  g_strfreev (registry->search_path);
  g_free (registry);
}

const char *const *
sift_registry_search_path (SiftRegistry *registry)
{
  g_return_val_if_fail (registry != NULL, NULL);
  return (const char *const *) registry->search_path;
}

static gboolean
module_load (SiftRegistry *r, Module *m, GError **error)
{
  if (m->state == MODULE_LOADED)
    return TRUE;
  if (m->state == MODULE_FAILED)
    {
      g_propagate_error (error, g_error_copy (m->error));
      return FALSE;
    }
  m->loaded = loaded_get (m->path, &m->error);
  if (m->loaded == NULL)
    {
      m->state = MODULE_FAILED;
      g_propagate_error (error, g_error_copy (m->error));
      return FALSE;
    }
  m->state = MODULE_LOADED;
  for (gsize i = 0; m->loaded->ops[i] != NULL; i++)
    {
      const SiftPolicyOps *ops = m->loaded->ops[i];
      SiftPolicyInfo *info = g_new0 (SiftPolicyInfo, 1);
      info->ops = ops;
      info->file = m->path;
      g_ptr_array_add (m->infos, info);
      const SiftPolicyInfo *other = g_hash_table_lookup (r->by_name, ops->name);
      if (other == NULL)
        {
          g_hash_table_insert (r->by_name, (gpointer) ops->name, info);
          continue;
        }
      GError *dup = g_error_new (SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_DUPLICATE,
                                 "%s: policy '%s' is also provided by %s", m->path, ops->name, other->file);
      if (!g_hash_table_contains (r->ambiguous, ops->name))
        g_hash_table_insert (r->ambiguous, g_strdup (ops->name), g_error_copy (dup));
      if (error != NULL && *error == NULL)
        g_propagate_error (error, dup);
      else
        g_error_free (dup);
    }
  return error == NULL || *error == NULL;
}

static const SiftPolicyInfo *
found (SiftRegistry *r, const char *name, GError **error)
{
  const GError *dup = g_hash_table_lookup (r->ambiguous, name);
  if (dup != NULL)
    {
      g_propagate_error (error, g_error_copy (dup));
      return NULL;
    }
  return g_hash_table_lookup (r->by_name, name);
}

const SiftPolicyInfo *
sift_registry_lookup (SiftRegistry *registry, const char *name, GError **error)
{
  g_return_val_if_fail (registry != NULL && name != NULL, NULL);
  GError *local = NULL;
  const SiftPolicyInfo *info = found (registry, name, &local);
  if (info != NULL || local != NULL)
    {
      if (local != NULL)
        g_propagate_error (error, local);
      return info;
    }

  /* The module named after the policy first: its own failure is the answer. */
  g_autofree char *want = normalize (name);
  for (guint i = 0; i < registry->modules->len; i++)
    {
      Module *m = registry->modules->pdata[i];
      if (strcmp (m->stem, want) != 0)
        continue;
      if (!module_load (registry, m, &local) && m->state == MODULE_FAILED)
        {
          g_propagate_error (error, local);
          return NULL;
        }
      g_clear_error (&local);
      info = found (registry, name, &local);
      if (info != NULL || local != NULL)
        {
          if (local != NULL)
            g_propagate_error (error, local);
          return info;
        }
    }

  /* Then every other module: duplicates among them are detected here. */
  guint n_failed = 0;
  for (guint i = 0; i < registry->modules->len; i++)
    {
      Module *m = registry->modules->pdata[i];
      if (m->state == MODULE_UNTRIED)
        module_load (registry, m, NULL);
      n_failed += m->state == MODULE_FAILED;
    }
  info = found (registry, name, &local);
  if (info != NULL || local != NULL)
    {
      if (local != NULL)
        g_propagate_error (error, local);
      return info;
    }

  g_autoptr (GPtrArray) names = sorted_keys (registry->by_name);
  const char *near[3];
  gsize n_near = sift_nearest_names (name, (const char *const *) names->pdata, names->len, near, 3);
  g_autoptr (GString) msg = g_string_new (NULL);
  g_string_append_printf (msg, "no policy named '%s'", name);
  if (n_near > 0)
    {
      g_string_append (msg, "; did you mean ");
      for (gsize k = 0; k < n_near; k++)
        g_string_append_printf (msg, "%s'%s'", k == 0 ? "" : k + 1 == n_near ? " or " : ", ", near[k]);
      g_string_append (msg, "?");
    }
  else if (names->len > 0)
    {
      g_string_append (msg, " (known: ");
      for (guint k = 0; k < names->len; k++)
        g_string_append_printf (msg, "%s%s", k ? ", " : "", (const char *) names->pdata[k]);
      g_string_append (msg, ")");
    }
  g_autofree char *dirs = g_strjoinv (G_SEARCHPATH_SEPARATOR_S, registry->search_path);
  g_string_append_printf (msg, "; searched %s", *dirs ? dirs : "(no directories)");
  if (n_failed > 0)
    g_string_append_printf (msg, "; %u other module(s) failed to load ('sift policies list' shows why)", n_failed);
  g_set_error_literal (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN, msg->str);
  return NULL;
}

static gint
cmp_info (gconstpointer a, gconstpointer b)
{
  const SiftPolicyInfo *x = *(const SiftPolicyInfo *const *) a, *y = *(const SiftPolicyInfo *const *) b;
  int c = strcmp (x->ops->name, y->ops->name);
  return c != 0 ? c : strcmp (x->file, y->file);
}

GPtrArray *
sift_registry_list (SiftRegistry *registry, GPtrArray *failures, GError **error)
{
  g_return_val_if_fail (registry != NULL, NULL);
  (void) error; /* nothing fails as a whole: broken modules go to `failures` */
  GPtrArray *out = g_ptr_array_new ();
  for (guint i = 0; i < registry->modules->len; i++)
    {
      Module *m = registry->modules->pdata[i];
      if (m->state == MODULE_UNTRIED)
        module_load (registry, m, NULL);
      if (m->state == MODULE_FAILED && failures != NULL)
        g_ptr_array_add (failures, g_error_copy (m->error));
      if (m->state == MODULE_LOADED)
        for (guint k = 0; k < m->infos->len; k++)
          {
            const SiftPolicyInfo *info = m->infos->pdata[k];
            if (g_hash_table_lookup (registry->by_name, info->ops->name) == info)
              g_ptr_array_add (out, (gpointer) info);
          }
    }
  if (failures != NULL)
    {
      g_autoptr (GPtrArray) names = sorted_keys (registry->ambiguous);
      for (guint i = 0; i < names->len; i++)
        g_ptr_array_add (failures, g_error_copy (g_hash_table_lookup (registry->ambiguous, names->pdata[i])));
    }
  g_ptr_array_sort (out, cmp_info);
  return out;
}

guint
sift_registry_n_opened (SiftRegistry *registry)
{
  g_return_val_if_fail (registry != NULL, 0);
  guint n = 0;
  for (guint i = 0; i < registry->modules->len; i++)
    n += ((Module *) registry->modules->pdata[i])->state != MODULE_UNTRIED;
  return n;
}

/* One JSON record per cell in OUT/records.jsonl; resuming reads them back
 * and skips cells whose settings are already recorded. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gguf-model.h"
#include "harness.h"
#include "json.h"

static const char *const needle_kinds[] = { "single", "multikey", "multivalue", "multiquery" };

static void
params_text (GString *s, const SiftPolicyChoice *c)
{
  g_string_append_printf (s, "%s{", c->name);
  const SiftParamSpec *spec = c->params != NULL ? sift_params_specs (c->params) : NULL;
  for (; spec != NULL && spec->name != NULL; spec++)
    {
      g_autofree char *v = sift_params_to_text (c->params, spec->name);
      g_string_append_printf (s, "%s=%s;", spec->name, v);
    }
  g_string_append (s, "}");
}

char *
harness_settings_key (const SiftConfig *c, const SiftPolicySetup *setup, gint64 length, double depth)
{
  const SiftModelShape *m = &c->shape;
  const SiftSyntheticConfig *k = sift_synthetic_config (c);
  const SiftHarnessConfig *h = sift_harness_config (c);
  const SiftKvConfig *kv = sift_kv_config (c);
  const SiftOffloadConfig *off = sift_offload_config (c);
  GString *s = g_string_new (NULL);
  /* Every value that changes a cell's scores or counters; the grid's other
   * cells, out_dir and min_accuracy do not. */
  g_string_append_printf (s, "sift %s\nsource %s\nshape %d %d %d %d %d %d %.9g\nseed %" G_GUINT64_FORMAT "\n",
                          sift_version_string (), c->source, m->n_layers, m->n_q_heads, m->n_kv_heads,
                          m->head_dim, m->block_size, m->chunk_size, (double) m->scale, sift_synthetic_seed (c));
  g_string_append_printf (s, "synthetic %" G_GINT64_FORMAT " %.17g %.17g %.17g %" G_GINT64_FORMAT
                          " %.17g %" G_GINT64_FORMAT " %.17g %.17g %.17g %.17g\n",
                          k->sink_tokens, k->sink_strength, k->locality, k->locality_scale, k->heavy_hitters,
                          k->heavy_hitter_strength, k->rope_dims, k->rope_base, k->retrieval_heads,
                          k->needle_strength, k->noise);
  g_string_append_printf (s, "kv %s %s %" G_GINT64_FORMAT "\noffload %s %d %d\n",
                          sift_dtype_name (kv->store_dtype), sift_dtype_name (kv->compute_dtype),
                          kv->capacity_tokens, off->store, off->ring_slots, (int) off->pipeline);
  /* Unbounded keys stay as before eviction existed; bounded ones name
   * their baseline (random eviction since it exists). */
  if (kv->capacity_tokens > 0)
    g_string_append_printf (s, "evict %d %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " random-eviction-baseline\n",
                            (int) kv->evict_granularity, kv->protect_sinks, kv->protect_recent);
  g_string_append_printf (s, "label %s\nprefill ", setup->label);
  params_text (s, &setup->prefill);
  g_string_append (s, "\ndecode ");
  params_text (s, &setup->decode);
  g_string_append (s, "\ndense");
  for (gsize i = 0; i < setup->n_dense_layers; i++)
    g_string_append_printf (s, " %" G_GINT64_FORMAT, setup->dense_layers[i]);
  g_string_append_printf (s, "\nneedle %s %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %" G_GINT64_FORMAT
                          " %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %" G_GUINT64_FORMAT "\n",
                          needle_kinds[h->needle], h->n_distractors, h->n_values, h->n_queries,
                          h->question_tokens, h->decode_steps, h->seed);
  g_string_append_printf (s, "baseline %" G_GINT64_FORMAT "\ndepths %d\nplanted %d %.17g %.17g %" G_GINT64_FORMAT "\n",
                          h->baseline_seeds, (int) h->depth_span, k->planted_exact, k->drift, k->drift_scale,
                          k->logn_length);
  if (g_strcmp0 (c->source, "gguf") == 0) /* text needles: the model file, the value kind, the haystack */
    g_string_append_printf (s, "gguf %s\nvalue %d\nhaystack %s\n", sift_gguf_config (c)->path, (int) h->value,
                            h->haystack != NULL ? h->haystack : "");
  g_string_append_printf (s, "cell %" G_GINT64_FORMAT " %.17g\n", length, depth);
  char *sum = g_compute_checksum_for_string (G_CHECKSUM_SHA256, s->str, (gssize) s->len);
  g_string_free (s, TRUE);
  return sum;
}

static void
write_choice (JsonWriter *w, const char *key, const SiftPolicyChoice *c)
{
  json_begin_object (w, key);
  json_string (w, "policy", c->name);
  json_begin_object (w, "params");
  const SiftParamSpec *spec = c->params != NULL ? sift_params_specs (c->params) : NULL;
  for (; spec != NULL && spec->name != NULL; spec++)
    {
      g_autofree char *v = sift_params_to_text (c->params, spec->name);
      json_string (w, spec->name, v);
    }
  json_end_object (w);
  json_end_object (w);
}

static void
write_counters (JsonWriter *w, const char *key, const SiftCounters *c)
{
  json_begin_object (w, key);
  json_uint (w, "bytes_loaded", c->bytes_loaded);
  json_uint (w, "bytes_stored", c->bytes_stored);
  json_uint (w, "blocks_available", c->blocks_available);
  json_uint (w, "blocks_selected", c->blocks_selected);
  json_uint (w, "tokens_available", c->tokens_available);
  json_uint (w, "tokens_attended", c->tokens_attended);
  json_double (w, "seconds_stalled", c->seconds_stalled);
  json_double (w, "seconds_compute", c->seconds_compute);
  json_double (w, "seconds_load", c->seconds_load);
  json_uint (w, "tokens_evicted", c->tokens_evicted);
  json_uint (w, "bytes_compacted", c->bytes_compacted);
  json_uint (w, "bytes_mapped", c->bytes_mapped);
  json_uint (w, "summaries_attended", c->summaries_attended);
  json_end_object (w);
}

/* The random baseline: its kind (random blocks, or random eviction at a
 * capacity, with the tokens it evicted), per seed whether the cell passed
 * and each phase's retrieval, then the mean pass and the needle recall. */
static void
write_baseline (JsonWriter *w, const HarnessBaseline *b)
{
  json_begin_object (w, "baseline");
  json_string (w, "kind", b->n_seeds == 0 ? "none" : b->capacity_tokens > 0 ? "eviction" : "selection");
  if (b->capacity_tokens > 0)
    {
      json_int (w, "capacity_tokens", b->capacity_tokens);
      json_double (w, "tokens_evicted", b->tokens_evicted);
    }
  json_int (w, "seeds", (gint64) b->n_seeds);
  json_begin_array (w, "pass");
  for (gsize i = 0; i < b->n_seeds; i++)
    json_bool (w, NULL, b->pass[i]);
  json_end_array (w);
  const double *per_phase[] = { b->prefill_retrieval, b->decode_retrieval };
  const char *names[] = { "prefill_retrieval", "decode_retrieval" };
  for (int ph = 0; ph < 2; ph++)
    {
      json_begin_array (w, names[ph]);
      for (gsize i = 0; i < b->n_seeds; i++)
        json_double (w, NULL, per_phase[ph][i]);
      json_end_array (w);
    }
  json_double (w, "pass_mean", harness_baseline_pass_mean (b));
  json_double (w, "prefill_recall", b->prefill_recall);
  json_double (w, "decode_recall", b->decode_recall);
  json_end_object (w);
}

static void
read_baseline (const JsonNode *r, HarnessBaseline *b)
{
  double cap = json_get_double (r, "baseline.capacity_tokens");
  b->capacity_tokens = isfinite (cap) ? (gint64) cap : 0;
  b->tokens_evicted = json_get_double (r, "baseline.tokens_evicted");
  const char *names[] = { "baseline.pass", "baseline.prefill_retrieval", "baseline.decode_retrieval" };
  const JsonNode *arrays[3];
  for (int i = 0; i < 3; i++)
    {
      arrays[i] = json_get (r, names[i]);
      if (arrays[i] == NULL || arrays[i]->type != JSON_ARRAY)
        return; /* a record from before the baseline: none */
    }
  b->n_seeds = MIN (arrays[0]->items->len, HARNESS_BASELINE_MAX_SEEDS);
  for (gsize i = 0; i < b->n_seeds; i++)
    {
      const JsonNode *p = g_ptr_array_index (arrays[0]->items, i);
      b->pass[i] = p->type == JSON_BOOL && p->number == 1.0;
      for (int a = 1; a < 3; a++)
        {
          const JsonNode *v = i < arrays[a]->items->len ? g_ptr_array_index (arrays[a]->items, i) : NULL;
          (a == 1 ? b->prefill_retrieval : b->decode_retrieval)[i] = v != NULL && v->type == JSON_NUMBER ? v->number
                                                                                                           : NAN;
        }
    }
  b->prefill_recall = json_get_double (r, "baseline.prefill_recall");
  b->decode_recall = json_get_double (r, "baseline.decode_recall");
}

char *
harness_record_json (const SiftConfig *c, const SiftPolicySetup *setup, const char *settings,
                     const HarnessCell *cell)
{
  JsonWriter w = { g_string_new (NULL), TRUE };
  const SiftModelShape *m = &c->shape;
  const SiftHarnessConfig *h = sift_harness_config (c);
  json_begin_object (&w, NULL);
  json_string (&w, "sift_version", sift_version_string ());
  json_string (&w, "config", c->file);
  json_string (&w, "label", setup->label);
  json_string (&w, "settings", settings);
  write_choice (&w, "prefill", &setup->prefill);
  write_choice (&w, "decode", &setup->decode);
  json_begin_array (&w, "dense_layers");
  for (gsize i = 0; i < setup->n_dense_layers; i++)
    json_int (&w, NULL, setup->dense_layers[i]);
  json_end_array (&w);
  json_begin_object (&w, "model");
  json_string (&w, "source", c->source);
  json_int (&w, "layers", m->n_layers);
  json_int (&w, "q_heads", m->n_q_heads);
  json_int (&w, "kv_heads", m->n_kv_heads);
  json_int (&w, "head_dim", m->head_dim);
  json_int (&w, "block_size", m->block_size);
  json_int (&w, "chunk_size", m->chunk_size);
  json_uint (&w, "seed", sift_synthetic_seed (c));
  json_string (&w, "planted_keys", sift_synthetic_config (c)->planted_exact ? "exact" : "matched");
  json_end_object (&w);
  const SiftKvConfig *kv = sift_kv_config (c);
  json_begin_object (&w, "kv");
  json_int (&w, "capacity_tokens", kv->capacity_tokens);
  json_string (&w, "evict_granularity", kv->evict_granularity == SIFT_EVICT_BLOCK ? "block" : "token");
  json_int (&w, "protect_sinks", kv->protect_sinks);
  json_int (&w, "protect_recent", kv->protect_recent);
  json_end_object (&w);
  json_int (&w, "length", cell->length);
  json_double (&w, "depth", cell->depth);
  json_begin_object (&w, "needle");
  json_string (&w, "kind", needle_kinds[h->needle]);
  json_begin_array (&w, "positions");
  for (gsize i = 0; i < cell->n_needle_positions; i++)
    json_int (&w, NULL, cell->needle_positions[i]);
  json_end_array (&w);
  json_int (&w, "question_tokens", h->question_tokens);
  json_int (&w, "decode_steps", cell->decode_steps);
  json_uint (&w, "seed", h->seed);
  json_string (&w, "depth_span", h->depth_span == SIFT_DEPTH_FULL ? "full" : "interior");
  json_end_object (&w);
  json_begin_object (&w, "scores");
  json_bool (&w, "pass", cell->pass);
  json_bool (&w, "prefill_pass", cell->prefill_pass);
  json_bool (&w, "decode_pass", cell->decode_pass);
  json_double (&w, "prefill_retrieval", cell->prefill_retrieval);
  json_double (&w, "decode_retrieval", cell->decode_retrieval);
  json_double (&w, "chance", cell->chance);
  json_double (&w, "prefill_recall", cell->prefill_recall);
  json_double (&w, "decode_recall", cell->decode_recall);
  json_string (&w, "recall_note", cell->recall_note);
  if (cell->recall_by_layer != NULL)
    {
      json_begin_object (&w, "recall_by_layer");
      for (int ph = 0; ph < 2; ph++)
        {
          json_begin_array (&w, ph == 0 ? "prefill" : "decode");
          for (gint32 l = 0; l < cell->n_layers; l++)
            json_double (&w, NULL, cell->recall_by_layer[ph * cell->n_layers + l]);
          json_end_array (&w);
        }
      json_end_object (&w);
    }
  if (cell->recall_by_head != NULL)
    {
      /* prefill / decode: one array per layer, one value per query head. */
      json_begin_object (&w, "recall_by_head");
      for (int ph = 0; ph < 2; ph++)
        {
          json_begin_array (&w, ph == 0 ? "prefill" : "decode");
          for (gint32 l = 0; l < cell->n_layers; l++)
            {
              json_begin_array (&w, NULL);
              for (gint32 h = 0; h < cell->n_q_heads; h++)
                json_double (&w, NULL, cell->recall_by_head[((gsize) ph * cell->n_layers + l) * cell->n_q_heads + h]);
              json_end_array (&w);
            }
          json_end_array (&w);
        }
      json_end_object (&w);
    }
  json_double (&w, "prefill_rel_error", cell->prefill_rel_error);
  json_double (&w, "decode_rel_error", cell->decode_rel_error);
  json_double (&w, "prefill_density", cell->prefill_density);
  json_double (&w, "decode_density", cell->decode_density);
  json_end_object (&w);
  if (cell->generated != NULL)
    {
      static const char *const values[] = { "number", "word", "uuid" };
      json_begin_object (&w, "text");
      json_string (&w, "model", sift_gguf_config (c)->path);
      json_string (&w, "haystack", h->haystack != NULL && h->haystack[0] ? h->haystack : "kjv");
      json_string (&w, "value", values[h->value]);
      json_string (&w, "generated", cell->generated);
      json_string (&w, "expected", cell->expected);
      json_double (&w, "match", cell->match);
      json_bool (&w, "exact", cell->exact);
      json_int (&w, "generated_tokens", cell->generated_tokens);
      json_int (&w, "question_start", cell->question_start);
      /* [first, end) token of each needle sentence: asked ones first. */
      json_begin_array (&w, "needle_spans");
      for (gsize i = 0; i < cell->n_needle_positions; i++)
        {
          json_begin_array (&w, NULL);
          json_int (&w, NULL, cell->needle_spans[2 * i]);
          json_int (&w, NULL, cell->needle_spans[2 * i + 1]);
          json_end_array (&w);
        }
      json_end_array (&w);
      json_string (&w, "rel_error", "last layer's attention output vs dense: prefill at the question's tokens,"
                   " decode at the steps whose tokens so far equal the dense run's");
      json_end_object (&w);
    }
  write_baseline (&w, &cell->baseline);
  json_begin_object (&w, "timings");
  json_double (&w, "prefill_seconds", cell->prefill_seconds);
  json_double (&w, "decode_seconds", cell->decode_seconds);
  json_double (&w, "prefill_tokens_per_second",
               cell->prefill_seconds > 0 ? (double) cell->length / cell->prefill_seconds : NAN);
  json_double (&w, "decode_tokens_per_second",
               cell->decode_seconds > 0 ? (double) cell->decode_steps / cell->decode_seconds : NAN);
  json_end_object (&w);
  json_begin_object (&w, "counters");
  write_counters (&w, "prefill", &cell->prefill_counters);
  write_counters (&w, "decode", &cell->decode_counters);
  json_end_object (&w);
  json_end_object (&w);
  return g_string_free (w.s, FALSE);
}

/* ---- Reading back ----------------------------------------------------------------- */

struct _HarnessRecords {
  char *path;
  GHashTable *by_settings;  /* settings -> JsonNode * (owned) */
  FILE *append;
};

static void
read_counters (const JsonNode *r, const char *key, SiftCounters *c)
{
  const JsonNode *n = json_get (r, key);
  struct { const char *name; guint64 *dst; } ints[] = {
    { "bytes_loaded", &c->bytes_loaded }, { "bytes_stored", &c->bytes_stored },
    { "blocks_available", &c->blocks_available }, { "blocks_selected", &c->blocks_selected },
    { "tokens_available", &c->tokens_available }, { "tokens_attended", &c->tokens_attended },
    { "tokens_evicted", &c->tokens_evicted }, { "bytes_compacted", &c->bytes_compacted },
    { "bytes_mapped", &c->bytes_mapped }, { "summaries_attended", &c->summaries_attended },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ints); i++)
    {
      double v = json_get_double (n, ints[i].name);
      *ints[i].dst = isfinite (v) ? (guint64) v : 0;
    }
  c->seconds_stalled = json_get_double (n, "seconds_stalled");
  c->seconds_compute = json_get_double (n, "seconds_compute");
  c->seconds_load = json_get_double (n, "seconds_load");
}

HarnessRecords *
harness_records_open (const char *path, GError **error)
{
  g_autoptr (HarnessRecords) rec = g_new0 (HarnessRecords, 1);
  rec->path = g_strdup (path);
  rec->by_settings = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, (GDestroyNotify) json_node_free);
  g_autofree char *text = NULL;
  g_autoptr (GError) local = NULL;
  if (!g_file_get_contents (path, &text, NULL, &local))
    {
      if (!g_error_matches (local, G_FILE_ERROR, G_FILE_ERROR_NOENT))
        {
          g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "%s", local->message);
          return NULL;
        }
    }
  else
    {
      g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
      for (int i = 0; lines[i] != NULL; i++)
        {
          if (g_strstrip (lines[i])[0] == '\0')
            continue;
          g_autoptr (GError) perr = NULL;
          g_autoptr (JsonNode) n = json_parse (lines[i], &perr);
          const char *settings = n != NULL ? json_get_string (n, "settings") : NULL;
          if (settings == NULL || !isfinite (json_get_double (n, "length")))
            {
              g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_RECORDS,
                           "%s:%d: not a needle record (%s); move the file away to start afresh", path, i + 1,
                           perr != NULL ? perr->message : "no settings or length");
              return NULL;
            }
          g_hash_table_replace (rec->by_settings, g_strdup (settings), g_steal_pointer (&n));
        }
    }
  return g_steal_pointer (&rec);
}

gboolean
harness_records_find (HarnessRecords *rec, const char *settings, HarnessCell *cell)
{
  const JsonNode *r = g_hash_table_lookup (rec->by_settings, settings);
  if (r == NULL)
    return FALSE;
  memset (cell, 0, sizeof *cell);
  cell->resumed = TRUE;
  cell->length = (gint64) json_get_double (r, "length");
  cell->depth = json_get_double (r, "depth");
  cell->pass = json_get_double (r, "scores.pass") == 1.0;
  cell->prefill_pass = json_get_double (r, "scores.prefill_pass") == 1.0;
  cell->decode_pass = json_get_double (r, "scores.decode_pass") == 1.0;
  cell->prefill_retrieval = json_get_double (r, "scores.prefill_retrieval");
  cell->decode_retrieval = json_get_double (r, "scores.decode_retrieval");
  cell->chance = json_get_double (r, "scores.chance");
  cell->prefill_recall = json_get_double (r, "scores.prefill_recall");
  cell->decode_recall = json_get_double (r, "scores.decode_recall");
  cell->recall_note = g_strdup (json_get_string (r, "scores.recall_note"));
  cell->prefill_rel_error = json_get_double (r, "scores.prefill_rel_error");
  cell->decode_rel_error = json_get_double (r, "scores.decode_rel_error");
  cell->prefill_density = json_get_double (r, "scores.prefill_density");
  cell->decode_density = json_get_double (r, "scores.decode_density");
  cell->prefill_seconds = json_get_double (r, "timings.prefill_seconds");
  cell->decode_seconds = json_get_double (r, "timings.decode_seconds");
  double steps = json_get_double (r, "needle.decode_steps");
  cell->decode_steps = isfinite (steps) ? (gint64) steps : 0;
  read_counters (r, "counters.prefill", &cell->prefill_counters);
  read_counters (r, "counters.decode", &cell->decode_counters);
  read_baseline (r, &cell->baseline);
  const char *generated = json_get_string (r, "text.generated");
  if (generated != NULL)
    {
      cell->generated = g_strdup (generated);
      cell->expected = g_strdup (json_get_string (r, "text.expected"));
      cell->match = json_get_double (r, "text.match");
      cell->exact = json_get_double (r, "text.exact") == 1.0;
    }
  const JsonNode *pos = json_get (r, "needle.positions");
  if (pos != NULL && pos->type == JSON_ARRAY)
    {
      cell->n_needle_positions = pos->items->len;
      cell->needle_positions = g_new0 (gint64, MAX (pos->items->len, 1));
      for (guint i = 0; i < pos->items->len; i++)
        cell->needle_positions[i] = (gint64) ((const JsonNode *) g_ptr_array_index (pos->items, i))->number;
    }
  return TRUE;
}

gboolean
harness_records_append (HarnessRecords *rec, const char *line, GError **error)
{
  if (rec->append == NULL)
    {
      g_autofree char *dir = g_path_get_dirname (rec->path);
      if (g_mkdir_with_parents (dir, 0755) != 0 || (rec->append = fopen (rec->path, "a")) == NULL)
        {
          g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot append to %s: %s", rec->path,
                       g_strerror (errno));
          return FALSE;
        }
    }
  if (fprintf (rec->append, "%s\n", line) < 0 || fflush (rec->append) != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot write %s: %s", rec->path,
                   g_strerror (errno));
      return FALSE;
    }
  return TRUE;
}

void
harness_records_free (HarnessRecords *rec)
{
  if (rec == NULL)
    return;
  if (rec->append != NULL)
    fclose (rec->append);
  g_hash_table_unref (rec->by_settings);
  g_free (rec->path);
  g_free (rec);
}

/* Random-weight GGUF models for tests and benches. */
#include <math.h>
#include <string.h>

#include "gguf-writer.h"
#include "ops.h"
#include "random-model.h"

void
gguf_random_model_init (GgufRandomModel *m, const char *arch, GgufTensorType type, guint64 seed)
{
  *m = (GgufRandomModel) {
    .arch = arch, .type = type,
    .n_layers = 2, .n_embd = 256, .n_ff = 512, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
    .n_vocab = 384, .n_ctx = 4096,
    .rope_base = g_str_equal (arch, "llama") ? 10000.0f : 1000000.0f,
    .eps = g_str_equal (arch, "llama") ? 1e-5f : 1e-6f,
    .rope_scaling = "none", .rope_factor = 1, .rope_orig_ctx = 0,
    .tied = FALSE, .seed = seed,
  };
}

gunichar
gguf_gpt2_byte_char (guint8 b)
{
  /* Printable bytes stand for themselves; the others (0-32, 127-160, 173)
   * take 256, 257, ... in byte order. */
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
    return b;
  int k = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174))
      k++;
  return 256 + k;
}

static const char corpus[] =
  "The quick brown fox jumps over the lazy dog. In the beginning there was the word, "
  "and the word was with the model. Sparse attention keeps the tokens that matter: "
  "the sink, the recent window and the heavy hitters. A needle in a haystack is a "
  "sentence hidden in a long text; the model must find it and answer the question. "
  "the the the and and of of to to in in is is that that it it with with for for "
  "Café déjà vu, naïve façade; 東京 と 大阪; emoji 🎉 and 🚀 travel as bytes.";

/* Byte-level BPE trained on the corpus: words split before each space, each
 * byte mapped to its gpt2 character, then the most frequent adjacent pair
 * merged, n_merges times (ties to the lexicographically smallest pair). */
static void
train_bpe (GPtrArray *tokens, GPtrArray *merges, int n_merges)
{
  g_autoptr (GPtrArray) words = g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref);
  GPtrArray *w = NULL;
  for (const char *p = corpus; *p; p++)
    {
      if (w == NULL || *p == ' ')
        {
          w = g_ptr_array_new_with_free_func (g_free);
          g_ptr_array_add (words, w);
        }
      char buf[8];
      buf[g_unichar_to_utf8 (gguf_gpt2_byte_char ((guint8) *p), buf)] = 0;
      g_ptr_array_add (w, g_strdup (buf));
    }
  for (int k = 0; k < n_merges; k++)
    {
      g_autoptr (GHashTable) counts = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
      for (guint i = 0; i < words->len; i++)
        {
          GPtrArray *s = words->pdata[i];
          for (guint j = 0; j + 1 < s->len; j++)
            {
              char *pair = g_strconcat (s->pdata[j], " ", s->pdata[j + 1], NULL);
              gpointer old = g_hash_table_lookup (counts, pair);
              g_hash_table_replace (counts, pair, GINT_TO_POINTER (GPOINTER_TO_INT (old) + 1));
            }
        }
      const char *best = NULL;
      int best_n = 0;
      GHashTableIter it;
      gpointer key, val;
      g_hash_table_iter_init (&it, counts);
      while (g_hash_table_iter_next (&it, &key, &val))
        if (GPOINTER_TO_INT (val) > best_n || (GPOINTER_TO_INT (val) == best_n && strcmp (key, best) < 0))
          {
            best = key;
            best_n = GPOINTER_TO_INT (val);
          }
      if (best == NULL)
        break;
      g_autofree char *left = g_strndup (best, strchr (best, ' ') - best);
      const char *right = strchr (best, ' ') + 1;
      g_ptr_array_add (merges, g_strdup (best));
      g_ptr_array_add (tokens, g_strconcat (left, right, NULL));
      for (guint i = 0; i < words->len; i++)
        {
          GPtrArray *s = words->pdata[i];
          for (guint j = 0; j + 1 < s->len; j++)
            if (g_str_equal (s->pdata[j], left) && g_str_equal (s->pdata[j + 1], right))
              {
                char *joined = g_strconcat (left, right, NULL);
                g_free (s->pdata[j]);
                s->pdata[j] = joined;
                g_ptr_array_remove_index (s, j + 1);
              }
        }
    }
}

static void
add_tokenizer (GgufWriter *w, const GgufRandomModel *m)
{
  g_autoptr (GPtrArray) tokens = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GPtrArray) merges = g_ptr_array_new_with_free_func (g_free);
  for (int b = 0; b < 256; b++)
    {
      char buf[8];
      buf[g_unichar_to_utf8 (gguf_gpt2_byte_char ((guint8) b), buf)] = 0;
      g_ptr_array_add (tokens, g_strdup (buf));
    }
  int n_special = 2;
  train_bpe (tokens, merges, MIN (200, MAX (0, m->n_vocab - 256 - n_special)));
  gint32 bos = (gint32) tokens->len;
  g_ptr_array_add (tokens, g_strdup ("<|begin_of_text|>"));
  g_ptr_array_add (tokens, g_strdup ("<|end_of_text|>"));
  gint32 n_tokens = m->tokenizer_vocab > 0 ? m->tokenizer_vocab : m->n_vocab;
  g_assert (n_tokens >= (gint32) tokens->len);
  for (int k = 0; (gint32) tokens->len < n_tokens; k++)
    g_ptr_array_add (tokens, g_strdup_printf ("<|reserved_special_token_%d|>", k));
  g_autofree gint32 *types = g_new (gint32, tokens->len);
  for (guint i = 0; i < tokens->len; i++)
    types[i] = (gint32) i >= bos ? 3 /* control */ : 1 /* normal */;
  gguf_writer_add_string (w, "tokenizer.ggml.model", "gpt2");
  gguf_writer_add_string (w, "tokenizer.ggml.pre", g_str_equal (m->arch, "llama") ? "llama-bpe" : "qwen2");
  gguf_writer_add_string_array (w, "tokenizer.ggml.tokens", tokens->len, (const char *const *) tokens->pdata);
  gguf_writer_add_array (w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, tokens->len, types);
  gguf_writer_add_string_array (w, "tokenizer.ggml.merges", merges->len, (const char *const *) merges->pdata);
  gguf_writer_add_u32 (w, "tokenizer.ggml.bos_token_id", (guint32) bos);
  gguf_writer_add_u32 (w, "tokenizer.ggml.eos_token_id", (guint32) bos + 1);
  gguf_writer_add_bool (w, "tokenizer.ggml.add_bos_token", TRUE);
}

static void
randn (GRand *r, float *x, gsize n, double mean, double std)
{
  for (gsize i = 0; i < n; i++)
    {
      double u = g_rand_double_range (r, 1e-12, 1), v = g_rand_double (r);
      x[i] = (float) (mean + std * sqrt (-2 * log (u)) * cos (2 * G_PI * v));
    }
}

/* A tensor of random N(mean, std^2) values in `type`. */
static void
add_random (GgufWriter *w, GRand *r, const char *name, GgufTensorType type, gint64 d0, gint64 d1,
            double mean, double std, const char *omit)
{
  if (omit != NULL && g_str_equal (name, omit))
    return;
  g_autofree float *x = g_new (float, d0 * d1);
  randn (r, x, (gsize) (d0 * d1), mean, std);
  guint64 dims[2] = { (guint64) d0, (guint64) d1 };
  gguf_writer_add_tensor_f32 (w, name, type, d1 == 1 ? 1 : 2, dims, x);
}

gboolean
gguf_random_model_write (const GgufRandomModel *m, const char *path, GError **error)
{
  g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
  const char *a = m->arch;
  char key[128];
#define KEY(s) (g_snprintf (key, sizeof key, "%s." s, a), key)
  gguf_writer_add_string (w, "general.architecture", a);
  g_autofree char *name = g_strdup_printf ("sift random %s %s seed %" G_GUINT64_FORMAT, a,
                                           gguf_tensor_type_name (m->type), m->seed);
  gguf_writer_add_string (w, "general.name", name);
  gguf_writer_add_u32 (w, KEY ("block_count"), (guint32) m->n_layers);
  gguf_writer_add_u32 (w, KEY ("context_length"), (guint32) m->n_ctx);
  gguf_writer_add_u32 (w, KEY ("embedding_length"), (guint32) m->n_embd);
  gguf_writer_add_u32 (w, KEY ("feed_forward_length"), (guint32) m->n_ff);
  gguf_writer_add_u32 (w, KEY ("attention.head_count"), (guint32) m->n_heads);
  gguf_writer_add_u32 (w, KEY ("attention.head_count_kv"), (guint32) m->n_kv_heads);
  gguf_writer_add_u32 (w, KEY ("attention.key_length"), (guint32) m->head_dim);
  gguf_writer_add_u32 (w, KEY ("attention.value_length"), (guint32) m->head_dim);
  gguf_writer_add_u32 (w, KEY ("rope.dimension_count"), (guint32) m->head_dim);
  gguf_writer_add_f32 (w, KEY ("rope.freq_base"), m->rope_base);
  gguf_writer_add_f32 (w, KEY ("attention.layer_norm_rms_epsilon"), m->eps);
  gboolean llama3 = g_str_equal (m->rope_scaling, "llama3");
  if (!g_str_equal (m->rope_scaling, "none") && !llama3)
    {
      gguf_writer_add_string (w, KEY ("rope.scaling.type"), m->rope_scaling);
      gguf_writer_add_f32 (w, KEY ("rope.scaling.factor"), m->rope_factor);
      if (m->rope_orig_ctx > 0)
        gguf_writer_add_u32 (w, KEY ("rope.scaling.original_context_length"), (guint32) m->rope_orig_ctx);
    }
  add_tokenizer (w, m);

  GRand *r = g_rand_new_with_seed_array ((const guint32[]) { (guint32) m->seed, (guint32) (m->seed >> 32) }, 2);
  gint64 nq = (gint64) m->n_heads * m->head_dim, nkv = (gint64) m->n_kv_heads * m->head_dim;
  add_random (w, r, "token_embd.weight", m->type, m->n_embd, m->n_vocab, 0, 1, m->omit_tensor);
  for (gint32 il = 0; il < m->n_layers; il++)
    {
      char t[GGUF_MAX_NAME];
#define T(s) (g_snprintf (t, sizeof t, "blk.%d." s, il), t)
      add_random (w, r, T ("attn_norm.weight"), GGUF_TENSOR_F32, m->n_embd, 1, 1, 0.1, m->omit_tensor);
      add_random (w, r, T ("attn_q.weight"), m->type, m->n_embd, nq, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
      add_random (w, r, T ("attn_k.weight"), m->type, m->n_embd, nkv, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
      add_random (w, r, T ("attn_v.weight"), m->type, m->n_embd, nkv, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
      if (g_str_equal (a, "qwen2"))
        {
          add_random (w, r, T ("attn_q.bias"), GGUF_TENSOR_F32, nq, 1, 0, 0.1, m->omit_tensor);
          add_random (w, r, T ("attn_k.bias"), GGUF_TENSOR_F32, nkv, 1, 0, 0.1, m->omit_tensor);
          add_random (w, r, T ("attn_v.bias"), GGUF_TENSOR_F32, nkv, 1, 0, 0.1, m->omit_tensor);
        }
      if (g_str_equal (a, "qwen3"))
        {
          add_random (w, r, T ("attn_q_norm.weight"), GGUF_TENSOR_F32, m->head_dim, 1, 1, 0.1, m->omit_tensor);
          add_random (w, r, T ("attn_k_norm.weight"), GGUF_TENSOR_F32, m->head_dim, 1, 1, 0.1, m->omit_tensor);
        }
      add_random (w, r, T ("attn_output.weight"), m->type, nq, m->n_embd, 0, 1 / sqrt (nq), m->omit_tensor);
      add_random (w, r, T ("ffn_norm.weight"), GGUF_TENSOR_F32, m->n_embd, 1, 1, 0.1, m->omit_tensor);
      add_random (w, r, T ("ffn_gate.weight"), m->type, m->n_embd, m->n_ff, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
      add_random (w, r, T ("ffn_up.weight"), m->type, m->n_embd, m->n_ff, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
      add_random (w, r, T ("ffn_down.weight"), m->type, m->n_ff, m->n_embd, 0, 1 / sqrt (m->n_ff), m->omit_tensor);
#undef T
    }
  add_random (w, r, "output_norm.weight", GGUF_TENSOR_F32, m->n_embd, 1, 1, 0.1, m->omit_tensor);
  if (!m->tied)
    add_random (w, r, "output.weight", m->type, m->n_embd, m->n_vocab, 0, 1 / sqrt (m->n_embd), m->omit_tensor);
  if (llama3)
    {
      /* Llama 3.1's scaling: factor, low 1, high 4, trained at rope_orig_ctx. */
      g_autofree float *f = g_new (float, m->head_dim / 2);
      llama_rope_llama3_factors (m->rope_base, m->head_dim, m->rope_factor, 1, 4, m->rope_orig_ctx, f);
      guint64 dims[1] = { (guint64) m->head_dim / 2 };
      gguf_writer_add_tensor (w, "rope_freqs.weight", GGUF_TENSOR_F32, 1, dims, f, sizeof (float) * (gsize) (m->head_dim / 2));
    }
  g_rand_free (r);
#undef KEY
  return gguf_writer_write (w, path, error);
}

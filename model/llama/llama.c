/* Llama-family model: loading (shape from metadata, tensors checked) and the
 * forward pass, step by step. */
#include <math.h>
#include <string.h>

#include <sift/error.h>
#include <sift/memory.h>
#include <sift/parallel.h>

#include "llama-gpu.h"
#include "llama.h"
#include "quant.h"
#include "repack.h"

struct _LlamaModel {
  GgufFile *f;
  LlamaConfig cfg;
  LlamaMat embd;      /* [n_vocab][n_embd] */
  LlamaMat output;    /* [n_vocab][n_embd]: output.weight, or embd when tied */
  float *output_norm; /* [n_embd] */
  float *rope_freqs;  /* [n_rot / 2] or NULL */
  LlamaLayer *layers; /* [n_layers] */
  guint64 weight_bytes;
  guint8 *x16;        /* the matrices repacked at load (sift_mem_alloc), or NULL */

  /* The step under way. */
  gboolean in_step;
  gint64 pos0, n;
  gint32 next_layer;  /* the layer whose qkv() comes next */
  gboolean want_attended;
  gint64 cap;         /* rows the buffers hold (sift_mem_map0'd) */
  gint64 used;        /* rows the last step used */
  float *x;           /* [cap][n_embd] residual stream */
  float *xn;          /* [cap][n_embd] normed */
  float *gate, *up;   /* [MIN (cap, MLP_SLICE)][MAX (n_ff, n_embd)], [MIN (cap, MLP_SLICE)][n_ff] */

  /* The forward pass on the GPU (llama_model_use_gpu), or NULL. */
  LlamaGpu *gpu;
  float *qkv;         /* [cap][n_q + 2 n_kv]: the GPU's projections, before bias, norms and RoPE */
};

static const struct {
  const char *name;
  LlamaArch arch;
} archs[] = {
  { "llama", LLAMA_ARCH_LLAMA },
  { "qwen2", LLAMA_ARCH_QWEN2 },
  { "qwen3", LLAMA_ARCH_QWEN3 },
};

/* ---- metadata ---- */

static char *
arch_key (const LlamaModel *m, const char *suffix)
{
  return g_strdup_printf ("%s.%s", m->cfg.arch_name, suffix);
}

/* A positive 32-bit count; `def` >= 0 when the key may be absent. */
static gboolean
get_count (const LlamaModel *m, const char *suffix, gint64 def, gint32 *out, GError **error)
{
  g_autofree char *key = arch_key (m, suffix);
  if (def >= 0 && gguf_find (m->f, key) == NULL)
    {
      *out = (gint32) def;
      return TRUE;
    }
  guint32 v;
  if (!gguf_get_uint32 (m->f, key, &v, error))
    return FALSE;
  if (v == 0 || v > (1u << 24))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": %u is out of range (1 to %u)",
                   gguf_path (m->f), key, gguf_find (m->f, key)->offset, v, 1u << 24);
      return FALSE;
    }
  *out = (gint32) v;
  return TRUE;
}

static gboolean
get_real (const LlamaModel *m, const char *suffix, double def, double *out, GError **error)
{
  g_autofree char *key = arch_key (m, suffix);
  if (!isnan (def) && gguf_find (m->f, key) == NULL)
    {
      *out = def;
      return TRUE;
    }
  return gguf_get_float (m->f, key, out, error);
}

static gboolean
bad_shape (const LlamaModel *m, GError **error, const char *fmt, ...) G_GNUC_PRINTF (3, 4);

static gboolean
bad_shape (const LlamaModel *m, GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT, "%s: %s", gguf_path (m->f), msg);
  return FALSE;
}

static gboolean
read_rope (LlamaModel *m, GError **error)
{
  LlamaConfig *c = &m->cfg;
  LlamaRope *r = &c->rope;
  r->style = c->arch == LLAMA_ARCH_LLAMA ? LLAMA_ROPE_NORM : LLAMA_ROPE_NEOX;
  if (!get_count (m, "rope.dimension_count", c->head_dim, &r->n_rot, error)
      || !get_real (m, "rope.freq_base", 10000.0, &r->base, error))
    return FALSE;
  if (r->n_rot % 2 != 0 || r->n_rot > c->head_dim || r->n_rot > 1024)
    return bad_shape (m, error, "rope.dimension_count %d must be even and at most head_dim %d",
                                          r->n_rot, c->head_dim);
  r->scaling = LLAMA_ROPE_SCALING_NONE;
  r->freq_scale = 1;
  r->attn_factor = 1;
  r->beta_fast = 32;
  r->beta_slow = 1;
  r->orig_ctx = c->n_ctx;
  g_autofree char *type_key = arch_key (m, "rope.scaling.type");
  const char *type = "none";
  if (gguf_find (m->f, type_key) != NULL && !gguf_get_string (m->f, type_key, &type, error))
    return FALSE;
  double factor = 0, linear = 0;
  if (!get_real (m, "rope.scaling.factor", 0.0, &factor, error)
      || !get_real (m, "rope.scale_linear", 0.0, &linear, error))
    return FALSE;
  if (g_str_equal (type, "none") && linear > 0 && linear != 1)
    {
      type = "linear";
      factor = linear;
    }
  if (g_str_equal (type, "linear") || g_str_equal (type, "yarn"))
    {
      if (!(factor > 0))
        {
          g_autofree char *fk = arch_key (m, "rope.scaling.factor");
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                       "%s: rope scaling '%s' needs a positive '%s' (is %g)", gguf_path (m->f), type, fk, factor);
          return FALSE;
        }
      r->freq_scale = 1 / factor;
      r->scaling = g_str_equal (type, "linear") ? LLAMA_ROPE_SCALING_LINEAR : LLAMA_ROPE_SCALING_YARN;
    }
  else if (!g_str_equal (type, "none"))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_UNSUPPORTED,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": rope scaling '%s' is not supported (none, linear, yarn; llama3 comes as the rope_freqs tensor)",
                   gguf_path (m->f), type_key, gguf_find (m->f, type_key)->offset, type);
      return FALSE;
    }
  if (r->scaling == LLAMA_ROPE_SCALING_YARN)
    {
      gint32 orig;
      double attn_factor;
      if (!get_count (m, "rope.scaling.original_context_length", c->n_ctx, &orig, error)
          || !get_real (m, "rope.scaling.attn_factor", 1.0, &attn_factor, error))
        return FALSE;
      r->orig_ctx = orig;
      r->attn_factor = attn_factor;
      r->ext_factor = 1;
    }
  return TRUE;
}

static gboolean
read_config (LlamaModel *m, GError **error)
{
  LlamaConfig *c = &m->cfg;
  const char *arch;
  if (!gguf_get_string (m->f, "general.architecture", &arch, error))
    return FALSE;
  gboolean found = FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS (archs); i++)
    if (g_str_equal (arch, archs[i].name))
      {
        c->arch = archs[i].arch;
        c->arch_name = archs[i].name;
        found = TRUE;
      }
  if (!found)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_UNSUPPORTED,
                   "%s: key 'general.architecture' at offset %" G_GUINT64_FORMAT
                   ": architecture '%s' is not supported (supported: " LLAMA_SUPPORTED_ARCHS ")",
                   gguf_path (m->f), gguf_find (m->f, "general.architecture")->offset, arch);
      return FALSE;
    }
  gint32 n_ctx;
  double eps;
  if (!get_count (m, "block_count", -1, &c->n_layers, error)
      || !get_count (m, "embedding_length", -1, &c->n_embd, error)
      || !get_count (m, "feed_forward_length", -1, &c->n_ff, error)
      || !get_count (m, "attention.head_count", -1, &c->n_heads, error)
      || !get_count (m, "attention.head_count_kv", c->n_heads, &c->n_kv_heads, error)
      || !get_count (m, "attention.key_length", c->n_embd / c->n_heads, &c->head_dim, error)
      || !get_count (m, "context_length", -1, &n_ctx, error)
      || !get_real (m, "attention.layer_norm_rms_epsilon", NAN, &eps, error))
    return FALSE;
  c->n_ctx = n_ctx;
  c->eps = (float) eps;
  if (c->n_heads % c->n_kv_heads != 0)
    return bad_shape (m, error, "%d attention heads are not a multiple of %d kv heads",
                                          c->n_heads, c->n_kv_heads);
  gint32 v_len;
  if (!get_count (m, "attention.value_length", c->head_dim, &v_len, error))
    return FALSE;
  if (v_len != c->head_dim)
    return bad_shape (m, error, "value_length %d differs from key_length %d", v_len, c->head_dim);
  return read_rope (m, error);
}

/* ---- tensors ---- */

static gboolean
tensor_fail (const LlamaModel *m, const GgufTensor *t, int code, GError **error, const char *fmt, ...) G_GNUC_PRINTF (5, 6);

static gboolean
tensor_fail (const LlamaModel *m, const GgufTensor *t, int code, GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, SIFT_MODEL_ERROR, code, "%s: tensor '%s' (info at offset %" G_GUINT64_FORMAT "): %s",
               gguf_path (m->f), t->name, t->info_offset, msg);
  return FALSE;
}

static gboolean
check_tensor (LlamaModel *m, const GgufTensor *t, guint32 n_dims, gint64 d0, gint64 d1, GError **error)
{
  if (!llama_type_supported (t->type))
    return tensor_fail (m, t, SIFT_MODEL_ERROR_UNSUPPORTED, error,
                        "type %s is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)",
                        gguf_tensor_type_name (t->type));
  gboolean ok = t->dims[0] == (guint64) d0 && t->dims[1] == (guint64) d1 && t->dims[2] == 1 && t->dims[3] == 1;
  if (!ok || (t->n_dims != n_dims && !(n_dims == 2 && d1 == 1)))
    return tensor_fail (m, t, SIFT_MODEL_ERROR_FORMAT, error,
                        "dims [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        "], expected [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] from the metadata",
                        t->dims[0], t->dims[1], t->dims[2], t->dims[3], d0, d1);
  m->weight_bytes += t->n_bytes;
  return TRUE;
}

static gboolean
get_mat (LlamaModel *m, const char *name, gint64 n_in, gint64 n_out, LlamaMat *out, GError **error)
{
  const GgufTensor *t;
  if (!gguf_get_tensor (m->f, name, &t, error) || !check_tensor (m, t, 2, n_in, n_out, error))
    return FALSE;
  llama_mat_init (out, t->type, n_in, n_out, t->data);
  return TRUE;
}

/* A vector as owned f32; absent: NULL if optional, else an error. */
static gboolean
get_vec (LlamaModel *m, const char *name, gint64 n, gboolean optional, float **out, GError **error)
{
  *out = NULL;
  const GgufTensor *t = gguf_find_tensor (m->f, name);
  if (t == NULL && optional)
    return TRUE;
  if (!gguf_get_tensor (m->f, name, &t, error) || !check_tensor (m, t, 1, n, 1, error))
    return FALSE;
  *out = g_new (float, n);
  llama_dequantize_row (t->type, t->data, *out, n);
  return TRUE;
}

static gboolean
read_layer (LlamaModel *m, gint32 il, LlamaLayer *L, GError **error)
{
  const LlamaConfig *c = &m->cfg;
  gint64 nq = (gint64) c->n_heads * c->head_dim, nkv = (gint64) c->n_kv_heads * c->head_dim;
  char name[GGUF_MAX_NAME + 32];
#define NAME(s) (g_snprintf (name, sizeof name, "blk.%d." s, il), name)
  if (!get_vec (m, NAME ("attn_norm.weight"), c->n_embd, FALSE, &L->attn_norm, error)
      || !get_mat (m, NAME ("attn_q.weight"), c->n_embd, nq, &L->q, error)
      || !get_mat (m, NAME ("attn_k.weight"), c->n_embd, nkv, &L->k, error)
      || !get_mat (m, NAME ("attn_v.weight"), c->n_embd, nkv, &L->v, error)
      || !get_mat (m, NAME ("attn_output.weight"), nq, c->n_embd, &L->o, error)
      || !get_vec (m, NAME ("ffn_norm.weight"), c->n_embd, FALSE, &L->ffn_norm, error)
      || !get_mat (m, NAME ("ffn_gate.weight"), c->n_embd, c->n_ff, &L->gate, error)
      || !get_mat (m, NAME ("ffn_up.weight"), c->n_embd, c->n_ff, &L->up, error)
      || !get_mat (m, NAME ("ffn_down.weight"), c->n_ff, c->n_embd, &L->down, error))
    return FALSE;
  gboolean qwen2 = c->arch == LLAMA_ARCH_QWEN2, qwen3 = c->arch == LLAMA_ARCH_QWEN3;
  /* llama files may carry biases too (some fine-tunes): optional there, required for qwen2. */
  if (!get_vec (m, NAME ("attn_q.bias"), nq, !qwen2, &L->bq, error)
      || !get_vec (m, NAME ("attn_k.bias"), nkv, !qwen2, &L->bk, error)
      || !get_vec (m, NAME ("attn_v.bias"), nkv, !qwen2, &L->bv, error))
    return FALSE;
  if (qwen3 && (!get_vec (m, NAME ("attn_q_norm.weight"), c->head_dim, FALSE, &L->q_norm, error)
                || !get_vec (m, NAME ("attn_k_norm.weight"), c->head_dim, FALSE, &L->k_norm, error)))
    return FALSE;
#undef NAME
  return TRUE;
}

static gboolean
read_tensors (LlamaModel *m, GError **error)
{
  LlamaConfig *c = &m->cfg;
  const GgufTensor *embd;
  if (!gguf_get_tensor (m->f, "token_embd.weight", &embd, error))
    return FALSE;
  if (embd->dims[1] > G_MAXINT32 || embd->dims[1] < 1)
    return tensor_fail (m, embd, SIFT_MODEL_ERROR_FORMAT, error, "%" G_GUINT64_FORMAT " rows", embd->dims[1]);
  c->n_vocab = (gint32) embd->dims[1];
  /* The tokenizer's vocabulary must be the embedding's rows. */
  const GgufValue *tokens = gguf_find (m->f, "tokenizer.ggml.tokens");
  if (tokens != NULL && tokens->type == GGUF_TYPE_ARRAY && tokens->arr.n != (guint64) c->n_vocab)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key 'tokenizer.ggml.tokens' at offset %" G_GUINT64_FORMAT ": vocab size %" G_GUINT64_FORMAT
                   " disagrees with the %d rows of tensor 'token_embd.weight'",
                   gguf_path (m->f), tokens->offset, tokens->arr.n, c->n_vocab);
      return FALSE;
    }
  if (!get_mat (m, "token_embd.weight", c->n_embd, c->n_vocab, &m->embd, error)
      || !get_vec (m, "output_norm.weight", c->n_embd, FALSE, &m->output_norm, error))
    return FALSE;
  c->tied = gguf_find_tensor (m->f, "output.weight") == NULL;
  if (c->tied)
    m->output = m->embd;
  else if (!get_mat (m, "output.weight", c->n_embd, c->n_vocab, &m->output, error))
    return FALSE;
  if (!get_vec (m, "rope_freqs.weight", c->rope.n_rot / 2, TRUE, &m->rope_freqs, error))
    return FALSE;
  c->rope.freq_factors = m->rope_freqs;
  m->layers = g_new0 (LlamaLayer, c->n_layers);
  for (gint32 il = 0; il < c->n_layers; il++)
    if (!read_layer (m, il, &m->layers[il], error))
      return FALSE;
  return TRUE;
}

/* ---- repacking ---- */

typedef struct {
  const GgufFile *f;
  const LlamaMat *src; /* rows in order, in the mapping */
  guint8 *dst;
} Repack;

/* Groups [begin, end), then the source's pages they used leave the resident set. */
static void
repack_body (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const Repack *r = user_data;
  gsize group = LLAMA_X16 * r->src->row_bytes;
  llama_mat_repack_groups (r->src, begin, end, r->dst);
  gguf_drop_pages (r->f, r->src->data + (gsize) begin * group, (gsize) (end - begin) * group);
}

/* The matrices that the active kernels read faster as x16 groups
 * (repack.h) are copied so into one buffer on huge pages, ~2 MiB at a time,
 * and the mapped file's pages they came from leave the resident set as
 * they are copied: the weights stay resident once, not twice. */
static void
repack (LlamaModel *m)
{
  const LlamaMatmulKernels *k = llama_matmul_kernels_get (sift_isa_active ());
  GPtrArray *mats = g_ptr_array_new ();
  g_ptr_array_add (mats, &m->embd);
  if (!m->cfg.tied)
    g_ptr_array_add (mats, &m->output);
  for (gint32 il = 0; il < m->cfg.n_layers; il++)
    {
      LlamaLayer *L = &m->layers[il];
      LlamaMat *each[] = { &L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down };
      for (gsize i = 0; i < G_N_ELEMENTS (each); i++)
        g_ptr_array_add (mats, each[i]);
    }
  gsize total = 0;
  for (guint i = 0; i < mats->len; i++)
    {
      const LlamaMat *w = mats->pdata[i];
      if (llama_mat_can_repack (w, k))
        total += ((gsize) w->n_out * w->row_bytes + 63) / 64 * 64;
    }
  if (total > 0 && (m->x16 = sift_mem_alloc (total)) != NULL)
    {
      gsize off = 0;
      for (guint i = 0; i < mats->len; i++)
        {
          LlamaMat *w = mats->pdata[i];
          if (!llama_mat_can_repack (w, k))
            continue;
          Repack r = { m->f, w, m->x16 + off };
          gint64 n_groups = w->n_out / LLAMA_X16;
          gsize bytes = (gsize) w->n_out * w->row_bytes;
          sift_parallel_for (n_groups, MAX (1, (gint64) (SIFT_HUGE_PAGE_BYTES / (LLAMA_X16 * w->row_bytes))),
                             repack_body, &r);
          gguf_drop_pages (m->f, w->data, bytes); /* the pages that straddled two ranges */
          w->data = m->x16 + off;
          w->x16 = TRUE;
          off += (bytes + 63) / 64 * 64;
        }
    }
  if (m->cfg.tied)
    m->output = m->embd;
  g_ptr_array_unref (mats);
}

/* Tokens per pass of the MLP: gate and up of 128 tokens take 8 MiB at
 * n_ff 8192 (32 MiB for a 512-token chunk), for ~5% more prefill CPU on
 * Llama-3.2-1B's shape (the weights are read once per pass;
 * docs/benchmarks.md, "Peak resident memory"). */
#define MLP_SLICE 128

/* The step buffers for `cap` rows, each its own mapping (the old ones
 * unmapped; 0: none). */
static void
step_buffers (LlamaModel *m, gint64 cap)
{
  const LlamaConfig *c = &m->cfg;
  const gint64 slice = MIN (m->cap, MLP_SLICE), new_slice = MIN (cap, MLP_SLICE);
  float **bufs[] = { &m->x, &m->xn, &m->gate, &m->up };
  const gint64 old_n[] = { m->cap * c->n_embd, m->cap * c->n_embd, slice * MAX (c->n_ff, c->n_embd), slice * c->n_ff };
  const gint64 new_n[] = { cap * c->n_embd, cap * c->n_embd, new_slice * MAX (c->n_ff, c->n_embd), new_slice * c->n_ff };
  for (gsize i = 0; i < G_N_ELEMENTS (bufs); i++)
    {
      sift_mem_unmap (*bufs[i], sizeof (float) * (gsize) old_n[i]);
      *bufs[i] = NULL;
      if (cap > 0 && (*bufs[i] = sift_mem_map0 (sizeof (float) * (gsize) new_n[i])) == NULL)
        g_error ("%s: out of memory (%" G_GINT64_FORMAT " floats)", gguf_path (m->f), new_n[i]);
    }
  m->cap = m->used = cap;
}

/* Before a step of n rows (n <= cap): the rows past n that a larger step
 * touched go back to the kernel (each step writes its rows before reading
 * them), so decode does not keep a prefill chunk's activations resident. */
static void
fit_step (LlamaModel *m, gint64 n)
{
  const LlamaConfig *c = &m->cfg;
  if (n < m->used)
    {
      sift_mem_discard (m->x + n * c->n_embd, sizeof (float) * (gsize) ((m->used - n) * c->n_embd));
      sift_mem_discard (m->xn + n * c->n_embd, sizeof (float) * (gsize) ((m->used - n) * c->n_embd));
      const gint64 s0 = MIN (n, MLP_SLICE), s1 = MIN (m->used, MLP_SLICE);
      sift_mem_discard (m->gate + s0 * MAX (c->n_ff, c->n_embd), sizeof (float) * (gsize) ((s1 - s0) * MAX (c->n_ff, c->n_embd)));
      sift_mem_discard (m->up + s0 * c->n_ff, sizeof (float) * (gsize) ((s1 - s0) * c->n_ff));
    }
  m->used = n;
}

static LlamaModel *
model_open (const char *path, gboolean for_compute, GError **error)
{
  g_autoptr (LlamaModel) m = g_new0 (LlamaModel, 1);
  m->f = gguf_open (path, error);
  if (m->f == NULL || !read_config (m, error) || !read_tensors (m, error))
    return NULL;
  if (for_compute)
    repack (m);
  return g_steal_pointer (&m);
}

LlamaModel *
llama_model_open (const char *path, GError **error)
{
  return model_open (path, TRUE, error);
}

LlamaModel *
llama_model_open_checked (const char *path, GError **error)
{
  return model_open (path, FALSE, error);
}

void
llama_model_free (LlamaModel *m)
{
  if (m == NULL)
    return;
  if (m->layers != NULL)
    for (gint32 il = 0; il < m->cfg.n_layers; il++)
      {
        LlamaLayer *L = &m->layers[il];
        g_free (L->attn_norm);
        g_free (L->ffn_norm);
        g_free (L->q_norm);
        g_free (L->k_norm);
        g_free (L->bq);
        g_free (L->bk);
        g_free (L->bv);
      }
  g_free (m->layers);
  g_free (m->output_norm);
  g_free (m->rope_freqs);
  step_buffers (m, 0);
  sift_mem_free (m->x16);
  g_free (m->qkv);
  llama_gpu_free (m->gpu);
  gguf_close (m->f);
  g_free (m);
}

gboolean
llama_model_use_gpu (LlamaModel *m, GError **error)
{
  if (m->gpu != NULL)
    return TRUE;
  m->in_step = FALSE;
  step_buffers (m, 0); /* the next step allocates the host side of the GPU's buffers too */
  m->gpu = llama_gpu_new (&m->cfg, m->layers, &m->output, m->output_norm, error);
  if (m->gpu == NULL)
    {
      g_prefix_error (error, "%s: ", gguf_path (m->f));
      return FALSE;
    }
  return TRUE;
}

gboolean
llama_model_on_gpu (const LlamaModel *m)
{
  return m->gpu != NULL;
}

const LlamaConfig *llama_model_config (const LlamaModel *m) { return &m->cfg; }
GgufFile *llama_model_gguf (const LlamaModel *m) { return m->f; }
guint64 llama_model_weight_bytes (const LlamaModel *m) { return m->weight_bytes; }

/* ---- the forward pass ---- */


static gboolean
out_of_order (const LlamaModel *m, const char *call, gint32 layer, GError **error)
{
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
               "%s: %s(layer %d) out of order (in step: %s, next layer %d, awaiting %s)",
               gguf_path (m->f), call, layer, m->in_step ? "yes" : "no", m->next_layer,
               m->want_attended ? "attended" : "qkv");
  return FALSE;
}

gboolean
llama_model_begin (LlamaModel *m, gint64 pos0, gint64 n, const gint32 *tokens, GError **error)
{
  const LlamaConfig *c = &m->cfg;
  /* A step left unfinished by an error is abandoned: begin starts afresh. */
  m->in_step = FALSE;
  if (n < 1 || pos0 < 0 || tokens == NULL)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s: a step needs tokens (n = %" G_GINT64_FORMAT ", pos0 = %" G_GINT64_FORMAT ")",
                   gguf_path (m->f), n, pos0);
      return FALSE;
    }
  for (gint64 t = 0; t < n; t++)
    if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
      {
        g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                     "%s: token %d at position %" G_GINT64_FORMAT " is outside the vocabulary (0 to %d)",
                     gguf_path (m->f), tokens[t], pos0 + t, c->n_vocab - 1);
        return FALSE;
      }
  if (n > m->cap)
    {
      step_buffers (m, n);
      if (m->gpu != NULL)
        m->qkv = g_renew (float, m->qkv, n * ((gint64) c->n_heads + 2 * (gint64) c->n_kv_heads) * c->head_dim);
    }
  fit_step (m, n);
  for (gint64 t = 0; t < n; t++)
    llama_mat_row (&m->embd, tokens[t], m->x + t * c->n_embd);
  if (m->gpu != NULL && !llama_gpu_begin (m->gpu, m->x, n, error))
    return FALSE;
  m->in_step = TRUE;
  m->pos0 = pos0;
  m->n = n;
  m->next_layer = 0;
  m->want_attended = FALSE;
  return TRUE;
}

static void
add_bias (float *y, const float *b, gint64 n, gint64 d)
{
  if (b == NULL)
    return;
  for (gint64 t = 0; t < n; t++)
    for (gint64 i = 0; i < d; i++)
      y[t * d + i] += b[i];
}

/* Products over one input share one parallel loop where their types and layouts agree. */
static gboolean
fusable (const LlamaMat *const *w, int n)
{
  for (int i = 1; i < n; i++)
    if (w[i]->type != w[0]->type || w[i]->x16 != w[0]->x16)
      return FALSE;
  return TRUE;
}

gboolean
llama_model_qkv (LlamaModel *m, gint32 layer, float *q, float *k, float *v, GError **error)
{
  const LlamaConfig *c = &m->cfg;
  if (!m->in_step || m->want_attended || layer != m->next_layer)
    return out_of_order (m, "qkv", layer, error);
  const LlamaLayer *L = &m->layers[layer];
  gint64 n = m->n, nq = (gint64) c->n_heads * c->head_dim, nkv = (gint64) c->n_kv_heads * c->head_dim;
  if (m->gpu != NULL)
    {
      if (!llama_gpu_qkv (m->gpu, layer, m->qkv, error))
        return FALSE;
      for (gint64 t = 0; t < n; t++)
        {
          const float *row = m->qkv + t * (nq + 2 * nkv);
          memcpy (q + t * nq, row, sizeof (float) * (gsize) nq);
          memcpy (k + t * nkv, row + nq, sizeof (float) * (gsize) nkv);
          memcpy (v + t * nkv, row + nq + nkv, sizeof (float) * (gsize) nkv);
        }
    }
  else
    {
      llama_rmsnorm (m->x, L->attn_norm, c->eps, n, c->n_embd, m->xn);
      const LlamaMat *qkv[] = { &L->q, &L->k, &L->v };
      float *out[] = { q, k, v };
      if (fusable (qkv, 3))
        llama_matmul_multi (qkv, out, 3, m->xn, n);
      else
        for (int i = 0; i < 3; i++)
          llama_matmul (qkv[i], m->xn, out[i], n);
    }
  add_bias (q, L->bq, n, nq);
  add_bias (k, L->bk, n, nkv);
  add_bias (v, L->bv, n, nkv);
  if (L->q_norm != NULL)
    {
      llama_rmsnorm (q, L->q_norm, c->eps, n * c->n_heads, c->head_dim, q);
      llama_rmsnorm (k, L->k_norm, c->eps, n * c->n_kv_heads, c->head_dim, k);
    }
  llama_rope (&c->rope, q, n, c->n_heads, c->head_dim, m->pos0);
  llama_rope (&c->rope, k, n, c->n_kv_heads, c->head_dim, m->pos0);
  m->want_attended = TRUE;
  return TRUE;
}

gboolean
llama_model_attended (LlamaModel *m, gint32 layer, const float *out, GError **error)
{
  const LlamaConfig *c = &m->cfg;
  if (!m->in_step || !m->want_attended || layer != m->next_layer)
    return out_of_order (m, "attended", layer, error);
  if (m->gpu != NULL)
    {
      if (!llama_gpu_attended (m->gpu, layer, out, error))
        return FALSE;
      m->want_attended = FALSE;
      m->next_layer++;
      return TRUE;
    }
  const LlamaLayer *L = &m->layers[layer];
  gint64 n = m->n, d = c->n_embd;
  /* Attention block: x += Wo out (xn is free once q, k and v exist). */
  llama_matmul (&L->o, out, m->xn, n);
  for (gint64 i = 0; i < n * d; i++)
    m->x[i] += m->xn[i];
  /* MLP: x += Wdown (silu (Wgate xn) * Wup xn), MLP_SLICE tokens at a time:
   * the n_ff-wide buffers hold a slice, not the whole step. */
  llama_rmsnorm (m->x, L->ffn_norm, c->eps, n, d, m->xn);
  for (gint64 s0 = 0; s0 < n; s0 += MLP_SLICE)
    {
      gint64 ns = MIN (MLP_SLICE, n - s0);
      const LlamaMat *gu[] = { &L->gate, &L->up };
      float *gu_out[] = { m->gate, m->up };
      if (fusable (gu, 2))
        llama_matmul_multi (gu, gu_out, 2, m->xn + s0 * d, ns);
      else
        for (int i = 0; i < 2; i++)
          llama_matmul (gu[i], m->xn + s0 * d, gu_out[i], ns);
      llama_swiglu (m->gate, m->up, ns * c->n_ff, m->up);
      llama_matmul (&L->down, m->up, m->gate, ns); /* gate is free: [ns][n_embd] */
      for (gint64 i = 0; i < ns * d; i++)
        m->x[s0 * d + i] += m->gate[i];
    }
  m->want_attended = FALSE;
  m->next_layer++;
  return TRUE;
}

gboolean
llama_model_end (LlamaModel *m, float *logits, GError **error)
{
  const LlamaConfig *c = &m->cfg;
  if (!m->in_step || m->want_attended || m->next_layer != c->n_layers)
    return out_of_order (m, "end", m->next_layer, error);
  m->in_step = FALSE;
  if (logits == NULL)
    return TRUE;
  if (m->gpu != NULL)
    return llama_gpu_end (m->gpu, logits, error);
  const float *last = m->x + (m->n - 1) * c->n_embd;
  llama_rmsnorm (last, m->output_norm, c->eps, 1, c->n_embd, m->xn);
  llama_matmul (&m->output, m->xn, logits, 1);
  return TRUE;
}

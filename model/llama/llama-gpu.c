/* The Llama forward pass on the GPU: weights uploaded once as f16, the
 * residual stream kept on the device, each product one cuBLAS call. See
 * llama-gpu.h. */
#include <string.h>

#include <sift/cuda.h>
#include <sift/dtype.h>
#include <sift/error.h>

#include "llama-gpu.h"
#include "quant.h"

/* A weight matrix on the device: f16 [n_out][n_in]. */
typedef struct {
  void *w;
  gint64 n_in, n_out;
} GpuMat;

typedef struct {
  GpuMat qkv;             /* [n_q + 2 n_kv][n_embd]: q, k, v rows */
  GpuMat o;               /* [n_embd][n_q] */
  GpuMat gate_up;         /* [2 n_ff][n_embd]: gate, up rows */
  GpuMat down;            /* [n_embd][n_ff] */
  float *attn_norm, *ffn_norm; /* [n_embd] */
} GpuLayer;

struct _LlamaGpu {
  LlamaConfig c;
  GpuLayer *layers;       /* [n_layers] */
  GpuMat output;          /* [n_vocab][n_embd] */
  float *output_norm;     /* [n_embd] */
  guint64 weight_bytes;
  /* The step. */
  gint64 n, cap;
  float *x;               /* [cap][n_embd] residual stream */
  guint16 *h;             /* [cap][max (n_embd, n_q, n_ff)] f16 operand of the next product */
  float *y;               /* [cap][max (n_q + 2 n_kv, 2 n_ff)] a product's f32 result */
  float *logits;          /* [n_vocab] */
};

static void *
dev_upload (const void *src, gsize bytes, LlamaGpu *g, GError **error)
{
  void *p = sift_cuda_malloc (bytes, error);
  if (p != NULL && !sift_cuda_memcpy_to_device (p, src, bytes, error))
    {
      sift_cuda_free (p);
      return NULL;
    }
  if (p != NULL)
    g->weight_bytes += bytes;
  return p;
}

/* Rows of m as f16 into dst [n_out][n_in]: F16 rows as they are, others
 * (repacked x16 groups too) through f32. */
static void
rows_to_f16 (const LlamaMat *m, guint16 *dst, float *tmp)
{
  for (gint64 r = 0; r < m->n_out; r++)
    {
      guint16 *out = dst + (gsize) r * (gsize) m->n_in;
      if (m->type == GGUF_TENSOR_F16 && !m->x16)
        memcpy (out, m->data + (gsize) r * m->row_bytes, (gsize) m->n_in * 2);
      else
        {
          llama_mat_row (m, r, tmp);
          sift_convert (tmp, SIFT_DTYPE_F32, out, SIFT_DTYPE_F16, (gsize) m->n_in);
        }
    }
}

/* Matrices stacked along n_out (same n_in) as one f16 device matrix. */
static gboolean
mat_upload (LlamaGpu *g, const LlamaMat *const *parts, int n_parts, GpuMat *out, GError **error)
{
  gint64 n_out = 0;
  for (int i = 0; i < n_parts; i++)
    n_out += parts[i]->n_out;
  const gint64 n_in = parts[0]->n_in;
  g_autofree guint16 *host = g_new (guint16, (gsize) n_out * (gsize) n_in);
  g_autofree float *tmp = g_new (float, n_in);
  for (int i = 0, at = 0; i < n_parts; at += (int) parts[i]->n_out, i++)
    rows_to_f16 (parts[i], host + (gsize) at * (gsize) n_in, tmp);
  out->n_in = n_in;
  out->n_out = n_out;
  out->w = dev_upload (host, (gsize) n_out * (gsize) n_in * 2, g, error);
  return out->w != NULL;
}

static float *
vec_upload (LlamaGpu *g, const float *v, gint64 n, GError **error)
{
  return dev_upload (v, (gsize) n * sizeof (float), g, error);
}

LlamaGpu *
llama_gpu_new (const LlamaConfig *c, const LlamaLayer *layers, const LlamaMat *output, const float *output_norm,
               GError **error)
{
  if (!sift_cuda_blas_init (error))
    return NULL;
  LlamaGpu *g = g_new0 (LlamaGpu, 1);
  g->c = *c;
  g->layers = g_new0 (GpuLayer, c->n_layers);
  gboolean ok = TRUE;
  for (gint32 l = 0; l < c->n_layers && ok; l++)
    {
      const LlamaLayer *L = &layers[l];
      GpuLayer *G = &g->layers[l];
      const LlamaMat *qkv[] = { &L->q, &L->k, &L->v }, *o[] = { &L->o }, *gu[] = { &L->gate, &L->up },
                     *down[] = { &L->down };
      ok = mat_upload (g, qkv, 3, &G->qkv, error) && mat_upload (g, o, 1, &G->o, error)
           && mat_upload (g, gu, 2, &G->gate_up, error) && mat_upload (g, down, 1, &G->down, error)
           && (G->attn_norm = vec_upload (g, L->attn_norm, c->n_embd, error)) != NULL
           && (G->ffn_norm = vec_upload (g, L->ffn_norm, c->n_embd, error)) != NULL;
    }
  const LlamaMat *out[] = { output };
  ok = ok && mat_upload (g, out, 1, &g->output, error)
       && (g->output_norm = vec_upload (g, output_norm, c->n_embd, error)) != NULL
       && (g->logits = sift_cuda_malloc (sizeof (float) * (gsize) c->n_vocab, error)) != NULL;
  if (!ok)
    {
      g_prefix_error (error, "the GPU forward pass: ");
      llama_gpu_free (g);
      return NULL;
    }
  return g;
}

void
llama_gpu_free (LlamaGpu *g)
{
  if (g == NULL)
    return;
  for (gint32 l = 0; l < g->c.n_layers; l++)
    {
      GpuLayer *G = &g->layers[l];
      sift_cuda_free (G->qkv.w);
      sift_cuda_free (G->o.w);
      sift_cuda_free (G->gate_up.w);
      sift_cuda_free (G->down.w);
      sift_cuda_free (G->attn_norm);
      sift_cuda_free (G->ffn_norm);
    }
  g_free (g->layers);
  sift_cuda_free (g->output.w);
  sift_cuda_free (g->output_norm);
  sift_cuda_free (g->logits);
  sift_cuda_free (g->x);
  sift_cuda_free (g->h);
  sift_cuda_free (g->y);
  g_free (g);
}

guint64
llama_gpu_weight_bytes (const LlamaGpu *g)
{
  return g->weight_bytes;
}

static gint64
q_width (const LlamaGpu *g)
{
  return (gint64) g->c.n_heads * g->c.head_dim;
}

static gint64
qkv_width (const LlamaGpu *g)
{
  return q_width (g) + 2 * (gint64) g->c.n_kv_heads * g->c.head_dim;
}

gboolean
llama_gpu_begin (LlamaGpu *g, const float *x, gint64 n, GError **error)
{
  const LlamaConfig *c = &g->c;
  if (n > g->cap)
    {
      sift_cuda_free (g->x);
      sift_cuda_free (g->h);
      sift_cuda_free (g->y);
      g->x = NULL, g->h = NULL, g->y = NULL, g->cap = 0;
      const gsize hw = (gsize) MAX (MAX (c->n_embd, q_width (g)), c->n_ff);
      const gsize yw = (gsize) MAX (qkv_width (g), 2 * (gint64) c->n_ff);
      if ((g->x = sift_cuda_malloc (sizeof (float) * (gsize) n * (gsize) c->n_embd, error)) == NULL
          || (g->h = sift_cuda_malloc (2 * (gsize) n * hw, error)) == NULL
          || (g->y = sift_cuda_malloc (sizeof (float) * (gsize) n * yw, error)) == NULL)
        return FALSE;
      g->cap = n;
    }
  g->n = n;
  return sift_cuda_memcpy_to_device (g->x, x, sizeof (float) * (gsize) n * (gsize) c->n_embd, error);
}

gboolean
llama_gpu_qkv (LlamaGpu *g, gint32 layer, float *qkv, GError **error)
{
  const LlamaConfig *c = &g->c;
  const GpuLayer *G = &g->layers[layer];
  return sift_cuda_rmsnorm_f16 (g->x, G->attn_norm, c->eps, g->n, c->n_embd, g->h, error)
         && sift_cuda_gemm_f16 (G->qkv.w, g->h, g->y, G->qkv.n_out, c->n_embd, g->n, 0.0f, error)
         && sift_cuda_memcpy_to_host (qkv, g->y, sizeof (float) * (gsize) g->n * (gsize) qkv_width (g), error);
}

gboolean
llama_gpu_attended (LlamaGpu *g, gint32 layer, const float *out, GError **error)
{
  const LlamaConfig *c = &g->c;
  const GpuLayer *G = &g->layers[layer];
  const gint64 n = g->n, nq = q_width (g);
  /* x += Wo out; x += Wdown (silu (Wgate xn) * Wup xn), xn = norm (x). */
  return sift_cuda_memcpy_to_device (g->y, out, sizeof (float) * (gsize) n * (gsize) nq, error)
         && sift_cuda_f32_to_f16 (g->y, (gsize) n * (gsize) nq, g->h, error)
         && sift_cuda_gemm_f16 (G->o.w, g->h, g->x, c->n_embd, nq, n, 1.0f, error)
         && sift_cuda_rmsnorm_f16 (g->x, G->ffn_norm, c->eps, n, c->n_embd, g->h, error)
         && sift_cuda_gemm_f16 (G->gate_up.w, g->h, g->y, 2 * (gint64) c->n_ff, c->n_embd, n, 0.0f, error)
         && sift_cuda_swiglu_f16 (g->y, n, c->n_ff, g->h, error)
         && sift_cuda_gemm_f16 (G->down.w, g->h, g->x, c->n_embd, c->n_ff, n, 1.0f, error);
}

gboolean
llama_gpu_end (LlamaGpu *g, float *logits, GError **error)
{
  const LlamaConfig *c = &g->c;
  const float *last = g->x + (gsize) (g->n - 1) * (gsize) c->n_embd;
  return sift_cuda_rmsnorm_f16 (last, g->output_norm, c->eps, 1, c->n_embd, g->h, error)
         && sift_cuda_gemm_f16 (g->output.w, g->h, g->logits, c->n_vocab, c->n_embd, 1, 0.0f, error)
         && sift_cuda_memcpy_to_host (logits, g->logits, sizeof (float) * (gsize) c->n_vocab, error);
}

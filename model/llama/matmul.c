/* Matmul: activation preparation, threading, ISA dispatch, scalar dots. */
#include <math.h>
#include <string.h>

#include <sift/dtype.h>
#include <sift/parallel.h>

#include "matmul.h"
#include "quant.h"

/* ---- scalar dot products (the reference the SIMD ones are tested against) ---- */

static float
dot_f32 (const void *w, const void *act, gint64 n)
{
  const float *a = w, *x = act;
  float s = 0;
  for (gint64 i = 0; i < n; i++)
    s += a[i] * x[i];
  return s;
}

static float
dot_f16 (const void *w, const void *act, gint64 n)
{
  const guint16 *a = w;
  const float *x = act;
  float s = 0;
  for (gint64 i = 0; i < n; i++)
    s += sift_f16_to_f32 (a[i]) * x[i];
  return s;
}

static float
dot_bf16 (const void *w, const void *act, gint64 n)
{
  const guint16 *a = w;
  const float *x = act;
  float s = 0;
  for (gint64 i = 0; i < n; i++)
    s += sift_bf16_to_f32 (a[i]) * x[i];
  return s;
}

static float
dot_q8_0 (const void *w, const void *act, gint64 n)
{
  const BlockQ8_0 *b = w;
  const ActQ8 *x = act;
  float s = 0;
  for (gint64 i = 0; i < n / QK; i++)
    {
      int sum = 0;
      for (int l = 0; l < QK; l++)
        sum += b[i].qs[l] * x[i].qs[l];
      s += sift_f16_to_f32 (b[i].d) * x[i].d * (float) sum;
    }
  return s;
}

static float
dot_q4_0 (const void *w, const void *act, gint64 n)
{
  const BlockQ4_0 *b = w;
  const ActQ8 *x = act;
  float s = 0;
  for (gint64 i = 0; i < n / QK; i++)
    {
      /* sum (q - 8) x = sum q x - 8 sum x */
      int sum = 0;
      for (int l = 0; l < QK / 2; l++)
        sum += (b[i].qs[l] & 15) * x[i].qs[l] + (b[i].qs[l] >> 4) * x[i].qs[l + QK / 2];
      s += sift_f16_to_f32 (b[i].d) * x[i].d * (float) (sum - 8 * x[i].sum);
    }
  return s;
}

static float
dot_q4_k (const void *w, const void *act, gint64 n)
{
  const BlockQ4_K *b = w;
  const ActQ8K *x = act;
  float s = 0;
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      /* sum (d sc q - dmin m) x = d sum_j sc_j (q.x)_j - dmin sum_j m_j (sum x)_j */
      int sum_q = 0, sum_m = 0;
      for (int j = 0; j < 8; j++)
        {
          guint8 sc, m;
          llama_q4_k_scale_min (b[i].scales, j, &sc, &m);
          const guint8 *q = b[i].qs + 32 * (j / 2);
          const gint8 *xq = x[i].qs + 32 * j;
          int dot = 0;
          for (int l = 0; l < 32; l++)
            dot += (j % 2 == 0 ? q[l] & 15 : q[l] >> 4) * xq[l];
          sum_q += sc * dot;
          sum_m += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
      s += x[i].d * (sift_f16_to_f32 (b[i].d) * (float) sum_q - sift_f16_to_f32 (b[i].dmin) * (float) sum_m);
    }
  return s;
}

static float
dot_q6_k (const void *w, const void *act, gint64 n)
{
  const BlockQ6_K *b = w;
  const ActQ8K *x = act;
  float s = 0;
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      int sum = 0;
      for (int h = 0; h < 2; h++)
        {
          const guint8 *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
          const gint8 *xq = x[i].qs + 128 * h;
          const gint8 *sc = b[i].scales + 8 * h;
          for (int l = 0; l < 32; l++)
            {
              int is = l / 16;
              int q0 = (ql[l] & 15) | ((qh[l] & 3) << 4);
              int q1 = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
              int q2 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
              int q3 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
              sum += sc[is] * q0 * xq[l] + sc[is + 2] * q1 * xq[l + 32]
                     + sc[is + 4] * q2 * xq[l + 64] + sc[is + 6] * q3 * xq[l + 96];
            }
        }
      /* The codes are q - 32: subtract 32 sc_j (sum x)_j. */
      for (int j = 0; j < 16; j++)
        sum -= 32 * b[i].scales[j] * x[i].bsums[j];
      s += sift_f16_to_f32 (b[i].d) * x[i].d * (float) sum;
    }
  return s;
}

const LlamaMatmulKernels llama_matmul_scalar = {
  .name = "scalar",
  .dot = {
    [GGUF_TENSOR_F32] = dot_f32,
    [GGUF_TENSOR_F16] = dot_f16,
    [GGUF_TENSOR_BF16] = dot_bf16,
    [GGUF_TENSOR_Q8_0] = dot_q8_0,
    [GGUF_TENSOR_Q4_0] = dot_q4_0,
    [GGUF_TENSOR_Q4_K] = dot_q4_k,
    [GGUF_TENSOR_Q6_K] = dot_q6_k,
  },
};

const LlamaMatmulKernels *
llama_matmul_kernels_get (SiftIsa isa)
{
  if (isa > sift_isa_detect ())
    return NULL;
  switch (isa)
    {
#ifdef SIFT_HAVE_AVX512
    case SIFT_ISA_AVX512:
      if (!__builtin_cpu_supports ("avx512vnni"))
        return llama_matmul_kernels_get (SIFT_ISA_AVX2);
#ifdef SIFT_HAVE_AMX
      if (llama_amx_usable ())
        {
          static LlamaMatmulKernels amx;
          static gsize once = 0;
          if (g_once_init_enter (&once))
            {
              amx = llama_matmul_avx512;
              amx.name = "avx512-amx";
              static const LlamaPanel q8_0 = { llama_amx_pack_bytes_q8_0, llama_amx_pack_q8_0, llama_amx_panel_q8_0 };
              static const LlamaPanel q4_k = { llama_amx_pack_bytes_q4_k, llama_amx_pack_q4_k, llama_amx_panel_q4_k };
              amx.panel[GGUF_TENSOR_Q8_0] = &q8_0;
              amx.panel[GGUF_TENSOR_Q4_K] = &q4_k;
              g_once_init_leave (&once, 1);
            }
          return &amx;
        }
#endif
      return &llama_matmul_avx512;
#endif
#ifdef SIFT_HAVE_AVX2
    case SIFT_ISA_AVX2: return &llama_matmul_avx2;
#endif
    case SIFT_ISA_SCALAR: return &llama_matmul_scalar;
    default: return NULL;
    }
}

void
llama_mat_init (LlamaMat *m, GgufTensorType type, gint64 n_in, gint64 n_out, const void *data)
{
  g_assert (llama_type_supported (type) && n_in % gguf_tensor_type_block (type) == 0);
  m->type = type;
  m->n_in = n_in;
  m->n_out = n_out;
  m->row_bytes = (gsize) (n_in / gguf_tensor_type_block (type)) * gguf_tensor_type_block_bytes (type);
  m->data = data;
}

/* ---- activations and the threaded loop ---- */

/* Bytes of one activation row prepared for `type`. */
static gsize
act_row_bytes (GgufTensorType type, gint64 n_in)
{
  switch (type)
    {
    case GGUF_TENSOR_Q8_0: case GGUF_TENSOR_Q4_0: return (gsize) (n_in / QK) * sizeof (ActQ8);
    case GGUF_TENSOR_Q4_K: case GGUF_TENSOR_Q6_K: return (gsize) (n_in / QK_K) * sizeof (ActQ8K);
    default: return (gsize) n_in * sizeof (float);
    }
}

typedef struct {
  const LlamaMatmulKernels *k;
  const LlamaMat *w;
  const guint8 *act; /* [n_tok][act_bytes] */
  gsize act_bytes;
  float *y;          /* [n_tok][n_out] */
  gint64 n_tok;
  gint64 tok_tile;   /* tokens per pass over a range of rows: their activations stay in L2 */
  int rows_per_item; /* the parallel loop's items are groups of this many rows (the tile's or panel's) */
  LlamaTileFn tile;         /* or NULL: dots only */
  const LlamaPanel *panel; /* or NULL */
  const guint8 *packed;    /* the activations as panel->pack laid them out */
} Job;

static void
rows_body (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const Job *j = user_data;
  const LlamaMat *w = j->w;
  LlamaDotFn dot = j->k->dot[w->type];
  LlamaTileFn tile = j->tile;
  int tr = j->k->tile_r, tt = j->k->tile_t;
  gint64 r0 = begin * j->rows_per_item, r1 = MIN (end * j->rows_per_item, w->n_out);
  if (j->panel != NULL)
    for (; r0 + LLAMA_PANEL_ROWS <= r1; r0 += LLAMA_PANEL_ROWS)
      j->panel->run (w->data + (gsize) r0 * w->row_bytes, w->row_bytes, j->packed, j->n_tok, w->n_in, j->y + r0,
                     (gsize) w->n_out);
  for (gint64 t0 = 0; t0 < j->n_tok; t0 += j->tok_tile)
    {
      gint64 t1 = MIN (t0 + j->tok_tile, j->n_tok);
      gint64 r = r0;
      if (tile != NULL)
        for (; r + tr <= r1; r += tr)
          {
            const guint8 *row = w->data + (gsize) r * w->row_bytes;
            for (gint64 t = t0; t < t1; t += tt)
              tile (row, w->row_bytes, j->act + (gsize) t * j->act_bytes, j->act_bytes, (int) MIN (tt, t1 - t),
                    w->n_in, j->y + t * w->n_out + r, (gsize) w->n_out);
          }
      for (; r < r1; r++)
        {
          const guint8 *row = w->data + (gsize) r * w->row_bytes;
          for (gint64 t = t0; t < t1; t++)
            j->y[t * w->n_out + r] = dot (row, j->act + (gsize) t * j->act_bytes, w->n_in);
        }
    }
}

typedef struct {
  GgufTensorType type;
  const float *x;
  guint8 *act;
  gint64 n_in;
  gsize act_bytes;
} Prep;

static void
prep_body (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const Prep *p = user_data;
  for (gint64 t = begin; t < end; t++)
    {
      const float *x = p->x + t * p->n_in;
      void *dst = p->act + (gsize) t * p->act_bytes;
      if (p->type == GGUF_TENSOR_Q8_0 || p->type == GGUF_TENSOR_Q4_0)
        llama_quantize_act_q8 (x, dst, p->n_in);
      else
        llama_quantize_act_q8k (x, dst, p->n_in);
    }
}

typedef struct {
  const LlamaPanel *panel;
  const guint8 *act;
  gsize act_bytes;
  gint64 n_in;
  guint8 *packed;
} Pack;

/* Tiles of 16 tokens in the panel's layout. */
static void
pack_body (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const Pack *p = user_data;
  gsize bytes = p->panel->pack_bytes (p->n_in);
  for (gint64 i = begin; i < end; i++)
    p->panel->pack (p->act + (gsize) (16 * i) * p->act_bytes, p->act_bytes, p->n_in, p->packed + (gsize) i * bytes);
}

void
llama_matmul_with (const LlamaMatmulKernels *k, const LlamaMat *w, const float *x, float *y, gint64 n_tok)
{
  g_assert (k != NULL && k->dot[w->type] != NULL && n_tok >= 0);
  Job job = { k, w, (const guint8 *) x, act_row_bytes (w->type, w->n_in), y, n_tok, 0, 1, NULL, NULL, NULL };
  g_autofree guint8 *act = NULL, *packed = NULL;
  if (w->type == GGUF_TENSOR_Q8_0 || w->type == GGUF_TENSOR_Q4_0
      || w->type == GGUF_TENSOR_Q4_K || w->type == GGUF_TENSOR_Q6_K)
    {
      if (k->panel[w->type] != NULL && n_tok >= LLAMA_PANEL_MIN_TOKENS)
        job.panel = k->panel[w->type];
      /* A panel reads whole tiles of 16 tokens: the rows past n_tok are zeros. */
      gint64 rows = job.panel != NULL ? (n_tok + 15) / 16 * 16 : n_tok;
      act = g_malloc ((gsize) rows * job.act_bytes);
      memset (act + (gsize) n_tok * job.act_bytes, 0, (gsize) (rows - n_tok) * job.act_bytes);
      Prep prep = { w->type, x, act, w->n_in, job.act_bytes };
      sift_parallel_for (n_tok, 8, prep_body, &prep);
      job.act = act;
      if (job.panel != NULL)
        {
          packed = g_malloc ((gsize) (rows / 16) * job.panel->pack_bytes (w->n_in));
          Pack pack = { job.panel, act, job.act_bytes, w->n_in, packed };
          sift_parallel_for (rows / 16, 1, pack_body, &pack);
          job.packed = packed;
        }
    }
  /* One token (decode) of Q8_0 runs faster on the dots than on tiles of 4 rows
   * x 1 token (sift-bench-matmul 2048 512 1, in cache: 50 against 37 GFLOP/s);
   * Q4_K's decode took 25% more CPU on its dots than on its tiles
   * (docs/benchmarks.md, "Real models against llama.cpp"). */
  gboolean tiles = k->tile[w->type] != NULL && (n_tok >= 2 || w->type != GGUF_TENSOR_Q8_0);
  int tt = tiles ? k->tile_t : 1;
  if (tiles)
    {
      job.tile = k->tile[w->type];
      job.rows_per_item = k->tile_r;
    }
  if (job.panel != NULL)
    job.rows_per_item = LLAMA_PANEL_ROWS; /* a multiple of tile_r */
  /* ~256 KiB of activations per pass, a whole number of tiles. */
  job.tok_tile = MAX (tt, (gint64) (262144 / MAX (job.act_bytes, 1)) / tt * tt);
  /* A range of rows should carry enough work (~64K multiply-adds) to pay for a hand-off. */
  gint64 items = (w->n_out + job.rows_per_item - 1) / job.rows_per_item;
  gint64 grain = MAX (1, 65536 / MAX (1, w->n_in * n_tok * job.rows_per_item));
  sift_parallel_for (items, grain, rows_body, &job);
}

void
llama_matmul (const LlamaMat *w, const float *x, float *y, gint64 n_tok)
{
  llama_matmul_with (llama_matmul_kernels_get (sift_isa_active ()), w, x, y, n_tok);
}

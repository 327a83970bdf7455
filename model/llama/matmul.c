/* Matmul: activation preparation, threading, ISA dispatch, scalar dots. */
#include <math.h>
#include <string.h>

#include <sift/dtype.h>
#include <sift/memory.h>
#include <sift/parallel.h>

#include "matmul.h"
#include "quant.h"
#include "repack.h"

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
  .x16 = {
    [GGUF_TENSOR_Q8_0] = llama_x16_scalar_q8_0,
    [GGUF_TENSOR_Q4_K] = llama_x16_scalar_q4_k,
    [GGUF_TENSOR_Q6_K] = llama_x16_scalar_q6_k,
  },
  .x16_t = 1,
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
              amx.panel[GGUF_TENSOR_Q8_0] = &llama_amx_panel_q8_0;
              amx.panel[GGUF_TENSOR_Q4_K] = &llama_amx_panel_q4_k;
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
  m->x16 = FALSE;
}

gboolean
llama_mat_can_repack (const LlamaMat *m, const LlamaMatmulKernels *k)
{
  return !m->x16 && llama_x16_type (m->type) && m->n_out % LLAMA_X16 == 0 && k != NULL && k->x16[m->type] != NULL
         && k != &llama_matmul_scalar;
}

void
llama_mat_repack_groups (const LlamaMat *m, gint64 g0, gint64 g1, guint8 *dst)
{
  g_assert (!m->x16 && llama_x16_type (m->type) && m->n_out % LLAMA_X16 == 0 && g1 * LLAMA_X16 <= m->n_out);
  gsize group = LLAMA_X16 * m->row_bytes;
  for (gint64 g = g0; g < g1; g++)
    llama_x16_repack (m->type, m->data + (gsize) g * group, m->row_bytes, m->n_in, dst + (gsize) g * group);
}

void
llama_mat_row (const LlamaMat *m, gint64 r, float *dst)
{
  g_assert (r >= 0 && r < m->n_out);
  if (m->x16)
    llama_x16_dequantize_row (m->type, m->data + (gsize) (r / LLAMA_X16) * LLAMA_X16 * m->row_bytes,
                              (int) (r % LLAMA_X16), m->n_in, dst);
  else
    llama_dequantize_row (m->type, m->data + (gsize) r * m->row_bytes, dst, m->n_in);
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

#define MAX_MATS 3

/* One matrix of a product: its items are groups of rows_per_item rows. */
typedef struct {
  const LlamaMat *w;
  float *y;           /* [n_tok][n_out] */
  gint64 item0;       /* its first item in the loop's index space */
  int rows_per_item;  /* the tile's rows, 16 for x16, 1 for dots only */
  LlamaTileFn tile;   /* or NULL: dots only (rows in order) */
} Part;

typedef struct {
  const LlamaMatmulKernels *k;
  Part part[MAX_MATS];
  int n_parts;
  const guint8 *act; /* [n_tok][act_bytes] */
  gsize act_bytes;
  gint64 n_tok;
  gint64 tok_tile;   /* tokens per pass over a range of rows: their activations stay in L2 */
  LlamaX16Fn x16;          /* for x16 matrices */
  const LlamaPanel *panel; /* or NULL */
  const guint8 *packed;    /* what panel->pack laid out */
  guint8 *scratch;         /* [thread][scratch_bytes]: the panel's */
  gsize scratch_bytes;
} Job;

/* Rows [r0, r1) of a matrix in row order: register tiles, then dots. */
static void
rows_in_order (const Job *j, const Part *p, gint64 r0, gint64 r1)
{
  const LlamaMat *w = p->w;
  LlamaDotFn dot = j->k->dot[w->type];
  int tr = j->k->tile_r, tt = j->k->tile_t;
  for (gint64 t0 = 0; t0 < j->n_tok; t0 += j->tok_tile)
    {
      gint64 t1 = MIN (t0 + j->tok_tile, j->n_tok);
      gint64 r = r0;
      if (p->tile != NULL)
        for (; r + tr <= r1; r += tr)
          {
            const guint8 *row = w->data + (gsize) r * w->row_bytes;
            for (gint64 t = t0; t < t1; t += tt)
              p->tile (row, w->row_bytes, j->act + (gsize) t * j->act_bytes, j->act_bytes, (int) MIN (tt, t1 - t),
                       w->n_in, p->y + t * w->n_out + r, (gsize) w->n_out);
          }
      for (; r < r1; r++)
        {
          const guint8 *row = w->data + (gsize) r * w->row_bytes;
          for (gint64 t = t0; t < t1; t++)
            p->y[t * w->n_out + r] = dot (row, j->act + (gsize) t * j->act_bytes, w->n_in);
        }
    }
}

/* Groups [g0, g1) of an x16 matrix: the panel for all tokens, else the x16
 * kernel per pass of tokens. */
static void
groups (const Job *j, const Part *p, gint64 g0, gint64 g1, gint worker)
{
  const LlamaMat *w = p->w;
  gsize group = LLAMA_X16 * w->row_bytes;
  if (j->panel != NULL)
    {
      for (gint64 g = g0; g < g1; g++)
        j->panel->run (w->data + (gsize) g * group, j->act, j->act_bytes, j->packed,
                       j->scratch + (gsize) worker * j->scratch_bytes, j->n_tok, w->n_in, p->y + g * LLAMA_X16,
                       (gsize) w->n_out);
      return;
    }
  int tt = j->x16 == j->k->x16[w->type] ? j->k->x16_t : llama_matmul_scalar.x16_t;
  for (gint64 t0 = 0; t0 < j->n_tok; t0 += j->tok_tile)
    {
      gint64 t1 = MIN (t0 + j->tok_tile, j->n_tok);
      for (gint64 g = g0; g < g1; g++)
        for (gint64 t = t0; t < t1; t += tt)
          j->x16 (w->data + (gsize) g * group, j->act + (gsize) t * j->act_bytes, j->act_bytes,
                  (int) MIN (tt, t1 - t), w->n_in, p->y + t * w->n_out + g * LLAMA_X16, (gsize) w->n_out);
    }
}

static void
rows_body (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  const Job *j = user_data;
  for (int i = 0; i < j->n_parts; i++)
    {
      const Part *p = &j->part[i];
      gint64 items = (p->w->n_out + p->rows_per_item - 1) / p->rows_per_item;
      gint64 b = MAX (begin, p->item0) - p->item0, e = MIN (end, p->item0 + items) - p->item0;
      if (b >= e)
        continue;
      if (p->w->x16)
        groups (j, p, b, e, worker);
      else
        rows_in_order (j, p, b * p->rows_per_item, MIN (e * p->rows_per_item, p->w->n_out));
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
llama_matmul_multi_with (const LlamaMatmulKernels *k, const LlamaMat *const *w, float *const *y, int n_mats,
                         const float *x, gint64 n_tok)
{
  g_assert (k != NULL && n_mats >= 1 && n_mats <= MAX_MATS && n_tok >= 0);
  GgufTensorType type = w[0]->type;
  gint64 n_in = w[0]->n_in;
  gboolean x16 = w[0]->x16;
  for (int i = 0; i < n_mats; i++)
    g_assert (w[i]->type == type && w[i]->n_in == n_in && w[i]->x16 == x16 && k->dot[type] != NULL);
  Job job = { .k = k, .n_parts = n_mats, .act = (const guint8 *) x, .act_bytes = act_row_bytes (type, n_in),
              .n_tok = n_tok };
  g_autofree guint8 *act = NULL, *packed = NULL;
  guint8 *scratch = NULL;
  if (type == GGUF_TENSOR_Q8_0 || type == GGUF_TENSOR_Q4_0 || type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q6_K)
    {
      if (x16 && k->panel[type] != NULL && n_tok >= LLAMA_PANEL_MIN_TOKENS)
        job.panel = k->panel[type];
      /* A panel reads whole tiles of 16 tokens: the rows past n_tok are zeros. */
      gint64 rows = job.panel != NULL ? (n_tok + 15) / 16 * 16 : n_tok;
      act = g_malloc ((gsize) rows * job.act_bytes);
      memset (act + (gsize) n_tok * job.act_bytes, 0, (gsize) (rows - n_tok) * job.act_bytes);
      Prep prep = { type, x, act, n_in, job.act_bytes };
      sift_parallel_for (n_tok, 8, prep_body, &prep);
      job.act = act;
      if (job.panel != NULL)
        {
          packed = g_malloc ((gsize) (rows / 16) * job.panel->pack_bytes (n_in));
          Pack pack = { job.panel, act, job.act_bytes, n_in, packed };
          sift_parallel_for (rows / 16, 1, pack_body, &pack);
          job.packed = packed;
          job.scratch_bytes = (job.panel->scratch_bytes (n_in) + 63) / 64 * 64;
          if (job.scratch_bytes > 0)
            job.scratch = scratch = sift_mem_alloc ((gsize) sift_parallel_n_threads () * job.scratch_bytes);
        }
    }
  /* One token (decode) of Q8_0 runs faster on the dots than on tiles of 4 rows
   * x 1 token (sift-bench-matmul 2048 512 1, in cache: 50 against 37 GFLOP/s);
   * Q4_K's decode took 25% more CPU on its dots than on its tiles
   * (docs/benchmarks.md, "Real models against llama.cpp"). */
  gboolean tiles = !x16 && k->tile[type] != NULL && (n_tok >= 2 || type != GGUF_TENSOR_Q8_0);
  int tt = 1;
  if (x16)
    {
      job.x16 = k->x16[type] != NULL ? k->x16[type] : llama_matmul_scalar.x16[type];
      tt = job.x16 == k->x16[type] ? k->x16_t : llama_matmul_scalar.x16_t;
    }
  else if (tiles)
    tt = k->tile_t;
  gint64 items = 0;
  for (int i = 0; i < n_mats; i++)
    {
      Part *p = &job.part[i];
      p->w = w[i];
      p->y = y[i];
      p->item0 = items;
      p->rows_per_item = x16 ? LLAMA_X16 : tiles ? k->tile_r : 1;
      p->tile = tiles ? k->tile[type] : NULL;
      g_assert (!x16 || w[i]->n_out % LLAMA_X16 == 0);
      items += (w[i]->n_out + p->rows_per_item - 1) / p->rows_per_item;
    }
  /* ~256 KiB of activations per pass, a whole number of tiles. */
  job.tok_tile = MAX (tt, (gint64) (262144 / MAX (job.act_bytes, 1)) / tt * tt);
  /* A range of rows should carry enough work (~64K multiply-adds) to pay for a hand-off. */
  gint64 grain = MAX (1, 65536 / MAX (1, n_in * n_tok * job.part[0].rows_per_item));
  sift_parallel_for (items, grain, rows_body, &job);
  sift_mem_free (scratch);
}

void
llama_matmul_with (const LlamaMatmulKernels *k, const LlamaMat *w, const float *x, float *y, gint64 n_tok)
{
  llama_matmul_multi_with (k, &w, &y, 1, x, n_tok);
}

void
llama_matmul (const LlamaMat *w, const float *x, float *y, gint64 n_tok)
{
  llama_matmul_with (llama_matmul_kernels_get (sift_isa_active ()), w, x, y, n_tok);
}

void
llama_matmul_multi (const LlamaMat *const *w, float *const *y, int n_mats, const float *x, gint64 n_tok)
{
  llama_matmul_multi_with (llama_matmul_kernels_get (sift_isa_active ()), w, y, n_mats, x, n_tok);
}

/* AMX int8 panels for prefill's products with Q8_0 and Q4_K weights (built
 * with -mamx-tile -mamx-int8 beside the AVX-512 flags; used only when the
 * CPU has AMX and the kernel grants this process the tile state).
 *
 * A panel is 16 weight rows against every token, 16 tokens at a time. Per
 * 32-element block (a Q8_0 block, a Q4_K sub-block) one tdpbssd makes
 * C [16 rows][16 tokens] in int32 from A, the rows' 8-bit codes (Q8_0: read
 * in place from the weights, stride the row; Q4_K: nibbles unpacked once per
 * panel), and B, the 16 tokens' codes in the tile's layout (8 rows of 64
 * bytes: 4 consecutive k of each token), packed once per product. C then
 * takes the block's scales in f32 into 16 accumulators held in registers
 * (one per row, a lane per token): every block has its own scales, so the
 * integer sums cannot run longer than a block. */
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "matmul.h"
#include "quant.h"

#define PR LLAMA_PANEL_ROWS /* rows of a panel: A's rows, C's rows */
#define PT 16               /* tokens of a tile: B's columns, C's columns */
#define KCH 2048            /* elements per pass of a Q4_K panel's unpacked codes (32 KiB) */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct __attribute__ ((packed)) {
  guint8 palette, start_row, reserved[14];
  guint16 colsb[16];
  guint8 rows[16];
} TileConfig;

gboolean
llama_amx_usable (void)
{
  static gsize once = 0;
  static gboolean ok = FALSE;
  if (g_once_init_enter (&once))
    {
      ok = __builtin_cpu_supports ("amx-int8") && __builtin_cpu_supports ("amx-tile")
           && syscall (SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
      g_once_init_leave (&once, 1);
    }
  return ok;
}

/* Tiles: 0 = C (16 rows x 16 tokens, int32), 1 = A (16 rows x 32 codes),
 * 2 = B (8 x 64: the tokens' codes, 4 k per column). The configuration is
 * per thread: every panel call loads it and releases the tiles at the end. */
static void
config_tiles (void)
{
  TileConfig c;
  memset (&c, 0, sizeof c);
  c.palette = 1;
  c.rows[0] = PR, c.colsb[0] = PT * 4;
  c.rows[1] = PR, c.colsb[1] = 32;
  c.rows[2] = 8, c.colsb[2] = PT * 4;
  _tile_loadconfig (&c);
}

/* GCC 12's tileloadd asm does not say that it reads memory: without this
 * barrier the stores that fill a tile's source may be dropped or sunk. */
#define READS_MEMORY() __asm__ volatile ("" ::: "memory")

/* C = A B; c [16 rows][16 tokens]. */
static inline void
multiply (const void *a, gsize a_stride, const void *b, gint32 c[PR][PT])
{
  READS_MEMORY ();
  _tile_zero (0);
  _tile_loadd (1, a, (long) a_stride);
  _tile_loadd (2, b, PT * 4);
  _tile_dpbssd (0, 1, 2);
  _tile_stored (0, c, PT * 4);
}

/* 32 codes of each of 16 tokens (rows `stride` apart) as a B tile [8][16][4]. */
static void
pack_b (const gint8 *codes, gsize stride, gint8 *bt)
{
  for (int t = 0; t < PT; t++)
    for (int k4 = 0; k4 < 8; k4++)
      memcpy (bt + (k4 * PT + t) * 4, codes + (gsize) t * stride + 4 * k4, 4);
}

/* acc [16 rows] (lanes: tokens) to y [token][row] for the first nt tokens. */
static void
store (const __m512 acc[PR], gint64 nt, float *y, gsize ys)
{
  _Alignas (64) float out[PR][PT];
  for (int r = 0; r < PR; r++)
    _mm512_store_ps (out[r], acc[r]);
  for (gint64 t = 0; t < nt; t++)
    for (int r = 0; r < PR; r++)
      y[t * (gint64) ys + r] = out[r][t];
}

/* ---- Q8_0 ---- */

/* Per block of a 16-token tile: B and the tokens' scales. */
typedef struct {
  gint8 b[8 * PT * 4];
  float d[PT];
} PackQ8;

gsize
llama_amx_pack_bytes_q8_0 (gint64 n)
{
  return (gsize) (n / QK) * sizeof (PackQ8);
}

void
llama_amx_pack_q8_0 (const guint8 *act, gsize as, gint64 n, guint8 *packed)
{
  PackQ8 *p = (PackQ8 *) packed;
  for (gint64 b = 0; b < n / QK; b++)
    {
      const ActQ8 *x0 = (const ActQ8 *) act + b;
      pack_b (x0->qs, as, p[b].b);
      for (int t = 0; t < PT; t++)
        p[b].d[t] = ((const ActQ8 *) (act + (gsize) t * as) + b)->d;
    }
}

void
llama_amx_panel_q8_0 (const guint8 *w, gsize ws, const guint8 *packed, gint64 n_tok, gint64 n, float *y, gsize ys)
{
  gint64 nb = n / QK;
  g_autofree float *dw = g_new (float, nb * PR); /* [block][row] */
  for (gint64 b = 0; b < nb; b++)
    for (int r = 0; r < PR; r++)
      dw[b * PR + r] = _cvtsh_ss (((const BlockQ8_0 *) (w + r * ws) + b)->d);
  config_tiles ();
  _Alignas (64) gint32 c[PR][PT];
  gsize tile_bytes = llama_amx_pack_bytes_q8_0 (n);
  for (gint64 t0 = 0; t0 < n_tok; t0 += PT)
    {
      const PackQ8 *p = (const PackQ8 *) (packed + (gsize) (t0 / PT) * tile_bytes);
      __m512 acc[PR];
      for (int r = 0; r < PR; r++)
        acc[r] = _mm512_setzero_ps ();
      for (gint64 b = 0; b < nb; b++)
        {
          multiply (((const BlockQ8_0 *) w + b)->qs, ws, p[b].b, c);
          __m512 dx = _mm512_loadu_ps (p[b].d);
          for (int r = 0; r < PR; r++)
            acc[r] = _mm512_fmadd_ps (_mm512_mul_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[r])), dx),
                                      _mm512_set1_ps (dw[b * PR + r]), acc[r]);
        }
      store (acc, MIN (PT, n_tok - t0), y + t0 * (gint64) ys, ys);
    }
  _tile_release ();
}

/* ---- Q4_K ---- */

/* Per super-block of a 16-token tile: B of each sub-block, the tokens'
 * scales, and their sums over each sub-block times the scale. */
typedef struct {
  gint8 b[8][8 * PT * 4];
  float d[PT];
  float dsum[8][PT];
} PackQ4K;

gsize
llama_amx_pack_bytes_q4_k (gint64 n)
{
  return (gsize) (n / QK_K) * sizeof (PackQ4K);
}

void
llama_amx_pack_q4_k (const guint8 *act, gsize as, gint64 n, guint8 *packed)
{
  PackQ4K *p = (PackQ4K *) packed;
  for (gint64 b = 0; b < n / QK_K; b++)
    {
      const ActQ8K *x0 = (const ActQ8K *) act + b;
      for (int j = 0; j < 8; j++)
        pack_b (x0->qs + 32 * j, as, p[b].b[j]);
      for (int t = 0; t < PT; t++)
        {
          const ActQ8K *x = (const ActQ8K *) (act + (gsize) t * as) + b;
          p[b].d[t] = x->d;
          for (int j = 0; j < 8; j++)
            p[b].dsum[j][t] = x->d * (float) (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        }
    }
}

/* Per pass of KCH elements: the rows' nibbles as codes (A [sub-block][16 rows][32])
 * and per sub-block the rows' d sc_j and dmin m_j. */
typedef struct {
  gint8 a[KCH / 32][PR][32];
  float dsc[KCH / 32][PR], dmn[KCH / 32][PR];
} UnpackQ4K;

static void
unpack_q4_k (const guint8 *w, gsize ws, gint64 b0, gint64 nsb, UnpackQ4K *u)
{
  for (int r = 0; r < PR; r++)
    for (gint64 b = 0; b < nsb; b++)
      {
        const BlockQ4_K *blk = (const BlockQ4_K *) (w + r * ws) + b0 + b;
        float d = _cvtsh_ss (blk->d), dmin = _cvtsh_ss (blk->dmin);
        for (int j = 0; j < 8; j++)
          {
            guint8 sc, mn;
            llama_q4_k_scale_min (blk->scales, j, &sc, &mn);
            u->dsc[8 * b + j][r] = d * sc;
            u->dmn[8 * b + j][r] = dmin * mn;
            __m256i q = _mm256_loadu_si256 ((const __m256i *) (blk->qs + 32 * (j / 2)));
            if (j % 2)
              q = _mm256_srli_epi16 (q, 4);
            _mm256_storeu_si256 ((__m256i *) u->a[8 * b + j][r], _mm256_and_si256 (q, _mm256_set1_epi8 (15)));
          }
      }
}

void
llama_amx_panel_q4_k (const guint8 *w, gsize ws, const guint8 *packed, gint64 n_tok, gint64 n, float *y, gsize ys)
{
  gint64 ntt = (n_tok + PT - 1) / PT;
  gsize tile_bytes = llama_amx_pack_bytes_q4_k (n);
  g_autofree __m512 *accs = g_malloc ((gsize) ntt * PR * sizeof (__m512)); /* [tile][row] across passes */
  g_autofree UnpackQ4K *u = g_malloc (sizeof (UnpackQ4K));
  _Alignas (64) gint32 c[PR][PT];
  for (gint64 k0 = 0; k0 < n; k0 += KCH)
    {
      gint64 nsb = MIN (KCH, n - k0) / QK_K;
      unpack_q4_k (w, ws, k0 / QK_K, nsb, u);
      config_tiles ();
      for (gint64 tt = 0; tt < ntt; tt++)
        {
          const PackQ4K *p = (const PackQ4K *) (packed + (gsize) tt * tile_bytes) + k0 / QK_K;
          __m512 acc[PR];
          for (int r = 0; r < PR; r++)
            acc[r] = k0 == 0 ? _mm512_setzero_ps () : _mm512_loadu_ps ((const float *) &accs[tt * PR + r]);
          for (gint64 b = 0; b < nsb; b++)
            for (int j = 0; j < 8; j++)
              {
                multiply (u->a[8 * b + j], 32, p[b].b[j], c);
                __m512 dx = _mm512_loadu_ps (p[b].d), ds = _mm512_loadu_ps (p[b].dsum[j]);
                for (int r = 0; r < PR; r++)
                  {
                    __m512 v = _mm512_mul_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[r])), dx);
                    v = _mm512_fmadd_ps (v, _mm512_set1_ps (u->dsc[8 * b + j][r]), acc[r]);
                    acc[r] = _mm512_fnmadd_ps (ds, _mm512_set1_ps (u->dmn[8 * b + j][r]), v);
                  }
              }
          if (k0 + KCH < n)
            for (int r = 0; r < PR; r++)
              _mm512_storeu_ps ((float *) &accs[tt * PR + r], acc[r]);
          else
            store (acc, MIN (PT, n_tok - tt * PT), y + tt * PT * (gint64) ys, ys);
        }
      _tile_release ();
    }
}

/* AMX int8 panels for prefill's products with Q8_0 and Q4_K weights (built
 * with -mamx-tile -mamx-int8 beside the AVX-512 flags; used only when the
 * CPU has AMX and the kernel grants this process the tile state).
 *
 * A panel is 16 weight rows against every token. Per 32-element block (a
 * Q8_0 block, a Q4_K sub-block) the 16 rows' codes are laid out once as a B
 * tile (8 rows of 64 bytes: 4 consecutive k of each of 16 columns) and meet
 * 16 tokens at a time: A is 16 rows of the tokens' 8-bit codes read in place
 * (stride: the activation row), C = A B in int32 by one tdpbssd. C then takes
 * the block's scales in f32 into the panel's accumulators: every block has
 * its own scales, so the integer sums cannot run longer than a block. */
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "matmul.h"
#include "quant.h"

#define PR 16          /* rows of a panel: the B tile's columns */
#define PT 16          /* tokens of an A or C tile */
#define TOK_CHUNK 256  /* tokens whose accumulators stay in L1 */

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

/* Tiles: 0 = C (16 tokens x 16 rows, int32), 1 = A (16 tokens x 32 codes),
 * 2 = B (8 x 64: the rows' codes, 4 k per column). The configuration is per
 * thread: every panel call loads it and releases the tiles at the end. */
static void
config_tiles (void)
{
  TileConfig c;
  memset (&c, 0, sizeof c);
  c.palette = 1;
  c.rows[0] = PT, c.colsb[0] = PR * 4;
  c.rows[1] = PT, c.colsb[1] = 32;
  c.rows[2] = 8, c.colsb[2] = PR * 4;
  _tile_loadconfig (&c);
}

/* GCC 12's tileloadd asm does not say that it reads memory: without this
 * barrier the stores that fill a tile's source may be dropped or sunk. */
#define READS_MEMORY() __asm__ volatile ("" ::: "memory")

/* codes [16 rows][32 k] to B [8][16][4]. */
static inline void
load_b (gint8 codes[PR][32])
{
  _Alignas (64) gint8 bt[8 * PR * 4];
  for (int n = 0; n < PR; n++)
    for (int k4 = 0; k4 < 8; k4++)
      memcpy (bt + (k4 * PR + n) * 4, codes[n] + 4 * k4, 4);
  READS_MEMORY ();
  _tile_loadd (2, bt, PR * 4);
}

/* C = A B for the 16 tokens whose block codes start at `a` (stride as). */
static inline void
multiply (const gint8 *a, gsize as, gint32 c[PT][PR])
{
  _tile_zero (0);
  READS_MEMORY ();
  _tile_loadd (1, a, (long) as);
  _tile_dpbssd (0, 1, 2);
  _tile_stored (0, c, PR * 4);
}

static void
store (float acc[TOK_CHUNK][PR], gint64 nt, float *y, gsize ys)
{
  for (gint64 t = 0; t < nt; t++)
    memcpy (y + t * (gint64) ys, acc[t], PR * sizeof (float));
}

void
llama_amx_panel_q8_0 (const guint8 *w, gsize ws, const guint8 *act, gsize as, gint64 n_tok, gint64 n, float *y,
                      gsize ys)
{
  config_tiles ();
  _Alignas (64) static __thread float acc[TOK_CHUNK][PR];
  _Alignas (64) gint32 c[PT][PR];
  gint8 codes[PR][32];
  for (gint64 t0 = 0; t0 < n_tok; t0 += TOK_CHUNK)
    {
      gint64 nt = MIN (TOK_CHUNK, n_tok - t0), ntp = (nt + PT - 1) / PT * PT;
      memset (acc, 0, (gsize) ntp * sizeof acc[0]);
      for (gint64 b = 0; b < n / QK; b++)
        {
          _Alignas (64) float dw[PR];
          for (int r = 0; r < PR; r++)
            {
              const BlockQ8_0 *blk = (const BlockQ8_0 *) (w + r * ws) + b;
              memcpy (codes[r], blk->qs, QK);
              dw[r] = _cvtsh_ss (blk->d);
            }
          load_b (codes);
          __m512 dwv = _mm512_load_ps (dw);
          for (gint64 m0 = 0; m0 < ntp; m0 += PT)
            {
              const guint8 *a0 = act + (gsize) (t0 + m0) * as + (gsize) b * sizeof (ActQ8);
              multiply (((const ActQ8 *) a0)->qs, as, c);
              for (int m = 0; m < PT; m++)
                {
                  const ActQ8 *x = (const ActQ8 *) (a0 + (gsize) m * as);
                  __m512 s = _mm512_mul_ps (dwv, _mm512_set1_ps (x->d));
                  _mm512_store_ps (acc[m0 + m], _mm512_fmadd_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[m])), s,
                                                                 _mm512_load_ps (acc[m0 + m])));
                }
            }
        }
      store (acc, nt, y + t0 * (gint64) ys, ys);
    }
  _tile_release ();
}

/* Q4_K: per sub-block j the codes are the nibbles (0..15), the scale d sc_j
 * and the offset dmin m_j times the token's sum over the sub-block. */
void
llama_amx_panel_q4_k (const guint8 *w, gsize ws, const guint8 *act, gsize as, gint64 n_tok, gint64 n, float *y,
                      gsize ys)
{
  config_tiles ();
  _Alignas (64) static __thread float acc[TOK_CHUNK][PR];
  _Alignas (64) gint32 c[PT][PR];
  gint8 codes[PR][32];
  for (gint64 t0 = 0; t0 < n_tok; t0 += TOK_CHUNK)
    {
      gint64 nt = MIN (TOK_CHUNK, n_tok - t0), ntp = (nt + PT - 1) / PT * PT;
      memset (acc, 0, (gsize) ntp * sizeof acc[0]);
      for (gint64 b = 0; b < n / QK_K; b++)
        for (int j = 0; j < 8; j++)
          {
            _Alignas (64) float dsc[PR], dmn[PR];
            for (int r = 0; r < PR; r++)
              {
                const BlockQ4_K *blk = (const BlockQ4_K *) (w + r * ws) + b;
                guint8 sc, mn;
                llama_q4_k_scale_min (blk->scales, j, &sc, &mn);
                dsc[r] = _cvtsh_ss (blk->d) * sc;
                dmn[r] = _cvtsh_ss (blk->dmin) * mn;
                __m256i q = _mm256_loadu_si256 ((const __m256i *) (blk->qs + 32 * (j / 2)));
                if (j % 2)
                  q = _mm256_srli_epi16 (q, 4);
                _mm256_storeu_si256 ((__m256i *) codes[r], _mm256_and_si256 (q, _mm256_set1_epi8 (15)));
              }
            load_b (codes);
            __m512 dscv = _mm512_load_ps (dsc), dmnv = _mm512_load_ps (dmn);
            for (gint64 m0 = 0; m0 < ntp; m0 += PT)
              {
                const guint8 *a0 = act + (gsize) (t0 + m0) * as + (gsize) b * sizeof (ActQ8K);
                multiply (((const ActQ8K *) a0)->qs + 32 * j, as, c);
                for (int m = 0; m < PT; m++)
                  {
                    const ActQ8K *x = (const ActQ8K *) (a0 + (gsize) m * as);
                    float bsum = (float) (x->bsums[2 * j] + x->bsums[2 * j + 1]);
                    __m512 v = _mm512_fmadd_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[m])), dscv,
                                                _mm512_mul_ps (dmnv, _mm512_set1_ps (-bsum)));
                    _mm512_store_ps (acc[m0 + m], _mm512_fmadd_ps (_mm512_set1_ps (x->d), v, _mm512_load_ps (acc[m0 + m])));
                  }
              }
          }
      store (acc, nt, y + t0 * (gint64) ys, ys);
    }
  _tile_release ();
}

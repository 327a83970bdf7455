/* AMX int8 panels for prefill's products with Q8_0 and Q4_K weights in the
 * x16 layout (repack.h) (built with -mamx-tile -mamx-int8 beside the
 * AVX-512 flags; used only when the CPU has AMX and the kernel grants this
 * process the tile state).
 *
 * A panel is one group of 16 weight rows against every token, 16 tokens at
 * a time. Per 32-element block (a Q8_0 block, a Q4_K sub-block) one tdpbssd
 * (tdpbsud for Q4_K's unsigned nibbles) makes C [16 tokens][16 rows] in
 * int32 from A, the tokens' 8-bit codes read in place from their activation
 * blocks (stride: a token's row), and B, the group's codes, which the x16
 * layout already holds as B tiles (8 rows of 64 bytes: 4 consecutive k of
 * each of 16 rows); Q4_K's nibbles are unpacked once per panel. C then takes
 * the block's scales in f32 into 16 accumulators held in registers (one per
 * token, a lane per row): every block has its own scales, so the integer
 * sums cannot run past a block. */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "matmul.h"
#include "quant.h"
#include "repack.h"

#define PT 16 /* tokens of a tile: A's rows, C's rows */

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

/* GCC 12's ldtilecfg and tileloadd asm do not say that it reads memory: without this
 * barrier the stores that fill a tile's source or the configuration may be dropped or sunk. */
#define READS_MEMORY() __asm__ volatile ("" ::: "memory")

/* Tiles: 0 = C (16 tokens x 16 rows, int32), 1 = A (16 tokens x 32 codes),
 * 2 = B (8 x 64: the rows' codes, 4 k per column). The configuration is
 * per thread: every panel call loads it and releases the tiles at the end. */
static void
config_tiles (void)
{
  TileConfig c;
  memset (&c, 0, sizeof c);
  c.palette = 1;
  c.rows[0] = PT, c.colsb[0] = 16 * 4;
  c.rows[1] = PT, c.colsb[1] = 32;
  c.rows[2] = 8, c.colsb[2] = 16 * 4;
  READS_MEMORY ();
  _tile_loadconfig (&c);
}

/* c [16 tokens][16 rows] = A B: signed codes times signed (Q8_0) or unsigned (Q4_K) ones. */
static inline void
multiply_ss (const void *a, gsize a_stride, const void *b, gint32 c[PT][16])
{
  READS_MEMORY ();
  _tile_zero (0);
  _tile_loadd (1, a, (long) a_stride);
  _tile_loadd (2, b, 64);
  _tile_dpbssd (0, 1, 2);
  _tile_stored (0, c, 64);
}

static inline void
multiply_su (const void *a, gsize a_stride, const void *b, gint32 c[PT][16])
{
  READS_MEMORY ();
  _tile_zero (0);
  _tile_loadd (1, a, (long) a_stride);
  _tile_loadd (2, b, 64);
  _tile_dpbsud (0, 1, 2);
  _tile_stored (0, c, 64);
}

/* acc [token] (lanes: rows) to y [token][row] for the first nt tokens. */
static void
store (const __m512 acc[PT], gint64 nt, float *y, gsize ys)
{
  for (gint64 t = 0; t < nt; t++)
    _mm512_storeu_ps (y + t * (gint64) ys, acc[t]);
}

/* ---- Q8_0 ---- */

/* Per 16 tokens: each block's token scales, [block][token]. */
static gsize
pack_bytes_q8_0 (gint64 n)
{
  return (gsize) (n / QK) * PT * sizeof (float);
}

static void
pack_q8_0 (const guint8 *act, gsize as, gint64 n, guint8 *packed)
{
  float *d = (float *) packed;
  for (gint64 b = 0; b < n / QK; b++)
    for (int t = 0; t < PT; t++)
      d[b * PT + t] = ((const ActQ8 *) (act + (gsize) t * as) + b)->d;
}

static gsize
scratch_bytes_q8_0 (gint64 n)
{
  (void) n;
  return 0;
}

static void
panel_q8_0 (const guint8 *group, const guint8 *act, gsize as, const guint8 *packed, guint8 *scratch, gint64 n_tok,
            gint64 n, float *y, gsize ys)
{
  (void) scratch;
  const BlockQ8_0x16 *w = (const BlockQ8_0x16 *) group;
  gint64 nb = n / QK;
  config_tiles ();
  _Alignas (64) gint32 c[PT][16];
  for (gint64 t0 = 0; t0 < n_tok; t0 += PT)
    {
      const float *dx = (const float *) (packed + (gsize) (t0 / PT) * pack_bytes_q8_0 (n));
      const guint8 *a = act + (gsize) t0 * as + offsetof (ActQ8, qs);
      __m512 acc[PT];
      for (int t = 0; t < PT; t++)
        acc[t] = _mm512_setzero_ps ();
      for (gint64 b = 0; b < nb; b++)
        {
          multiply_ss (a + b * sizeof (ActQ8), as, w[b].qs, c);
          __m512 dw = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) w[b].d));
          for (int t = 0; t < PT; t++)
            acc[t] = _mm512_fmadd_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[t])),
                                      _mm512_mul_ps (dw, _mm512_set1_ps (dx[b * PT + t])), acc[t]);
        }
      store (acc, MIN (PT, n_tok - t0), y + t0 * (gint64) ys, ys);
    }
  _tile_release ();
}

const LlamaPanel llama_amx_panel_q8_0 = { pack_bytes_q8_0, pack_q8_0, scratch_bytes_q8_0, panel_q8_0 };

/* ---- Q4_K ---- */

/* Per super-block of 16 tokens: their scales and their sums over each
 * sub-block times the scale. */
typedef struct {
  float d[PT];
  float dsum[8][PT];
} PackQ4K;

static gsize
pack_bytes_q4_k (gint64 n)
{
  return (gsize) (n / QK_K) * sizeof (PackQ4K);
}

static void
pack_q4_k (const guint8 *act, gsize as, gint64 n, guint8 *packed)
{
  PackQ4K *p = (PackQ4K *) packed;
  for (gint64 b = 0; b < n / QK_K; b++)
    for (int t = 0; t < PT; t++)
      {
        const ActQ8K *x = (const ActQ8K *) (act + (gsize) t * as) + b;
        p[b].d[t] = x->d;
        for (int j = 0; j < 8; j++)
          p[b].dsum[j][t] = x->d * (float) (x->bsums[2 * j] + x->bsums[2 * j + 1]);
      }
}

/* A group unpacked once per panel: per super-block, each sub-block's codes
 * as a B tile and the rows' d sc_j and dmin m_j. */
typedef struct {
  guint8 b[8][QK / 4][16][4];
  float dsc[8][16], dmn[8][16];
} UnpackQ4K;

static gsize
scratch_bytes_q4_k (gint64 n)
{
  return (gsize) (n / QK_K) * sizeof (UnpackQ4K);
}

static void
unpack_q4_k (const BlockQ4_Kx16 *w, gint64 nsb, UnpackQ4K *u)
{
  const __m512i m4 = _mm512_set1_epi8 (15);
  for (gint64 s = 0; s < nsb; s++)
    {
      for (int c = 0; c < 4; c++)
        for (int g = 0; g < QK / 4; g++)
          {
            __m512i v = _mm512_loadu_si512 (w[s].qs[c][g]);
            _mm512_store_si512 (u[s].b[2 * c][g], _mm512_and_si512 (v, m4));
            _mm512_store_si512 (u[s].b[2 * c + 1][g], _mm512_and_si512 (_mm512_srli_epi16 (v, 4), m4));
          }
      guint8 sc[8][16], m[8][16];
      llama_x16_q4_k_scales (&w[s], sc, m);
      __m512 d = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) w[s].d));
      __m512 dmin = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) w[s].dmin));
      for (int j = 0; j < 8; j++)
        {
          _mm512_store_ps (u[s].dsc[j], _mm512_mul_ps (d, _mm512_cvtepi32_ps (_mm512_cvtepu8_epi32 (_mm_loadu_si128 ((const __m128i *) sc[j])))));
          _mm512_store_ps (u[s].dmn[j], _mm512_mul_ps (dmin, _mm512_cvtepi32_ps (_mm512_cvtepu8_epi32 (_mm_loadu_si128 ((const __m128i *) m[j])))));
        }
    }
}

static void
panel_q4_k (const guint8 *group, const guint8 *act, gsize as, const guint8 *packed, guint8 *scratch, gint64 n_tok,
            gint64 n, float *y, gsize ys)
{
  gint64 nsb = n / QK_K;
  UnpackQ4K *u = (UnpackQ4K *) scratch;
  unpack_q4_k ((const BlockQ4_Kx16 *) group, nsb, u);
  config_tiles ();
  _Alignas (64) gint32 c[PT][16];
  for (gint64 t0 = 0; t0 < n_tok; t0 += PT)
    {
      const PackQ4K *p = (const PackQ4K *) (packed + (gsize) (t0 / PT) * pack_bytes_q4_k (n));
      const guint8 *a = act + (gsize) t0 * as + offsetof (ActQ8K, qs);
      __m512 acc[PT];
      for (int t = 0; t < PT; t++)
        acc[t] = _mm512_setzero_ps ();
      for (gint64 s = 0; s < nsb; s++)
        {
          /* Per token: sum_j d sc_j (q.x)_j, then times the token's d, less sum_j dmin m_j d (sum x)_j. */
          __m512 sq[PT];
          for (int t = 0; t < PT; t++)
            sq[t] = _mm512_setzero_ps ();
          for (int j = 0; j < 8; j++)
            {
              multiply_su (a + s * sizeof (ActQ8K) + 32 * j, as, u[s].b[j], c);
              __m512 dsc = _mm512_load_ps (u[s].dsc[j]);
              for (int t = 0; t < PT; t++)
                sq[t] = _mm512_fmadd_ps (_mm512_cvtepi32_ps (_mm512_load_si512 (c[t])), dsc, sq[t]);
            }
          for (int t = 0; t < PT; t++)
            {
              __m512 v = _mm512_fmadd_ps (sq[t], _mm512_set1_ps (p[s].d[t]), acc[t]);
              for (int j = 0; j < 8; j++)
                v = _mm512_fnmadd_ps (_mm512_load_ps (u[s].dmn[j]), _mm512_set1_ps (p[s].dsum[j][t]), v);
              acc[t] = v;
            }
        }
      store (acc, MIN (PT, n_tok - t0), y + t0 * (gint64) ys, ys);
    }
  _tile_release ();
}

const LlamaPanel llama_amx_panel_q4_k = { pack_bytes_q4_k, pack_q4_k, scratch_bytes_q4_k, panel_q4_k };

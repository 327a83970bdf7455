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
#include "repack-avx512.h"

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

/* Tiles: 0, 1 (and 5, 6 for a second 16 tokens) = C (16 tokens x 16 rows,
 * int32: the sums with the scales' low and high 3 bits), 2 (and 7) = A (16
 * tokens x 64 codes), 3, 4 = B (16 x 64: 64 elements of the 16 rows, 4 k
 * per column). */
static void
config_tiles_q4_k (void)
{
  TileConfig c;
  memset (&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 8; i++)
    c.rows[i] = 16, c.colsb[i] = 64;
  READS_MEMORY ();
  _tile_loadconfig (&c);
}

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

/* A group's super-block unpacked once per panel. The 6-bit scale sc of
 * each sub-block and row is split 8 hi + lo (both 0..7), and each code q
 * (0..15) is stored twice as a B tile byte, q lo and q hi (at most 105:
 * u8), so that sum_j sc_j (q.x)_j = C_lo + 8 C_hi comes out of the tiles
 * exactly, accumulated over the whole super-block (4 tdpbsud of 64
 * elements each), and the f32 scaling runs once per super-block instead of
 * once per sub-block. Per 64 elements c, B rows 0-7 are sub-block 2c
 * (the low nibbles), rows 8-15 sub-block 2c + 1 (the high ones). */
typedef struct {
  guint8 lo[4][16][16][4], hi[4][16][16][4];
  float d[16];
  float dmn[8][16]; /* dmin m_j */
} UnpackQ4K;

static gsize
scratch_bytes_q4_k (gint64 n)
{
  return (gsize) (n / QK_K) * sizeof (UnpackQ4K);
}

/* Each 16-bit lane of a row's 32-bit lane holds the row's value (< 8). */
static inline __m512i
words (__m512i v)
{
  return _mm512_or_si512 (v, _mm512_slli_epi32 (v, 16));
}

static void
unpack_q4_k (const BlockQ4_Kx16 *w, gint64 nsb, UnpackQ4K *u)
{
  const __m512i m4 = _mm512_set1_epi8 (15), m7 = _mm512_set1_epi32 (7);
  for (gint64 s = 0; s < nsb; s++)
    {
      __m512i sc[8], m[8];
      x16_q4_k_scales_avx512 (&w[s], sc, m);
      __m512 d = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) w[s].d));
      __m512 dmin = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) w[s].dmin));
      _mm512_store_ps (u[s].d, d);
      for (int j = 0; j < 8; j++)
        _mm512_store_ps (u[s].dmn[j], _mm512_mul_ps (dmin, _mm512_cvtepi32_ps (m[j])));
      for (int c = 0; c < 4; c++)
        {
          /* q (< 16) times a 16-bit lane's value (< 8) stays inside each byte. */
          __m512i lo0 = words (_mm512_and_si512 (sc[2 * c], m7)), hi0 = words (_mm512_srli_epi32 (sc[2 * c], 3));
          __m512i lo1 = words (_mm512_and_si512 (sc[2 * c + 1], m7)), hi1 = words (_mm512_srli_epi32 (sc[2 * c + 1], 3));
          for (int g = 0; g < QK / 4; g++)
            {
              __m512i v = _mm512_loadu_si512 (w[s].qs[c][g]);
              __m512i q0 = _mm512_and_si512 (v, m4), q1 = _mm512_and_si512 (_mm512_srli_epi16 (v, 4), m4);
              _mm512_store_si512 (u[s].lo[c][g], _mm512_mullo_epi16 (q0, lo0));
              _mm512_store_si512 (u[s].hi[c][g], _mm512_mullo_epi16 (q0, hi0));
              _mm512_store_si512 (u[s].lo[c][8 + g], _mm512_mullo_epi16 (q1, lo1));
              _mm512_store_si512 (u[s].hi[c][8 + g], _mm512_mullo_epi16 (q1, hi1));
            }
        }
    }
}

/* Per token of a tile: d_x (d sum_j sc_j (q.x)_j) less sum_j dmin m_j d_x (sum x)_j. */
static inline __attribute__ ((always_inline)) void
scale_q4_k (const UnpackQ4K *u, const PackQ4K *p, gint32 clo[PT][16], gint32 chi[PT][16], __m512 acc[PT])
{
  __m512 d = _mm512_load_ps (u->d);
#pragma GCC unroll 16
  for (int t = 0; t < PT; t++)
    {
      __m512i sq = _mm512_add_epi32 (_mm512_load_si512 (clo[t]), _mm512_slli_epi32 (_mm512_load_si512 (chi[t]), 3));
      __m512 v = _mm512_fmadd_ps (_mm512_cvtepi32_ps (sq), _mm512_mul_ps (d, _mm512_set1_ps (p->d[t])), acc[t]);
      for (int j = 0; j < 8; j++)
        v = _mm512_fnmadd_ps (_mm512_load_ps (u->dmn[j]), _mm512_set1_ps (p->dsum[j][t]), v);
      acc[t] = v;
    }
}

/* NT (1 or 2) tiles of 16 tokens from t0, which share each B tile load:
 * tiles 0, 1 = the first tile's C lo and hi, 5, 6 = the second's; 2, 7 = A. */
static inline __attribute__ ((always_inline)) void
tiles_q4_k (const UnpackQ4K *u, gint64 nsb, const guint8 *act, gsize as, const guint8 *packed, gint64 t0,
            const int NT, gint64 n_tok, gint64 n, float *y, gsize ys)
{
  _Alignas (64) gint32 clo[2][PT][16], chi[2][PT][16];
  const guint8 *a = act + (gsize) t0 * as + offsetof (ActQ8K, qs);
  const guint8 *a1 = a + PT * as;
  const PackQ4K *p[2];
  for (int k = 0; k < NT; k++)
    p[k] = (const PackQ4K *) (packed + (gsize) (t0 / PT + k) * pack_bytes_q4_k (n));
  __m512 acc[2][PT];
  for (int k = 0; k < NT; k++)
#pragma GCC unroll 16
    for (int t = 0; t < PT; t++)
      acc[k][t] = _mm512_setzero_ps ();
  for (gint64 s = 0; s < nsb; s++)
    {
      READS_MEMORY ();
      _tile_zero (0);
      _tile_zero (1);
      if (NT == 2)
        {
          _tile_zero (5);
          _tile_zero (6);
        }
      for (int c = 0; c < 4; c++)
        {
          gsize off = s * sizeof (ActQ8K) + 64 * c;
          _tile_loadd (2, a + off, (long) as);
          _tile_loadd (3, u[s].lo[c], 64);
          _tile_loadd (4, u[s].hi[c], 64);
          _tile_dpbsud (0, 2, 3);
          _tile_dpbsud (1, 2, 4);
          if (NT == 2)
            {
              _tile_loadd (7, a1 + off, (long) as);
              _tile_dpbsud (5, 7, 3);
              _tile_dpbsud (6, 7, 4);
            }
        }
      _tile_stored (0, clo[0], 64);
      _tile_stored (1, chi[0], 64);
      if (NT == 2)
        {
          _tile_stored (5, clo[1], 64);
          _tile_stored (6, chi[1], 64);
        }
      for (int k = 0; k < NT; k++)
        scale_q4_k (&u[s], &p[k][s], clo[k], chi[k], acc[k]);
    }
  for (int k = 0; k < NT; k++)
    store (acc[k], MIN (PT, n_tok - t0 - k * PT), y + (t0 + k * PT) * (gint64) ys, ys);
}

static void
panel_q4_k (const guint8 *group, const guint8 *act, gsize as, const guint8 *packed, guint8 *scratch, gint64 n_tok,
            gint64 n, float *y, gsize ys)
{
  gint64 nsb = n / QK_K;
  UnpackQ4K *u = (UnpackQ4K *) scratch;
  unpack_q4_k ((const BlockQ4_Kx16 *) group, nsb, u);
  config_tiles_q4_k ();
  gint64 t0 = 0;
  for (; t0 + 2 * PT <= (n_tok + PT - 1) / PT * PT; t0 += 2 * PT)
    tiles_q4_k (u, nsb, act, as, packed, t0, 2, n_tok, n, y, ys);
  if (t0 < n_tok)
    tiles_q4_k (u, nsb, act, as, packed, t0, 1, n_tok, n, y, ys);
  _tile_release ();
}

const LlamaPanel llama_amx_panel_q4_k = { pack_bytes_q4_k, pack_q4_k, scratch_bytes_q4_k, panel_q4_k };

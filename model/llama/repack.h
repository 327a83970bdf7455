/* Weight matrices repacked once at load: 16 rows interleaved ("x16"), so
 * that one 512-bit vector holds 4 consecutive elements of each of 16 rows.
 * A decode product then multiplies the vector by 4 activation codes
 * broadcast to every lane (vpdpbusd) and keeps one row per lane: no
 * horizontal sums, every byte of a 64-byte load used, the 16 rows' scales
 * loaded as one vector. The same blocks are AMX's B tiles (VNNI layout:
 * K/4 rows of 16 columns x 4 bytes), read in place by prefill's panels.
 * A group of 16 rows takes exactly the bytes of the 16 rows it replaces.
 * Private to model/llama/. */
#pragma once

#include <glib.h>

#include "gguf.h"
#include "quant.h"

G_BEGIN_DECLS

#define LLAMA_X16 16 /* rows of a group */

/* Q8_0, per 16 rows and block of 32: the rows' scales, then their codes:
 * qs[g][r][i] = code of element 4g + i of row r. */
typedef struct {
  guint16 d[16]; /* f16 */
  gint8 qs[QK / 4][16][4];
} BlockQ8_0x16;

/* Q4_K, per 16 rows and super-block: the rows' d and dmin; their 12 bytes
 * of packed 6-bit scales and mins as planes (scales[k][r]: byte k of row
 * r); their nibbles: qs[c][g][r][i] holds element 64c + 4g + i of row r in
 * its low nibble and element 64c + 32 + 4g + i in its high nibble (the
 * codes of sub-blocks 2c and 2c + 1). */
typedef struct {
  guint16 d[16], dmin[16]; /* f16 */
  guint8 scales[12][16];
  guint8 qs[4][QK / 4][16][4];
} BlockQ4_Kx16;

/* Q6_K, per 16 rows and super-block: the rows' d and 16 sub-block scales
 * (scales[j][r]), then the low 4 bits: ql[h][p][g][r][i] = byte
 * 64 h + 32 p + 4 g + i of row r's ql, and the high 2 bits:
 * qh[h][g][r][i] = byte 32 h + 4 g + i of its qh (dequantize_q6_k's
 * order: a byte of ql holds elements 128 h + 32 p + l and + 64, one of qh
 * the top bits of elements 128 h + l, + 32, + 64, + 96). */
typedef struct {
  guint16 d[16]; /* f16 */
  gint8 scales[16][16];
  guint8 ql[2][2][QK / 4][16][4];
  guint8 qh[2][QK / 4][16][4];
} BlockQ6_Kx16;

G_STATIC_ASSERT (sizeof (BlockQ8_0x16) == 16 * sizeof (BlockQ8_0));
G_STATIC_ASSERT (sizeof (BlockQ6_Kx16) == 16 * sizeof (BlockQ6_K));
G_STATIC_ASSERT (sizeof (BlockQ4_Kx16) == 16 * sizeof (BlockQ4_K));

/* Whether `type` has an x16 layout (Q8_0, Q4_K, Q6_K). */
gboolean llama_x16_type (GgufTensorType type);
/* 16 rows (row_bytes apart, n_in elements) as one group at dst (16 * row_bytes). */
void llama_x16_repack (GgufTensorType type, const guint8 *rows, gsize row_bytes, gint64 n_in, guint8 *dst);
/* Row `lane` (0..15) of a group to f32. */
void llama_x16_dequantize_row (GgufTensorType type, const guint8 *group, int lane, gint64 n_in, float *dst);
/* The 6-bit scales (sc[j][r]) and mins (m[j][r]) of the 16 rows of a Q4_K group's super-block. */
void llama_x16_q4_k_scales (const BlockQ4_Kx16 *b, guint8 sc[8][16], guint8 m[8][16]);

/* Scalar products of a group with nt tokens (act_stride bytes apart, in
 * the type's activation blocks): y[t * ys + r], r < 16. The same integer
 * sums in the same order as the row layout's scalar dots. */
void llama_x16_scalar_q8_0 (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y,
                            gsize ys);
void llama_x16_scalar_q4_k (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y,
                            gsize ys);
void llama_x16_scalar_q6_k (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y,
                            gsize ys);

G_END_DECLS

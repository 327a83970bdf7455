/* Policy benchmark input from a config's synthetic source (bench-synth.h). */
#include <string.h>

#include "bench-synth.h"

gboolean
sift_bench_synth_qkv (const SiftConfig *cfg, gint32 q_heads, gint64 n, float *q, float *k, float *v,
                      GError **error)
{
  SiftModelShape shape = cfg->shape;
  shape.n_layers = 1;
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&shape, sift_synthetic_seed (cfg), sift_synthetic_config (cfg), NULL, error);
  if (src == NULL)
    return FALSE;
  const gint32 d = shape.head_dim, Hq = shape.n_q_heads, Hk = shape.n_kv_heads;
  const gint32 group = Hq / Hk, kv = (q_heads + group - 1) / group;
  g_return_val_if_fail (q_heads >= 1 && q_heads <= Hq, FALSE);
  const gint64 step = 4096;
  const gsize row = (gsize) d * sizeof (float);
  g_autofree float *sq = g_new (float, (gsize) step * (gsize) Hq * (gsize) d);
  g_autofree float *sk = g_new (float, (gsize) step * (gsize) Hk * (gsize) d);
  g_autofree float *sv = g_new (float, (gsize) step * (gsize) Hk * (gsize) d);
  for (gint64 p0 = 0; p0 < n; p0 += step)
    {
      gint64 m = MIN (step, n - p0);
      if (!sift_model_qkv_at (src, 0, p0, m, sq, sk, sv, error))
        return FALSE;
      /* The source writes token-major [m][heads][d]; the benches want head-major. */
      for (gint64 t = 0; t < m; t++)
        {
          for (gint32 h = 0; h < q_heads; h++)
            memcpy (q + ((gsize) h * (gsize) n + (gsize) (p0 + t)) * (gsize) d,
                    sq + ((gsize) t * (gsize) Hq + (gsize) h) * (gsize) d, row);
          for (gint32 g = 0; g < kv; g++)
            {
              memcpy (k + ((gsize) g * (gsize) n + (gsize) (p0 + t)) * (gsize) d,
                      sk + ((gsize) t * (gsize) Hk + (gsize) g) * (gsize) d, row);
              memcpy (v + ((gsize) g * (gsize) n + (gsize) (p0 + t)) * (gsize) d,
                      sv + ((gsize) t * (gsize) Hk + (gsize) g) * (gsize) d, row);
            }
        }
    }
  return TRUE;
}

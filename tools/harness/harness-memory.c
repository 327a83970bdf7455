/* What a run of a config keeps in memory at once, estimated from the
 * shape before anything is allocated, so that an impossible shape is a
 * config error rather than an abort or an OOM kill half-way through.
 * Counted in double: tokens x heads x dim x bytes of the largest legal
 * values overflows 64 bits, a double only loses digits nobody reads. */
#include <math.h>
#include <unistd.h>

#include <sift/attn.h>

#include "harness-config.h"

static double
element_bytes (SiftDType dtype)
{
  if (dtype == SIFT_DTYPE_Q8_0)
    return (double) sift_dtype_row_bytes (dtype, SIFT_Q8_0_BLOCK) / SIFT_Q8_0_BLOCK;
  return (double) sift_dtype_size (dtype);
}

void
harness_memory_estimate (const SiftConfig *config, gint64 longest, HarnessMemory *out)
{
  const SiftKvConfig *kv = sift_kv_config (config);
  const SiftOffloadConfig *off = sift_offload_config (config);
  const SiftHarnessConfig *h = sift_harness_config (config);
  const SiftModelShape *s = &config->shape;
  const double L = s->n_layers, hq = s->n_q_heads, hkv = s->n_kv_heads, d = s->head_dim;
  const double block = s->block_size, chunk = s->chunk_size;
  const double es = element_bytes (kv->compute_dtype);
  /* Per layer: prefill and decode buffers for K and V (engine/). */
  double engine = L * 2.0 * hkv * d * es * (chunk + block + SIFT_ATTN_DECODE_MAX_ROWS);
  /* Ring slots, the partial output of a chunk, and the model's q, k, v rows. */
  engine += (double) off->ring_slots * 2.0 * hkv * block * d * es;
  engine += hq * chunk * (d + 1) * 4.0;
  engine += chunk * (hq + 2.0 * hkv) * d * 4.0;
  /* The synthetic source keeps at most head_dim directions of head_dim per kv head. */
  if (g_strcmp0 (config->source, "synthetic") == 0)
    engine += L * hkv * d * d * 4.0;
  out->engine = engine;
  out->store = 0;
  if (g_strcmp0 (off->store, "host") == 0)
    {
      double tokens = (double) longest + (double) h->decode_steps;
      /* A bounded cache holds its budget plus what one offload adds before
       * eviction (docs/eviction.md); harness.capacities runs each budget. */
      gint64 budget = kv->capacity_tokens; /* 0: unbounded */
      if (h->n_capacities > 0)
        {
          budget = 1;
          for (gsize i = 0; i < h->n_capacities && budget > 0; i++)
            budget = h->capacities[i] == 0 ? 0 : MAX (budget, h->capacities[i]);
        }
      if (budget > 0)
        tokens = MIN (tokens, (double) budget + chunk + block);
      double blocks = ceil (tokens / block);
      out->store = L * 2.0 * hkv * blocks * block * d * element_bytes (kv->store_dtype);
    }
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  out->machine = pages > 0 && page > 0 ? (double) pages * (double) page : 0;
}

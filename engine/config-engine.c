/* The engine's config keys: kv.* (dtypes, the cache bound and eviction)
 * and offload.* (the store and the ring), registered when libsift loads. */
#include <stddef.h>

#include <sift/cuda.h>
#include <sift/engine.h>
#include <sift/error.h>

#define KOFF(field) offsetof (SiftKvConfig, field)
#define OOFF(field) offsetof (SiftOffloadConfig, field)
#define NO_RANGE SIFT_CONFIG_NO_RANGE
#define BIG 1e18

static const SiftConfigEnumValue store_dtypes[] = {
  { "f32", SIFT_DTYPE_F32 }, { "f16", SIFT_DTYPE_F16 }, { "bf16", SIFT_DTYPE_BF16 }, { "q8_0", SIFT_DTYPE_Q8_0 },
  { NULL, 0 },
};
static const SiftConfigEnumValue compute_dtypes[] = {
  { "f32", SIFT_DTYPE_F32 }, { "f16", SIFT_DTYPE_F16 }, { "bf16", SIFT_DTYPE_BF16 }, { NULL, 0 },
};
static const SiftConfigEnumValue granularities[] = {
  { "token", SIFT_EVICT_TOKEN }, { "block", SIFT_EVICT_BLOCK }, { NULL, 0 },
};
static const SiftConfigEnumValue stores[] = { { "host", 0 }, { "file", 0 }, { NULL, 0 } };
static const SiftConfigEnumValue pipelines[] = {
  { "ring", SIFT_PIPELINE_RING }, { "cross_layer", SIFT_PIPELINE_CROSS_LAYER }, { NULL, 0 },
};

static const SiftConfigEnumValue devices[] = {
  { "cpu", SIFT_DEVICE_CPU }, { "cuda", SIFT_DEVICE_CUDA }, { NULL, 0 },
};

static const SiftConfigKey kv_keys[] = {
  { "store_dtype", SIFT_CONFIG_KEY_ENUM, KOFF (store_dtype), 0, NO_RANGE, store_dtypes, "f16", "dtype of stored blocks: f32 | f16 | bf16 | q8_0" },
  { "compute_dtype", SIFT_CONFIG_KEY_ENUM, KOFF (compute_dtype), 0, NO_RANGE, compute_dtypes, "f32", "dtype of compute-side buffers: f32 | f16 | bf16" },
  { "capacity_tokens", SIFT_CONFIG_KEY_INT, KOFF (capacity_tokens), 0, 0, BIG, NULL, "0", "stored KV tokens kept per layer, evicting beyond (0: unbounded)" },
  { "evict_granularity", SIFT_CONFIG_KEY_ENUM, KOFF (evict_granularity), 0, NO_RANGE, granularities, "token", "what eviction removes: token (blocks compacted) | block" },
  { "protect_sinks", SIFT_CONFIG_KEY_INT, KOFF (protect_sinks), 0, 0, BIG, NULL, "4", "first tokens never evicted" },
  { "protect_recent", SIFT_CONFIG_KEY_INT, KOFF (protect_recent), 0, 0, BIG, NULL, "64", "most recent tokens never evicted" },
  { NULL },
};

static const SiftConfigKey offload_keys[] = {
  { "store", SIFT_CONFIG_KEY_STRING, OOFF (store), 0, NO_RANGE, stores, "host", "the tier holding stored blocks: host | file" },
  { "path", SIFT_CONFIG_KEY_STRING, OOFF (store_path), 0, NO_RANGE, NULL, NULL, "the file store's backing file (unset: <harness.out>/kv.store)" },
  { "keep", SIFT_CONFIG_KEY_BOOL, OOFF (store_keep), 0, NO_RANGE, NULL, "false", "keep the file store's file afterwards" },
  { "direct", SIFT_CONFIG_KEY_BOOL, OOFF (store_direct), 0, NO_RANGE, NULL, "false", "O_DIRECT for the file store" },
  { "ring_slots", SIFT_CONFIG_KEY_INT32, OOFF (ring_slots), 0, 2, 1024, NULL, "4", "compute-side ring slots of one block each (>= 2)" },
  { "pipeline", SIFT_CONFIG_KEY_ENUM, OOFF (pipeline), 0, NO_RANGE, pipelines, "ring", "decode loading: ring | cross_layer" },
  { "force_copy", SIFT_CONFIG_KEY_BOOL, OOFF (force_copy), 0, NO_RANGE, NULL, "false", "copy every ring load, even where the host store's blocks could be read in place (zero-copy)" },
  { "device", SIFT_CONFIG_KEY_ENUM, OOFF (device), 0, NO_RANGE, devices, "cpu", "where the compute side runs: cpu | cuda (ring slots and buffers on the GPU, the host store pinned; kv.compute_dtype f16 or bf16, model.head_dim 64 or 128, policies that only select blocks)" },
  { "resident", SIFT_CONFIG_KEY_BOOL, OOFF (resident), 0, NO_RANGE, NULL, "false", "keep every stored block in compute memory too (with device cuda: GPU-resident KV, attention reads the blocks in device memory, no ring loads; the whole cache must fit the GPU)" },
  { NULL },
};

/* offload.device cuda: a library built with CUDA, the dtypes and head
 * sizes the GPU kernels take, and policies without their own (CPU)
 * attention. Whether a GPU is there is known when the engine is made. */
static gboolean
check_offload (const SiftConfig *config, gconstpointer values, GError **error)
{
  const SiftOffloadConfig *off = values;
  if (off->device != SIFT_DEVICE_CUDA)
    return TRUE;
  const char *const keys[] = { "offload.device", NULL };
  if (!sift_cuda_built ())
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID, keys,
                             "offload.device cuda: this sift was built without CUDA (meson setup -Dcuda=enabled "
                             "needs nvcc)");
  const SiftKvConfig *kv = sift_kv_config (config);
  if (kv->compute_dtype != SIFT_DTYPE_F16 && kv->compute_dtype != SIFT_DTYPE_BF16)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "kv.compute_dtype", "offload.device", NULL },
                             "offload.device cuda computes in f16 or bf16, but kv.compute_dtype is %s",
                             sift_dtype_name (kv->compute_dtype));
  if (config->shape.head_dim != 64 && config->shape.head_dim != 128)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "model.head_dim", "offload.device", NULL },
                             "offload.device cuda: the GPU kernels take model.head_dim 64 or 128, not %d",
                             config->shape.head_dim);
  for (guint i = 0; i < config->setups->len; i++)
    {
      const SiftPolicySetup *s = config->setups->pdata[i];
      const SiftPolicyChoice *ph[2] = { &s->prefill, &s->decode };
      for (int p = 0; p < 2; p++)
        {
          const SiftPolicyOps *ops = ph[p]->ops;
          if (ops != NULL && (p == 0 ? ops->compute_chunked_prefill : ops->compute_chunked_decode) != NULL)
            return sift_config_fail_setup (config, i, error, SIFT_CONFIG_ERROR_INVALID,
                                           ".%s: policy '%s' computes its own attention on the CPU "
                                           "(compute_chunked_%s); offload.device cuda runs only policies that "
                                           "select blocks (full, quest, h2o, ...)",
                                           p == 0 ? "prefill" : "decode", ph[p]->name, p == 0 ? "prefill" : "decode");
        }
    }
  return TRUE;
}

/* The store's dtype against the shape, and a bounded cache against what
 * eviction must keep: the protected tokens and the block just offloaded
 * (docs/eviction.md). */
static gboolean
check_kv (const SiftConfig *config, gconstpointer values, GError **error)
{
  const SiftKvConfig *kv = values;
  const SiftModelShape *shape = &config->shape;
  if (kv->store_dtype == SIFT_DTYPE_Q8_0 && shape->head_dim % SIFT_Q8_0_BLOCK != 0)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "kv.store_dtype", "model.head_dim", NULL },
                             "kv.store_dtype q8_0 packs rows in blocks of %d, but model.head_dim = %d is not a "
                             "multiple of it", SIFT_Q8_0_BLOCK, shape->head_dim);
  const gint64 need = sift_kv_config_min_capacity (kv, shape);
  if (kv->capacity_tokens > 0 && kv->capacity_tokens < need)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "kv.capacity_tokens", "kv.protect_recent", NULL },
                             "kv.capacity_tokens = %" G_GINT64_FORMAT " cannot hold %" G_GINT64_FORMAT
                             " protected sink and %" G_GINT64_FORMAT " recent tokens with %s eviction of %d-token"
                             " blocks (at least %" G_GINT64_FORMAT " needed)",
                             kv->capacity_tokens, kv->protect_sinks, kv->protect_recent,
                             kv->evict_granularity == SIFT_EVICT_BLOCK ? "block" : "token", shape->block_size, need);
  /* A setup's own KV budget likewise. */
  for (guint i = 0; i < config->setups->len; i++)
    {
      const SiftPolicySetup *s = config->setups->pdata[i];
      if (s->capacity_tokens > 0 && s->capacity_tokens < need)
        return sift_config_fail_setup (config, i, error, SIFT_CONFIG_ERROR_INVALID,
                                       ".capacity_tokens = %" G_GINT64_FORMAT " cannot hold the %" G_GINT64_FORMAT
                                       " protected sink and recent tokens and one block (at least %" G_GINT64_FORMAT
                                       " needed)", s->capacity_tokens, kv->protect_sinks + kv->protect_recent, need);
    }
  return TRUE;
}

gint64
sift_kv_config_min_capacity (const SiftKvConfig *kv, const SiftModelShape *shape)
{
  return kv->protect_sinks + kv->protect_recent + shape->block_size
         + (kv->evict_granularity == SIFT_EVICT_BLOCK ? 2 * (gint64) shape->block_size : 0);
}

static const SiftConfigSection kv_section = {
  "kv", 110, "KV blocks and dtypes", sizeof (SiftKvConfig), kv_keys, check_kv,
};
static const SiftConfigSection offload_section = {
  "offload", 200, "the store and the compute-side ring", sizeof (SiftOffloadConfig), offload_keys, check_offload,
};

const SiftKvConfig *
sift_kv_config (const SiftConfig *config)
{
  return sift_config_get_section (config, &kv_section);
}

const SiftOffloadConfig *
sift_offload_config (const SiftConfig *config)
{
  return sift_config_get_section (config, &offload_section);
}

SiftKvConfig *
sift_kv_config_edit (SiftConfig *config)
{
  return sift_config_edit_section (config, &kv_section);
}

SiftOffloadConfig *
sift_offload_config_edit (SiftConfig *config)
{
  return sift_config_edit_section (config, &offload_section);
}

/* libsift's own sections are there for every program that links it. */
static void __attribute__ ((constructor))
register_sections (void)
{
  sift_config_register_section (&kv_section);
  sift_config_register_section (&offload_section);
}

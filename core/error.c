/* Error domains. */
#include <sift/error.h>

G_DEFINE_QUARK (sift-attn-error-quark, sift_attn_error)
G_DEFINE_QUARK (sift-config-error-quark, sift_config_error)
G_DEFINE_QUARK (sift-plugin-error-quark, sift_plugin_error)
G_DEFINE_QUARK (sift-engine-error-quark, sift_engine_error)
G_DEFINE_QUARK (sift-store-error-quark, sift_store_error)
G_DEFINE_QUARK (sift-model-error-quark, sift_model_error)
G_DEFINE_QUARK (sift-harness-error-quark, sift_harness_error)

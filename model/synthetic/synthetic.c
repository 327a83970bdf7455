/* The synthetic model source (docs/synthetic-model.md).
 *
 * Head dims [0, nr) carry "content" structure, dims [nr, head_dim) are
 * rotary (nr = head_dim - rope_dims). Per (layer, kv head) an orthonormal
 * basis of the content dims holds the structural directions:
 *   e[0] sink, e[1] heavy hitter, e[2 + m] needle key m,
 *   e[2 + n_keys + d] distractor d's private direction.
 * A feature of logit strength S shared by a query and a key is a component
 * sqrt(S / scale) along one direction in both, so scale * q . k gains S.
 * Locality is a constant vector in the rotary dims shared by q and k: after
 * rotation q_i . k_j = sum_f A_f^2 cos((i - j) theta_f), a kernel of i - j
 * only, with A_f chosen so it decays over locality_scale tokens. Ordinary
 * tokens also carry drifting content (add_drift): a per-segment gaussian
 * topic shared by q and k, so recent keys and whole far segments, not
 * scattered single tokens, take what the sinks and heavy hitters leave. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>
#include "synthetic.h"

#include "synthetic-private.h"

enum { TAG_Q = 1, TAG_K = 2, TAG_V = 3, TAG_BASIS = 4, TAG_PHASE = 5, TAG_DRIFT = 6 };

/* Heavy hitters are spread over this many tokens when there is no plan. */
#define DEFAULT_CONTEXT 4096
/* Matched planted keys: the planted direction's share of an ordinary key's
 * RMS norm, and the ordinary keys sampled for that norm. */
#define PLANTED_SHARE 0.5
#define PLANTED_SAMPLES 256

typedef struct {
  SiftModel parent;
  SiftSyntheticConfig knobs;
  guint64 seed;
  gint32 nr;               /* content dims */
  gint32 n_pairs;          /* rope_dims / 2 */
  gint32 n_basis;
  float *basis;            /* [layers][kv_heads][n_basis][nr], orthonormal rows */
  float *theta;            /* [n_pairs] rotary frequencies */
  float *loc_amp;          /* [n_pairs] locality amplitude per pair */
  float *loc_phase;        /* [layers][kv_heads][n_pairs] */
  gboolean *retrieval;     /* [layers][q_heads] */
  gint64 *heavy;           /* [n_heavy] ascending */
  gsize n_heavy;
  float a_sink, a_heavy, a_needle; /* component lengths (same in q and k) */
  float a_drift;           /* length of the drifting content per content dim */
  float *a_planted;        /* [layers][kv_heads] planted direction's length in a matched planted key */
  SiftNeedlePlan plan;     /* copy; plan.needles owned */
  gboolean has_plan;
  gint64 rope_offset;
} SynthSource;

/* ---- Counter-based gaussians -------------------------------------------- */

static inline guint64
splitmix64 (guint64 *state)
{
  guint64 z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static guint64
mix_key (guint64 seed, guint32 tag, gint32 layer, gint32 head, gint64 position)
{
  guint64 s = seed ^ 0x5851f42d4c957f2dull;
  guint64 h = splitmix64 (&s);
  s = h ^ ((guint64) tag << 56) ^ ((guint64) (guint32) layer << 32) ^ (guint64) (guint32) head;
  h = splitmix64 (&s);
  s = h ^ (guint64) position;
  return splitmix64 (&s);
}

/* (0, 1], never 0 so the logarithm is finite. */
static inline double
uniform01 (guint64 *state)
{
  return ((double) (splitmix64 (state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void
sift_synth_gaussians (guint64 seed, guint32 tag, gint32 layer, gint32 head, gint64 position,
                      float *out, gsize n)
{
  guint64 state = mix_key (seed, tag, layer, head, position);
  for (gsize i = 0; i < n; i += 2)
    {
      /* Box-Muller: two independent normals per pair of uniforms. */
      double r = sqrt (-2.0 * log (uniform01 (&state)));
      double t = 2.0 * G_PI * uniform01 (&state);
      out[i] = (float) (r * cos (t));
      if (i + 1 < n)
        out[i + 1] = (float) (r * sin (t));
    }
}

/* ---- Setup --------------------------------------------------------------- */

static gboolean
invalid (GError **error, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

static gboolean
invalid (GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error_literal (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID, msg);
  return FALSE;
}

static gboolean
check_knobs (const SiftModelShape *s, const SiftSyntheticConfig *k, GError **error)
{
  if (s->n_layers <= 0 || s->n_q_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0
      || s->n_q_heads % s->n_kv_heads != 0)
    return invalid (error, "synthetic model: impossible shape (%d layers, %d q heads, %d kv heads, head_dim %d)",
                    s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim);
  if (k->rope_dims < 0 || k->rope_dims % 2 != 0 || k->rope_dims > s->head_dim)
    return invalid (error, "model.synthetic.rope_dims = %" G_GINT64_FORMAT
                    ": must be even and within [0, head_dim = %d]", k->rope_dims, s->head_dim);
  struct { const char *name; double v; } nonneg[] = {
    { "sink_strength", k->sink_strength }, { "locality", k->locality },
    { "heavy_hitter_strength", k->heavy_hitter_strength }, { "needle_strength", k->needle_strength },
    { "noise", k->noise }, { "drift", k->drift }, { "sink_tokens", (double) k->sink_tokens },
    { "heavy_hitters", (double) k->heavy_hitters },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (nonneg); i++)
    if (!(nonneg[i].v >= 0.0) || !isfinite (nonneg[i].v))
      return invalid (error, "model.synthetic.%s = %g: must be finite and >= 0", nonneg[i].name, nonneg[i].v);
  if (!(k->locality_scale > 0.0) || !(k->rope_base > 1.0) || !(k->drift_scale >= 1.0 && k->drift_scale <= 1e9))
    return invalid (error, "model.synthetic: locality_scale (%g) must be > 0, rope_base (%g) > 1"
                    " and drift_scale (%g) within [1, 1e9]", k->locality_scale, k->rope_base, k->drift_scale);
  if (!(k->retrieval_heads >= 0.0 && k->retrieval_heads <= 1.0))
    return invalid (error, "model.synthetic.retrieval_heads = %g: must be within [0, 1]", k->retrieval_heads);
  if (k->logn_length == 1 || k->logn_length < 0)
    return invalid (error, "model.synthetic.logn_length = %" G_GINT64_FORMAT
                    ": must be 0 (off) or at least 2 (queries past it are scaled by ln(p + 1) / ln(logn_length))",
                    k->logn_length);
  if (k->locality > 0.0 && k->rope_dims == 0)
    return invalid (error, "model.synthetic.locality = %g needs rope_dims > 0 (locality lives in the rotary dims)",
                    k->locality);
  return TRUE;
}

/* Gram-Schmidt on seeded gaussian vectors: n orthonormal rows of length d. */
static gboolean
orthonormal_rows (guint64 seed, gint32 layer, gint32 kv_head, gint32 n, gint32 d, float *rows)
{
  for (gint32 r = 0; r < n; r++)
    {
      float *x = rows + (gsize) r * d;
      for (int attempt = 0; attempt < 8; attempt++)
        {
          sift_synth_gaussians (seed, TAG_BASIS, layer, kv_head, (gint64) r * 8 + attempt, x, (gsize) d);
          for (gint32 p = 0; p < r; p++)
            {
              const float *y = rows + (gsize) p * d;
              double dot = 0;
              for (gint32 i = 0; i < d; i++)
                dot += (double) x[i] * y[i];
              for (gint32 i = 0; i < d; i++)
                x[i] -= (float) dot * y[i];
            }
          double norm = 0;
          for (gint32 i = 0; i < d; i++)
            norm += (double) x[i] * x[i];
          if (norm > 1e-6)
            {
              float inv = (float) (1.0 / sqrt (norm));
              for (gint32 i = 0; i < d; i++)
                x[i] *= inv;
              break;
            }
          if (attempt == 7)
            return FALSE;
        }
    }
  return TRUE;
}

/* Lorentzian weights over the rotary frequencies: the cosine sum then
 * approximates exp(-|delta| / locality_scale); theta_f appears once more
 * because RoPE frequencies are log-spaced (d theta ~ theta d f). */
static void
locality_weights (SynthSource *s, float scale)
{
  const SiftSyntheticConfig *k = &s->knobs;
  double total = 0;
  for (gint32 f = 0; f < s->n_pairs; f++)
    {
      s->theta[f] = (float) pow (k->rope_base, -2.0 * f / (double) (2 * s->n_pairs));
      double x = s->theta[f] * k->locality_scale;
      s->loc_amp[f] = (float) (x / (1.0 + x * x));
      total += s->loc_amp[f];
    }
  for (gint32 f = 0; f < s->n_pairs; f++)
    {
      double w = total > 0 ? s->loc_amp[f] / total : 0.0;
      s->loc_amp[f] = (float) sqrt (k->locality * w / scale);
    }
}

static int
cmp_i64 (gconstpointer a, gconstpointer b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return x < y ? -1 : x > y;
}

static gboolean
is_planted (const SynthSource *s, gint64 p)
{
  for (gsize i = 0; i < s->plan.n_needles; i++)
    if (s->plan.needles[i].position == p)
      return TRUE;
  return FALSE;
}

/* Heavy hitters: seeded positions in the haystack (after the sinks, before
 * the question), never on a needle or distractor. */
static void
place_heavy_hitters (SynthSource *s)
{
  gint64 lo = s->knobs.sink_tokens;
  gint64 hi = s->has_plan ? s->plan.question_start : DEFAULT_CONTEXT;
  gint64 room = hi - lo - (gint64) s->plan.n_needles;
  gsize want = (gsize) MIN ((gint64) s->knobs.heavy_hitters, MAX (room, 0));
  s->heavy = g_new0 (gint64, MAX (want, 1));
  guint64 state = mix_key (s->seed, TAG_PHASE, -1, -1, 0x4848);
  while (s->n_heavy < want)
    {
      gint64 p = lo + (gint64) (splitmix64 (&state) % (guint64) (hi - lo));
      gboolean taken = is_planted (s, p);
      for (gsize i = 0; i < s->n_heavy && !taken; i++)
        taken = s->heavy[i] == p;
      if (!taken)
        s->heavy[s->n_heavy++] = p;
    }
  qsort (s->heavy, s->n_heavy, sizeof (gint64), cmp_i64);
}

static gboolean
is_heavy (const SynthSource *s, gint64 p)
{
  gsize lo = 0, hi = s->n_heavy;
  while (lo < hi)
    {
      gsize mid = (lo + hi) / 2;
      if (s->heavy[mid] == p)
        return TRUE;
      if (s->heavy[mid] < p)
        lo = mid + 1;
      else
        hi = mid;
    }
  return FALSE;
}

static const SiftNeedle *
needle_at (const SynthSource *s, gint64 p)
{
  for (gsize i = 0; i < s->plan.n_needles; i++)
    if (s->plan.needles[i].position == p)
      return &s->plan.needles[i];
  return NULL;
}

/* ---- Generation ---------------------------------------------------------- */

static const float *
basis_row (const SynthSource *s, gint32 layer, gint32 kv_head, gint32 r)
{
  const SiftModelShape *sh = &s->parent.shape;
  return s->basis + (((gsize) layer * sh->n_kv_heads + kv_head) * s->n_basis + r) * s->nr;
}

static void
add_dir (float *x, const float *dir, float a, gint32 n)
{
  for (gint32 i = 0; i < n; i++)
    x[i] += a * dir[i];
}

/* Adds the locality vector of (layer, kv_head) to the rotary dims, then
 * rotates them by the token's position. */
static void
rotary (const SynthSource *s, gint32 layer, gint32 kv_head, gint64 position, float *x)
{
  const float *phase = s->loc_phase + ((gsize) layer * s->parent.shape.n_kv_heads + kv_head) * s->n_pairs;
  double pos = (double) (position + s->rope_offset);
  for (gint32 f = 0; f < s->n_pairs; f++)
    {
      float *pr = x + s->nr + 2 * f;
      float a = pr[0] + s->loc_amp[f] * cosf (phase[f]);
      float b = pr[1] + s->loc_amp[f] * sinf (phase[f]);
      double ang = pos * s->theta[f];
      float c = (float) cos (ang), sn = (float) sin (ang);
      pr[0] = a * c - b * sn;
      pr[1] = a * sn + b * c;
    }
}

/* The drifting content of kv head g at position p, added to x[0, nr): a
 * gaussian "topic" per segment of drift_scale tokens, blended with the next
 * segment's as p crosses its segment (cos/sin weights keep the variance),
 * so q_i . k_j gains about drift * corr(i, j): drift at i = j, fading over
 * drift_scale tokens, and a random logit of spread drift / sqrt(nr) between
 * far segments, the same for every row of a segment (block structure). */
static void
add_drift (const SynthSource *s, gint32 layer, gint32 g, gint64 p, float *x)
{
  if (s->a_drift == 0.0f)
    return;
  gint64 len = (gint64) s->knobs.drift_scale;
  gint64 seg = p / len;
  double f = (double) (p % len) / (double) len;
  float c0 = (float) cos (0.5 * G_PI * f) * s->a_drift, c1 = (float) sin (0.5 * G_PI * f) * s->a_drift;
  g_autofree float *t = g_new (float, 2 * (gsize) s->nr);
  sift_synth_gaussians (s->seed, TAG_DRIFT, layer, g, seg, t, (gsize) s->nr);
  sift_synth_gaussians (s->seed, TAG_DRIFT, layer, g, seg + 1, t + s->nr, (gsize) s->nr);
  for (gint32 i = 0; i < s->nr; i++)
    x[i] += c0 * t[i] + c1 * t[s->nr + i];
}

/* Random content lives off the structural directions, so each feature's
 * logit is what its knob says and noise only decides among ordinary keys. */
static void
noise_row (const SynthSource *s, guint32 tag, gint32 layer, gint32 head, gint32 g, gint64 p, float *x)
{
  const SiftModelShape *sh = &s->parent.shape;
  sift_synth_gaussians (s->seed, tag, layer, head, p, x, (gsize) sh->head_dim);
  for (gint32 i = 0; i < sh->head_dim; i++)
    x[i] *= (float) s->knobs.noise;
  add_drift (s, layer, g, p, x);
  for (gint32 r = 0; r < s->n_basis; r++)
    {
      const float *e = basis_row (s, layer, g, r);
      float along = 0;
      for (gint32 i = 0; i < s->nr; i++)
        along += x[i] * e[i];
      add_dir (x, e, -along, s->nr);
    }
}

static float
norm_of (const float *x, gint32 n)
{
  double s = 0;
  for (gint32 i = 0; i < n; i++)
    s += (double) x[i] * x[i];
  return (float) sqrt (s);
}

/* A matched planted key: the ordinary key of its position (noise, drift)
 * shrunk to make room for a_planted along the planted direction u, so its
 * norm is exactly that ordinary key's (u is orthogonal to the ordinary
 * part): k = a u + sqrt(|o|^2 - a^2) o / |o|. */
static void
planted_key (const SynthSource *s, gint32 layer, gint32 g, gint64 p, const SiftNeedle *n, float *k)
{
  const SiftModelShape *sh = &s->parent.shape;
  float a = s->a_planted[layer * sh->n_kv_heads + g];
  noise_row (s, TAG_K, layer, g, g, p, k);
  float o = norm_of (k, sh->head_dim);
  float beta = o > a ? sqrtf (o * o - a * a) / o : 0.0f;
  for (gint32 i = 0; i < sh->head_dim; i++)
    k[i] *= beta;
  if (n->distractor < 0)
    add_dir (k, basis_row (s, layer, g, 2 + n->key), a, s->nr);
  else
    {
      double c = s->plan.distractor_similarity;
      add_dir (k, basis_row (s, layer, g, 2 + n->key), (float) (c * a), s->nr);
      add_dir (k, basis_row (s, layer, g, 2 + s->plan.n_keys + n->distractor), (float) (sqrt (1.0 - c * c) * a),
               s->nr);
    }
}

static void
key_row (const SynthSource *s, gint32 layer, gint32 g, gint64 p, float *k)
{
  const SiftModelShape *sh = &s->parent.shape;
  const SiftNeedle *n = needle_at (s, p);
  gboolean sink = p < s->knobs.sink_tokens, heavy = is_heavy (s, p);
  if (n != NULL && !s->knobs.planted_exact)
    {
      planted_key (s, layer, g, p, n, k);
      rotary (s, layer, g, p, k);
      return;
    }
  /* Sinks, heavy hitters and (planted_keys: exact) planted keys are clean:
   * a sink's logit is sink_strength for every query, question . needle key
   * is needle_strength. */
  if (sink || heavy || n != NULL)
    memset (k, 0, sizeof (float) * (gsize) sh->head_dim);
  else
    noise_row (s, TAG_K, layer, g, g, p, k);
  if (sink)
    add_dir (k, basis_row (s, layer, g, 0), s->a_sink, s->nr);
  if (heavy)
    add_dir (k, basis_row (s, layer, g, 1), s->a_heavy, s->nr);
  if (n != NULL && n->distractor < 0)
    add_dir (k, basis_row (s, layer, g, 2 + n->key), s->a_needle, s->nr);
  else if (n != NULL)
    {
      /* Near-identical to the needle key, yet its own direction. */
      double c = s->plan.distractor_similarity;
      add_dir (k, basis_row (s, layer, g, 2 + n->key), (float) (c * s->a_needle), s->nr);
      add_dir (k, basis_row (s, layer, g, 2 + s->plan.n_keys + n->distractor),
               (float) (sqrt (1.0 - c * c) * s->a_needle), s->nr);
    }
  rotary (s, layer, g, p, k);
}

static void
query_row (const SynthSource *s, gint32 layer, gint32 h, gint64 p, float *q)
{
  const SiftModelShape *sh = &s->parent.shape;
  gint32 g = h / (sh->n_q_heads / sh->n_kv_heads);
  noise_row (s, TAG_Q, layer, h, g, p, q);
  if (s->knobs.sink_tokens > 0)
    add_dir (q, basis_row (s, layer, g, 0), s->a_sink, s->nr);
  if (s->n_heavy > 0)
    add_dir (q, basis_row (s, layer, g, 1), s->a_heavy, s->nr);
  /* The question's component along the needle key: a_needle^2 / a keeps
   * question . needle key at needle_strength whatever the key's length a. */
  if (s->has_plan && s->retrieval[layer * sh->n_q_heads + h] && sift_needle_plan_is_question (&s->plan, p))
    {
      float a = s->knobs.planted_exact ? s->a_needle : s->a_planted[layer * sh->n_kv_heads + g];
      add_dir (q, basis_row (s, layer, g, 2 + sift_needle_plan_key_at (&s->plan, p)), s->a_needle * s->a_needle / a,
               s->nr);
    }
  rotary (s, layer, g, p, q);
  /* logn attention: past logn_length keys, every logit of the row grows by
   * ln(p + 1) / ln(logn_length), so the structural features keep their
   * share as the number of ordinary keys grows. */
  gint64 L = s->knobs.logn_length;
  if (L >= 2 && p + 1 > L)
    {
      float f = (float) (log ((double) (p + 1)) / log ((double) L));
      for (gint32 i = 0; i < sh->head_dim; i++)
        q[i] *= f;
    }
}

void
sift_model_synthetic_value_code (SiftModel *src, gint32 layer, gint32 kv_head, gint64 position,
                                 float *out)
{
  SynthSource *s = (SynthSource *) src;
  sift_synth_gaussians (s->seed, TAG_V, layer, kv_head, position, out, (gsize) src->shape.head_dim);
}

static gboolean
synth_qkv (SiftModel *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
           GError **error)
{
  SynthSource *s = (SynthSource *) src;
  const SiftModelShape *sh = &src->shape;
  if (layer < 0 || layer >= sh->n_layers || pos0 < 0 || n < 0)
    return invalid (error, "synthetic model: no layer %d or range [%" G_GINT64_FORMAT ", +%" G_GINT64_FORMAT ")",
                    layer, pos0, n);
  gsize d = (gsize) sh->head_dim;
  for (gint64 t = 0; t < n; t++)
    {
      gint64 p = pos0 + t;
      if (q != NULL)
        for (gint32 h = 0; h < sh->n_q_heads; h++)
          query_row (s, layer, h, p, q + ((gsize) t * sh->n_q_heads + h) * d);
      for (gint32 g = 0; g < sh->n_kv_heads; g++)
        {
          if (k != NULL)
            key_row (s, layer, g, p, k + ((gsize) t * sh->n_kv_heads + g) * d);
          if (v != NULL)
            sift_model_synthetic_value_code (src, layer, g, p, v + ((gsize) t * sh->n_kv_heads + g) * d);
        }
    }
  return TRUE;
}

static void
synth_finalize (SiftModel *src)
{
  SynthSource *s = (SynthSource *) src;
  g_free (s->basis);
  g_free (s->theta);
  g_free (s->loc_amp);
  g_free (s->loc_phase);
  g_free (s->retrieval);
  g_free (s->a_planted);
  g_free (s->heavy);
  g_free (s->plan.needles);
}

static const SiftModelClass synth_class = SIFT_MODEL_POSITIONAL_CLASS ("synthetic", synth_qkv, synth_finalize);

/* Picks round(fraction * q_heads) retrieval heads per layer (at least one
 * when the fraction is positive), by a seeded shuffle. */
static void
pick_retrieval_heads (SynthSource *s)
{
  const SiftModelShape *sh = &s->parent.shape;
  gint32 n = (gint32) lround (s->knobs.retrieval_heads * sh->n_q_heads);
  if (s->knobs.retrieval_heads > 0 && n == 0)
    n = 1;
  g_autofree gint32 *order = g_new (gint32, sh->n_q_heads);
  for (gint32 l = 0; l < sh->n_layers; l++)
    {
      guint64 state = mix_key (s->seed, TAG_PHASE, l, -2, 0x5245);
      for (gint32 h = 0; h < sh->n_q_heads; h++)
        order[h] = h;
      for (gint32 h = sh->n_q_heads - 1; h > 0; h--)
        {
          gint32 j = (gint32) (splitmix64 (&state) % (guint64) (h + 1));
          gint32 t = order[h];
          order[h] = order[j];
          order[j] = t;
        }
      for (gint32 i = 0; i < n; i++)
        s->retrieval[l * sh->n_q_heads + order[i]] = TRUE;
    }
}

SiftModel *
sift_model_synthetic_new (const SiftModelShape *shape, guint64 seed, const SiftSyntheticConfig *knobs,
                          const SiftNeedlePlan *plan, GError **error)
{
  g_return_val_if_fail (shape != NULL, NULL);
  SiftSyntheticConfig defaults;
  sift_synthetic_config_defaults (&defaults);
  if (knobs == NULL)
    knobs = &defaults;
  if (!check_knobs (shape, knobs, error))
    return NULL;

  gint32 n_keys = plan != NULL ? plan->n_keys : 1;
  gint32 n_distractors = 0;
  if (plan != NULL)
    for (gsize i = 0; i < plan->n_needles; i++)
      n_distractors = MAX (n_distractors, plan->needles[i].distractor + 1);
  gint32 nr = shape->head_dim - (gint32) knobs->rope_dims;
  gint32 n_basis = 2 + n_keys + n_distractors;
  if (nr < n_basis)
    {
      invalid (error, "model.synthetic.rope_dims = %" G_GINT64_FORMAT " leaves %d content dims of head_dim %d;"
               " sinks, heavy hitters and %d needle keys need %d", knobs->rope_dims, nr, shape->head_dim,
               n_keys + n_distractors, n_basis);
      return NULL;
    }

  SynthSource *s = g_new0 (SynthSource, 1);
  if (!sift_model_init (&s->parent, &synth_class, shape, 0, error))
    {
      g_free (s);
      return NULL;
    }
  s->knobs = *knobs;
  s->seed = seed;
  s->nr = nr;
  s->n_pairs = (gint32) knobs->rope_dims / 2;
  s->n_basis = n_basis;
  float scale = sift_attn_scale (shape->scale, shape->head_dim);
  s->a_sink = sqrtf ((float) knobs->sink_strength / scale);
  s->a_heavy = sqrtf ((float) knobs->heavy_hitter_strength / scale);
  s->a_needle = sqrtf ((float) knobs->needle_strength / scale);
  /* nr dims of unit gaussians: |t|^2 ~ nr, so scale * a^2 * nr = drift. */
  s->a_drift = sqrtf ((float) knobs->drift / (scale * (float) nr));
  if (plan != NULL)
    {
      s->plan = *plan;
      s->plan.needles = g_memdup2 (plan->needles, sizeof (SiftNeedle) * MAX (plan->n_needles, 1));
      s->has_plan = TRUE;
    }

  gsize n_heads = (gsize) shape->n_layers * shape->n_kv_heads;
  s->basis = g_new (float, n_heads * n_basis * nr);
  for (gint32 l = 0; l < shape->n_layers; l++)
    for (gint32 g = 0; g < shape->n_kv_heads; g++)
      if (!orthonormal_rows (seed, l, g, n_basis, nr,
                             s->basis + ((gsize) l * shape->n_kv_heads + g) * n_basis * nr))
        {
          invalid (error, "synthetic model: could not build %d orthonormal directions in %d dims", n_basis, nr);
          synth_finalize (&s->parent);
          g_free (s);
          return NULL;
        }
  s->theta = g_new0 (float, MAX (s->n_pairs, 1));
  s->loc_amp = g_new0 (float, MAX (s->n_pairs, 1));
  locality_weights (s, scale);
  s->loc_phase = g_new0 (float, n_heads * MAX (s->n_pairs, 1));
  for (gsize i = 0; i < n_heads; i++)
    {
      guint64 state = mix_key (seed, TAG_PHASE, (gint32) i, -3, 0x4c4f);
      for (gint32 f = 0; f < s->n_pairs; f++)
        s->loc_phase[i * s->n_pairs + f] = (float) (2.0 * G_PI * uniform01 (&state));
    }
  s->retrieval = g_new0 (gboolean, (gsize) shape->n_layers * shape->n_q_heads);
  /* A matched planted key keeps PLANTED_SHARE of the RMS norm of ordinary
   * keys (sampled at PLANTED_SAMPLES seeded positions) for its direction. */
  s->a_planted = g_new (float, n_heads);
  g_autofree float *row = g_new (float, shape->head_dim);
  for (gint32 l = 0; l < shape->n_layers; l++)
    for (gint32 g = 0; g < shape->n_kv_heads; g++)
      {
        double sum = 0;
        for (gint64 i = 0; i < PLANTED_SAMPLES; i++)
          {
            noise_row (s, TAG_K, l, g, g, 1000003 * (i + 1), row);
            float o = norm_of (row, shape->head_dim);
            sum += (double) o * o;
          }
        s->a_planted[l * shape->n_kv_heads + g] = (float) (PLANTED_SHARE * sqrt (sum / PLANTED_SAMPLES));
      }
  pick_retrieval_heads (s);
  place_heavy_hitters (s);
  return &s->parent;
}

gboolean
sift_model_synthetic_is_retrieval_head (SiftModel *src, gint32 layer, gint32 q_head)
{
  g_return_val_if_fail (src != NULL && src->klass == &synth_class, FALSE);
  SynthSource *s = (SynthSource *) src;
  g_return_val_if_fail (layer >= 0 && layer < src->shape.n_layers, FALSE);
  g_return_val_if_fail (q_head >= 0 && q_head < src->shape.n_q_heads, FALSE);
  return s->retrieval[layer * src->shape.n_q_heads + q_head];
}

const gint64 *
sift_model_synthetic_heavy_hitters (SiftModel *src, gsize *n_out)
{
  g_return_val_if_fail (src != NULL && src->klass == &synth_class, NULL);
  SynthSource *s = (SynthSource *) src;
  *n_out = s->n_heavy;
  return s->heavy;
}

void
sift_model_synthetic_set_rope_offset (SiftModel *src, gint64 offset)
{
  g_return_if_fail (src != NULL && src->klass == &synth_class);
  ((SynthSource *) src)->rope_offset = offset;
}

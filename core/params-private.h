/* Scalar text as YAML reads it: shared by the params and the config parser. */
#pragma once

#include <glib.h>

/* Each returns FALSE (and leaves *out alone) when the text is not of the type. */
gboolean sift_text_to_int (const char *text, gint64 *out);
gboolean sift_text_to_float (const char *text, double *out);   /* ints too; finite only */
gboolean sift_text_to_bool (const char *text, gboolean *out);  /* true/false, yes/no, on/off */
/* A number too large (or small) for the type: a range error, not a type error. */
gboolean sift_text_beyond_range (const char *text, gboolean integer);
/* A flow list "[1, 2, 3]" (or "[]") of ints; *values freed with g_free. */
gboolean sift_text_to_int_list (const char *text, gint64 **values, gsize *n);

/* Shortest text that reads back as the same double. */
char *sift_float_to_text (double value);
/* A string as a YAML scalar: plain when safe, double-quoted otherwise. */
char *sift_yaml_quote (const char *text);
/* "[lo, hi]" of a range, integers printed as such. */
char *sift_range_to_text (double lo, double hi, gboolean integer);

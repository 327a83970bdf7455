/* GGUF reader: every metadata type (nested arrays too) and tensor info
 * written by the writer reads back; every malformed file is a GError naming
 * the file, the key or tensor, and an offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "gguf-writer.h"
#include "gguf.h"

#define PATH "fixture.gguf"

/* A file with one key of each type and two tensors. */
static GBytes *
sample (guint32 version, guint32 alignment)
{
  g_autoptr (GgufWriter) w = gguf_writer_new (version, alignment);
  gguf_writer_add_string (w, "general.architecture", "llama");
  gguf_writer_add_u32 (w, "u32", 4000000000u);
  gguf_writer_add_i32 (w, "i32", -7);
  gguf_writer_add_u64 (w, "u64", G_GUINT64_CONSTANT (1) << 40);
  gguf_writer_add_f32 (w, "f32", 0.25f);
  gguf_writer_add_bool (w, "bool", TRUE);
  guint8 u8 = 200;
  gguf_writer_add_raw (w, "u8", GGUF_TYPE_UINT8, &u8, 1);
  gint8 i8 = -100;
  gguf_writer_add_raw (w, "i8", GGUF_TYPE_INT8, &i8, 1);
  guint16 u16 = 60000;
  gguf_writer_add_raw (w, "u16", GGUF_TYPE_UINT16, &u16, 2);
  gint16 i16 = -30000;
  gguf_writer_add_raw (w, "i16", GGUF_TYPE_INT16, &i16, 2);
  gint64 i64 = -(G_GINT64_CONSTANT (1) << 50);
  gguf_writer_add_raw (w, "i64", GGUF_TYPE_INT64, &i64, 8);
  double f64 = -1.0 / 3.0;
  gguf_writer_add_raw (w, "f64", GGUF_TYPE_FLOAT64, &f64, 8);
  float floats[3] = { 1.5f, -2.0f, 1e-6f };
  gguf_writer_add_array (w, "floats", GGUF_TYPE_FLOAT32, 3, floats);
  gint32 ints[4] = { 1, -2, 3, G_MININT32 };
  gguf_writer_add_array (w, "ints", GGUF_TYPE_INT32, 4, ints);
  const char *strs[] = { "a", "", "héllo 世界 🎉" };
  gguf_writer_add_string_array (w, "strings", 3, strs);
  /* [[1, 2], [3]] and [["x"], []]: arrays of arrays. */
  g_autoptr (GByteArray) nested = g_byte_array_new ();
  gguf_put_u32 (nested, GGUF_TYPE_ARRAY);
  gguf_put_u64 (nested, 2);
  gguf_put_u32 (nested, GGUF_TYPE_UINT32);
  gguf_put_u64 (nested, 2);
  gguf_put_u32 (nested, 1);
  gguf_put_u32 (nested, 2);
  gguf_put_u32 (nested, GGUF_TYPE_UINT32);
  gguf_put_u64 (nested, 1);
  gguf_put_u32 (nested, 3);
  gguf_writer_add_raw (w, "nested", GGUF_TYPE_ARRAY, nested->data, nested->len);
  g_autoptr (GByteArray) nested_s = g_byte_array_new ();
  gguf_put_u32 (nested_s, GGUF_TYPE_ARRAY);
  gguf_put_u64 (nested_s, 2);
  gguf_put_u32 (nested_s, GGUF_TYPE_STRING);
  gguf_put_u64 (nested_s, 1);
  gguf_put_string (nested_s, "x");
  gguf_put_u32 (nested_s, GGUF_TYPE_STRING);
  gguf_put_u64 (nested_s, 0);
  gguf_writer_add_raw (w, "nested_strings", GGUF_TYPE_ARRAY, nested_s->data, nested_s->len);

  float a[2 * 3] = { 1, 2, 3, 4, 5, 6 };
  guint64 a_dims[2] = { 3, 2 };
  gguf_writer_add_tensor (w, "a", GGUF_TENSOR_F32, 2, a_dims, a, sizeof a);
  guint8 q[2 * 34] = { 0 };
  guint64 q_dims[2] = { 32, 2 };
  gguf_writer_add_tensor (w, "blk.0.q", GGUF_TENSOR_Q8_0, 2, q_dims, q, sizeof q);
  return gguf_writer_to_bytes (w);
}

static GgufFile *
open_bytes (GBytes *b, GError **error)
{
  gsize size;
  const guint8 *data = g_bytes_get_data (b, &size);
  return gguf_open_bytes (PATH, data, size, error);
}

static void
check_sample (GgufFile *f, guint32 version, guint32 alignment)
{
  g_autoptr (GError) error = NULL;
  assert_int_equal (gguf_version (f), version);
  assert_int_equal (gguf_alignment (f), alignment);
  assert_int_equal (gguf_data_offset (f) % alignment, 0);
  const char *s;
  assert_true (gguf_get_string (f, "general.architecture", &s, &error));
  assert_string_equal (s, "llama");
  guint64 u;
  gint64 i;
  double x;
  gboolean b;
  assert_true (gguf_get_uint (f, "u32", &u, &error));
  assert_true (u == 4000000000u);
  assert_true (gguf_get_int (f, "i32", &i, &error));
  assert_true (i == -7);
  assert_true (gguf_get_uint (f, "u64", &u, &error));
  assert_true (u == G_GUINT64_CONSTANT (1) << 40);
  assert_true (gguf_get_float (f, "f32", &x, &error));
  assert_true (x == 0.25);
  assert_true (gguf_get_bool (f, "bool", &b, &error) && b);
  assert_true (gguf_get_uint (f, "u8", &u, &error) && u == 200);
  assert_true (gguf_get_int (f, "i8", &i, &error) && i == -100);
  assert_true (gguf_get_uint (f, "u16", &u, &error) && u == 60000);
  assert_true (gguf_get_int (f, "i16", &i, &error) && i == -30000);
  assert_true (gguf_get_int (f, "i64", &i, &error) && i == -(G_GINT64_CONSTANT (1) << 50));
  assert_true (gguf_get_float (f, "f64", &x, &error) && x == -1.0 / 3.0);

  const GgufArray *a;
  assert_true (gguf_get_array (f, "floats", GGUF_TYPE_FLOAT32, &a, &error));
  assert_int_equal (a->n, 3);
  assert_true (gguf_array_float (a, 0) == 1.5 && gguf_array_float (a, 1) == -2.0
               && gguf_array_float (a, 2) == (double) 1e-6f);
  assert_true (gguf_get_array (f, "ints", GGUF_TYPE_INT32, &a, &error));
  assert_true (gguf_array_int (a, 1) == -2 && gguf_array_int (a, 3) == G_MININT32);
  assert_true (gguf_get_array (f, "strings", GGUF_TYPE_STRING, &a, &error));
  assert_int_equal (a->n, 3);
  assert_string_equal (a->strings[0], "a");
  assert_string_equal (a->strings[1], "");
  assert_string_equal (a->strings[2], "héllo 世界 🎉");
  assert_int_equal (a->lengths[2], strlen ("héllo 世界 🎉"));
  assert_true (gguf_get_array (f, "nested", GGUF_TYPE_ARRAY, &a, &error));
  assert_int_equal (a->n, 2);
  assert_int_equal (a->items[0].arr.n, 2);
  assert_int_equal (gguf_array_int (&a->items[0].arr, 1), 2);
  assert_int_equal (a->items[1].arr.n, 1);
  assert_int_equal (gguf_array_int (&a->items[1].arr, 0), 3);
  assert_true (gguf_get_array (f, "nested_strings", GGUF_TYPE_ARRAY, &a, &error));
  assert_string_equal (a->items[0].arr.strings[0], "x");
  assert_int_equal (a->items[1].arr.n, 0);
  assert_null (error);

  assert_int_equal (gguf_n_tensors (f), 2);
  const GgufTensor *t;
  assert_true (gguf_get_tensor (f, "a", &t, &error));
  assert_int_equal (t->n_dims, 2);
  assert_int_equal (t->dims[0], 3);
  assert_int_equal (t->dims[1], 2);
  assert_int_equal (t->n_elements, 6);
  assert_int_equal (t->n_bytes, 24);
  float a6[6];
  memcpy (a6, t->data, sizeof a6);
  assert_true (a6[0] == 1 && a6[5] == 6);
  assert_true (gguf_get_tensor (f, "blk.0.q", &t, &error));
  assert_int_equal (t->type, GGUF_TENSOR_Q8_0);
  assert_int_equal (t->n_bytes, 68);
  assert_int_equal (t->offset % alignment, 0);
}

static void
test_roundtrip (void **state)
{
  (void) state;
  guint32 versions[] = { 2, 3 }, alignments[] = { 32, 64, 1 };
  for (int v = 0; v < 2; v++)
    for (int al = 0; al < 3; al++)
      {
        g_autoptr (GBytes) b = sample (versions[v], alignments[al]);
        g_autoptr (GError) error = NULL;
        g_autoptr (GgufFile) f = open_bytes (b, &error);
        assert_null (error);
        check_sample (f, versions[v], alignments[al]);
      }
}

static void
test_file_mapped (void **state)
{
  (void) state;
  g_autofree char *dir = g_dir_make_tmp ("sift-gguf-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "m.gguf", NULL);
  g_autoptr (GBytes) b = sample (3, 32);
  assert_true (g_file_set_contents (path, g_bytes_get_data (b, NULL), (gssize) g_bytes_get_size (b), NULL));
  g_autoptr (GError) error = NULL;
  GgufFile *f = gguf_open (path, &error);
  assert_non_null (f);
  check_sample (f, 3, 32);
  assert_string_equal (gguf_path (f), path);
  gguf_close (f);
  g_remove (path);
  f = gguf_open (path, &error);
  assert_null (f);
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_IO));
  assert_non_null (strstr (error->message, path));
  g_rmdir (dir);
}

/* The error of parsing `bytes`: it must fail with `code` and a message
 * holding the path and every needle. */
static void
expect_error (const guint8 *bytes, gsize size, int code, const char *n1, const char *n2)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GgufFile) f = gguf_open_bytes (PATH, bytes, size, &error);
  assert_null (f);
  assert_non_null (error);
  if (error->domain != SIFT_MODEL_ERROR || error->code != code || strstr (error->message, PATH) == NULL
      || (n1 != NULL && strstr (error->message, n1) == NULL) || (n2 != NULL && strstr (error->message, n2) == NULL))
    fail_msg ("unexpected error %d: %s (wanted %d, '%s', '%s')", error->code, error->message, code,
              n1 ? n1 : "", n2 ? n2 : "");
}

static void
put32 (guint8 *p, guint32 v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (guint8) (v >> (8 * i));
}

static void
put64 (guint8 *p, guint64 v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (guint8) (v >> (8 * i));
}

/* A writable copy of the sample and the file offsets of tensor i's fields. */
typedef struct {
  guint8 *data;
  gsize size;
  gsize n_dims_at, dims_at, type_at, offset_at;
} Patchable;

static Patchable
patchable (guint64 tensor)
{
  g_autoptr (GBytes) b = sample (3, 32);
  Patchable p;
  p.data = g_bytes_unref_to_data (g_bytes_ref (b), &p.size);
  g_autoptr (GgufFile) f = gguf_open_bytes (PATH, p.data, p.size, NULL);
  const GgufTensor *t = gguf_tensor (f, tensor);
  p.n_dims_at = t->info_offset + 8 + strlen (t->name);
  p.dims_at = p.n_dims_at + 4;
  p.type_at = p.dims_at + 8 * t->n_dims;
  p.offset_at = p.type_at + 4;
  return p;
}

static void
test_bad_magic_and_version (void **state)
{
  (void) state;
  Patchable p = patchable (0);
  p.data[0] = 'G';
  p.data[3] = 'X';
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "magic", "offset 0");
  memcpy (p.data, "GGUF", 4);
  put32 (p.data + 4, 1);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_UNSUPPORTED, "version 1", "offset 4");
  put32 (p.data + 4, 4);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_UNSUPPORTED, "version 4", NULL);
  put32 (p.data + 4, 0x03000000);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_UNSUPPORTED, "big-endian", NULL);
  expect_error (p.data, 0, SIFT_MODEL_ERROR_FORMAT, "truncated", "offset 0");
  g_free (p.data);
}

/* Every cut inside the header fails cleanly; a cut inside the data names the tensor. */
static void
test_truncated (void **state)
{
  (void) state;
  Patchable p = patchable (0);
  g_autoptr (GgufFile) f = gguf_open_bytes (PATH, p.data, p.size, NULL);
  gsize header = gguf_tensor (f, 1)->info_offset + 40;
  for (gsize cut = 0; cut < header; cut++)
    expect_error (p.data, cut, SIFT_MODEL_ERROR_FORMAT, "truncated", "offset");
  const GgufTensor *last = gguf_tensor (f, 1);
  gsize cut = gguf_data_offset (f) + last->offset + last->n_bytes - 1;
  expect_error (p.data, cut, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "truncated data");
  g_free (p.data);
}

static void
test_bad_tensor_infos (void **state)
{
  (void) state;
  Patchable p = patchable (1);
  g_autofree guint8 *orig = g_memdup2 (p.data, p.size);

  put64 (p.data + p.offset_at, 1 << 20);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "past the end");
  memcpy (p.data, orig, p.size);
  put64 (p.data + p.offset_at, G_MAXUINT64 - 31);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "past the end");
  memcpy (p.data, orig, p.size);
  put64 (p.data + p.offset_at, 33);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "alignment");
  memcpy (p.data, orig, p.size);

  /* 2^32 * 2^32 elements. */
  put64 (p.data + p.dims_at, G_GUINT64_CONSTANT (1) << 37);
  put64 (p.data + p.dims_at + 8, G_GUINT64_CONSTANT (1) << 32);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "overflows");
  memcpy (p.data, orig, p.size);
  put64 (p.data + p.dims_at, 0);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "dimension 0");
  memcpy (p.data, orig, p.size);
  put64 (p.data + p.dims_at, 48);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "block");
  memcpy (p.data, orig, p.size);

  put32 (p.data + p.type_at, 99);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_UNSUPPORTED, "'blk.0.q'", "unknown tensor type 99");
  memcpy (p.data, orig, p.size);
  put32 (p.data + p.type_at, 4); /* a removed ggml type */
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_UNSUPPORTED, "'blk.0.q'", "type 4");
  memcpy (p.data, orig, p.size);

  put32 (p.data + p.n_dims_at, 5);
  expect_error (p.data, p.size, SIFT_MODEL_ERROR_FORMAT, "'blk.0.q'", "5 dimensions");
  memcpy (p.data, orig, p.size);
  g_free (p.data);

  /* A name as long as GGUF_MAX_NAME. */
  g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
  char name[GGUF_MAX_NAME + 1];
  memset (name, 'n', GGUF_MAX_NAME);
  name[GGUF_MAX_NAME] = 0;
  float x = 1;
  guint64 dims[1] = { 1 };
  gguf_writer_add_tensor (w, name, GGUF_TENSOR_F32, 1, dims, &x, 4);
  g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
  expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "name of 64 bytes", "offset");
}

static void
test_bad_metadata (void **state)
{
  (void) state;
  {
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    gguf_writer_add_u32 (w, "k", 1);
    gguf_writer_add_u32 (w, "k", 2);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'k'", "twice");
  }
  {
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    gguf_writer_add_u32 (w, "general.alignment", 48);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'general.alignment'", "power of two");
  }
  {
    /* An array claiming 2^60 elements, and one of an unknown element type. */
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    g_autoptr (GByteArray) a = g_byte_array_new ();
    gguf_put_u32 (a, GGUF_TYPE_STRING);
    gguf_put_u64 (a, G_GUINT64_CONSTANT (1) << 60);
    gguf_writer_add_raw (w, "huge", GGUF_TYPE_ARRAY, a->data, a->len);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'huge'", "truncated");
  }
  {
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    g_autoptr (GByteArray) a = g_byte_array_new ();
    gguf_put_u32 (a, 77);
    gguf_put_u64 (a, 1);
    gguf_writer_add_raw (w, "odd", GGUF_TYPE_ARRAY, a->data, a->len);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'odd'", "element type 77");
  }
  {
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    guint32 v = 0;
    gguf_writer_add_raw (w, "badtype", 13, &v, 4);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'badtype'", "value type 13");
  }
  {
    /* Arrays nested deeper than the reader allows. */
    g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
    g_autoptr (GByteArray) a = g_byte_array_new ();
    for (int d = 0; d < 20; d++)
      {
        gguf_put_u32 (a, GGUF_TYPE_ARRAY);
        gguf_put_u64 (a, 1);
      }
    gguf_writer_add_raw (w, "deep", GGUF_TYPE_ARRAY, a->data, a->len);
    g_autoptr (GBytes) b = gguf_writer_to_bytes (w);
    expect_error (g_bytes_get_data (b, NULL), g_bytes_get_size (b), SIFT_MODEL_ERROR_FORMAT, "'deep'", "nested");
  }
}

static void
test_getters_check_types (void **state)
{
  (void) state;
  g_autoptr (GBytes) b = sample (3, 32);
  g_autoptr (GgufFile) f = open_bytes (b, NULL);
  g_autoptr (GError) error = NULL;
  const char *s;
  guint64 u;
  guint32 u32;
  double x;
  const GgufArray *a;
  const GgufTensor *t;
  assert_false (gguf_get_string (f, "u32", &s, &error));
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT));
  assert_non_null (strstr (error->message, "'u32'"));
  assert_non_null (strstr (error->message, "offset"));
  g_clear_error (&error);
  assert_false (gguf_get_uint (f, "i32", &u, &error));
  assert_non_null (strstr (error->message, "negative"));
  g_clear_error (&error);
  assert_false (gguf_get_uint32 (f, "u64", &u32, &error));
  assert_non_null (strstr (error->message, "32 bits"));
  g_clear_error (&error);
  assert_false (gguf_get_float (f, "i32", &x, &error));
  g_clear_error (&error);
  assert_false (gguf_get_array (f, "floats", GGUF_TYPE_INT32, &a, &error));
  assert_non_null (strstr (error->message, "array of float32"));
  g_clear_error (&error);
  assert_false (gguf_get_uint (f, "absent.key", &u, &error));
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_MISSING));
  assert_non_null (strstr (error->message, "'absent.key'"));
  g_clear_error (&error);
  assert_false (gguf_get_tensor (f, "output.weight", &t, &error));
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_MISSING));
  assert_non_null (strstr (error->message, "'output.weight'"));
  assert_non_null (strstr (error->message, PATH));
  assert_non_null (strstr (error->message, "offset"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_roundtrip),
    cmocka_unit_test (test_file_mapped),
    cmocka_unit_test (test_bad_magic_and_version),
    cmocka_unit_test (test_truncated),
    cmocka_unit_test (test_bad_tensor_infos),
    cmocka_unit_test (test_bad_metadata),
    cmocka_unit_test (test_getters_check_types),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}

/* sift — SIFT_API: what libsift exports.
 *
 * libsift is built with hidden symbol visibility: only the functions
 * declared with SIFT_API in these headers are in its dynamic symbol table
 * (`nm -D --defined-only libsift.so`); everything else is private to the
 * library and may change in any release. */
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define SIFT_API __attribute__ ((visibility ("default"))) extern
#else
#define SIFT_API extern
#endif

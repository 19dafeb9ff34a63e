/* Minimal C test harness for ctest: TEST(name) functions run by RUN_TESTS;
 * CHECK counts failures and keeps going; the process exits 1 on any failure. */
#ifndef EMBER_TEST_H
#define EMBER_TEST_H
#include <stdio.h>
#include <math.h>
#include <string.h>
#include "ember/ember.h"

static int test_failures = 0, test_checks = 0;
#define CHECK(cond) do { test_checks++; if (!(cond)) { test_failures++; \
  fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, em_last_error()); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); test_checks++; if (!(fabs(_a - _b) <= (tol))) { \
  test_failures++; fprintf(stderr, "%s:%d: %s = %g, expected %g (tol %g)\n", __FILE__, __LINE__, #a, _a, _b, (double)(tol)); } } while (0)
#define CHECK_ERR_CONTAINS(expr_is_failure, needle) do { test_checks++; if (!(expr_is_failure) || !strstr(em_last_error(), needle)) { \
  test_failures++; fprintf(stderr, "%s:%d: expected failure mentioning '%s', got '%s'\n", __FILE__, __LINE__, needle, em_last_error()); } } while (0)
#define TEST(name) static void name(void)
#define RUN(name) do { fprintf(stderr, "  %s\n", #name); name(); } while (0)
#define TEST_MAIN_END() do { fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures); return test_failures ? 1 : 0; } while (0)
#endif

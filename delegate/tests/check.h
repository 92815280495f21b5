// CHECK for the runtime's C++ tests: a failed condition is printed and counted, and the test goes on
// (so one run reports every failure); main returns non-zero when g_failures is.
#pragma once

#include <cstdio>

static int g_failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

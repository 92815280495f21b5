/* Loops whose cycles a core's documentation fixes, to check a pipeline model against
 * (tests/test_arm_cycles.py, bench/arm_cycles.py). Each loop runs ITERATIONS passes of eight
 * instructions (twelve for dual_issue) and its counter's decrement and branch, between two marks
 * of the counting plugin (bench/arm64/counter.c): loop k is bracketed by marks 2k and 2k + 1.
 *
 *   0 fma_chain        eight FMLAs into one accumulator: 8 x the FMLA latency
 *   1 fma_independent  eight FMLAs into eight accumulators: 8 / FMLAs issued a cycle
 *   2 load_q           eight 128-bit loads of one cache line pair: 8 / 128-bit loads a cycle
 *   3 load_d           eight 64-bit loads: 8 / 64-bit loads a cycle
 *   4 dual_issue       six FMLAs, each beside a 64-bit load or an insert: how the in-order cores'
 *                      GEMM kernels (XNNPACK's, ncnn's, ONNX Runtime's) load, since the A55 issues
 *                      each of those beside an FMLA: six cycles there
 *
 * Build: aarch64-linux-gnu-gcc -O1 -static -o microkernels microkernels.c */
#include <sys/resource.h>
#include <unistd.h>

#define ITERATIONS 20000
#define MARK_MAGIC 0x6466 /* counter.c's kMarkMagic */

static void mark(int tag) { getpriority(MARK_MAGIC, tag); }

static float data[64] __attribute__((aligned(64)));

/* One loop, bracketed by marks 2k and 2k + 1; every loop may clobber the same registers. */
#define LOOP(k, body)                                                                                   \
  do {                                                                                                  \
    long n = ITERATIONS;                                                                                \
    mark(2 * (k));                                                                                      \
    __asm__ volatile("1:\n" body "subs %0, %0, #1\n b.ne 1b\n"                                          \
                     : "+r"(n)                                                                          \
                     : "r"(data)                                                                        \
                     : "v0", "v1", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "x9", "x10", \
                       "cc", "memory");                                                                 \
    mark(2 * (k) + 1);                                                                                  \
  } while (0)

#define EIGHT(x) x x x x x x x x

int main(void) {
  LOOP(0, EIGHT("fmla v0.4s, v1.4s, v2.4s\n"));
  LOOP(1, "fmla v16.4s, v1.4s, v2.4s\n fmla v17.4s, v1.4s, v2.4s\n fmla v18.4s, v1.4s, v2.4s\n"
          "fmla v19.4s, v1.4s, v2.4s\n fmla v20.4s, v1.4s, v2.4s\n fmla v21.4s, v1.4s, v2.4s\n"
          "fmla v22.4s, v1.4s, v2.4s\n fmla v23.4s, v1.4s, v2.4s\n");
  LOOP(2, "ldr q16, [%1]\n ldr q17, [%1, #16]\n ldr q18, [%1, #32]\n ldr q19, [%1, #48]\n"
          "ldr q20, [%1, #64]\n ldr q21, [%1, #80]\n ldr q22, [%1, #96]\n ldr q23, [%1, #112]\n");
  LOOP(3, "ldr d16, [%1]\n ldr d17, [%1, #8]\n ldr d18, [%1, #16]\n ldr d19, [%1, #24]\n"
          "ldr d20, [%1, #32]\n ldr d21, [%1, #40]\n ldr d22, [%1, #48]\n ldr d23, [%1, #56]\n");
  LOOP(4, "ldr d0, [%1]\n fmla v16.4s, v4.4s, v5.s[0]\n ldr x9, [%1, #8]\n fmla v17.4s, v4.4s, v5.s[1]\n"
          "ins v0.d[1], x9\n fmla v18.4s, v4.4s, v5.s[2]\n ldr d1, [%1, #16]\n fmla v19.4s, v4.4s, v5.s[3]\n"
          "ldr x10, [%1, #24]\n fmla v20.4s, v6.4s, v5.s[0]\n ins v1.d[1], x10\n fmla v21.4s, v6.4s, v5.s[1]\n");
  return 0;
}

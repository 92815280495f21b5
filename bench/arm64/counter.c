/* A TCG plugin for QEMU's user-mode emulator (plugin API version 1, as in Debian's qemu-user 7.2):
 * counts the guest instructions and memory accesses executed, and writes the running totals to a
 * file each time the guest program marks a point.
 *
 * The guest marks a point with the system call getpriority(MARK_MAGIC, tag): an invalid `which`
 * that the kernel refuses with EINVAL, so the call has no effect beyond this plugin seeing it.
 * bench/arm_count.py (through bench/arm64/guest.py) marks the start and end of K invokes of a model; the difference between two
 * marks is exactly what those invokes executed, free of the process's start-up and exit.
 *
 * Counting is inline (an add per translated block, an add per memory access) with no callback on
 * the hot path, and the counters are plain globals: measure one guest thread (num_threads=1).
 *
 * With ARM_COUNT_BLOCKS set to a path, each translated block also gets its own execution counter
 * (one more inline add per block), for a cycle estimate (bench/arm_cycles.py times each block on a
 * pipeline model). A mark with an odd tag ends a bracket: the plugin appends to that file the
 * executions of every block since the mark before it, "count TAG ID N" (and the block's code the
 * first time, "code ID VADDR HEX"); every mark starts the next bracket. Blocks are numbered by
 * translation, not address: a library unloaded and another loaded at its address get new numbers.
 *
 * No header ships with the qemu-user package, so the few plugin functions used are declared here,
 * as qemu's include/qemu/qemu-plugin.h (version 1) declares them.
 *
 * Build: gcc -shared -fPIC -O2 -o counter.so counter.c
 * Use:   ARM_COUNT_OUT=marks.txt [ARM_COUNT_BLOCKS=blocks.txt] qemu-aarch64 -plugin ./counter.so PROGRAM ...
 *        marks.txt gets "mark TAG INSNS MEMS" per mark and "exit 0 INSNS MEMS" at exit. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
enum qemu_plugin_mem_rw { QEMU_PLUGIN_MEM_R = 1, QEMU_PLUGIN_MEM_W, QEMU_PLUGIN_MEM_RW };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num,
                                              uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5,
                                              uint64_t a6, uint64_t a7, uint64_t a8);

size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr,
                                              uint64_t imm);
void qemu_plugin_register_vcpu_mem_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_mem_rw rw,
                                          enum qemu_plugin_op op, void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_syscall_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

enum { kGetPriorityAarch64 = 141, kMarkMagic = 0x6466 /* "df" */ };

static uint64_t insns, mems;
static FILE *out;

/* One translated block: its executions (the inline counter), those already written, its code. */
struct block {
  uint64_t executions, written, vaddr;
  int code_written;
  size_t nbytes;
  unsigned char bytes[];
};
static FILE *blocks_out; /* NULL: no per-block counts */
static struct block **blocks;
static size_t nblocks, capacity;

static void count_block(struct qemu_plugin_tb *tb, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
  struct block *b = calloc(1, sizeof *b + total);
  if (!b) return;
  if (nblocks == capacity) { /* translation is serialized by qemu, so no lock */
    size_t grown = capacity ? 2 * capacity : 4096;
    struct block **more = realloc(blocks, grown * sizeof *more);
    if (!more) { free(b); return; }
    blocks = more, capacity = grown;
  }
  b->vaddr = qemu_plugin_tb_vaddr(tb);
  for (size_t i = 0; i < n; i++) {
    const struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
    memcpy(b->bytes + b->nbytes, qemu_plugin_insn_data(insn), qemu_plugin_insn_size(insn));
    b->nbytes += qemu_plugin_insn_size(insn);
  }
  blocks[nblocks++] = b;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->executions, 1);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  size_t n = qemu_plugin_tb_n_insns(tb);
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, n);
  for (size_t i = 0; i < n; i++)
    qemu_plugin_register_vcpu_mem_inline(qemu_plugin_tb_get_insn(tb, i), QEMU_PLUGIN_MEM_RW,
                                         QEMU_PLUGIN_INLINE_ADD_U64, &mems, 1);
  if (blocks_out) count_block(tb, n);
}

/* Ends a bracket: an odd tag writes each block's executions since the last mark; any mark restarts. */
static void write_blocks(uint64_t tag) {
  for (size_t k = 0; k < nblocks; k++) {
    struct block *b = blocks[k];
    uint64_t since = b->executions - b->written;
    b->written = b->executions;
    if (!since || !(tag & 1)) continue;
    if (!b->code_written) {
      fprintf(blocks_out, "code %zu %llx ", k, (unsigned long long)b->vaddr);
      for (size_t i = 0; i < b->nbytes; i++) fprintf(blocks_out, "%02x", b->bytes[i]);
      fputc('\n', blocks_out);
      b->code_written = 1;
    }
    fprintf(blocks_out, "count %llu %zu %llu\n", (unsigned long long)tag, k, (unsigned long long)since);
  }
  fflush(blocks_out);
}

static void write_line(const char *what, uint64_t tag) {
  fprintf(out, "%s %llu %llu %llu\n", what, (unsigned long long)tag, (unsigned long long)insns,
          (unsigned long long)mems);
  fflush(out);  /* the guest may be killed; what was marked stays written */
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2, uint64_t a3,
                       uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8) {
  if (num != kGetPriorityAarch64 || a1 != kMarkMagic) return;
  write_line("mark", a2);
  if (blocks_out) write_blocks(a2);
}

static void at_exit(qemu_plugin_id_t id, void *userdata) {
  write_line("exit", 0);
  fclose(out);
  if (blocks_out) fclose(blocks_out);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const void *info, int argc,
                                                               char **argv) {
  const char *path = getenv("ARM_COUNT_OUT");
  out = fopen(path ? path : "/dev/stderr", "a");
  if (!out) return 1;
  const char *blocks_path = getenv("ARM_COUNT_BLOCKS");
  if (blocks_path && !(blocks_out = fopen(blocks_path, "w"))) return 1;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
  qemu_plugin_register_atexit_cb(id, at_exit, NULL);
  return 0;
}

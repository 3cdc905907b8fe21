/* The UPMEM emulator's C side: the host's scatter (pack) and one synchronisation round of every DPU
 * (round: broadcast, the per-DPU program, gather into the host's sums).
 *
 * Memory layout handed in by the host side (rlbench_upmem/emulator.py), all plain buffers:
 *   records  (N x 16 B)  the MRAM chunks of every DPU back to back; DPU d owns [offsets[d], offsets[d+1])
 *   q        (D x S x A) each DPU's Q-table in its MRAM, fp32 or int32 fixed point
 *   seen     (D x S x A) uint8, 1 where the DPU updated (s, a) -- what the host averages over
 * Per DPU, as the DPU program would: copy Q and seen from MRAM into WRAM, stream the chunk through
 * one DMA buffer per tasklet (block b goes to tasklet b % T), apply the updates strictly in chunk
 * order, write Q and seen back to MRAM. Each emulated DPU has its own 64 KB-class WRAM scratch.
 * The INT32 path uses integer arithmetic only (the DPU has no FPU); products are 64-bit, results
 * are saturated to int32 and the saturations counted. FP32 is IEEE single precision, built with
 * -ffp-contract=off (no fused multiply-add), whatever the instruction set.
 *
 * Speed (the hardware runs its DPUs side by side; this host runs them on one thread):
 * - GROUP DPUs run interleaved, update k of each in turn. Their tables are disjoint, so every DPU
 *   still sees exactly its own sequential order; one table's TD updates form a chain through memory
 *   (an update reads the row an earlier one may have just written), and several chains give the
 *   core independent work while one waits.
 * - The update is compiled once per action count 1..MAX_SPECIALISED_ACTIONS (the max over a row is
 *   then unrolled) and per rule and numeric type; other action counts take the generic loop.
 * - A round goes rank by rank through broadcast, program and gather, so that a rank's tables are
 *   still in cache from one phase to the next.
 * - The host-side loops (pack, the gather's sums) are vectorised, and built for AVX-512 and AVX2
 *   besides baseline x86-64 (target_clones: the CPU picks one at load time).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <time.h>

typedef struct {
    int32_t obs;
    int32_t next_obs;
    union { float f; int32_t i; } reward; /* fp32, or fixed point for the INT32 program */
    uint8_t action;
    uint8_t next_action;
    uint8_t done;
    uint8_t pad;
} record_t;

_Static_assert(sizeof(record_t) == 16, "a record is 16 bytes (8-byte aligned MRAM DMA)");

enum { RULE_QLEARNING = 0, RULE_SARSA = 1 };
enum { GROUP = 4 };  /* DPUs interleaved: on Taxi's 500 x 6 tables 3 to 6 measured alike, 8 slower */
enum { MAX_SPECIALISED_ACTIONS = 8 };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The constants of one TD update, copied into locals by the caller: kept in registers, they are
 * not reloaded after every store into a table (a uint8_t store may alias anything). */
typedef struct {
    Py_ssize_t seen_at; /* the seen flags' offset in WRAM */
    float alpha_f, gamma_f;
    int64_t alpha_fx, gamma_fx, scale;
} step_t;

/* What every DPU runs: the program's constants, the same for all DPUs of a launch. */
typedef struct {
    int n_actions, epochs, tasklets, block_records;
    Py_ssize_t table, q_bytes, dma_at, dma_bytes;
    step_t step;
} program_t;

/* One DPU: its MRAM chunk and table images, and its WRAM. */
typedef struct {
    const record_t *chunk;
    Py_ssize_t n;
    uint8_t *q_mram, *seen_mram, *wram;
} dpu_t;

static inline int32_t saturate(int64_t v, long long *saturations) {
    if (v > INT32_MAX) { (*saturations)++; return INT32_MAX; }
    if (v < INT32_MIN) { (*saturations)++; return INT32_MIN; }
    return (int32_t)v;
}

/* What a TD target bootstraps from, for int32 or float rows alike: next[a'] for SARSA, else the
 * row's maximum, scanned in order (strictly greater replaces, so the first of equal maxima stays). */
#define ROW_BOOTSTRAP(best, next, r, A, rule)                                                  \
    do {                                                                                        \
        (best) = (next)[0];                                                                     \
        if ((rule) == RULE_SARSA) (best) = (next)[(r)->next_action];                            \
        else for (int a_ = 1; a_ < (A); a_++) (best) = (next)[a_] > (best) ? (next)[a_] : (best); \
    } while (0)

/* One TD update in the DPU's arithmetic, on the table at the start of WRAM. A, rule and is_int32 are
 * compile-time constants where this is inlined; the row is always read (next_obs is in range) and
 * the bootstrap dropped when done. */
ALWAYS_INLINE void update(const record_t *r, uint8_t *wram, const step_t c, const int A, const int rule,
                          const int is_int32, long long *saturations) {
    Py_ssize_t at = (Py_ssize_t)r->obs * A + r->action, next_at = (Py_ssize_t)r->next_obs * A;
    if (is_int32) {
        int32_t *q = (int32_t *)wram, best;
        ROW_BOOTSTRAP(best, q + next_at, r, A, rule);
        int64_t bootstrap = r->done ? 0 : best;
        int64_t target = (int64_t)r->reward.i + (c.gamma_fx * bootstrap) / c.scale;
        int64_t step = (c.alpha_fx * (target - (int64_t)q[at])) / c.scale;
        q[at] = saturate((int64_t)q[at] + step, saturations);
    } else {
        float *q = (float *)wram, best;
        ROW_BOOTSTRAP(best, q + next_at, r, A, rule);
        float bootstrap = r->done ? 0.0f : best;
        float target = r->reward.f + c.gamma_f * bootstrap;
        q[at] = q[at] + c.alpha_f * (target - q[at]);
    }
    wram[c.seen_at + at] = 1;
}

/* mram_read of block b of a DPU's chunk into the DMA buffer of tasklet b % T; returns the buffer. */
ALWAYS_INLINE const record_t *dma_read(const dpu_t *d, const program_t *p, Py_ssize_t block, Py_ssize_t len) {
    record_t *buffer = (record_t *)(d->wram + p->dma_at + (block % p->tasklets) * p->dma_bytes);
    memcpy(buffer, d->chunk + block * p->block_records, (size_t)len * sizeof(record_t));
    return buffer;
}

/* Blocks first..end of one DPU's chunk, in order. */
ALWAYS_INLINE void sweep_blocks(const dpu_t *d, const program_t *p, Py_ssize_t first, const int A, const int rule,
                                const int is_int32, long long *saturations) {
    const step_t c = p->step;
    uint8_t *wram = d->wram;
    for (Py_ssize_t block = first; block * p->block_records < d->n; block++) {
        Py_ssize_t start = block * p->block_records;
        Py_ssize_t len = d->n - start < p->block_records ? d->n - start : p->block_records;
        const record_t *buffer = dma_read(d, p, block, len);
        for (Py_ssize_t k = 0; k < len; k++) update(&buffer[k], wram, c, A, rule, is_int32, saturations);
    }
}

/* `count` DPUs (at most GROUP) from MRAM load to MRAM write-back; what a full group cannot run
 * interleaved (and all of a short group) runs DPU after DPU. */
ALWAYS_INLINE void run_group(dpu_t *g, int count, const program_t *p, const int A, const int rule, const int is_int32,
                             long long *saturations) {
    const step_t c = p->step;
    for (int j = 0; j < count; j++) {
        memcpy(g[j].wram, g[j].q_mram, (size_t)p->q_bytes);
        memcpy(g[j].wram + c.seen_at, g[j].seen_mram, (size_t)p->table);
    }
    Py_ssize_t common = 0;
    if (count == GROUP) {
        Py_ssize_t shortest = g[0].n;
        for (int j = 1; j < GROUP; j++) shortest = g[j].n < shortest ? g[j].n : shortest;
        common = shortest / p->block_records;
    }
    const Py_ssize_t B = p->block_records;
    long long saturated = 0;
    for (int e = 0; e < p->epochs; e++) {
        for (Py_ssize_t block = 0; block < common; block++) {
            const record_t *buffers[GROUP];
            uint8_t *wram[GROUP];
            for (int j = 0; j < GROUP; j++) {
                buffers[j] = dma_read(&g[j], p, block, B);
                wram[j] = g[j].wram;
            }
            for (Py_ssize_t k = 0; k < B; k++)
                for (int j = 0; j < GROUP; j++) update(&buffers[j][k], wram[j], c, A, rule, is_int32, &saturated);
        }
        for (int j = 0; j < count; j++) sweep_blocks(&g[j], p, common, A, rule, is_int32, &saturated);
    }
    *saturations += saturated;
    for (int j = 0; j < count; j++) {
        memcpy(g[j].q_mram, g[j].wram, (size_t)p->q_bytes); /* mram_write */
        memcpy(g[j].seen_mram, g[j].wram + c.seen_at, (size_t)p->table);
    }
}

ALWAYS_INLINE long long run_all(dpu_t *dpus, Py_ssize_t n_dpus, const program_t *p, const int A, const int rule,
                                const int is_int32) {
    long long saturations = 0;
    for (Py_ssize_t d = 0; d < n_dpus; d += GROUP) {
        int count = n_dpus - d < GROUP ? (int)(n_dpus - d) : GROUP;
        run_group(dpus + d, count, p, A, rule, is_int32, &saturations);
    }
    return saturations;
}

#define RUN_WITH(A_, RULE_, INT32_) return run_all(dpus, n_dpus, p, A_, RULE_, INT32_)
#define RUN_NUMERIC(A_, RULE_) do { if (is_int32) RUN_WITH(A_, RULE_, 1); RUN_WITH(A_, RULE_, 0); } while (0)
#define RUN_RULE(A_)                                       \
    do {                                                   \
        if (rule == RULE_SARSA) RUN_NUMERIC(A_, RULE_SARSA); \
        RUN_NUMERIC(A_, RULE_QLEARNING);                   \
    } while (0)

static long long dispatch(dpu_t *dpus, Py_ssize_t n_dpus, const program_t *p, int rule, int is_int32) {
    switch (p->n_actions) {
    case 1: RUN_RULE(1);
    case 2: RUN_RULE(2);
    case 3: RUN_RULE(3);
    case 4: RUN_RULE(4);
    case 5: RUN_RULE(5);
    case 6: RUN_RULE(6);
    case 7: RUN_RULE(7);
    case 8: RUN_RULE(8);
    default: RUN_RULE(p->n_actions);
    }
}

_Static_assert(MAX_SPECIALISED_ACTIONS == 8, "dispatch() has one case per specialised action count");

/* The fields of one row the DPU program cannot use, as bits: 1 reward not finite (when finite_mask
 * is the float32 exponent; 0 checks nothing), 2 obs, 4 action, 8 next_obs, 16 next_action outside
 * the table (a negative id wraps to a large unsigned one). */
ALWAYS_INLINE uint32_t bad_fields(uint32_t obs, uint32_t action, uint32_t next_obs, uint32_t next_action,
                                  uint32_t reward, uint32_t S, uint32_t A, uint32_t finite_mask) {
    return (uint32_t)(finite_mask != 0 && (reward & finite_mask) == finite_mask) | (uint32_t)(obs >= S) << 1 |
           (uint32_t)(action >= A) << 2 | (uint32_t)(next_obs >= S) << 3 | (uint32_t)(next_action >= A) << 4;
}

/* Records of rows [0, n) in dataset order, as 4 x 32-bit words: obs, next_obs, reward and
 * action | next_action << 8 | done << 16 (record_t on a little-endian host), checked as they are
 * written. Written so that the compiler vectorises it, and compiled for AVX-512 and AVX2 besides
 * baseline x86-64. Returns the bad_fields bits of all rows. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint32_t pack_in_order(uint32_t *restrict out, const int32_t *restrict o, const int32_t *restrict a,
                              const int32_t *restrict o2, const int32_t *restrict a2, const int32_t *restrict r,
                              const uint8_t *restrict end, Py_ssize_t n, uint32_t S, uint32_t A,
                              uint32_t finite_mask) {
    uint32_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t next_a = a2 ? (uint32_t)a2[i] : 0;
        out[4 * i] = (uint32_t)o[i];
        out[4 * i + 1] = (uint32_t)o2[i];
        out[4 * i + 2] = (uint32_t)r[i];
        out[4 * i + 3] = ((uint32_t)a[i] & 0xff) | (next_a & 0xff) << 8 | (uint32_t)(end[i] != 0) << 16;
        bad |= bad_fields((uint32_t)o[i], (uint32_t)a[i], (uint32_t)o2[i], next_a, (uint32_t)r[i], S, A, finite_mask);
    }
    return bad;
}

_Static_assert(offsetof(record_t, reward) == 8 && offsetof(record_t, action) == 12 &&
               offsetof(record_t, next_action) == 13 && offsetof(record_t, done) == 14,
               "pack_in_order writes record_t's layout as 32-bit words");

/* pack(records, order, obs, action, next_obs, next_action, reward, done, n_states, n_actions,
 *      check_finite) -> 0, or the bad_fields bits of the rows packed
 * The host side of the scatter: record i is dataset row order[i] (row i when order is empty). Ids
 * are int32, reward 4 bytes (fp32, checked finite when asked, or fixed point), done uint8; an empty
 * next_action writes zeros (Q-learning never reads it). Every byte of a record is written; the
 * values are checked in the same pass, and the caller refuses the records when one is bad. */
static PyObject *pack(PyObject *self, PyObject *args) {
    Py_buffer out, order, obs, action, next_obs, next_action, reward, done;
    int S, A, check_finite;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*y*y*y*iip", &out, &order, &obs, &action, &next_obs, &next_action, &reward,
                          &done, &S, &A, &check_finite))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = obs.len / 4, rows = n;
    int ok = obs.len % 4 == 0 && action.len == obs.len && reward.len == obs.len && next_obs.len == obs.len &&
             (next_action.len == 0 || next_action.len == obs.len) && done.len == n &&
             (order.len == 0 || order.len % 8 == 0) && out.len % (Py_ssize_t)sizeof(record_t) == 0 && S > 0 && A > 0;
    if (ok && order.len) n = order.len / 8;
    if (!ok || out.len != n * (Py_ssize_t)sizeof(record_t)) {
        PyErr_SetString(PyExc_ValueError, "pack: array lengths do not match");
        goto done;
    }
    const int64_t *rows_of = order.len ? (const int64_t *)order.buf : NULL;
    for (Py_ssize_t i = 0; rows_of && i < n; i++) {
        if (rows_of[i] < 0 || rows_of[i] >= rows) {
            PyErr_SetString(PyExc_ValueError, "pack: order holds a row outside the dataset");
            goto done;
        }
    }
    const int32_t *o = obs.buf, *a = action.buf, *o2 = next_obs.buf, *a2 = next_action.len ? next_action.buf : NULL;
    const int32_t *r = reward.buf;
    const uint8_t *end = done.buf;
    const uint32_t finite_mask = check_finite ? 0x7f800000u : 0u; /* exponent all ones: infinity or NaN */
    uint32_t bad = 0;
    Py_BEGIN_ALLOW_THREADS
    if (rows_of == NULL) {
        bad = pack_in_order(out.buf, o, a, o2, a2, r, end, n, (uint32_t)S, (uint32_t)A, finite_mask);
    } else {
        record_t *rec = out.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t t = rows_of[i];
            int32_t next_a = a2 ? a2[t] : 0;
            record_t x = {.obs = o[t], .next_obs = o2[t], .action = (uint8_t)a[t], .next_action = (uint8_t)next_a,
                          .done = end[t] != 0, .pad = 0};
            x.reward.i = r[t];
            rec[i] = x;
            bad |= bad_fields((uint32_t)o[t], (uint32_t)a[t], (uint32_t)o2[t], (uint32_t)next_a, (uint32_t)r[t],
                              (uint32_t)S, (uint32_t)A, finite_mask);
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromUnsignedLong(bad);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&order);
    PyBuffer_Release(&obs);
    PyBuffer_Release(&action);
    PyBuffer_Release(&next_obs);
    PyBuffer_Release(&next_action);
    PyBuffer_Release(&reward);
    PyBuffer_Release(&done);
    return result;
}

/* One DPU's table into the host's sums and counts; restrict lets the compiler vectorise it, and it
 * is compiled for AVX-512 and AVX2 as well as baseline x86-64, the CPU picking at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void accumulate_table(const int32_t *restrict fixed, const float *restrict real,
                             const uint8_t *restrict seen, double *restrict sums, int64_t *restrict counts,
                             Py_ssize_t table) {
    for (Py_ssize_t i = 0; i < table; i++) {
        double value = fixed ? (double)fixed[i] : (double)real[i];
        sums[i] += seen[i] ? value : 0.0;
        counts[i] += seen[i] != 0;
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* round(records, offsets, q, seen, host, sums, counts, n_states, n_actions, rule, int32, alpha, gamma,
 *       scale, epochs, tasklets, block_records, wram_bytes, slice_dpus (the DPUs of a rank))
 *   -> (saturations, broadcast seconds, kernel seconds, gather seconds)
 * One synchronisation round of every DPU:
 *   broadcast  every DPU's MRAM table = host (S x A, fp32 or fixed point), its seen flags cleared;
 *   kernel     the DPU program (run_all) sweeps its chunk `epochs` times;
 *   gather     sums[s, a] += q[s, a] (as float64) and counts[s, a] += 1 where the DPU saw (s, a),
 *              DPU after DPU in order.
 * The host drives slice_dpus DPUs at a time through the three phases, so that a slice's tables are
 * still in cache from one phase to the next; the DPUs are independent and the gather keeps DPU
 * order, so the result is that of three whole-system phases. Each phase's time is summed apart. */
static PyObject *run_round(PyObject *self, PyObject *args) {
    Py_buffer records, offsets, q, seen, host, sums, counts;
    int S, A, rule, is_int32, epochs, tasklets, block_records, slice_dpus;
    double alpha, gamma;
    long long scale;
    Py_ssize_t wram_bytes;
    if (!PyArg_ParseTuple(args, "y*y*w*w*y*w*w*iiiiddLiiini", &records, &offsets, &q, &seen, &host, &sums, &counts,
                          &S, &A, &rule, &is_int32, &alpha, &gamma, &scale, &epochs, &tasklets, &block_records,
                          &wram_bytes, &slice_dpus))
        return NULL;
    PyObject *result = NULL;
    dpu_t *dpus = NULL;
    uint8_t *wram = NULL;
    program_t p = {.n_actions = A, .epochs = epochs, .tasklets = tasklets, .block_records = block_records,
                   .table = (Py_ssize_t)S * A};
    p.q_bytes = p.table * 4;
    p.dma_bytes = (Py_ssize_t)block_records * sizeof(record_t);
    p.step.seen_at = (p.q_bytes + 7) & ~(Py_ssize_t)7;
    p.dma_at = (p.step.seen_at + p.table + 7) & ~(Py_ssize_t)7;
    Py_ssize_t n_dpus = offsets.len / (Py_ssize_t)sizeof(int64_t) - 1;
    if (S < 1 || A < 1 || A > 255 || tasklets < 1 || block_records < 1 || epochs < 0 || scale < 1 || n_dpus < 1 ||
        slice_dpus < 1 || (rule != RULE_QLEARNING && rule != RULE_SARSA)) {
        PyErr_SetString(PyExc_ValueError, "bad kernel arguments");
        goto done;
    }
    if (q.len != n_dpus * p.q_bytes || seen.len != n_dpus * p.table || host.len != p.q_bytes ||
        sums.len != p.table * 8 || counts.len != p.table * 8 || records.len % (Py_ssize_t)sizeof(record_t)) {
        PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the DPU count and table shape");
        goto done;
    }
    if (p.dma_at + (Py_ssize_t)tasklets * p.dma_bytes > wram_bytes) {
        PyErr_SetString(PyExc_MemoryError, "Q-table, seen flags and tasklet DMA buffers exceed WRAM");
        goto done;
    }
    const int64_t *off = (const int64_t *)offsets.buf;
    Py_ssize_t n_records = records.len / (Py_ssize_t)sizeof(record_t);
    for (Py_ssize_t d = 0; d < n_dpus; d++) {
        if (off[d] < 0 || off[d] > off[d + 1] || off[d + 1] > n_records) {
            PyErr_SetString(PyExc_ValueError, "chunk offsets out of range");
            goto done;
        }
    }
    /* one WRAM per DPU of a group, 64-byte aligned; reused group after group */
    Py_ssize_t wram_stride = (wram_bytes + 63) & ~(Py_ssize_t)63;
    wram = PyMem_RawMalloc((size_t)(GROUP * wram_stride + 64));
    dpus = PyMem_RawMalloc((size_t)n_dpus * sizeof(dpu_t));
    if (wram == NULL || dpus == NULL) { PyErr_NoMemory(); goto done; }
    uint8_t *wram_aligned = (uint8_t *)(((uintptr_t)wram + 63) & ~(uintptr_t)63);
    const record_t *all = (const record_t *)records.buf;
    for (Py_ssize_t d = 0; d < n_dpus; d++)
        dpus[d] = (dpu_t){.chunk = all + off[d], .n = off[d + 1] - off[d],
                          .q_mram = (uint8_t *)q.buf + d * p.q_bytes, .seen_mram = (uint8_t *)seen.buf + d * p.table,
                          .wram = wram_aligned + (d % GROUP) * wram_stride};
    p.step.alpha_f = (float)alpha;
    p.step.gamma_f = (float)gamma;
    p.step.alpha_fx = llround(alpha * (double)scale);
    p.step.gamma_fx = llround(gamma * (double)scale);
    p.step.scale = scale;
    long long saturations = 0;
    double seconds[3] = {0.0, 0.0, 0.0};
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t first = 0; first < n_dpus; first += slice_dpus) {
        Py_ssize_t count = n_dpus - first < slice_dpus ? n_dpus - first : slice_dpus;
        dpu_t *slice = dpus + first;
        double t0 = now();
        for (Py_ssize_t d = 0; d < count; d++) {
            memcpy(slice[d].q_mram, host.buf, (size_t)p.q_bytes);
            memset(slice[d].seen_mram, 0, (size_t)p.table);
        }
        double t1 = now();
        saturations += dispatch(slice, count, &p, rule, is_int32);
        double t2 = now();
        for (Py_ssize_t d = 0; d < count; d++)
            accumulate_table(is_int32 ? (const int32_t *)slice[d].q_mram : NULL,
                             is_int32 ? NULL : (const float *)slice[d].q_mram, slice[d].seen_mram, sums.buf,
                             counts.buf, p.table);
        double t3 = now();
        seconds[0] += t1 - t0;
        seconds[1] += t2 - t1;
        seconds[2] += t3 - t2;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("Lddd", saturations, seconds[0], seconds[1], seconds[2]);
done:
    PyMem_RawFree(wram);
    PyMem_RawFree(dpus);
    PyBuffer_Release(&records);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&q);
    PyBuffer_Release(&seen);
    PyBuffer_Release(&host);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"round", run_round, METH_VARARGS,
     "One round on every DPU: broadcast the host table, run the DPU program, gather into sums and counts."},
    {"pack", pack, METH_VARARGS, "Pack dataset rows, in an order, into 16-byte MRAM records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pim", "UPMEM DPU program emulation", -1, methods};

PyMODINIT_FUNC PyInit__pim(void) { return PyModule_Create(&module); }

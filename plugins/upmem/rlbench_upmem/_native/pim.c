/* The per-DPU program of the UPMEM emulator: every DPU's sequential tabular TD sweep, in one call.
 *
 * Memory layout handed in by the host side (rlbench_upmem/emulator.py), all plain buffers:
 *   records  (N x 16 B)  the MRAM chunks of every DPU back to back; DPU d owns [offsets[d], offsets[d+1])
 *   q        (D x S x A) each DPU's Q-table in its MRAM, fp32 or int32 fixed point
 *   seen     (D x S x A) uint8, 1 where the DPU updated (s, a) -- what the host averages over
 * Per DPU, as the DPU program would: copy Q and seen from MRAM into WRAM, stream the chunk through
 * one DMA buffer per tasklet (block b goes to tasklet b % T), apply the updates strictly in chunk
 * order, write Q and seen back to MRAM. WRAM is a real 64 KB-class scratch, reused DPU after DPU.
 * The INT32 path uses integer arithmetic only (the DPU has no FPU); products are 64-bit, results
 * are saturated to int32 and the saturations counted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

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

static inline int32_t saturate(int64_t v, long long *saturations) {
    if (v > INT32_MAX) { (*saturations)++; return INT32_MAX; }
    if (v < INT32_MIN) { (*saturations)++; return INT32_MIN; }
    return (int32_t)v;
}

static void sweep_fp32(const record_t *block, Py_ssize_t n, float *q, uint8_t *seen, int A, int rule,
                       float alpha, float gamma) {
    for (Py_ssize_t k = 0; k < n; k++) {
        const record_t *r = &block[k];
        const float *next = q + (Py_ssize_t)r->next_obs * A;
        float bootstrap = 0.0f;
        if (!r->done) {
            if (rule == RULE_SARSA) {
                bootstrap = next[r->next_action];
            } else {
                bootstrap = next[0];
                for (int a = 1; a < A; a++) if (next[a] > bootstrap) bootstrap = next[a];
            }
        }
        Py_ssize_t at = (Py_ssize_t)r->obs * A + r->action;
        float target = r->reward.f + gamma * bootstrap;
        q[at] = q[at] + alpha * (target - q[at]);
        seen[at] = 1;
    }
}

static void sweep_int32(const record_t *block, Py_ssize_t n, int32_t *q, uint8_t *seen, int A, int rule,
                        int64_t alpha_fx, int64_t gamma_fx, int64_t scale, long long *saturations) {
    for (Py_ssize_t k = 0; k < n; k++) {
        const record_t *r = &block[k];
        const int32_t *next = q + (Py_ssize_t)r->next_obs * A;
        int64_t bootstrap = 0;
        if (!r->done) {
            if (rule == RULE_SARSA) {
                bootstrap = next[r->next_action];
            } else {
                int32_t best = next[0];
                for (int a = 1; a < A; a++) if (next[a] > best) best = next[a];
                bootstrap = best;
            }
        }
        Py_ssize_t at = (Py_ssize_t)r->obs * A + r->action;
        int64_t target = (int64_t)r->reward.i + (gamma_fx * bootstrap) / scale;
        int64_t step = (alpha_fx * (target - (int64_t)q[at])) / scale;
        q[at] = saturate((int64_t)q[at] + step, saturations);
        seen[at] = 1;
    }
}

/* run(records, offsets, q, seen, n_states, n_actions, rule, int32, alpha, gamma, scale, epochs,
 *     tasklets, block_records, wram_bytes) -> saturations */
static PyObject *run(PyObject *self, PyObject *args) {
    Py_buffer records, offsets, q, seen;
    int S, A, rule, is_int32, epochs, tasklets, block_records;
    double alpha, gamma;
    long long scale;
    Py_ssize_t wram_bytes;
    if (!PyArg_ParseTuple(args, "y*y*w*w*iiiiddLiiin", &records, &offsets, &q, &seen, &S, &A, &rule, &is_int32,
                          &alpha, &gamma, &scale, &epochs, &tasklets, &block_records, &wram_bytes))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t table = (Py_ssize_t)S * A;
    Py_ssize_t n_dpus = offsets.len / (Py_ssize_t)sizeof(int64_t) - 1;
    Py_ssize_t q_bytes = table * 4, dma_bytes = (Py_ssize_t)block_records * sizeof(record_t);
    Py_ssize_t seen_at = (q_bytes + 7) & ~(Py_ssize_t)7, dma_at = (seen_at + table + 7) & ~(Py_ssize_t)7;
    if (S < 1 || A < 1 || tasklets < 1 || block_records < 1 || epochs < 0 || scale < 1 || n_dpus < 1) {
        PyErr_SetString(PyExc_ValueError, "bad kernel arguments");
        goto done;
    }
    if (q.len != n_dpus * q_bytes || seen.len != n_dpus * table || records.len % (Py_ssize_t)sizeof(record_t)) {
        PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the DPU count and table shape");
        goto done;
    }
    if (dma_at + (Py_ssize_t)tasklets * dma_bytes > wram_bytes) {
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
    uint8_t *wram = PyMem_RawMalloc((size_t)wram_bytes);
    if (wram == NULL) { PyErr_NoMemory(); goto done; }
    long long saturations = 0;
    const float alpha_f = (float)alpha, gamma_f = (float)gamma;
    const int64_t alpha_fx = llround(alpha * (double)scale), gamma_fx = llround(gamma * (double)scale);
    Py_BEGIN_ALLOW_THREADS
    const record_t *all = (const record_t *)records.buf;
    for (Py_ssize_t d = 0; d < n_dpus; d++) {
        uint8_t *q_mram = (uint8_t *)q.buf + d * q_bytes, *seen_mram = (uint8_t *)seen.buf + d * table;
        void *q_wram = wram;
        uint8_t *seen_wram = wram + seen_at;
        memcpy(q_wram, q_mram, (size_t)q_bytes);
        memcpy(seen_wram, seen_mram, (size_t)table);
        const record_t *chunk = all + off[d];
        Py_ssize_t n = off[d + 1] - off[d];
        for (int e = 0; e < epochs; e++) {
            Py_ssize_t block = 0;
            for (Py_ssize_t start = 0; start < n; start += block_records, block++) {
                Py_ssize_t len = n - start < block_records ? n - start : block_records;
                record_t *buffer = (record_t *)(wram + dma_at + (block % tasklets) * dma_bytes);
                memcpy(buffer, chunk + start, (size_t)len * sizeof(record_t)); /* mram_read */
                if (is_int32)
                    sweep_int32(buffer, len, (int32_t *)q_wram, seen_wram, A, rule, alpha_fx, gamma_fx, scale,
                                &saturations);
                else
                    sweep_fp32(buffer, len, (float *)q_wram, seen_wram, A, rule, alpha_f, gamma_f);
            }
        }
        memcpy(q_mram, q_wram, (size_t)q_bytes); /* mram_write */
        memcpy(seen_mram, seen_wram, (size_t)table);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(wram);
    result = PyLong_FromLongLong(saturations);
done:
    PyBuffer_Release(&records);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&q);
    PyBuffer_Release(&seen);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "Run every DPU's sequential tabular sweep over its MRAM chunk."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pim", "UPMEM DPU program emulation", -1, methods};

PyMODINIT_FUNC PyInit__pim(void) { return PyModule_Create(&module); }

/* rlbench._sumtree: the sum/min tree behind proportional prioritized replay (Schaul et al. 2016).
 *
 * Layout: a K-ary tree stored level by level (level 0 = leaves). The K children of a node form one
 * block: their K sums followed by their K mins. With K = 4 doubles a block is exactly one 64-byte
 * cache line, so a priority update touches one line per level and sampling reads one line per
 * level (a million leaves: 10 levels below the root). Measured on the development machine against
 * K = 8 (two lines per block, 7 levels) and K = 16: K = 4 sampled ~20 % faster than K = 8 and
 * updated as fast; K = 16 was 2x slower at both.
 *
 * Leaves hold p**alpha. The min part ignores zero priorities (they are never sampled, so they
 * must not set the importance-weight normalisation) and empty slots: both hold +inf there.
 *
 * Batches are processed level by level across the whole batch rather than item by item: the
 * memory loads of different items are independent, so the CPU overlaps their cache misses, and
 * the next level's line of every item is prefetched while the others are handled.
 *
 * Arrays come in through the buffer protocol (no per-element Python objects); random numbers are
 * drawn by numpy's seeded Generator in Python and passed in, so runs are reproducible.
 *
 * The same update (check, then write) and sampling code is exported to C through the capsule
 * rlbench._sumtree._C_API (sumtree.h): the replay node's fast path (wire.c) runs it on the memory's
 * tree without a Python call in between.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include "sumtree.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TREE_SHIFT
#define TREE_SHIFT 2 /* K = 4 children: 4 sums + 4 mins = one 64-byte cache line */
#endif
#define K (1 << TREE_SHIFT)
#define BLOCK (2 * K) /* K sums, then K mins */
#define MAX_LEVELS 64
#define CHUNK 256 /* items descended together when sampling */

struct SumTree {
    PyObject_HEAD
    Py_ssize_t capacity;
    int levels; /* including the leaves; the top level has one element, the root */
    double *level[MAX_LEVELS];
    Py_ssize_t count[MAX_LEVELS]; /* elements per level */
    double alpha;
    double max_priority; /* largest raw priority seen, the default for new items */
};

static inline double *sum_slot(double *lvl, Py_ssize_t element) {
    return lvl + (element >> TREE_SHIFT) * BLOCK + (element & (K - 1));
}

/* Sum (pairwise, so the dependency chain is short) and min of the K children in one block. */
static inline void reduce_block(const double *block, double *sum, double *min) {
    double s[K], m[K];
    for (int k = 0; k < K; k++) {
        s[k] = block[k];
        m[k] = block[K + k];
    }
    for (int width = K / 2; width >= 1; width /= 2)
        for (int k = 0; k < width; k++) {
            s[k] = s[k] + s[k + width];
            m[k] = m[k] < m[k + width] ? m[k] : m[k + width];
        }
    *sum = s[0];
    *min = m[0];
}

static inline void refresh_element(SumTree *t, int lvl, Py_ssize_t element) {
    double *dst = sum_slot(t->level[lvl], element);
    reduce_block(t->level[lvl - 1] + element * BLOCK, dst, dst + K);
}

static void tree_free_levels(SumTree *t) {
    for (int l = 0; l < t->levels; l++) {
        free(t->level[l]);
        t->level[l] = NULL;
    }
    t->levels = 0;
}

static void SumTree_dealloc(SumTree *self) {
    tree_free_levels(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int SumTree_init(SumTree *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"capacity", "alpha", NULL};
    Py_ssize_t capacity;
    double alpha;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nd", keywords, &capacity, &alpha))
        return -1;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be at least 1, got %zd", capacity);
        return -1;
    }
    if (!(alpha >= 0.0) || !isfinite(alpha)) {
        char text[32];
        snprintf(text, sizeof text, "%g", alpha);
        PyErr_Format(PyExc_ValueError, "alpha must be a finite number >= 0, got %s", text);
        return -1;
    }
    tree_free_levels(self);
    Py_ssize_t n = capacity;
    int l = 0;
    for (;;) {
        Py_ssize_t blocks = (n + K - 1) / K;
        size_t bytes = (size_t)blocks * BLOCK * sizeof(double);
        double *mem = aligned_alloc(128, (bytes + 127) & ~(size_t)127);
        if (mem == NULL) {
            tree_free_levels(self);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t b = 0; b < blocks; b++)
            for (int k = 0; k < K; k++) {
                mem[b * BLOCK + k] = 0.0;
                mem[b * BLOCK + K + k] = INFINITY;
            }
        self->level[l] = mem;
        self->count[l] = n;
        self->levels = ++l;
        if (n == 1)
            break;
        n = blocks;
    }
    self->capacity = capacity;
    self->alpha = alpha;
    self->max_priority = 1.0;
    return 0;
}

/* A SumTree made with __new__ but never initialised has no levels. */
static int not_ready(SumTree *t) {
    if (t->levels > 0)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "SumTree was not initialised: call SumTree(capacity, alpha)");
    return 1;
}

/* ---- buffers ------------------------------------------------------------------------------- */

/* Native-order format code of a buffer, without the byte-order prefix numpy may add. */
static char format_code(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return f[1] == '\0' ? f[0] : '?';
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *what, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        /* Always TypeError (numpy says ValueError for a strided array): the caller converts and retries. */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s array", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* Indices: int64 or int32. Returns the element count or -1. */
static Py_ssize_t index_buffer(PyObject *obj, Py_buffer *view, int *wide) {
    if (get_buffer(obj, view, "indices", 0) < 0)
        return -1;
    char code = format_code(view);
    if (view->itemsize == 8 && (code == 'l' || code == 'q'))
        *wide = 1;
    else if (view->itemsize == 4 && (code == 'i' || code == 'l'))
        *wide = 0;
    else {
        PyErr_Format(PyExc_TypeError, "indices must be int64 or int32, got format '%s'", view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / view->itemsize;
}

static inline Py_ssize_t index_at(const void *indices, int wide, Py_ssize_t i) {
    return wide ? (Py_ssize_t)((const int64_t *)indices)[i] : (Py_ssize_t)((const int32_t *)indices)[i];
}

static inline double priority_at(const void *priorities, int wide, Py_ssize_t i) {
    return wide ? ((const double *)priorities)[i] : (double)((const float *)priorities)[i];
}

/* Priorities: float64 or float32. Returns the element count or -1. */
static Py_ssize_t priority_buffer(PyObject *obj, Py_buffer *view, int *wide) {
    if (get_buffer(obj, view, "priorities", 0) < 0)
        return -1;
    char code = format_code(view);
    if (view->itemsize == 8 && code == 'd')
        *wide = 1;
    else if (view->itemsize == 4 && code == 'f')
        *wide = 0;
    else {
        PyErr_Format(PyExc_TypeError, "priorities must be float64 or float32, got format '%s'", view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / view->itemsize;
}

/* p ** exponent. In float32 where the operands allow (3-4x cheaper than double pow; priorities are
 * float32 TD errors and the weights are returned as float32, so nothing is lost that was there). */
static inline double raise_to(double p, double exponent) {
    if (p >= 1e-30 && p <= 1e30)
        return (double)powf((float)p, (float)exponent);
    return pow(p, exponent);
}

/* ---- update ---------------------------------------------------------------------------------- */

/* Ask for the cache lines (sum and min) of an element that is about to be written. */
static inline void prefetch_slot(SumTree *t, int lvl, Py_ssize_t element) {
    if (lvl < t->levels) {
        double *slot = sum_slot(t->level[lvl], element);
        __builtin_prefetch(slot, 1);
        __builtin_prefetch(slot + K, 1);
    }
}

/* Recompute every ancestor of the given leaves, one level at a time. A level with no more
 * elements than the batch is recomputed whole: cheaper than once per item, since near the root
 * all items share their ancestors. */
static void refresh_ancestors(SumTree *t, const void *indices, int wide, Py_ssize_t n) {
    for (int l = 1; l < t->levels; l++) {
        if (t->count[l] <= n) {
            for (Py_ssize_t e = 0; e < t->count[l]; e++)
                refresh_element(t, l, e);
            continue;
        }
        int shift = TREE_SHIFT * l;
        Py_ssize_t previous = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t e = index_at(indices, wide, i) >> shift;
            if (e != previous)
                refresh_element(t, l, e);
            previous = e;
            prefetch_slot(t, l + 1, e >> TREE_SHIFT);
        }
    }
}

/* Validate an update (nothing is written): indices in [0, size), priorities finite and >= 0, and
 * the largest raised to alpha finite. Sets *batch_max (0 without priorities). */
static int tree_check(SumTree *t, const void *indices, int indices_wide, const void *priorities, int priorities_wide,
                      Py_ssize_t n, Py_ssize_t size, double *batch_max) {
    double largest = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t index = index_at(indices, indices_wide, i);
        if (index < 0 || index >= size) {
            PyErr_Format(PyExc_ValueError, "index %zd out of range for a memory holding %zd items", index, size);
            return -1;
        }
        prefetch_slot(t, 0, index); /* the leaf writes then find their lines arriving */
        if (priorities != NULL) {
            double p = priority_at(priorities, priorities_wide, i);
            if (!(p >= 0.0) || !isfinite(p)) {
                char text[32];
                snprintf(text, sizeof text, "%g", p);
                PyErr_Format(PyExc_ValueError, "priority %s at position %zd: priorities must be finite and >= 0",
                             text, i);
                return -1;
            }
            largest = p > largest ? p : largest;
        }
    }
    if (priorities != NULL && !isfinite(raise_to(largest, t->alpha))) {
        char text[64];
        snprintf(text, sizeof text, "priority %g raised to alpha=%g overflows", largest, t->alpha);
        PyErr_SetString(PyExc_ValueError, text);
        return -1;
    }
    *batch_max = largest;
    return 0;
}

/* Apply an update that tree_check accepted. */
static void tree_write(SumTree *t, const void *indices, int indices_wide, const void *priorities, int priorities_wide,
                       Py_ssize_t n, double batch_max) {
    double alpha = t->alpha;
    double *leaves = t->level[0];
    double default_value = raise_to(t->max_priority, alpha);
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = default_value;
        if (priorities != NULL) {
            double p = priority_at(priorities, priorities_wide, i);
            v = alpha == 1.0 ? p : raise_to(p, alpha);
        }
        Py_ssize_t index = index_at(indices, indices_wide, i);
        double *slot = sum_slot(leaves, index);
        slot[0] = v;
        slot[K] = v > 0.0 ? v : INFINITY;
        prefetch_slot(t, 1, index >> TREE_SHIFT);
    }
    if (batch_max > t->max_priority)
        t->max_priority = batch_max;
    refresh_ancestors(t, indices, indices_wide, n);
}

PyDoc_STRVAR(update_doc,
"update(indices, priorities, size)\n--\n\n"
"Set the leaves at `indices` to priorities**alpha (priorities None: the largest priority seen so far)\n"
"and fix their ancestors. Indices must lie in [0, size). When an index repeats, the last one wins.\n"
"Everything is validated before anything is written: an error leaves the tree unchanged.\n"
"Returns the number of items written.");

static PyObject *SumTree_update(SumTree *self, PyObject *const *args, Py_ssize_t nargs) {
    if (not_ready(self))
        return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "update(indices, priorities, size) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[2]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0 || size > self->capacity) {
        PyErr_Format(PyExc_ValueError, "size %zd outside [0, %zd]", size, self->capacity);
        return NULL;
    }
    Py_buffer idx, pri;
    int idx_wide, pri_wide = 1;
    Py_ssize_t n = index_buffer(args[0], &idx, &idx_wide);
    if (n < 0)
        return NULL;
    int have_priorities = args[1] != Py_None;
    if (have_priorities) {
        Py_ssize_t m = priority_buffer(args[1], &pri, &pri_wide);
        if (m < 0) {
            PyBuffer_Release(&idx);
            return NULL;
        }
        if (m != n) {
            PyErr_Format(PyExc_ValueError, "got %zd indices but %zd priorities", n, m);
            goto fail;
        }
    }
    const void *priorities = have_priorities ? pri.buf : NULL;
    double batch_max;
    if (tree_check(self, idx.buf, idx_wide, priorities, pri_wide, n, size, &batch_max) < 0)
        goto fail;
    tree_write(self, idx.buf, idx_wide, priorities, pri_wide, n, batch_max);
    PyBuffer_Release(&idx);
    if (have_priorities)
        PyBuffer_Release(&pri);
    return PyLong_FromSsize_t(n);
fail:
    PyBuffer_Release(&idx);
    if (have_priorities)
        PyBuffer_Release(&pri);
    return NULL;
}

/* ---- sample ---------------------------------------------------------------------------------- */

/* Pick the child of one block holding offset *u (branch-free scan of the prefix sums), subtract
 * the mass before it, and return its slot. A zero child is never picked: when rounding pushes *u
 * past the block's mass, the last non-zero child is taken instead. */
static inline int descend(const double *block, double *u) {
    double prefix = 0.0, before = 0.0;
    int j = 0;
    for (int k = 0; k < K - 1; k++) {
        prefix += block[k];
        int passed = prefix <= *u;
        j += passed;
        before = passed ? prefix : before;
    }
    *u -= before;
    if (block[j] == 0.0) {
        while (j > 0 && block[j] == 0.0)
            j--;
        *u = block[j];
    }
    return j;
}

/* Whether the tree can be sampled; a ValueError and -1 when not. */
static int tree_can_draw(SumTree *t) {
    const double total = t->level[t->levels - 1][0];
    if (!(total > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "cannot sample: every stored priority is zero");
        return -1;
    }
    if (!isfinite(total)) {
        PyErr_SetString(PyExc_ValueError, "cannot sample: the sum of priorities**alpha overflows; use smaller priorities");
        return -1;
    }
    return 0;
}

/* Stratified draw of n leaves (the tree passed tree_can_draw). */
static void tree_draw(SumTree *t, const double *r, Py_ssize_t n, double beta, int64_t *indices, float *weights) {
    const int top = t->levels - 1;
    const double total = t->level[top][0];
    const double p_min = t->level[top][K];
    const double segment = total / (double)n;
    Py_ssize_t node[CHUNK];
    double u[CHUNK], leaf_value[CHUNK];
    for (Py_ssize_t start = 0; start < n; start += CHUNK) {
        Py_ssize_t m = n - start < CHUNK ? n - start : CHUNK;
        for (Py_ssize_t q = 0; q < m; q++) {
            u[q] = ((double)(start + q) + r[start + q]) * segment;
            node[q] = 0;
            leaf_value[q] = total; /* stays so only when the root is the only leaf (capacity 1) */
        }
        for (int l = top - 1; l >= 0; l--) {
            const double *lvl = t->level[l];
            const double *below = l > 0 ? t->level[l - 1] : NULL;
            for (Py_ssize_t q = 0; q < m; q++) {
                const double *block = lvl + node[q] * BLOCK;
                int j = descend(block, &u[q]);
                node[q] = node[q] * K + j;
                if (below)
                    __builtin_prefetch(below + node[q] * BLOCK);
                else
                    leaf_value[q] = block[j];
            }
        }
        for (Py_ssize_t q = 0; q < m; q++) {
            indices[start + q] = node[q];
            weights[start + q] = beta == 0.0 ? 1.0f : (float)raise_to(leaf_value[q] / p_min, -beta);
        }
    }
}

PyDoc_STRVAR(sample_doc,
"sample(uniforms, beta, out_indices, out_weights)\n--\n\n"
"Stratified proportional sampling: item i of n falls in segment [i, i+1) * total / n at offset\n"
"uniforms[i] (float64 in [0, 1)). Writes the leaf indices (int64) and the importance weights\n"
"(float32) (p_i / p_min) ** -beta, which equal (N P(i))**-beta / max_j (N P(j))**-beta.");

static PyObject *SumTree_sample(SumTree *self, PyObject *const *args, Py_ssize_t nargs) {
    if (not_ready(self))
        return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "sample(uniforms, beta, out_indices, out_weights) takes 4 arguments");
        return NULL;
    }
    double beta = PyFloat_AsDouble(args[1]);
    if (beta == -1.0 && PyErr_Occurred())
        return NULL;
    Py_buffer uni, out_idx, out_w;
    if (get_buffer(args[0], &uni, "uniforms", 0) < 0)
        return NULL;
    if (get_buffer(args[2], &out_idx, "out_indices", 1) < 0) {
        PyBuffer_Release(&uni);
        return NULL;
    }
    if (get_buffer(args[3], &out_w, "out_weights", 1) < 0) {
        PyBuffer_Release(&uni);
        PyBuffer_Release(&out_idx);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = uni.len / (Py_ssize_t)sizeof(double);
    if (format_code(&uni) != 'd' || format_code(&out_w) != 'f' || out_idx.itemsize != 8 ||
        !(format_code(&out_idx) == 'l' || format_code(&out_idx) == 'q')) {
        PyErr_SetString(PyExc_TypeError, "sample needs float64 uniforms, int64 out_indices, float32 out_weights");
        goto done;
    }
    if (out_idx.len / 8 != n || out_w.len / 4 != n) {
        PyErr_Format(PyExc_ValueError, "got %zd uniforms but %zd out_indices and %zd out_weights", n,
                     out_idx.len / 8, out_w.len / 4);
        goto done;
    }
    if (tree_can_draw(self) < 0)
        goto done;
    tree_draw(self, uni.buf, n, beta, out_idx.buf, out_w.buf);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&uni);
    PyBuffer_Release(&out_idx);
    PyBuffer_Release(&out_w);
    return result;
}

/* ---- reading --------------------------------------------------------------------------------- */

PyDoc_STRVAR(get_doc, "get(indices, out)\n--\n\nWrite the stored priorities**alpha at `indices` into `out` (float64).");

static PyObject *SumTree_get(SumTree *self, PyObject *const *args, Py_ssize_t nargs) {
    if (not_ready(self))
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get(indices, out) takes 2 arguments");
        return NULL;
    }
    Py_buffer idx, out;
    int wide;
    Py_ssize_t n = index_buffer(args[0], &idx, &wide);
    if (n < 0)
        return NULL;
    if (get_buffer(args[1], &out, "out", 1) < 0) {
        PyBuffer_Release(&idx);
        return NULL;
    }
    PyObject *result = NULL;
    if (format_code(&out) != 'd' || out.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "out must be float64 with %zd elements", n);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t index = index_at(idx.buf, wide, i);
        if (index < 0 || index >= self->capacity) {
            PyErr_Format(PyExc_ValueError, "index %zd out of range for capacity %zd", index, self->capacity);
            goto done;
        }
        ((double *)out.buf)[i] = *sum_slot(self->level[0], index);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&idx);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *SumTree_total(SumTree *self, void *closure) {
    if (not_ready(self))
        return NULL;
    return PyFloat_FromDouble(self->level[self->levels - 1][0]);
}

static PyObject *SumTree_min(SumTree *self, void *closure) {
    if (not_ready(self))
        return NULL;
    return PyFloat_FromDouble(self->level[self->levels - 1][K]);
}

static PyObject *SumTree_max_priority(SumTree *self, void *closure) {
    return PyFloat_FromDouble(self->max_priority);
}

static PyObject *SumTree_alpha(SumTree *self, void *closure) {
    return PyFloat_FromDouble(self->alpha);
}

static PyObject *SumTree_capacity(SumTree *self, void *closure) {
    return PyLong_FromSsize_t(self->capacity);
}

static PyMethodDef SumTree_methods[] = {
    {"update", (PyCFunction)(void (*)(void))SumTree_update, METH_FASTCALL, update_doc},
    {"sample", (PyCFunction)(void (*)(void))SumTree_sample, METH_FASTCALL, sample_doc},
    {"get", (PyCFunction)(void (*)(void))SumTree_get, METH_FASTCALL, get_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SumTree_getset[] = {
    {"total", (getter)SumTree_total, NULL, "sum of priorities**alpha", NULL},
    {"min", (getter)SumTree_min, NULL, "smallest non-zero priority**alpha (inf when none)", NULL},
    {"max_priority", (getter)SumTree_max_priority, NULL, "largest raw priority seen (starts at 1.0)", NULL},
    {"alpha", (getter)SumTree_alpha, NULL, "priority exponent", NULL},
    {"capacity", (getter)SumTree_capacity, NULL, "number of leaves", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SumTreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlbench._sumtree.SumTree",
    .tp_basicsize = sizeof(SumTree),
    .tp_dealloc = (destructor)SumTree_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("SumTree(capacity, alpha): K-ary sum/min tree over priorities**alpha."),
    .tp_methods = SumTree_methods,
    .tp_getset = SumTree_getset,
    .tp_init = (initproc)SumTree_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef sumtree_module = {
    PyModuleDef_HEAD_INIT, "_sumtree", "Sum/min tree for proportional prioritized replay.", -1, NULL,
};

PyMODINIT_FUNC PyInit__sumtree(void) {
    if (PyType_Ready(&SumTreeType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&sumtree_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&SumTreeType);
    if (PyModule_AddObject(module, "SumTree", (PyObject *)&SumTreeType) < 0) {
        Py_DECREF(&SumTreeType);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "ARITY", K) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    static SumTreeAPI api;
    api = (SumTreeAPI){&SumTreeType, tree_check, tree_write, tree_can_draw, tree_draw};
    PyObject *capsule = PyCapsule_New(&api, SUMTREE_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(module, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

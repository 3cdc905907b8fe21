/* The sum tree's C interface: implemented by rlbench._sumtree (sumtree.c), called by the replay
 * node's fast path (rlbench._wire, wire.c) through the capsule SUMTREE_CAPSULE, so both paths run
 * the same update and sampling code on the same tree object.
 *
 * Indices are int64 (wide = 1) or int32; priorities float64 (wide = 1) or float32, or NULL for "the
 * largest priority seen so far". `check` validates without writing (a ValueError and -1 when
 * something is wrong); `write` then applies what `check` accepted. */
#ifndef RLBENCH_SUMTREE_H
#define RLBENCH_SUMTREE_H

#include <Python.h>
#include <stdint.h>

#define SUMTREE_CAPSULE "rlbench._sumtree._C_API"

typedef struct SumTree SumTree;

typedef struct {
    PyTypeObject *type; /* what a tree object must be */
    int (*check)(SumTree *tree, const void *indices, int indices_wide, const void *priorities, int priorities_wide,
                 Py_ssize_t n, Py_ssize_t size, double *batch_max);
    void (*write)(SumTree *tree, const void *indices, int indices_wide, const void *priorities, int priorities_wide,
                  Py_ssize_t n, double batch_max);
    /* 0 when the tree can be sampled; else a ValueError and -1 (every priority zero, or an overflow) */
    int (*can_draw)(SumTree *tree);
    /* stratified draw of n leaves: uniforms[i] in [0, 1); writes indices and importance weights */
    void (*draw)(SumTree *tree, const double *uniforms, Py_ssize_t n, double beta, int64_t *indices, float *weights);
} SumTreeAPI;

#endif

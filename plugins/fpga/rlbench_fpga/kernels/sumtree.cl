// PEARL-style K-ary sum tree for proportional prioritized replay, written as FPGA kernels.
//
// Defined by the host: FANOUT (K), DEPTH (D), WORDS (32-bit words per stored transition),
// LEVEL_OFFSETS ({offset of level 0, ..., level D}; level l holds K**l nodes, leaves are level D;
// each level starts on a 64-byte boundary so a node's children share cache lines), and PREFETCH(p)
// (a cache prefetch on CPU devices; nothing elsewhere).
// Two trees: `sum` (priority**alpha, every level) and `least` (the smallest priority**alpha below a
// node, +inf where none is positive) for the internal levels only: a leaf's own minimum is its sum
// value, so updates and inserts touch one leaf array, not two. The roots give the total mass and
// the smallest priority for max-normalised importance weights.
//
// Every kernel is a single work-item (a loop the FPGA compiler pipelines). Sampling is a pipeline:
// producer (random targets, on the device) -> one stage per tree level -> consumer (importance
// weight and row gather). With cl_intel_channels the stages are separate kernels joined by channels
// and run concurrently (FPGA emulator or board); elsewhere one kernel runs the same stage functions
// stage after stage over the batch, the channel FIFOs replaced by global memory (the output buffer).
// Batch loops walk one tree level for every item before the next level: the items are independent,
// so a CPU overlaps their cache misses (helped by PREFETCH a few items ahead) and an FPGA pipelines them.

#ifdef cl_intel_channels
#pragma OPENCL EXTENSION cl_intel_channels : enable
#define TASK __attribute__((max_global_work_dim(0))) __attribute__((reqd_work_group_size(1, 1, 1)))
#else
#define TASK __attribute__((reqd_work_group_size(1, 1, 1)))
#endif

__constant int level_offset[DEPTH + 1] = LEVEL_OFFSETS;
#define LEAF_OFFSET (level_offset[DEPTH])

// Sample output, one buffer so one read brings everything back:
// [status][B indices][B weights][B * WORDS row words]. status 1: the memory holds no mass.
#define OUT_INDEX(B) 1
#define OUT_WEIGHT(B) (1 + (B))
#define OUT_ROWS(B) (1 + 2 * (B))

inline uint mix32(uint x) {  // lowbias32 integer hash (counter-based randomness)
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

inline float leaf_value(float priority, float alpha) {
    return priority > 0.0f ? exp2(alpha * log2(priority)) : 0.0f;  // zero stays zero: never sampled
}

#ifndef PREFETCH
#define PREFETCH(p)
#endif
#define PREFETCH_AHEAD 8  // items ahead of the one being processed

// Recompute one node at `level` (< DEPTH) from its K children; below the last internal level the
// children's minimum comes from the sum leaves themselves. The sum adds the children in order (the
// sampler's running sum repeats these additions exactly); the minimum, exact in any order, runs in
// MIN_LANES independent chains so the two chains do not serialise.
#define MIN_LANES 4
inline void refresh_node(__global float *restrict sum, __global float *restrict least, int level, int node) {
    int first = level_offset[level + 1] + node * FANOUT;
    float s = 0.0f, m[MIN_LANES];
    #pragma unroll
    for (int lane = 0; lane < MIN_LANES; lane++) m[lane] = INFINITY;
    if (level == DEPTH - 1) {
        #pragma unroll
        for (int c = 0; c < FANOUT; c++) {
            float v = sum[first + c];
            s += v;
            m[c % MIN_LANES] = fmin(m[c % MIN_LANES], v > 0.0f ? v : INFINITY);
        }
    } else {
        #pragma unroll
        for (int c = 0; c < FANOUT; c++) {
            s += sum[first + c];
            m[c % MIN_LANES] = fmin(m[c % MIN_LANES], least[first + c]);
        }
    }
    float smallest = m[0];
    #pragma unroll
    for (int lane = 1; lane < MIN_LANES; lane++) smallest = fmin(smallest, m[lane]);
    sum[level_offset[level] + node] = s;
    least[level_offset[level] + node] = smallest;
}

// Recompute the ancestors of leaves [lo, hi], level by level up to the root.
inline void refresh_range(__global float *restrict sum, __global float *restrict least, int lo, int hi) {
    for (int level = DEPTH - 1; level >= 0; level--) {
        lo /= FANOUT;
        hi /= FANOUT;
        for (int node = lo; node <= hi; node++) refresh_node(sum, least, level, node);
    }
}

// Insert n rows at ring slots start, start+1, ... (mod capacity), n <= capacity.
// staging: [n * WORDS row words][n raw priorities as float]
TASK __kernel void sumtree_insert(__global const uint *restrict staging, __global uint *restrict rows,
                                  __global float *restrict sum, __global float *restrict least,
                                  int start, int n, int capacity, float alpha) {
    __global const float *priorities = (__global const float *)(staging + n * WORDS);
    for (int k = 0; k < n; k++) {
        int slot = start + k < capacity ? start + k : start + k - capacity;
        #pragma unroll
        for (int w = 0; w < WORDS; w++) rows[slot * WORDS + w] = staging[k * WORDS + w];
        sum[LEAF_OFFSET + slot] = leaf_value(priorities[k], alpha);
    }
    int end = start + n - 1;
    if (end < capacity) {
        refresh_range(sum, least, start, end);
    } else {
        refresh_range(sum, least, start, capacity - 1);
        refresh_range(sum, least, 0, end - capacity);
    }
}

// Set n priorities; a slot named twice ends with the last priority given (deterministic, as a
// sequential loop would leave it). The leaves are written in the order given, then each level's
// touched nodes are recomputed from their (final) children, bottom up: the same values, bit for bit,
// as refreshing each leaf's path after each write, with independent work at every level.
// staging: [n slot indices as int][n raw priorities as float]
inline void apply_updates(__global const int *restrict staging, __global float *restrict sum,
                          __global float *restrict least, int n, float alpha) {
    __global const float *priorities = (__global const float *)(staging + n);
    for (int k = 0; k < n; k++) PREFETCH(sum + LEAF_OFFSET + staging[k]);
    for (int k = 0; k < n; k++) sum[LEAF_OFFSET + staging[k]] = leaf_value(priorities[k], alpha);
    int span = 1;  // leaves below one node of the level being refreshed, divided by FANOUT
    for (int level = DEPTH - 1; level >= 0; level--) {
        span *= FANOUT;
        int previous = -1;
        for (int k = 0; k < n; k++) {
            if (k + PREFETCH_AHEAD < n) {  // the nodes written: their children were written just before
                int ahead = level_offset[level] + staging[k + PREFETCH_AHEAD] / span;
                PREFETCH(sum + ahead);
                PREFETCH(least + ahead);
            }
            int node = staging[k] / span;
            if (node != previous) refresh_node(sum, least, level, node);  // a repeat would write the same values
            previous = node;
        }
    }
}

TASK __kernel void sumtree_update(__global const int *restrict staging, __global float *restrict sum,
                                  __global float *restrict least, int n, float alpha) {
    apply_updates(staging, sum, least, n, alpha);
}

// -- sampling stages, shared by both assemblies ------------------------------------------------------
// Stratified: item i's target lies in the i-th of B equal segments of the total mass.
inline float stage_target(int i, int batch, float total, uint key_a, uint key_b) {
    uint bits = mix32(mix32((uint)i * 0x9E3779B9U + key_a) ^ key_b);
    float r = (float)(bits >> 8) * (1.0f / 16777216.0f);
    return ((float)i + r) * (total / (float)batch);
}

// One tree level: pick the first child whose running sum of mass exceeds u (local node index at
// `level`). The running sum is the only dependency chain; the comparisons hang off it, so a CPU
// overlaps them and an FPGA compares all K in parallel. Its last value equals the node's own sum
// bit for bit (the same additions in the same order), so u stays inside the chosen child's mass.
inline int stage_descend(__global const float *restrict sum, int level, int node, float *u) {
    int first = level_offset[level + 1] + node * FANOUT;
    int pick = 0, last_with_mass = 0;
    float target = *u, running = 0.0f, below = 0.0f;
    #pragma unroll
    for (int c = 0; c < FANOUT; c++) {
        float v = sum[first + c];
        running += v;
        if (running <= target) {  // all of child c lies below the target
            pick = c + 1;
            below = running;
        }
        if (v > 0.0f) last_with_mass = c;
    }
    float rest = target - below;
    if (pick == FANOUT) {  // float rounding ran past the last child: take the last one that has mass
        pick = last_with_mass;
        rest = sum[first + pick] * 0.999999f;
    }
    *u = rest;
    return node * FANOUT + pick;
}

inline void stage_consume(__global const float *restrict sum, __global const uint *restrict rows,
                          __global uint *restrict out, int i, int batch, int leaf, float least_mass, float beta) {
    out[OUT_INDEX(batch) + i] = (uint)leaf;
    float w = exp2(-beta * log2(sum[LEAF_OFFSET + leaf] / least_mass));  // (N P(i))^-beta / max_j (N P(j))^-beta
    ((__global float *)out)[OUT_WEIGHT(batch) + i] = w;
    #pragma unroll
    for (int w_ = 0; w_ < WORDS; w_++) out[OUT_ROWS(batch) + i * WORDS + w_] = rows[leaf * WORDS + w_];
}

#ifndef cl_intel_channels
// Global-memory assembly: the stages run one after another over the whole batch; the index and
// weight slots of `out` carry (node, remaining mass) from stage to stage. A priority update the host
// staged since the last launch is applied first (one launch instead of two, same order of effects).
TASK __kernel void sumtree_sample(__global float *restrict sum, __global float *restrict least,
                                  __global const uint *restrict rows, __global uint *restrict out,
                                  int batch, uint key_a, uint key_b, float beta,
                                  __global const int *restrict pending, int pending_n, float alpha) {
    apply_updates(pending, sum, least, pending_n, alpha);
    float total = sum[0], least_mass = least[0];
    out[0] = total > 0.0f ? 0u : 1u;
    if (!(total > 0.0f)) return;
    __global int *node = (__global int *)(out + OUT_INDEX(batch));
    __global float *mass = (__global float *)(out + OUT_WEIGHT(batch));
    for (int i = 0; i < batch; i++) {
        node[i] = 0;
        mass[i] = stage_target(i, batch, total, key_a, key_b);
    }
    for (int level = 0; level < DEPTH; level++) {
        for (int i = 0; i < batch; i++) {
            if (i + PREFETCH_AHEAD < batch) PREFETCH(sum + level_offset[level + 1] + node[i + PREFETCH_AHEAD] * FANOUT);
            float u = mass[i];
            node[i] = stage_descend(sum, level, node[i], &u);
            mass[i] = u;
        }
    }
    for (int i = 0; i < batch; i++) {
        if (i + PREFETCH_AHEAD < batch) PREFETCH(rows + node[i + PREFETCH_AHEAD] * WORDS);
        stage_consume(sum, rows, out, i, batch, node[i], least_mass, beta);
    }
}
#else
// Channel assembly: producer -> DEPTH level kernels -> consumer, each a concurrent single work-item.
typedef struct { int node; float mass; } walk_t;
channel walk_t level_channel[DEPTH + 1] __attribute__((depth(64)));

TASK __kernel void sumtree_sample_producer(__global const float *restrict sum, int batch, uint key_a, uint key_b) {
    float total = sum[0];
    for (int i = 0; i < batch; i++) {
        walk_t walk = {0, total > 0.0f ? stage_target(i, batch, total, key_a, key_b) : 0.0f};
        write_channel_intel(level_channel[0], walk);
    }
}

#define LEVEL_STAGE(L)                                                                                   \
    TASK __kernel void sumtree_sample_level_##L(__global const float *restrict sum, int batch) {         \
        for (int i = 0; i < batch; i++) {                                                                \
            walk_t walk = read_channel_intel(level_channel[L]);                                          \
            walk.node = stage_descend(sum, L, walk.node, &walk.mass);                                    \
            write_channel_intel(level_channel[L + 1], walk);                                             \
        }                                                                                                \
    }
LEVEL_STAGES  // the host defines LEVEL_STAGES as LEVEL_STAGE(0) ... LEVEL_STAGE(DEPTH - 1)

TASK __kernel void sumtree_sample_consumer(__global const float *restrict sum, __global const float *restrict least,
                                           __global const uint *restrict rows, __global uint *restrict out,
                                           int batch, float beta) {
    float total = sum[0], least_mass = least[0];
    out[0] = total > 0.0f ? 0u : 1u;
    for (int i = 0; i < batch; i++) {
        walk_t walk = read_channel_intel(level_channel[DEPTH]);
        if (total > 0.0f) stage_consume(sum, rows, out, i, batch, walk.node, least_mass, beta);
    }
}
#endif

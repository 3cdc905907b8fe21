/* rlbench._frames: a store of frames kept once each, behind the replay memories that store image
 * observations (`frames=k`, rlbench.kit.frames).
 *
 * A FrameStore holds up to `slots` frames of `frame_bytes` bytes each in one allocation, with a
 * reference count per slot, a stack of free slots and an index from each stored frame's 64-bit
 * fingerprint to its slot. `store` looks every given frame up by fingerprint and shares a stored
 * one only when the bytes compare equal (memcmp), so what is read back is always exactly what was
 * given, whatever the input (a fingerprint that collides just means the frame is stored again);
 * otherwise the frame is copied into a free slot. Each frame given counts one reference; `release`
 * drops references, and a slot with none left goes back to the free stack and leaves the index.
 *
 * The index is open addressing with linear probing over a power-of-two table of at least twice the
 * slots (load <= 1/2), deletion by backward shift (no tombstones, so a long run of adds and
 * evictions never slows lookups down). Free slots are popped lowest first from a fresh store and
 * reused last-freed first, so the pages touched stay those of the most frames ever alive at once.
 * The frames' block is mmap'd in transparent huge pages (see block_map).
 *
 * The fingerprint (rlbench.kit.frames.fingerprints documents it as numpy arithmetic): the frame read
 * as little-endian uint64 words w_i (the last one zero-padded), s = sum_i w_i * (2i+1) * G mod 2**64
 * with G = 0x9E3779B97F4A7C15, finished by murmur3's 64-bit mixer (a bijection). Two frames that
 * differ in one word always differ in s (each multiplier is odd). Four independent sums keep the
 * multiplier pipeline full: ~0.3 us for an 84x84 frame.
 *
 * `store` stops at the first frame that needs a slot when none is free and returns how many it
 * handled; the caller grows the store (`grow`: the block is remapped, its bytes are not copied) and
 * calls again with the rest. Arrays come in through the buffer protocol, C-contiguous.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EMPTY (-1)
#define HUGE_PAGE ((size_t)2 << 20)
#define GOLDEN 0x9E3779B97F4A7C15ULL

typedef struct {
    PyObject_HEAD
    Py_ssize_t frame_bytes;
    Py_ssize_t slots;
    Py_ssize_t live; /* slots holding a frame (references > 0) */
    uint8_t *frames; /* slots * frame_bytes, in a block of block_bytes */
    size_t block_bytes;
    int32_t *refs;
    uint64_t *fingerprints;
    int32_t *free_slots; /* a stack: the next slot given out is free_slots[free_count - 1] */
    Py_ssize_t free_count;
    int32_t *table;
    size_t table_mask;
    long long written;    /* frames copied in */
    long long shared;     /* frames given that were found stored */
    long long collisions; /* equal fingerprints of different bytes */
} FrameStore;

/* ---- the fingerprint ------------------------------------------------------------------------ */
static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t fingerprint(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t words = n / 8;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint64_t m = GOLDEN; /* (2i+1) * G for word i */
    const uint64_t step = 2 * GOLDEN, step4 = 8 * GOLDEN;
    Py_ssize_t i = 0;
    uint64_t m0 = m, m1 = m + step, m2 = m + 2 * step, m3 = m + 3 * step;
    for (; i + 4 <= words; i += 4) {
        uint64_t w[4];
        memcpy(w, p + 8 * i, 32);
        s0 += w[0] * m0;
        s1 += w[1] * m1;
        s2 += w[2] * m2;
        s3 += w[3] * m3;
        m0 += step4;
        m1 += step4;
        m2 += step4;
        m3 += step4;
    }
    m = m0;
    for (; i < words; i++, m += step) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        s0 += w * m;
    }
    if (n % 8) {
        uint64_t w = 0;
        memcpy(&w, p + 8 * words, (size_t)(n % 8));
        s0 += w * m;
    }
    return mix64(s0 + s1 + s2 + s3);
}

/* ---- buffers -------------------------------------------------------------------------------- */
static char format_code(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return f[1] == '\0' ? f[0] : '?';
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *what, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s array", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* An int32 buffer; returns its element count or -1. */
static Py_ssize_t int32_buffer(PyObject *obj, Py_buffer *view, const char *what, int writable) {
    if (get_buffer(obj, view, what, writable) < 0)
        return -1;
    char code = format_code(view);
    if (view->itemsize != 4 || !(code == 'i' || code == 'l')) {
        PyErr_Format(PyExc_TypeError, "%s must be int32, got format '%s'", what, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / 4;
}

/* Frames: any contiguous buffer whose length is a whole number of frames; returns the frame count or -1. */
static Py_ssize_t frame_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t frame_bytes, int writable) {
    if (get_buffer(obj, view, writable ? "out" : "frames", writable) < 0)
        return -1;
    if (view->len % frame_bytes) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not a whole number of %zd-byte frames", view->len, frame_bytes);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / frame_bytes;
}

/* ---- the frames' block: mmap'd, in transparent huge pages where the kernel gives them ------------ */
/* Sampling reads frames scattered over gigabytes: with 4 KiB pages nearly every frame costs TLB misses
 * (page walks through megabytes of page tables); 2 MiB pages remove most of them. Pages are still
 * touched only when used. */
static size_t block_bytes(Py_ssize_t slots, Py_ssize_t frame_bytes) {
    size_t bytes = (size_t)slots * (size_t)frame_bytes;
    return (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

static uint8_t *block_map(size_t bytes) {
    void *block = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(block, bytes, MADV_HUGEPAGE);
#endif
    return block;
}

static uint8_t *block_remap(uint8_t *block, size_t old_bytes, size_t bytes) {
    void *moved = mremap(block, old_bytes, bytes, MREMAP_MAYMOVE); /* pages move, bytes are not copied */
    if (moved == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(moved, bytes, MADV_HUGEPAGE);
#endif
    return moved;
}

/* ---- the store ------------------------------------------------------------------------------ */
static void store_free(FrameStore *s) {
    if (s->frames != NULL)
        munmap(s->frames, s->block_bytes);
    free(s->refs);
    free(s->fingerprints);
    free(s->free_slots);
    free(s->table);
    s->frames = NULL;
    s->refs = NULL;
    s->fingerprints = NULL;
    s->free_slots = NULL;
    s->table = NULL;
    s->slots = s->live = s->free_count = 0;
}

static void FrameStore_dealloc(FrameStore *self) {
    store_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static size_t table_size_for(Py_ssize_t slots) {
    size_t size = 16;
    while (size < 2 * (size_t)slots)
        size <<= 1;
    return size;
}

/* A new table for the live slots (after growth or a load). */
static int rebuild_table(FrameStore *s, size_t size) {
    int32_t *table = malloc(size * sizeof(int32_t));
    if (table == NULL)
        return -1;
    memset(table, 0xFF, size * sizeof(int32_t)); /* EMPTY everywhere */
    size_t mask = size - 1;
    for (Py_ssize_t slot = 0; slot < s->slots; slot++) {
        if (s->refs[slot] <= 0)
            continue;
        size_t b = s->fingerprints[slot] & mask;
        while (table[b] != EMPTY)
            b = (b + 1) & mask;
        table[b] = (int32_t)slot;
    }
    free(s->table);
    s->table = table;
    s->table_mask = mask;
    return 0;
}

/* Free slots from `first` to slots - 1, pushed so that the lowest is given out first. */
static void push_free_range(FrameStore *s, Py_ssize_t first) {
    for (Py_ssize_t slot = s->slots - 1; slot >= first; slot--)
        if (s->refs[slot] <= 0)
            s->free_slots[s->free_count++] = (int32_t)slot;
}

static int check_slots(Py_ssize_t slots) {
    if (slots < 1 || slots > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "slots must lie in [1, %d], got %zd", INT32_MAX, slots);
        return -1;
    }
    return 0;
}

static int FrameStore_init(FrameStore *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"frame_bytes", "slots", NULL};
    Py_ssize_t frame_bytes, slots;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nn", keywords, &frame_bytes, &slots))
        return -1;
    if (frame_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "frame_bytes must be at least 1, got %zd", frame_bytes);
        return -1;
    }
    if (check_slots(slots) < 0)
        return -1;
    store_free(self);
    self->frame_bytes = frame_bytes;
    self->block_bytes = block_bytes(slots, frame_bytes);
    self->frames = block_map(self->block_bytes);
    self->refs = calloc((size_t)slots, sizeof(int32_t));
    self->fingerprints = malloc((size_t)slots * sizeof(uint64_t));
    self->free_slots = malloc((size_t)slots * sizeof(int32_t));
    if (!self->frames || !self->refs || !self->fingerprints || !self->free_slots) {
        store_free(self);
        PyErr_NoMemory();
        return -1;
    }
    self->slots = slots;
    push_free_range(self, 0);
    if (rebuild_table(self, table_size_for(slots)) < 0) {
        store_free(self);
        PyErr_NoMemory();
        return -1;
    }
    self->written = self->shared = self->collisions = 0;
    return 0;
}

static int not_ready(FrameStore *s) {
    if (s->table != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "FrameStore was not initialised: call FrameStore(frame_bytes, slots)");
    return 1;
}

/* Remove `slot` from the index (backward-shift deletion: every entry stays reachable from its home). */
static void unindex(FrameStore *s, int32_t slot) {
    size_t mask = s->table_mask;
    size_t i = s->fingerprints[slot] & mask;
    while (s->table[i] != slot)
        i = (i + 1) & mask;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        int32_t entry = s->table[j];
        if (entry == EMPTY)
            break;
        size_t home = s->fingerprints[entry] & mask;
        /* entry may move to the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->table[i] = entry;
            i = j;
        }
    }
    s->table[i] = EMPTY;
}

/* Drop one reference to a stored frame (the caller checked it is stored). */
static inline void drop(FrameStore *s, int32_t slot) {
    if (--s->refs[slot] == 0) {
        unindex(s, slot);
        s->free_slots[s->free_count++] = slot;
        s->live--;
    }
}

static const char store_doc[] =
    "store(frames, out[, fresh]) -> int: look up each frame (a contiguous buffer of whole frames), share a\n"
    "stored one whose bytes are equal or copy it into a free slot; out (int32) gets each frame's slot and\n"
    "every frame counts one reference; fresh (bool, optional) says which frames were copied in. Returns\n"
    "the frames handled: fewer than given when no slot was free (grow, then store the rest).";

static PyObject *FrameStore_store(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "store(frames, out[, fresh]) takes 2 or 3 arguments");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_buffer frames, out, fresh_view = {0};
    Py_ssize_t n = frame_buffer(args[0], &frames, self->frame_bytes, 0);
    if (n < 0)
        return NULL;
    Py_ssize_t room = int32_buffer(args[1], &out, "out", 1);
    if (room < 0) {
        PyBuffer_Release(&frames);
        return NULL;
    }
    if (nargs == 3 && get_buffer(args[2], &fresh_view, "fresh", 1) < 0) {
        PyBuffer_Release(&frames);
        PyBuffer_Release(&out);
        return NULL;
    }
    if (room < n || (nargs == 3 && (fresh_view.itemsize != 1 || fresh_view.len < n))) {
        PyErr_Format(PyExc_ValueError, "out (and fresh: one byte each) must hold an entry for each of the %zd frames", n);
        PyBuffer_Release(&frames);
        PyBuffer_Release(&out);
        if (nargs == 3)
            PyBuffer_Release(&fresh_view);
        return NULL;
    }
    const uint8_t *given = frames.buf;
    int32_t *ids = out.buf;
    uint8_t *fresh = nargs == 3 ? fresh_view.buf : NULL;
    const Py_ssize_t bytes = self->frame_bytes;
    const size_t mask = self->table_mask;
    Py_ssize_t j = 0;
    for (; j < n; j++) {
        const uint8_t *frame = given + j * bytes;
        uint64_t h = fingerprint(frame, bytes);
        size_t b = h & mask;
        int32_t found = EMPTY, slot;
        while ((slot = self->table[b]) != EMPTY) {
            if (self->fingerprints[slot] == h) {
                if (memcmp(self->frames + (size_t)slot * bytes, frame, (size_t)bytes) == 0) {
                    found = slot;
                    break;
                }
                self->collisions++;
            }
            b = (b + 1) & mask;
        }
        if (found != EMPTY) {
            self->refs[found]++;
            self->shared++;
            ids[j] = found;
            if (fresh)
                fresh[j] = 0;
            continue;
        }
        if (self->free_count == 0)
            break;
        slot = self->free_slots[--self->free_count];
        memcpy(self->frames + (size_t)slot * bytes, frame, (size_t)bytes);
        self->fingerprints[slot] = h;
        self->refs[slot] = 1;
        self->table[b] = slot; /* the first empty bucket of this fingerprint's probe run */
        self->live++;
        self->written++;
        ids[j] = slot;
        if (fresh)
            fresh[j] = 1;
    }
    PyBuffer_Release(&frames);
    PyBuffer_Release(&out);
    if (fresh)
        PyBuffer_Release(&fresh_view);
    return PyLong_FromSsize_t(j);
}

/* Every id names a stored frame; a ValueError (nothing changed) otherwise. */
static int check_ids(FrameStore *s, const int32_t *ids, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t slot = ids[i];
        if (slot < 0 || slot >= s->slots || s->refs[slot] <= 0) {
            PyErr_Format(PyExc_ValueError, "frame id %d names no stored frame", (int)slot);
            return -1;
        }
    }
    return 0;
}

static PyObject *change_refs(FrameStore *self, PyObject *const *args, Py_ssize_t nargs, int release) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "takes 1 argument: an int32 array of frame ids");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_buffer view;
    Py_ssize_t n = int32_buffer(args[0], &view, "ids", 0);
    if (n < 0)
        return NULL;
    const int32_t *ids = view.buf;
    if (check_ids(self, ids, n) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (release && n > 1) { /* an id given more often than it has references is refused before any change */
        for (Py_ssize_t i = 0; i < n; i++)
            self->refs[ids[i]]--;
        int under = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            under |= self->refs[ids[i]] < 0;
        for (Py_ssize_t i = 0; i < n; i++)
            self->refs[ids[i]]++;
        if (under) {
            PyErr_SetString(PyExc_ValueError, "release: an id is given more often than its frame is referenced");
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t slot = ids[i];
        if (!release) {
            self->refs[slot]++;
            continue;
        }
        drop(self, slot);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static const char release_doc[] =
    "release(ids): drop one reference per id (int32); a frame left with none frees its slot.";
static PyObject *FrameStore_release(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    return change_refs(self, args, nargs, 1);
}

static const char retain_doc[] = "retain(ids): one more reference per id (int32).";
static PyObject *FrameStore_retain(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    return change_refs(self, args, nargs, 0);
}

static const char gather_doc[] =
    "gather(ids, out): copy the frames named by ids (int32, stored frames only) into out, back to back.";

static PyObject *FrameStore_gather(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gather(ids, out) takes 2 arguments");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_buffer view, out;
    Py_ssize_t n = int32_buffer(args[0], &view, "ids", 0);
    if (n < 0)
        return NULL;
    Py_ssize_t room = frame_buffer(args[1], &out, self->frame_bytes, 1);
    if (room < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const int32_t *ids = view.buf;
    if (room != n) {
        PyErr_Format(PyExc_ValueError, "out holds %zd frames, %zd ids were given", room, n);
    } else if (check_ids(self, ids, n) == 0) {
        const size_t bytes = (size_t)self->frame_bytes;
        uint8_t *dst = out.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + 1 < n)
                __builtin_prefetch(self->frames + (size_t)ids[i + 1] * bytes);
            memcpy(dst + (size_t)i * bytes, self->frames + (size_t)ids[i] * bytes, bytes);
        }
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static const char place_doc[] =
    "place(obs_table, next_table, positions, obs_ids, next_ids, size): a memory's tables of k frame ids per\n"
    "position (int32, positions x k) take the new ids (int32, k per position, each holding the reference\n"
    "`store` gave it) at `positions` (int64, distinct); the ids they held at positions below `size` (the\n"
    "transitions overwritten) are released.";

static PyObject *FrameStore_place(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "place(obs_table, next_table, positions, obs_ids, next_ids, size) takes 6 arguments");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[5]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer views[5];
    int held = 0;
    Py_ssize_t counts[5];
    const char *names[5] = {"obs_table", "next_table", "positions", "obs_ids", "next_ids"};
    for (; held < 5; held++) {
        if (held == 2) {
            if (get_buffer(args[2], &views[2], "positions", 0) < 0)
                break;
            char code = format_code(&views[2]);
            counts[2] = views[2].len / 8;
            if (views[2].itemsize != 8 || !(code == 'l' || code == 'q')) {
                PyErr_Format(PyExc_TypeError, "positions must be int64, got format '%s'", views[2].format);
                PyBuffer_Release(&views[2]);
                break;
            }
        } else if ((counts[held] = int32_buffer(args[held], &views[held], names[held], held < 2)) < 0)
            break;
    }
    Py_ssize_t n = held == 5 ? counts[2] : 0;
    Py_ssize_t k = n > 0 ? counts[3] / n : 0;
    Py_ssize_t positions_held = k > 0 ? counts[0] / k : 0;
    int32_t *obs_table = held == 5 ? views[0].buf : NULL, *next_table = held == 5 ? views[1].buf : NULL;
    const int64_t *positions = held == 5 ? views[2].buf : NULL;
    const int32_t *obs_ids = held == 5 ? views[3].buf : NULL, *next_ids = held == 5 ? views[4].buf : NULL;
    if (held == 5 && n > 0) {
        if (k < 1 || counts[3] != n * k || counts[4] != n * k || counts[1] != counts[0] || counts[0] % k)
            PyErr_SetString(PyExc_ValueError, "place: tables of k ids per position and k new ids per position expected");
        else if (check_ids(self, obs_ids, n * k) == 0 && check_ids(self, next_ids, n * k) == 0)
            for (Py_ssize_t r = 0; r < n; r++)
                if (positions[r] < 0 || positions[r] >= positions_held) {
                    PyErr_Format(PyExc_ValueError, "place: position %lld is outside the tables' %zd",
                                 (long long)positions[r], positions_held);
                    break;
                }
        if (!PyErr_Occurred()) {
            /* Released newest first, so that the oldest frame freed ends on top of the free stack: the
             * next frames stored take the freed slots in the order their frames had, and a stream's
             * frames stay in ascending slots (read_stacks then copies each transition's frames as one
             * run; a descending run reads ~1.4x slower, measured). */
            for (Py_ssize_t r = n - 1; r >= 0; r--) {
                int64_t at = positions[r];
                if (at >= size)
                    continue;
                const int32_t *obs = obs_table + at * k, *next = next_table + at * k;
                for (Py_ssize_t i = k - 1; i >= 0; i--)
                    drop(self, next[i]);
                for (Py_ssize_t i = k - 1; i >= 0; i--)
                    drop(self, obs[i]);
            }
            for (Py_ssize_t r = 0; r < n; r++) {
                memcpy(obs_table + positions[r] * k, obs_ids + r * k, (size_t)k * sizeof(int32_t));
                memcpy(next_table + positions[r] * k, next_ids + r * k, (size_t)k * sizeof(int32_t));
            }
        }
    }
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static const char read_stacks_doc[] =
    "read_stacks(obs_ids, next_ids, indices, out) -> bool: for the transitions at indices (int64) of\n"
    "tables of k frame ids per transition (int32, positions x k), when every next_obs is its obs shifted\n"
    "by one frame, copy each transition's k + 1 frames (its obs, then next_obs's last frame) into out and\n"
    "return True; otherwise write nothing and return False. One call for a sample's stacks.";

static PyObject *FrameStore_read_stacks(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read_stacks(obs_ids, next_ids, indices, out) takes 4 arguments");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_buffer obs_view, next_view, index_view, out;
    Py_ssize_t cells = int32_buffer(args[0], &obs_view, "obs_ids", 0);
    if (cells < 0)
        return NULL;
    if (int32_buffer(args[1], &next_view, "next_ids", 0) != cells) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "obs_ids and next_ids must be tables of the same size");
        PyBuffer_Release(&obs_view);
        return NULL;
    }
    if (get_buffer(args[2], &index_view, "indices", 0) < 0) {
        PyBuffer_Release(&obs_view);
        PyBuffer_Release(&next_view);
        return NULL;
    }
    Py_ssize_t rows = frame_buffer(args[3], &out, self->frame_bytes, 1);
    if (rows < 0) {
        PyBuffer_Release(&obs_view);
        PyBuffer_Release(&next_view);
        PyBuffer_Release(&index_view);
        return NULL;
    }
    const int32_t *obs_ids = obs_view.buf, *next_ids = next_view.buf;
    const int64_t *indices = index_view.buf;
    Py_ssize_t n = index_view.len / 8;
    char code = format_code(&index_view);
    int shifted = 1;
    Py_ssize_t k = n > 0 ? rows / n : 0;
    if (index_view.itemsize != 8 || !(code == 'l' || code == 'q'))
        PyErr_Format(PyExc_TypeError, "indices must be int64, got format '%s'", index_view.format);
    else if (n == 0 || rows % n || k < 2 || cells % (k - 1))
        PyErr_Format(PyExc_ValueError, "out must hold k + 1 frames for each of the %zd indices", n);
    k -= 1; /* frames per stack */
    Py_ssize_t positions = k > 0 ? cells / k : 0;
    for (Py_ssize_t r = 0; r < n && !PyErr_Occurred() && shifted; r++) {
        int64_t at = indices[r];
        if (at < 0 || at >= positions) {
            PyErr_Format(PyExc_ValueError, "index %lld is outside the table of %zd positions", (long long)at, positions);
            break;
        }
        const int32_t *obs = obs_ids + at * k, *next = next_ids + at * k;
        for (Py_ssize_t i = 0; i + 1 < k; i++)
            shifted &= next[i] == obs[i + 1];
        if (check_ids(self, obs, k) < 0 || check_ids(self, next + k - 1, 1) < 0)
            break;
    }
    if (!PyErr_Occurred() && shifted) {
        const size_t bytes = (size_t)self->frame_bytes;
        uint8_t *dst = out.buf;
        for (Py_ssize_t r = 0; r < n; r++) {
            const int32_t *obs = obs_ids + indices[r] * k;
            int32_t last = next_ids[indices[r] * k + k - 1];
            /* a stream's frames sit in consecutive slots: copy runs in one memcpy */
            Py_ssize_t i = 0;
            while (i <= k) {
                int32_t first = i < k ? obs[i] : last;
                Py_ssize_t j = i + 1;
                while (j <= k && (j < k ? obs[j] : last) == first + (int32_t)(j - i))
                    j++;
                memcpy(dst + i * bytes, self->frames + (size_t)first * bytes, (size_t)(j - i) * bytes);
                i = j;
            }
            dst += (k + 1) * bytes;
        }
    }
    PyBuffer_Release(&obs_view);
    PyBuffer_Release(&next_view);
    PyBuffer_Release(&index_view);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(shifted);
}

static const char grow_doc[] = "grow(slots): room for more frames (stored frames and ids stay as they are).";

static PyObject *FrameStore_grow(FrameStore *self, PyObject *arg) {
    if (not_ready(self))
        return NULL;
    Py_ssize_t slots = PyLong_AsSsize_t(arg);
    if (slots == -1 && PyErr_Occurred())
        return NULL;
    if (check_slots(slots) < 0)
        return NULL;
    if (slots <= self->slots) {
        PyErr_Format(PyExc_ValueError, "grow: %zd slots is not more than the %zd held", slots, self->slots);
        return NULL;
    }
    /* Each realloc leaves its block intact when it fails, and `slots` changes last: a failure here
     * leaves larger blocks behind, never an inconsistent store. */
    size_t bytes = block_bytes(slots, self->frame_bytes);
    uint8_t *frames = block_remap(self->frames, self->block_bytes, bytes);
    if (frames == NULL)
        return PyErr_NoMemory();
    self->frames = frames;
    self->block_bytes = bytes;
    int32_t *refs = realloc(self->refs, (size_t)slots * sizeof(int32_t));
    if (refs == NULL)
        return PyErr_NoMemory();
    self->refs = refs;
    uint64_t *fingerprints = realloc(self->fingerprints, (size_t)slots * sizeof(uint64_t));
    if (fingerprints == NULL)
        return PyErr_NoMemory();
    self->fingerprints = fingerprints;
    int32_t *free_slots = realloc(self->free_slots, (size_t)slots * sizeof(int32_t));
    if (free_slots == NULL)
        return PyErr_NoMemory();
    self->free_slots = free_slots;
    size_t table_size = table_size_for(slots);
    if (table_size > self->table_mask + 1 && rebuild_table(self, table_size) < 0) /* (reads the old slots) */
        return PyErr_NoMemory();
    memset(self->refs + self->slots, 0, (size_t)(slots - self->slots) * sizeof(int32_t));
    /* new slots go under the free ones already stacked, so that freed slots are reused first */
    Py_ssize_t added = slots - self->slots;
    memmove(self->free_slots + added, self->free_slots, (size_t)self->free_count * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < added; i++)
        self->free_slots[i] = (int32_t)(slots - 1 - i);
    self->free_count += added;
    self->slots = slots;
    Py_RETURN_NONE;
}

static const char load_doc[] =
    "load(frames, refs): hold exactly these frames (whole frames, back to back) in slots 0..m-1 with these\n"
    "reference counts (int32, each >= 1); every other slot free. What a checkpoint restores.";

static PyObject *FrameStore_load(FrameStore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "load(frames, refs) takes 2 arguments");
        return NULL;
    }
    if (not_ready(self))
        return NULL;
    Py_buffer frames, refs;
    Py_ssize_t m = frame_buffer(args[0], &frames, self->frame_bytes, 0);
    if (m < 0)
        return NULL;
    Py_ssize_t counts = int32_buffer(args[1], &refs, "refs", 0);
    if (counts < 0) {
        PyBuffer_Release(&frames);
        return NULL;
    }
    const int32_t *given = refs.buf;
    if (counts != m)
        PyErr_Format(PyExc_ValueError, "load: %zd frames but %zd reference counts", m, counts);
    else if (m > self->slots)
        PyErr_Format(PyExc_ValueError, "load: %zd frames do not fit %zd slots (grow first)", m, self->slots);
    else
        for (Py_ssize_t i = 0; i < m; i++)
            if (given[i] < 1) {
                PyErr_Format(PyExc_ValueError, "load: frame %zd has %d references (each needs at least one)", i,
                             (int)given[i]);
                break;
            }
    if (PyErr_Occurred()) {
        PyBuffer_Release(&frames);
        PyBuffer_Release(&refs);
        return NULL;
    }
    const size_t bytes = (size_t)self->frame_bytes;
    memcpy(self->frames, frames.buf, (size_t)m * bytes);
    memset(self->refs, 0, (size_t)self->slots * sizeof(int32_t));
    memcpy(self->refs, given, (size_t)m * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < m; i++)
        self->fingerprints[i] = fingerprint(self->frames + (size_t)i * bytes, (Py_ssize_t)bytes);
    PyBuffer_Release(&frames);
    PyBuffer_Release(&refs);
    self->free_count = 0;
    push_free_range(self, m);
    self->live = m;
    /* the same table size: a new one only to clear it */
    if (rebuild_table(self, self->table_mask + 1) < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static const char refcounts_doc[] = "refcounts(out): each slot's reference count into out (int32, one per slot).";

static PyObject *FrameStore_refcounts(FrameStore *self, PyObject *arg) {
    if (not_ready(self))
        return NULL;
    Py_buffer out;
    Py_ssize_t n = int32_buffer(arg, &out, "out", 1);
    if (n < 0)
        return NULL;
    if (n != self->slots)
        PyErr_Format(PyExc_ValueError, "out holds %zd counts, the store has %zd slots", n, self->slots);
    else
        memcpy(out.buf, self->refs, (size_t)n * sizeof(int32_t));
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *get_ssize(Py_ssize_t value) { return PyLong_FromSsize_t(value); }
static PyObject *FrameStore_frame_bytes(FrameStore *s, void *c) { return get_ssize(s->frame_bytes); }
static PyObject *FrameStore_slots(FrameStore *s, void *c) { return get_ssize(s->slots); }
static PyObject *FrameStore_live(FrameStore *s, void *c) { return get_ssize(s->live); }
static PyObject *FrameStore_free(FrameStore *s, void *c) { return get_ssize(s->free_count); }
static PyObject *FrameStore_written(FrameStore *s, void *c) { return PyLong_FromLongLong(s->written); }
static PyObject *FrameStore_shared(FrameStore *s, void *c) { return PyLong_FromLongLong(s->shared); }
static PyObject *FrameStore_collisions(FrameStore *s, void *c) { return PyLong_FromLongLong(s->collisions); }

static PyMethodDef FrameStore_methods[] = {
    {"store", (PyCFunction)(void (*)(void))FrameStore_store, METH_FASTCALL, store_doc},
    {"release", (PyCFunction)(void (*)(void))FrameStore_release, METH_FASTCALL, release_doc},
    {"retain", (PyCFunction)(void (*)(void))FrameStore_retain, METH_FASTCALL, retain_doc},
    {"gather", (PyCFunction)(void (*)(void))FrameStore_gather, METH_FASTCALL, gather_doc},
    {"read_stacks", (PyCFunction)(void (*)(void))FrameStore_read_stacks, METH_FASTCALL, read_stacks_doc},
    {"place", (PyCFunction)(void (*)(void))FrameStore_place, METH_FASTCALL, place_doc},
    {"grow", (PyCFunction)FrameStore_grow, METH_O, grow_doc},
    {"load", (PyCFunction)(void (*)(void))FrameStore_load, METH_FASTCALL, load_doc},
    {"refcounts", (PyCFunction)FrameStore_refcounts, METH_O, refcounts_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FrameStore_getset[] = {
    {"frame_bytes", (getter)FrameStore_frame_bytes, NULL, "bytes of one frame", NULL},
    {"slots", (getter)FrameStore_slots, NULL, "frames the store has room for", NULL},
    {"live", (getter)FrameStore_live, NULL, "frames stored (at least one reference)", NULL},
    {"free", (getter)FrameStore_free, NULL, "slots free", NULL},
    {"written", (getter)FrameStore_written, NULL, "frames copied in by store since creation", NULL},
    {"shared", (getter)FrameStore_shared, NULL, "frames given that were found stored and shared", NULL},
    {"collisions", (getter)FrameStore_collisions, NULL, "equal fingerprints of frames whose bytes differ", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrameStoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlbench._frames.FrameStore",
    .tp_basicsize = sizeof(FrameStore),
    .tp_dealloc = (destructor)FrameStore_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("FrameStore(frame_bytes, slots): frames stored once each, reference counted."),
    .tp_methods = FrameStore_methods,
    .tp_getset = FrameStore_getset,
    .tp_init = (initproc)FrameStore_init,
    .tp_new = PyType_GenericNew,
};

static const char fingerprints_doc[] =
    "fingerprints(frames, frame_bytes, out): each frame's 64-bit fingerprint into out (uint64).";

static PyObject *module_fingerprints(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "fingerprints(frames, frame_bytes, out) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t bytes = PyLong_AsSsize_t(args[1]);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    if (bytes < 1) {
        PyErr_Format(PyExc_ValueError, "frame_bytes must be at least 1, got %zd", bytes);
        return NULL;
    }
    Py_buffer frames, out;
    Py_ssize_t n = frame_buffer(args[0], &frames, bytes, 0);
    if (n < 0)
        return NULL;
    if (get_buffer(args[2], &out, "out", 1) < 0) {
        PyBuffer_Release(&frames);
        return NULL;
    }
    char code = format_code(&out);
    if (out.itemsize != 8 || !(code == 'Q' || code == 'L'))
        PyErr_Format(PyExc_TypeError, "out must be uint64, got format '%s'", out.format);
    else if (out.len / 8 != n)
        PyErr_Format(PyExc_ValueError, "out holds %zd fingerprints, %zd frames were given", out.len / 8, n);
    else {
        uint64_t *dst = out.buf;
        const uint8_t *src = frames.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = fingerprint(src + i * bytes, bytes);
    }
    PyBuffer_Release(&frames);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"fingerprints", (PyCFunction)(void (*)(void))module_fingerprints, METH_FASTCALL, fingerprints_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "_frames", "Frames stored once each, for replay memories of image observations.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__frames(void) {
    if (PyType_Ready(&FrameStoreType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&frames_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&FrameStoreType);
    if (PyModule_AddObject(module, "FrameStore", (PyObject *)&FrameStoreType) < 0) {
        Py_DECREF(&FrameStoreType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

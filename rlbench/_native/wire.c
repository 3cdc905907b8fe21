/* rlbench._wire: the wire's codec and the replay node's fast path, in C.
 *
 * messages.py defines the wire; this module implements what it declares and defers to it wherever
 * a decision is not plain:
 *
 * - A descriptor block is checked against its op's schema by messages.py (`_native_layout`, once
 *   per distinct block); the result is remembered here, keyed by (op, array count, block bytes).
 *   Per message this code checks sizes and the scalars' ranges, as messages.decode does.
 * - Whatever this code does not accept outright goes to messages.py's own decoder or encoder, which
 *   then accepts it or raises its WireError: so every error, and its text, is messages.py's. This
 *   code only ever accepts less than messages.py would, never more.
 *
 * FastPath handles the replay node's hot requests (INSERT, SAMPLE, UPDATE_PRIORITIES) for the core
 * memories in one call per message: decode, the peer's authentication and role, the memory
 * operation, the node's counters and the rate limiter (called back in Python), and the reply's
 * bytes. It acts only on a message the general path would accept and serve the same way, and only
 * after everything it depends on is checked; anything else it leaves to the general path
 * untouched (handle returns None), so refusals, their counters and their texts are the general
 * path's. It reads and writes the same Python objects the general path does, by the attribute
 * names replay_node.py and builtin/replay.py use: the node's peers (refused, authenticated, role,
 * last_insert) and state (produced, stored, done, first_insert_t, last_insert_t, params_version,
 * learner_updates, credit, beta), and the memory's ring (_size, _cursor, _adds, _add_calls,
 * _samples, _sampled_items, _updates, _updated_items, _columns, _rng) and sum tree (through the
 * capsule of rlbench._sumtree, the same code the memory's methods run).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "sumtree.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rlbench._wire writes the little-endian wire format with native stores"
#endif

/* The struct formats this file implements; messages.py compares them with its own at import. */
#define HEADER_FORMAT "<2sBBIHH"
#define DESCRIPTOR_FORMAT "<BB"
#define SHAPE_FORMAT "<I"
#define NBYTES_FORMAT "<Q"
#define HEADER_BYTES 12
#define MAX_DIMS 32
#define MAX_PARTS 128
#define MAX_DTYPES 32
#define SINGLE_BUFFER_LIMIT (64 << 10) /* larger messages keep messages.py's zero-copy parts */
#define LAYOUT_SLOTS 2048
#define LAYOUT_LIMIT 1024 /* remembered layouts; cleared when full, as messages.py does */
#define EXACT_INTEGER (9007199254740992.0) /* 2**53: integers up to this are exact doubles */

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter's clock on Linux */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline Py_ssize_t pad8(Py_ssize_t offset) { return (8 - (offset & 7)) & 7; }

/* ============================================================================ layouts */

enum { F_OBS, F_ACTION, F_REWARD, F_NEXT_OBS, F_DONE, F_PRODUCED, F_PRIORITIES, F_BATCH_SIZE, F_BETA, F_INDICES,
       F_LEARNER_UPDATES, F_CREDIT, N_FIELDS };
/* messages.SCHEMAS' names of the fields the fast path reads; the first five are TRANSITION_FIELDS */
static const char *FIELD_NAMES[N_FIELDS] = {"obs", "action", "reward", "next_obs", "done", "produced", "priorities",
                                            "batch_size", "beta", "indices", "learner_updates", "credit"};
#define N_TRANSITION_FIELDS 5

typedef struct {
    PyObject *name;
    PyArray_Descr *descr;
    int code;
    int nd;
    npy_intp dims[MAX_DIMS];
    Py_ssize_t offset, nbytes;
} Entry;

typedef struct {
    int entry;
    int native; /* 1: a scalar whose range this code checks; 0: messages._check_value checks it */
    double low, high;
    PyObject *spec;
} Check;

/* A Python object only for its reference count: whoever uses a layout holds a reference, so the
 * codec can forget it (its cache is full) while another thread, or a callback, still reads it. */
typedef struct {
    PyObject_HEAD
    uint64_t hash;
    int op;
    int n_arrays;
    Py_ssize_t block_len;
    char *block;
    PyObject *op_member;
    Py_ssize_t end;
    int n_entries, n_checks;
    int all_native; /* every check is a scalar range checked here */
    Entry *entries;
    Check *checks;
    int field[N_FIELDS]; /* entry index of each named field, -1 when absent */
} Layout;

static void Layout_dealloc(Layout *layout) {
    for (int i = 0; i < layout->n_entries; i++) {
        Py_XDECREF(layout->entries[i].name);
        Py_XDECREF(layout->entries[i].descr);
    }
    for (int i = 0; i < layout->n_checks; i++)
        Py_XDECREF(layout->checks[i].spec);
    Py_XDECREF(layout->op_member);
    PyMem_Free(layout->entries);
    PyMem_Free(layout->checks);
    PyMem_Free(layout->block);
    Py_TYPE(layout)->tp_free((PyObject *)layout);
}

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlbench._wire.Layout",
    .tp_basicsize = sizeof(Layout),
    .tp_dealloc = (destructor)Layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("A remembered, checked message layout (internal)."),
};

static uint64_t block_hash(int op, int n_arrays, const char *block, Py_ssize_t len) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)(op * 65536 + n_arrays), word;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) { /* a word at a time: blocks are a few hundred bytes */
        memcpy(&word, block + i, 8);
        h = (h ^ word) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < len; i++)
        h = (h ^ (unsigned char)block[i]) * 1099511628211ULL;
    return h;
}

/* ============================================================================ the codec */

typedef struct {
    PyObject_HEAD
    char magic[2];
    int version;
    int max_arrays;
    Py_ssize_t max_message_bytes;
    PyArray_Descr *dtypes[MAX_DTYPES];
    int n_dtypes;
    int code_int64, code_float32, code_float64, code_uint8, code_bool;
    PyObject *ops;          /* tuple of 256: the Op member of each code, or None */
    PyObject *layout_of;    /* messages._native_layout */
    PyObject *check_value;  /* messages._check_value */
    PyObject *slow_encode;  /* messages' own encoder and decoder */
    PyObject *slow_decode;
    PyObject *field_names[N_FIELDS];
    Layout **slots; /* each holds a reference */
    int n_layouts;
} Codec;

/* The wire code of a numpy dtype, or -1 when it cannot travel (messages.DTYPE_CODE's keys). */
static int code_of(Codec *codec, PyArray_Descr *descr) {
    if (!PyTypeNum_ISNUMBER(descr->type_num) && descr->type_num != NPY_HALF)
        return -1;
    if (descr->byteorder == '>' || PyDataType_HASFIELDS(descr) || PyDataType_HASSUBARRAY(descr))
        return -1;
    for (int i = 0; i < codec->n_dtypes; i++) {
        PyArray_Descr *known = codec->dtypes[i];
        if (known->kind == descr->kind && PyDataType_ELSIZE(known) == PyDataType_ELSIZE(descr))
            return i;
    }
    return -1;
}

static int code_named(Codec *codec, char kind, int size) {
    for (int i = 0; i < codec->n_dtypes; i++)
        if (codec->dtypes[i]->kind == kind && PyDataType_ELSIZE(codec->dtypes[i]) == size)
            return i;
    return -1;
}

static void codec_forget_layouts(Codec *codec) {
    for (int i = 0; i < LAYOUT_SLOTS; i++)
        Py_CLEAR(codec->slots[i]);
    codec->n_layouts = 0;
}

static Layout *codec_find(Codec *codec, uint64_t hash, int op, int n_arrays, const char *block, Py_ssize_t len) {
    for (size_t probe = 0; probe < LAYOUT_SLOTS; probe++) {
        Layout *layout = codec->slots[(hash + probe) & (LAYOUT_SLOTS - 1)];
        if (layout == NULL)
            return NULL;
        if (layout->hash == hash && layout->op == op && layout->n_arrays == n_arrays && layout->block_len == len &&
            memcmp(layout->block, block, len) == 0)
            return layout;
    }
    return NULL;
}

/* Convert what messages._native_layout returned: (op member, entries, end, checks). */
static Layout *layout_from_python(Codec *codec, PyObject *described, uint64_t hash, int op, int n_arrays,
                                  const char *block, Py_ssize_t len) {
    PyObject *op_member, *entries, *checks;
    Py_ssize_t end;
    if (!PyArg_ParseTuple(described, "OO!nO!;messages._native_layout returns (op, entries, end, checks)",
                          &op_member, &PyList_Type, &entries, &end, &PyList_Type, &checks))
        return NULL;
    Layout *layout = PyObject_New(Layout, &LayoutType);
    if (layout == NULL)
        return NULL;
    memset((char *)layout + sizeof(PyObject), 0, sizeof(Layout) - sizeof(PyObject));
    layout->op_member = Py_NewRef(op_member);
    layout->hash = hash;
    layout->op = op;
    layout->n_arrays = n_arrays;
    layout->block_len = len;
    layout->end = end;
    layout->all_native = 1;
    for (int f = 0; f < N_FIELDS; f++)
        layout->field[f] = -1;
    layout->block = PyMem_Malloc(len ? len : 1);
    layout->n_entries = (int)PyList_GET_SIZE(entries);
    layout->n_checks = (int)PyList_GET_SIZE(checks);
    layout->entries = PyMem_Calloc(layout->n_entries ? layout->n_entries : 1, sizeof(Entry));
    layout->checks = PyMem_Calloc(layout->n_checks ? layout->n_checks : 1, sizeof(Check));
    if (layout->block == NULL || layout->entries == NULL || layout->checks == NULL) {
        Py_DECREF(layout);
        return (Layout *)PyErr_NoMemory();
    }
    memcpy(layout->block, block, len);
    for (int i = 0; i < layout->n_entries; i++) {
        Entry *entry = &layout->entries[i];
        PyObject *name, *dtype, *shape;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(entries, i), "UOO!nn;a layout entry is (name, dtype, shape, offset, nbytes)",
                              &name, &dtype, &PyTuple_Type, &shape, &entry->offset, &entry->nbytes))
            goto fail;
        if (!PyArray_DescrCheck(dtype) || PyTuple_GET_SIZE(shape) > MAX_DIMS) {
            PyErr_SetString(PyExc_TypeError, "a layout entry needs a numpy dtype and a short shape");
            goto fail;
        }
        Py_INCREF(name);
        entry->name = name;
        PyUnicode_InternInPlace(&entry->name);
        Py_INCREF(dtype);
        entry->descr = (PyArray_Descr *)dtype;
        entry->code = code_of(codec, entry->descr);
        entry->nd = (int)PyTuple_GET_SIZE(shape);
        for (int d = 0; d < entry->nd; d++) {
            entry->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (entry->dims[d] == -1 && PyErr_Occurred())
                goto fail;
        }
        for (int f = 0; f < N_FIELDS; f++)
            if (PyUnicode_Compare(entry->name, codec->field_names[f]) == 0)
                layout->field[f] = i;
    }
    for (int i = 0; i < layout->n_checks; i++) {
        Check *check = &layout->checks[i];
        PyObject *spec;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(checks, i), "iOpdd;a layout check is (entry, spec, native, low, high)",
                              &check->entry, &spec, &check->native, &check->low, &check->high))
            goto fail;
        if (check->entry < 0 || check->entry >= layout->n_entries) {
            PyErr_SetString(PyExc_ValueError, "a layout check names no entry");
            goto fail;
        }
        Py_INCREF(spec);
        check->spec = spec;
        layout->all_native &= check->native;
    }
    return layout;
fail:
    Py_DECREF(layout);
    return NULL;
}

/* The remembered layout of this header and block (a new reference); on a miss messages.py checks it
 * (its WireError is raised as is). */
static Layout *codec_layout(Codec *codec, int op, int n_arrays, const char *block, Py_ssize_t len, uint32_t request_id) {
    uint64_t hash = block_hash(op, n_arrays, block, len);
    Layout *layout = codec_find(codec, hash, op, n_arrays, block, len);
    if (layout != NULL)
        return (Layout *)Py_NewRef(layout);
    PyObject *described = PyObject_CallFunction(codec->layout_of, "iiy#k", op, n_arrays, block, len,
                                                (unsigned long)request_id);
    if (described == NULL)
        return NULL;
    layout = layout_from_python(codec, described, hash, op, n_arrays, block, len);
    Py_DECREF(described);
    if (layout == NULL)
        return NULL;
    if (codec_find(codec, hash, op, n_arrays, block, len) == NULL) { /* (another thread may have added it) */
        if (codec->n_layouts >= LAYOUT_LIMIT)
            codec_forget_layouts(codec);
        for (size_t probe = 0;; probe++) {
            Layout **slot = &codec->slots[(hash + probe) & (LAYOUT_SLOTS - 1)];
            if (*slot == NULL) {
                *slot = (Layout *)Py_NewRef(layout);
                break;
            }
        }
        codec->n_layouts++;
    }
    return layout;
}

enum { PARSED, TO_PYTHON, FAILED };

/* Header, size and layout checks of one message, in messages.decode's order; TO_PYTHON for anything
 * it would refuse (or that this code does not decide), FAILED with the exception of a layout check.
 * When a layout is found (PARSED or a size mismatch) *layout holds a reference to it. */
static int parse(Codec *codec, const char *buf, Py_ssize_t size, Py_ssize_t max_bytes, Layout **layout,
                 uint32_t *request_id) {
    if (size > max_bytes || size < HEADER_BYTES || buf[0] != codec->magic[0] || buf[1] != codec->magic[1] ||
        (unsigned char)buf[2] != codec->version)
        return TO_PYTHON;
    uint16_t n_arrays, block_len;
    memcpy(request_id, buf + 4, 4);
    memcpy(&n_arrays, buf + 8, 2);
    memcpy(&block_len, buf + 10, 2);
    if (HEADER_BYTES + (Py_ssize_t)block_len > size)
        return TO_PYTHON;
    *layout = codec_layout(codec, (unsigned char)buf[3], n_arrays, buf + HEADER_BYTES, block_len, *request_id);
    if (*layout == NULL)
        return FAILED;
    if ((*layout)->end == size)
        return PARSED;
    Py_CLEAR(*layout);
    return TO_PYTHON;
}

/* A scalar's value as a double, when it is exactly one (else 0: messages.py decides). */
static int exact_double(const Entry *entry, const char *p, double *out) {
    switch (entry->descr->kind) {
    case 'b': {
        unsigned char v = (unsigned char)*p;
        if (v > 1)
            return 0;
        *out = v;
        return 1;
    }
    case 'i': {
        int64_t v;
        switch (PyDataType_ELSIZE(entry->descr)) {
        case 1: v = *(const int8_t *)p; break;
        case 2: { int16_t x; memcpy(&x, p, 2); v = x; break; }
        case 4: { int32_t x; memcpy(&x, p, 4); v = x; break; }
        case 8: memcpy(&v, p, 8); break;
        default: return 0;
        }
        if (v > (int64_t)EXACT_INTEGER || v < -(int64_t)EXACT_INTEGER)
            return 0;
        *out = (double)v;
        return 1;
    }
    case 'u': {
        uint64_t v;
        switch (PyDataType_ELSIZE(entry->descr)) {
        case 1: v = *(const uint8_t *)p; break;
        case 2: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
        case 8: memcpy(&v, p, 8); break;
        default: return 0;
        }
        if (v > (uint64_t)EXACT_INTEGER)
            return 0;
        *out = (double)v;
        return 1;
    }
    case 'f':
        if (PyDataType_ELSIZE(entry->descr) == 4) {
            float x;
            memcpy(&x, p, 4);
            *out = x;
        } else if (PyDataType_ELSIZE(entry->descr) == 8) {
            memcpy(out, p, 8);
        } else {
            return 0;
        }
        return !isnan(*out);
    }
    return 0;
}

/* 1 when a native check passes; 0 when messages._check_value must look. */
static inline int check_passes(const Layout *layout, const Check *check, const char *buf) {
    const Entry *entry = &layout->entries[check->entry];
    double value;
    return check->native && exact_double(entry, buf + entry->offset, &value) && check->low <= value &&
           value <= check->high;
}

/* Every check of a layout, natively only: 1 when all pass. */
static int values_pass(const Layout *layout, const char *buf) {
    if (!layout->all_native)
        return 0;
    for (int i = 0; i < layout->n_checks; i++)
        if (!check_passes(layout, &layout->checks[i], buf))
            return 0;
    return 1;
}

static PyObject *call_slow_decode(Codec *codec, PyObject *buffer, Py_ssize_t max_bytes) {
    PyObject *limit = PyLong_FromSsize_t(max_bytes);
    if (limit == NULL)
        return NULL;
    PyObject *args[2] = {buffer, limit};
    PyObject *names = Py_BuildValue("(s)", "max_bytes");
    PyObject *result = names ? PyObject_Vectorcall(codec->slow_decode, args, 1, names) : NULL;
    Py_XDECREF(names);
    Py_DECREF(limit);
    return result;
}

/* A Codec or FastPath made without a successful __init__ (Codec.__new__(Codec)) has NULL fields:
 * its methods refuse instead of reading them. */
static int not_initialised(int ready, const char *type) {
    if (ready)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "this %s was not initialised", type);
    return 1;
}

static PyObject *Codec_decode(Codec *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (not_initialised(self->slots != NULL, "Codec"))
        return NULL;
    Py_ssize_t max_bytes = self->max_message_bytes;
    Py_ssize_t n_keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || n_keywords > 1 ||
        (n_keywords == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "max_bytes") != 0)) {
        PyErr_SetString(PyExc_TypeError, "decode(buffer, *, max_bytes=MAX_MESSAGE_BYTES)");
        return NULL;
    }
    if (n_keywords == 1) {
        max_bytes = PyLong_AsSsize_t(args[1]);
        if (max_bytes == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *buffer = args[0];
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return call_slow_decode(self, buffer, max_bytes);
    }
    Layout *layout;
    uint32_t request_id;
    int parsed = parse(self, view.buf, view.len, max_bytes, &layout, &request_id);
    if (parsed != PARSED) {
        PyBuffer_Release(&view);
        return parsed == FAILED ? NULL : call_slow_decode(self, buffer, max_bytes);
    }
    const char *buf = view.buf;
    int writeable = !view.readonly;
    PyObject *base = PyMemoryView_FromObject(buffer); /* what the arrays keep alive, as np.frombuffer's do */
    PyObject *arrays = base ? PyDict_New() : NULL;
    PyObject *made[MAX_PARTS];
    int n_made = 0;
    PyObject *result = NULL;
    if (arrays == NULL)
        goto done;
    for (int i = 0; i < layout->n_entries; i++) {
        Entry *entry = &layout->entries[i];
        Py_INCREF(entry->descr);
        PyObject *array = PyArray_NewFromDescr(&PyArray_Type, entry->descr, entry->nd, entry->dims, NULL,
                                               (void *)(buf + entry->offset), writeable ? NPY_ARRAY_WRITEABLE : 0, NULL);
        if (array == NULL)
            goto done;
        Py_INCREF(base);
        if (PyArray_SetBaseObject((PyArrayObject *)array, base) < 0) {
            Py_DECREF(array);
            goto done;
        }
        PyArray_UpdateFlags((PyArrayObject *)array, NPY_ARRAY_UPDATE_ALL);
        int failed = PyDict_SetItem(arrays, entry->name, array);
        if (i < MAX_PARTS)
            made[n_made++] = array;
        Py_DECREF(array); /* the dict holds it */
        if (failed < 0)
            goto done;
    }
    for (int i = 0; i < layout->n_checks; i++) {
        Check *check = &layout->checks[i];
        if (check_passes(layout, check, buf))
            continue;
        Entry *entry = &layout->entries[check->entry];
        PyObject *array = check->entry < n_made ? made[check->entry] : PyDict_GetItem(arrays, entry->name);
        PyObject *checked = PyObject_CallFunction(self->check_value, "OOOOk", layout->op_member, entry->name,
                                                  check->spec, array, (unsigned long)request_id);
        if (checked == NULL)
            goto done;
        Py_DECREF(checked);
    }
    result = Py_BuildValue("(OkO)", layout->op_member, (unsigned long)request_id, arrays);
done:
    Py_DECREF(layout);
    Py_XDECREF(arrays);
    Py_XDECREF(base);
    PyBuffer_Release(&view);
    return result;
}

/* ---------------------------------------------------------------------------- encoding */

typedef struct {
    const char *name;
    Py_ssize_t name_len;
    int code;
    int nd;
    npy_intp dims[MAX_DIMS];
    const char *data; /* NULL: the caller fills the payload at `out` */
    Py_ssize_t nbytes;
    char *out;
    char scalar[16];
} Part;

/* One message's bytes from its parts (descriptors, padding, payloads); NULL with an exception, or
 * NULL without one when the header cannot say it (messages.py's encoder then raises). */
static PyObject *build_message(Codec *codec, int op, uint32_t request_id, Part *parts, int n, Py_ssize_t limit) {
    Py_ssize_t block = 0;
    for (int i = 0; i < n; i++)
        block += 1 + parts[i].name_len + 2 + 4 * parts[i].nd + 8;
    if (block > 0xFFFF || n > 0xFFFF)
        return NULL;
    Py_ssize_t total = HEADER_BYTES + block;
    for (int i = 0; i < n; i++)
        total += pad8(total) + parts[i].nbytes;
    if (total > limit)
        return NULL;
    PyObject *message = PyBytes_FromStringAndSize(NULL, total);
    if (message == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(message);
    uint16_t n16 = (uint16_t)n, block16 = (uint16_t)block;
    out[0] = codec->magic[0];
    out[1] = codec->magic[1];
    out[2] = (char)codec->version;
    out[3] = (char)op;
    memcpy(out + 4, &request_id, 4);
    memcpy(out + 8, &n16, 2);
    memcpy(out + 10, &block16, 2);
    char *d = out + HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        Part *part = &parts[i];
        *d++ = (char)part->name_len;
        memcpy(d, part->name, part->name_len);
        d += part->name_len;
        *d++ = (char)part->code;
        *d++ = (char)part->nd;
        for (int k = 0; k < part->nd; k++) {
            uint32_t extent = (uint32_t)part->dims[k];
            memcpy(d, &extent, 4);
            d += 4;
        }
        uint64_t nbytes = (uint64_t)part->nbytes;
        memcpy(d, &nbytes, 8);
        d += 8;
    }
    Py_ssize_t offset = HEADER_BYTES + block;
    for (int i = 0; i < n; i++) {
        Py_ssize_t pad = pad8(offset);
        memset(out + offset, 0, pad);
        offset += pad;
        parts[i].out = out + offset;
        if (parts[i].data != NULL && parts[i].nbytes)
            memcpy(out + offset, parts[i].data, parts[i].nbytes);
        offset += parts[i].nbytes;
    }
    return message;
}

/* What np.asarray(value) would send, for the values this code takes: arrays (C-contiguous), numpy
 * scalars, Python bool, int (int64) and float (float64). 0: let messages.py encode the message. */
static int resolve(Codec *codec, PyObject *value, Part *part) {
    part->data = part->scalar;
    part->nd = 0;
    if (PyArray_Check(value)) {
        PyArrayObject *array = (PyArrayObject *)value;
        if (!PyArray_IS_C_CONTIGUOUS(array) || PyArray_NDIM(array) > MAX_DIMS)
            return 0;
        part->code = code_of(codec, PyArray_DESCR(array));
        part->nd = PyArray_NDIM(array);
        for (int k = 0; k < part->nd; k++) {
            part->dims[k] = PyArray_DIM(array, k);
            if (part->dims[k] > 0xFFFFFFFFLL)
                return 0;
        }
        part->data = PyArray_DATA(array);
        part->nbytes = PyArray_NBYTES(array);
        return part->code >= 0;
    }
    if (PyBool_Check(value)) {
        part->code = codec->code_bool;
        part->scalar[0] = value == Py_True;
        part->nbytes = 1;
        return part->code >= 0;
    }
    if (PyLong_Check(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        int64_t wide = v;
        memcpy(part->scalar, &wide, 8);
        part->code = codec->code_int64;
        part->nbytes = 8;
        return part->code >= 0;
    }
    if (PyFloat_Check(value)) {
        double v = PyFloat_AS_DOUBLE(value);
        memcpy(part->scalar, &v, 8);
        part->code = codec->code_float64;
        part->nbytes = 8;
        return part->code >= 0;
    }
    if (PyArray_IsScalar(value, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(value);
        if (descr == NULL) {
            PyErr_Clear();
            return 0;
        }
        part->code = code_of(codec, descr);
        part->nbytes = PyDataType_ELSIZE(descr);
        Py_DECREF(descr);
        if (part->code < 0 || part->nbytes > (Py_ssize_t)sizeof part->scalar)
            return 0;
        PyArray_ScalarAsCtype(value, part->scalar);
        return 1;
    }
    return 0;
}

static PyObject *call_slow_encode(Codec *codec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return PyObject_Vectorcall(codec->slow_encode, args, nargs, kwnames);
}

static PyObject *Codec_encode(Codec *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const keywords[] = {"op", "arrays", "request_id"};
    if (not_initialised(self->slots != NULL, "Codec"))
        return NULL;
    PyObject *given[3] = {NULL, Py_None, NULL};
    Py_ssize_t n_keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 3)
        return call_slow_encode(self, args, nargs, kwnames);
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    for (Py_ssize_t k = 0; k < n_keywords; k++) {
        int found = 0;
        for (int i = 0; i < 3; i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), keywords[i]) == 0 && i >= nargs) {
                given[i] = args[nargs + k];
                found = 1;
            }
        if (!found)
            return call_slow_encode(self, args, nargs, kwnames);
    }
    if (given[0] == NULL || !PyLong_Check(given[0]))
        return call_slow_encode(self, args, nargs, kwnames);
    long op = PyLong_AsLong(given[0]);
    if (op < 0 || op > 255 || (op == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return call_slow_encode(self, args, nargs, kwnames);
    }
    uint32_t request_id = 0;
    if (given[2] != NULL) {
        if (!PyLong_Check(given[2]))
            return call_slow_encode(self, args, nargs, kwnames);
        request_id = (uint32_t)(PyLong_AsUnsignedLongLongMask(given[2]) & 0xFFFFFFFFULL);
        if (PyErr_Occurred())
            return NULL;
    }
    PyObject *arrays = given[1];
    Py_ssize_t n = 0;
    if (arrays != Py_None) {
        if (!PyDict_CheckExact(arrays))
            return call_slow_encode(self, args, nargs, kwnames);
        n = PyDict_GET_SIZE(arrays);
    }
    if (n > self->max_arrays || n > MAX_PARTS)
        return call_slow_encode(self, args, nargs, kwnames);
    Part parts[MAX_PARTS];
    Py_ssize_t position = 0;
    PyObject *name, *value;
    int i = 0;
    while (n && PyDict_Next(arrays, &position, &name, &value)) {
        Part *part = &parts[i++];
        if (!PyUnicode_Check(name) || !resolve(self, value, part))
            return call_slow_encode(self, args, nargs, kwnames);
        part->name = PyUnicode_AsUTF8AndSize(name, &part->name_len);
        if (part->name == NULL) {
            PyErr_Clear();
            return call_slow_encode(self, args, nargs, kwnames);
        }
        if (part->name_len > 255)
            return call_slow_encode(self, args, nargs, kwnames);
    }
    PyObject *message = build_message(self, (int)op, request_id, parts, (int)n, SINGLE_BUFFER_LIMIT);
    if (message == NULL)
        return PyErr_Occurred() ? NULL : call_slow_encode(self, args, nargs, kwnames);
    PyObject *list = PyList_New(1);
    if (list == NULL) {
        Py_DECREF(message);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, message);
    return list;
}

static int Codec_init(Codec *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"magic", "version", "dtypes", "ops", "max_arrays", "max_message_bytes",
                               "layout_of", "check_value", "encode", "decode", NULL};
    const char *magic;
    Py_ssize_t magic_len;
    PyObject *dtypes, *ops, *layout_of, *check_value, *slow_encode, *slow_decode;
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Codec is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y#iO!O!inOOOO", keywords, &magic, &magic_len, &self->version,
                                     &PyTuple_Type, &dtypes, &PyTuple_Type, &ops, &self->max_arrays,
                                     &self->max_message_bytes, &layout_of, &check_value, &slow_encode, &slow_decode))
        return -1;
    if (magic_len != 2 || PyTuple_GET_SIZE(ops) != 256 || PyTuple_GET_SIZE(dtypes) > MAX_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "Codec needs a 2-byte magic, 256 ops and at most 32 dtypes");
        return -1;
    }
    memcpy(self->magic, magic, 2);
    self->ops = Py_NewRef(ops);
    self->layout_of = Py_NewRef(layout_of);
    self->check_value = Py_NewRef(check_value);
    self->slow_encode = Py_NewRef(slow_encode);
    self->slow_decode = Py_NewRef(slow_decode);
    self->n_dtypes = (int)PyTuple_GET_SIZE(dtypes);
    for (int i = 0; i < self->n_dtypes; i++) {
        PyObject *dtype = PyTuple_GET_ITEM(dtypes, i);
        if (!PyArray_DescrCheck(dtype)) {
            PyErr_SetString(PyExc_TypeError, "dtypes must be numpy dtypes");
            return -1;
        }
        Py_INCREF(dtype);
        self->dtypes[i] = (PyArray_Descr *)dtype;
    }
    self->code_int64 = code_named(self, 'i', 8);
    self->code_float32 = code_named(self, 'f', 4);
    self->code_float64 = code_named(self, 'f', 8);
    self->code_uint8 = code_named(self, 'u', 1);
    self->code_bool = code_named(self, 'b', 1);
    for (int f = 0; f < N_FIELDS; f++) {
        self->field_names[f] = PyUnicode_InternFromString(FIELD_NAMES[f]);
        if (self->field_names[f] == NULL)
            return -1;
    }
    self->slots = PyMem_Calloc(LAYOUT_SLOTS, sizeof(Layout *));
    if (self->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Codec_dealloc(Codec *self) {
    if (self->slots != NULL) {
        codec_forget_layouts(self);
        PyMem_Free(self->slots);
    }
    for (int i = 0; i < self->n_dtypes; i++)
        Py_XDECREF(self->dtypes[i]);
    for (int f = 0; f < N_FIELDS; f++)
        Py_XDECREF(self->field_names[f]);
    Py_XDECREF(self->ops);
    Py_XDECREF(self->layout_of);
    Py_XDECREF(self->check_value);
    Py_XDECREF(self->slow_encode);
    Py_XDECREF(self->slow_decode);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Codec_remembered(Codec *self, void *closure) { return PyLong_FromLong(self->n_layouts); }

static PyMethodDef Codec_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))Codec_encode, METH_FASTCALL | METH_KEYWORDS,
     "encode(op, arrays=None, request_id=0)\n--\n\nmessages.encode: a small message as one bytes part."},
    {"decode", (PyCFunction)(void (*)(void))Codec_decode, METH_FASTCALL | METH_KEYWORDS,
     "decode(buffer, *, max_bytes=MAX_MESSAGE_BYTES)\n--\n\nmessages.decode: (op, request_id, arrays)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Codec_getset[] = {
    {"remembered", (getter)Codec_remembered, NULL, "layouts remembered", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CodecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlbench._wire.Codec",
    .tp_basicsize = sizeof(Codec),
    .tp_dealloc = (destructor)Codec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("The wire's codec, built by messages.py from its own definitions."),
    .tp_methods = Codec_methods,
    .tp_getset = Codec_getset,
    .tp_init = (initproc)Codec_init,
    .tp_new = PyType_GenericNew,
};

/* ============================================================================ the fast path */

enum { T_INSERT, T_SAMPLE, T_UPDATE, N_TIMED };
static const char *TIMED_NAMES[N_TIMED] = {"INSERT", "SAMPLE", "UPDATE_PRIORITIES"};
#define TIMINGS 4096

static PyObject *NOT_HANDLED; /* Py_None: the general path takes the message */

typedef struct {
    PyObject_HEAD
    Codec *codec;
    SumTreeAPI *tree_api;
    PyObject *memory, *tree; /* tree: None for uniform replay */
    PyObject *peers, *state, *pending_samples;
    PyObject *state_fields, *memory_fields; /* their instance dicts (or the objects when they have none) */
    PyObject *inserted, *can_insert, *can_sample, *sampled; /* the rate limiter's methods */
    PyObject *rng_random, *rng_integers;                  /* the memory's generator's */
    PyObject *zero, *dtype_keyword, *int64_type;
    PyObject *check_deadline, *hold_insert, *drain;     /* the node's */
    PyObject *allowed[256];                              /* roles that may send each op (NULL: not here) */
    int op_insert, op_inserted, op_sample, op_batch, op_update;
    long long total_steps;
    double deadline_s; /* perf_counter seconds, INFINITY without a time budget */
    Py_ssize_t capacity; /* the node's idea of it; -1 when unknown */
    Py_ssize_t max_bytes;
    long long max_credit;
    long long max_held; /* INSERT replies the limiter may hold for one peer (more: the general path refuses) */
    int ready;          /* __init__ succeeded */
    int prioritized;
    int mass; /* BATCHes carry the memory's priority mass after the draw (a shard of several: ReplayNode._batch) */
    /* the INSERT layout last found compatible with the memory's columns */
    Layout *fit_layout; /* a reference */
    PyObject *fit_columns;
    int fit_entry[N_TRANSITION_FIELDS];
    /* timings (ns) not yet handed to the node's recorder */
    int64_t serve_ns[N_TIMED][TIMINGS], memory_ns[N_TIMED][TIMINGS];
    int timed[N_TIMED];
    long long handled[N_TIMED];
} FastPath;

static PyObject *S_refused, *S_authenticated, *S_role, *S_last_insert, *S_held, *S_produced, *S_stored, *S_done,
    *S_first_insert_t, *S_last_insert_t, *S_params_version, *S_learner_updates, *S_credit, *S_beta, *S_size,
    *S_cursor, *S_adds, *S_add_calls, *S_samples, *S_sampled_items, *S_updates, *S_updated_items, *S_columns,
    *S_indices, *S_weights, *S_step, *S_finished, *S_mass, *S_min_mass, *S_total, *S_min;

/* -- fields of the node's and the memory's Python objects: read and written through the object's
 * instance dict where the fast path holds it (the node's state, the memory), else as attributes;
 * -1 with an exception when a field is missing or not an int -- */
static PyObject *get_field(PyObject *holder, PyObject *name) {
    if (!PyDict_CheckExact(holder))
        return PyObject_GetAttr(holder, name);
    PyObject *value = PyDict_GetItemWithError(holder, name);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "the fast path found no field %R", name);
    return Py_XNewRef(value);
}

static int set_field(PyObject *holder, PyObject *name, PyObject *value) {
    return PyDict_CheckExact(holder) ? PyDict_SetItem(holder, name, value) : PyObject_SetAttr(holder, name, value);
}

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *value = get_field(obj, name);
    if (value == NULL)
        return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *obj, PyObject *name, long long v) {
    PyObject *value = PyLong_FromLongLong(v);
    if (value == NULL)
        return -1;
    int rc = set_field(obj, name, value);
    Py_DECREF(value);
    return rc;
}

static int add_ll(PyObject *obj, PyObject *name, long long delta) {
    long long v;
    return get_ll(obj, name, &v) < 0 ? -1 : set_ll(obj, name, v + delta);
}

static int get_truth(PyObject *obj, PyObject *name) {
    PyObject *value = get_field(obj, name);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* Python truth of calling f(args): -1 on an exception. */
static int call_truth(PyObject *f, PyObject *const *args, size_t n) {
    PyObject *result = PyObject_Vectorcall(f, args, n, NULL);
    if (result == NULL)
        return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

static int call_void(PyObject *f, PyObject *const *args, size_t n) {
    PyObject *result = PyObject_Vectorcall(f, args, n, NULL);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

static int call_with_ll(PyObject *f, long long v, int want_truth) {
    PyObject *arg = PyLong_FromLongLong(v);
    if (arg == NULL)
        return -1;
    int rc = want_truth ? call_truth(f, &arg, 1) : call_void(f, &arg, 1);
    Py_DECREF(arg);
    return rc;
}

static long long read_ll(const Entry *entry, const char *buf) {
    const char *p = buf + entry->offset;
    int size = (int)PyDataType_ELSIZE(entry->descr);
    int is_signed = entry->descr->kind == 'i';
    switch (size) {
    case 1: return is_signed ? *(const int8_t *)p : *(const uint8_t *)p;
    case 2: { int16_t s; uint16_t u; memcpy(&s, p, 2); memcpy(&u, p, 2); return is_signed ? s : u; }
    case 4: { int32_t s; uint32_t u; memcpy(&s, p, 4); memcpy(&u, p, 4); return is_signed ? s : (long long)u; }
    default: { int64_t s; memcpy(&s, p, 8); return s; } /* a checked count: at most 2**53 */
    }
}

/* A real scalar (f4, f8 or an integer) as a double; 0 for what the general path should read. */
static int read_double(const Entry *entry, const char *buf, double *out) {
    if (entry->descr->kind == 'f' && PyDataType_ELSIZE(entry->descr) == 2)
        return 0;
    return exact_double(entry, buf + entry->offset, out);
}

static int peer_may_send(FastPath *f, PyObject *peers, PyObject *peer_id, int op, PyObject **peer_out) {
    PyObject *peer = PyDict_GetItemWithError(peers, peer_id);
    if (peer == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int refused = get_truth(peer, S_refused);
    if (refused != 0)
        return refused < 0 ? -1 : 0;
    int authenticated = get_truth(peer, S_authenticated);
    if (authenticated <= 0)
        return authenticated;
    PyObject *role = PyObject_GetAttr(peer, S_role);
    if (role == NULL)
        return -1;
    int allowed = PySet_Contains(f->allowed[op], role);
    Py_DECREF(role);
    if (allowed > 0)
        *peer_out = Py_NewRef(peer);
    return allowed;
}

typedef struct {
    PyObject *dict;
    int n;
    PyArrayObject *array[8];
    PyObject *name[8];
    int code[8];
    Py_ssize_t row_bytes[8];
} Columns;

/* The memory's columns (borrowed from its `_columns` dict); 0 when there are none yet or they are
 * not what the fast path can copy rows of. */
static int memory_columns(FastPath *f, Columns *columns) {
    PyObject *dict = get_field(f->memory_fields, S_columns);
    if (dict == NULL)
        return -1;
    Py_DECREF(dict); /* the memory keeps it */
    if (!PyDict_CheckExact(dict) || PyDict_GET_SIZE(dict) == 0 || PyDict_GET_SIZE(dict) > 8)
        return 0;
    columns->dict = dict;
    columns->n = 0;
    Py_ssize_t position = 0;
    PyObject *name, *value;
    while (PyDict_Next(dict, &position, &name, &value)) {
        if (!PyArray_CheckExact(value) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)value) ||
            PyArray_NDIM((PyArrayObject *)value) < 1 || !PyUnicode_Check(name))
            return 0;
        PyArrayObject *array = (PyArrayObject *)value;
        int i = columns->n++;
        columns->array[i] = array;
        columns->name[i] = name;
        columns->code[i] = code_of(f->codec, PyArray_DESCR(array));
        columns->row_bytes[i] = PyArray_DIM(array, 0) ? PyArray_NBYTES(array) / PyArray_DIM(array, 0) : 0;
        if (columns->code[i] < 0 || PyArray_DIM(array, 0) != f->capacity)
            return 0;
    }
    return 1;
}

/* Whether an INSERT of this layout fits the memory's columns as TransitionLayout.validate checks it:
 * the same five fields, dtypes and row shapes. Remembered for the last layout seen. */
static int insert_fits(FastPath *f, Layout *layout, Columns *columns) {
    if (f->fit_layout == layout && f->fit_columns == columns->dict)
        return 1;
    if (columns->n != N_TRANSITION_FIELDS)
        return 0;
    int entry_of[N_TRANSITION_FIELDS];
    for (int c = 0; c < columns->n; c++) {
        int e = -1;
        for (int k = 0; k < N_TRANSITION_FIELDS; k++)
            if (PyUnicode_Compare(columns->name[c], f->codec->field_names[k]) == 0)
                e = layout->field[k];
        if (e < 0)
            return 0;
        Entry *entry = &layout->entries[e];
        PyArrayObject *array = columns->array[c];
        if (entry->code != columns->code[c] || entry->nd != PyArray_NDIM(array))
            return 0;
        for (int d = 1; d < entry->nd; d++)
            if (entry->dims[d] != PyArray_DIM(array, d))
                return 0;
        entry_of[c] = e;
    }
    Py_XSETREF(f->fit_columns, Py_NewRef(columns->dict));
    Py_XSETREF(f->fit_layout, (Layout *)Py_NewRef(layout));
    memcpy(f->fit_entry, entry_of, sizeof entry_of);
    return 1;
}

/* Copy n rows into a ring column at cursor, keeping only the last `capacity` (UniformReplay._write_rows). */
static void write_rows(char *column, Py_ssize_t row_bytes, Py_ssize_t capacity, Py_ssize_t cursor, const char *rows,
                       Py_ssize_t n) {
    Py_ssize_t keep = n < capacity ? n : capacity;
    Py_ssize_t first = (cursor + n - keep) % capacity;
    const char *source = rows + (n - keep) * row_bytes;
    Py_ssize_t before_end = capacity - first < keep ? capacity - first : keep;
    memcpy(column + first * row_bytes, source, before_end * row_bytes);
    if (keep > before_end)
        memcpy(column, source + before_end * row_bytes, (keep - before_end) * row_bytes);
}

static void record(FastPath *f, int which, int64_t serve, int64_t memory) {
    int i = f->timed[which];
    f->handled[which]++;
    if (i == TIMINGS) /* only when the node's drain failed */
        return;
    f->serve_ns[which][i] = serve;
    f->memory_ns[which][i] = memory;
    f->timed[which] = i + 1;
}

/* After a message: hand full timing buffers to the node (it calls take_timings). */
static int drain_if_full(FastPath *f) {
    for (int k = 0; k < N_TIMED; k++)
        if (f->timed[k] == TIMINGS)
            return call_void(f->drain, NULL, 0);
    return 0;
}

/* A reply of scalar int fields (INSERTED): names, values and codes in order. */
static PyObject *scalar_reply(FastPath *f, int op, uint32_t request_id, PyObject *const *names, const long long *values,
                              const int *codes, int n) {
    Part parts[8];
    for (int i = 0; i < n; i++) {
        Part *part = &parts[i];
        part->name = PyUnicode_AsUTF8AndSize(names[i], &part->name_len);
        if (part->name == NULL)
            return NULL;
        part->code = codes[i];
        part->nd = 0;
        part->nbytes = PyDataType_ELSIZE(f->codec->dtypes[codes[i]]);
        int64_t v = values[i];
        memcpy(part->scalar, &v, 8); /* little endian: the low bytes are the narrower value */
        part->data = part->scalar;
    }
    return build_message(f->codec, op, request_id, parts, n, PY_SSIZE_T_MAX);
}

/* ReplayNode._check_deadline, called when a budget may be spent (it decides, and says why). */
static int check_deadline(FastPath *f, long long produced, int64_t now) {
    int done = get_truth(f->state_fields, S_done);
    if (done != 0)
        return done < 0 ? -1 : 0;
    if (produced >= f->total_steps || (double)now / 1e9 >= f->deadline_s)
        return call_void(f->check_deadline, NULL, 0);
    return 0;
}

static PyObject *fast_insert(FastPath *f, PyObject *peer_id, PyObject *peer, Layout *layout, const char *buf,
                             uint32_t request_id, int64_t t0) {
    long long last_insert;
    if (get_ll(peer, S_last_insert, &last_insert) < 0)
        return NULL;
    if (last_insert == (long long)request_id) /* a retry: the general path answers it */
        return Py_NewRef(NOT_HANDLED);
    long long held;
    if (get_ll(peer, S_held, &held) < 0)
        return NULL;
    if (held >= f->max_held) /* too many of its replies held: the general path refuses it */
        return Py_NewRef(NOT_HANDLED);
    PyObject *first = get_field(f->state_fields, S_first_insert_t);
    if (first == NULL)
        return NULL;
    Py_DECREF(first);
    if (first == Py_None) /* the first INSERT starts the node's clock: the general path's */
        return Py_NewRef(NOT_HANDLED);
    Columns columns;
    int usable = memory_columns(f, &columns);
    if (usable <= 0)
        return usable < 0 ? NULL : Py_NewRef(NOT_HANDLED);
    if (!insert_fits(f, layout, &columns))
        return Py_NewRef(NOT_HANDLED);
    Entry *obs = &layout->entries[layout->field[F_OBS]];
    Py_ssize_t n = obs->dims[0];
    long long produced = read_ll(&layout->entries[layout->field[F_PRODUCED]], buf);
    if (produced != (long long)n) /* the node counts what it stores: the general path refuses it */
        return Py_NewRef(NOT_HANDLED);
    const void *priorities = NULL;
    int priorities_wide = 1;
    if (layout->field[F_PRIORITIES] >= 0) {
        Entry *entry = &layout->entries[layout->field[F_PRIORITIES]];
        if (PyDataType_ELSIZE(entry->descr) == 2)
            return Py_NewRef(NOT_HANDLED);
        priorities = buf + entry->offset;
        priorities_wide = PyDataType_ELSIZE(entry->descr) == 8;
    }
    long long size, cursor;
    if (get_ll(f->memory_fields, S_size, &size) < 0 || get_ll(f->memory_fields, S_cursor, &cursor) < 0)
        return NULL;
    Py_ssize_t capacity = f->capacity;
    Py_ssize_t new_size = size + n < capacity ? size + n : capacity;
    int64_t small[256];
    int64_t *indices = n <= 256 ? small : PyMem_Malloc(n * sizeof(int64_t));
    if (indices == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        indices[i] = (cursor + i) % capacity;
    PyObject *result = NOT_HANDLED;
    double batch_max = 0.0;
    /* everything the memory would refuse, refused before anything is written */
    if (f->tree != Py_None) {
        if (f->tree_api->check((SumTree *)f->tree, indices, 1, priorities, priorities_wide, n, new_size, &batch_max) < 0) {
            PyErr_Clear();
            goto done;
        }
    } else if (priorities != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            double p = priorities_wide ? ((const double *)priorities)[i] : ((const float *)priorities)[i];
            if (!(p >= 0.0) || !isfinite(p))
                goto done;
        }
    }
    int64_t m0 = now_ns();
    if (f->tree != Py_None)
        f->tree_api->write((SumTree *)f->tree, indices, 1, priorities, priorities_wide, n, batch_max);
    for (int c = 0; c < columns.n; c++) {
        Entry *entry = &layout->entries[f->fit_entry[c]];
        write_rows(PyArray_DATA(columns.array[c]), columns.row_bytes[c], capacity, cursor, buf + entry->offset, n);
    }
    result = NULL;
    if (set_ll(f->memory_fields, S_cursor, (cursor + n) % capacity) < 0 || set_ll(f->memory_fields, S_size, new_size) < 0 ||
        add_ll(f->memory_fields, S_adds, n) < 0 || add_ll(f->memory_fields, S_add_calls, 1) < 0)
        goto done;
    int64_t m1 = now_ns();
    /* the node's side, as ReplayNode._on_insert */
    PyObject *now = PyFloat_FromDouble((double)m1 / 1e9);
    if (now == NULL)
        goto done;
    int failed = set_field(f->state_fields, S_last_insert_t, now);
    Py_DECREF(now);
    long long total_produced;
    if (failed < 0 || set_ll(peer, S_last_insert, request_id) < 0 || add_ll(peer, S_stored, n) < 0 ||
        get_ll(f->state_fields, S_produced, &total_produced) < 0 ||
        set_ll(f->state_fields, S_produced, total_produced += produced) < 0 || add_ll(f->state_fields, S_stored, n) < 0 ||
        call_with_ll(f->inserted, n, 0) < 0 || check_deadline(f, total_produced, m1) < 0)
        goto done;
    int done_now = get_truth(f->state_fields, S_done);
    int may_go = done_now ? 1 : call_with_ll(f->can_insert, 0, 1);
    if (done_now < 0 || may_go < 0)
        goto done;
    if (may_go) {
        long long values[4];
        if (get_ll(f->state_fields, S_params_version, &values[1]) < 0 || get_ll(f->state_fields, S_learner_updates, &values[2]) < 0)
            goto done;
        values[0] = total_produced;
        values[3] = done_now;
        PyObject *names[4] = {S_produced, S_params_version, S_learner_updates, S_finished};
        int codes[4] = {f->codec->code_int64, f->codec->code_int64, f->codec->code_int64, f->codec->code_uint8};
        result = scalar_reply(f, f->op_inserted, request_id, names, values, codes, 4);
        if (result == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "INSERTED could not be encoded");
    } else { /* actors are ahead of the learner: the node holds the reply, and with it the actor */
        PyObject *args[2] = {peer_id, PyLong_FromUnsignedLong(request_id)};
        if (args[1] == NULL)
            goto done;
        int held = call_void(f->hold_insert, args, 2);
        Py_DECREF(args[1]);
        if (held < 0)
            goto done;
        result = Py_True;
        Py_INCREF(result);
    }
    if (result != NULL)
        record(f, T_INSERT, now_ns() - t0, m1 - m0);
done:
    if (indices != small)
        PyMem_Free(indices);
    if (result == NOT_HANDLED)
        Py_INCREF(result);
    return result;
}

/* A BATCH of n items drawn now (the memory's sample, then the rate limiter's `sampled`), as
 * ReplayNode._batch builds it; NOT_HANDLED when the memory would refuse the draw. */
static PyObject *build_batch(FastPath *f, Py_ssize_t n, double beta, uint32_t request_id, int64_t *memory_time) {
    long long size;
    if (get_ll(f->memory_fields, S_size, &size) < 0)
        return NULL;
    if (size == 0)
        return Py_NewRef(NOT_HANDLED);
    if (f->tree != Py_None && f->tree_api->can_draw((SumTree *)f->tree) < 0) {
        PyErr_Clear();
        return Py_NewRef(NOT_HANDLED);
    }
    Columns columns;
    int usable = memory_columns(f, &columns);
    if (usable <= 0)
        return usable < 0 ? NULL : Py_NewRef(NOT_HANDLED);
    Part parts[13]; /* indices, weights, up to 8 columns, step, mass, min_mass */
    int n_parts = 0;
    PyObject *fixed_names[2] = {S_indices, S_weights};
    int fixed_codes[2] = {f->codec->code_int64, f->codec->code_float32};
    for (int i = 0; i < 2; i++, n_parts++) {
        Part *part = &parts[n_parts];
        part->name = PyUnicode_AsUTF8AndSize(fixed_names[i], &part->name_len);
        part->code = fixed_codes[i];
        part->nd = 1;
        part->dims[0] = n;
        part->nbytes = n * PyDataType_ELSIZE(f->codec->dtypes[fixed_codes[i]]);
        part->data = NULL;
    }
    for (int c = 0; c < columns.n; c++, n_parts++) {
        PyObject *name = columns.name[c];
        if (PyUnicode_Compare(name, S_indices) == 0 || PyUnicode_Compare(name, S_weights) == 0 ||
            PyUnicode_Compare(name, S_step) == 0)
            return Py_NewRef(NOT_HANDLED);
        Part *part = &parts[n_parts];
        part->name = PyUnicode_AsUTF8AndSize(name, &part->name_len);
        if (part->name == NULL)
            return NULL;
        part->code = columns.code[c];
        part->nd = PyArray_NDIM(columns.array[c]);
        part->dims[0] = n;
        for (int d = 1; d < part->nd; d++)
            part->dims[d] = PyArray_DIM(columns.array[c], d);
        part->nbytes = n * columns.row_bytes[c];
        part->data = NULL;
    }
    Part *step = &parts[n_parts++];
    step->name = PyUnicode_AsUTF8AndSize(S_step, &step->name_len);
    step->code = f->codec->code_int64;
    step->nd = 0;
    step->nbytes = 8;
    step->data = NULL;
    Part *mass_parts[2] = {NULL, NULL}; /* mass, min_mass: float64 scalars, when f->mass */
    if (f->mass) {
        PyObject *mass_names[2] = {S_mass, S_min_mass};
        for (int i = 0; i < 2; i++) {
            Part *part = mass_parts[i] = &parts[n_parts++];
            part->name = PyUnicode_AsUTF8AndSize(mass_names[i], &part->name_len);
            part->code = f->codec->code_float64;
            part->nd = 0;
            part->nbytes = 8;
            part->data = NULL;
        }
    }
    PyObject *message = build_message(f->codec, f->op_batch, request_id, parts, n_parts, PY_SSIZE_T_MAX);
    if (message == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(NOT_HANDLED);
    int64_t m0 = now_ns();
    if (add_ll(f->memory_fields, S_samples, 1) < 0 || add_ll(f->memory_fields, S_sampled_items, n) < 0)
        goto fail;
    int64_t *indices = (int64_t *)parts[0].out;
    float *weights = (float *)parts[1].out;
    PyObject *count = PyLong_FromSsize_t(n);
    if (count == NULL)
        goto fail;
    PyObject *drawn;
    if (f->tree != Py_None) { /* PrioritizedReplay.sample: rng.random(n) */
        drawn = PyObject_CallOneArg(f->rng_random, count);
    } else { /* UniformReplay.sample: rng.integers(0, size, n, dtype=np.int64) */
        PyObject *args[5] = {NULL, f->zero, PyLong_FromLongLong(size), count, f->int64_type};
        drawn = args[2] ? PyObject_Vectorcall(f->rng_integers, args + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, f->dtype_keyword)
                        : NULL;
        Py_XDECREF(args[2]);
    }
    Py_DECREF(count);
    if (drawn == NULL)
        goto fail;
    Py_buffer view;
    if (PyObject_GetBuffer(drawn, &view, PyBUF_C_CONTIGUOUS) < 0 || view.len != n * 8) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the memory's generator drew an unexpected array");
        else
            view.obj = NULL;
        if (view.obj)
            PyBuffer_Release(&view);
        Py_DECREF(drawn);
        goto fail;
    }
    if (f->tree != Py_None) {
        f->tree_api->draw((SumTree *)f->tree, view.buf, n, beta, indices, weights);
    } else {
        memcpy(indices, view.buf, n * 8);
        for (Py_ssize_t i = 0; i < n; i++)
            weights[i] = 1.0f;
    }
    PyBuffer_Release(&view);
    Py_DECREF(drawn);
    for (int c = 0; c < columns.n; c++) {
        const char *column = PyArray_DATA(columns.array[c]);
        Py_ssize_t row_bytes = columns.row_bytes[c];
        char *out = parts[2 + c].out;
        for (Py_ssize_t i = 0; i < n; i++)
            memcpy(out + i * row_bytes, column + indices[i] * row_bytes, row_bytes);
    }
    *memory_time = now_ns() - m0;
    long long produced;
    if (call_with_ll(f->sampled, n, 0) < 0 || get_ll(f->state_fields, S_produced, &produced) < 0)
        goto fail;
    int64_t at = produced;
    memcpy(step->out, &at, 8);
    if (f->mass) { /* after the draw, as PrioritizedReplay.priority_mass / UniformReplay.priority_mass say */
        double masses[2] = {(double)size, 1.0};
        if (f->tree != Py_None) {
            PyObject *names[2] = {S_total, S_min};
            for (int i = 0; i < 2; i++) {
                PyObject *value = PyObject_GetAttr(f->tree, names[i]);
                masses[i] = value != NULL ? PyFloat_AsDouble(value) : -1.0;
                Py_XDECREF(value);
                if (PyErr_Occurred())
                    goto fail;
            }
        }
        memcpy(mass_parts[0]->out, &masses[0], 8);
        memcpy(mass_parts[1]->out, &masses[1], 8);
    }
    return message;
fail:
    Py_DECREF(message);
    return NULL;
}

static PyObject *fast_sample(FastPath *f, Layout *layout, const char *buf, uint32_t request_id, int64_t t0) {
    Py_ssize_t n = (Py_ssize_t)read_ll(&layout->entries[layout->field[F_BATCH_SIZE]], buf);
    double beta;
    if (!read_double(&layout->entries[layout->field[F_BETA]], buf, &beta))
        return Py_NewRef(NOT_HANDLED);
    if (f->capacity >= 0 && n > f->capacity) /* refused by the general path */
        return Py_NewRef(NOT_HANDLED);
    Py_ssize_t waiting = PyObject_Length(f->pending_samples);
    int done = get_truth(f->state_fields, S_done);
    if (waiting < 0 || done < 0)
        return NULL;
    if (waiting > 0 || done) /* others wait, or the run is over (END): the general path's order */
        return Py_NewRef(NOT_HANDLED);
    long long size;
    if (get_ll(f->memory_fields, S_size, &size) < 0)
        return NULL;
    PyObject *args[2] = {PyLong_FromSsize_t(n), PyLong_FromLongLong(size)};
    int can = args[0] && args[1] ? call_truth(f->can_sample, args, 2) : -1;
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    if (can <= 0)
        return can < 0 ? NULL : Py_NewRef(NOT_HANDLED);
    int64_t memory_time = 0;
    PyObject *reply = build_batch(f, n, beta, request_id, &memory_time);
    if (reply != NULL && reply != NOT_HANDLED)
        record(f, T_SAMPLE, now_ns() - t0, memory_time);
    return reply;
}

static PyObject *fast_update(FastPath *f, Layout *layout, const char *buf, int64_t t0) {
    Entry *indices = &layout->entries[layout->field[F_INDICES]];
    Entry *priorities = &layout->entries[layout->field[F_PRIORITIES]];
    Py_ssize_t n = indices->dims[0];
    long long learner_updates = read_ll(&layout->entries[layout->field[F_LEARNER_UPDATES]], buf);
    long long credit = 0;
    double beta = 0.0;
    int has_credit = layout->field[F_CREDIT] >= 0;
    if (has_credit) { /* ReplayNode._add_credit reads both (a credit without beta is the general path's error) */
        if (layout->field[F_BETA] < 0 || !read_double(&layout->entries[layout->field[F_BETA]], buf, &beta))
            return Py_NewRef(NOT_HANDLED);
        credit = read_ll(&layout->entries[layout->field[F_CREDIT]], buf);
    }
    int64_t memory_time = 0;
    if (f->prioritized && n) { /* PrioritizedReplay.update_priorities, validated before anything changes */
        int indices_wide = PyDataType_ELSIZE(indices->descr) == 8 && indices->descr->kind == 'i';
        int indices_narrow = PyDataType_ELSIZE(indices->descr) == 4 && indices->descr->kind == 'i';
        int priorities_size = (int)PyDataType_ELSIZE(priorities->descr);
        if (f->tree == Py_None || !(indices_wide || indices_narrow) || (priorities_size != 8 && priorities_size != 4))
            return Py_NewRef(NOT_HANDLED);
        long long size;
        if (get_ll(f->memory_fields, S_size, &size) < 0)
            return NULL;
        double batch_max;
        SumTree *tree = (SumTree *)f->tree;
        const char *index_data = buf + indices->offset, *priority_data = buf + priorities->offset;
        if (f->tree_api->check(tree, index_data, indices_wide, priority_data, priorities_size == 8, n, size, &batch_max) < 0) {
            PyErr_Clear();
            return Py_NewRef(NOT_HANDLED);
        }
        int64_t m0 = now_ns();
        f->tree_api->write(tree, index_data, indices_wide, priority_data, priorities_size == 8, n, batch_max);
        if (add_ll(f->memory_fields, S_updated_items, n) < 0 || add_ll(f->memory_fields, S_updates, 1) < 0)
            return NULL;
        memory_time = now_ns() - m0;
    }
    if (set_ll(f->state_fields, S_learner_updates, learner_updates) < 0)
        return NULL;
    if (has_credit) {
        long long held;
        if (get_ll(f->state_fields, S_credit, &held) < 0)
            return NULL;
        held += credit;
        PyObject *beta_value = PyFloat_FromDouble(beta);
        int failed = beta_value == NULL || set_ll(f->state_fields, S_credit, held < f->max_credit ? held : f->max_credit) < 0 ||
                     set_field(f->state_fields, S_beta, beta_value) < 0;
        Py_XDECREF(beta_value);
        if (failed)
            return NULL;
    }
    record(f, T_UPDATE, now_ns() - t0, memory_time);
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(handle_doc,
"handle(peer, message)\n--\n\n"
"Serve one message the way the general path would: the reply's bytes to send, True when it was\n"
"served without a reply, None when the general path must take it (nothing was changed).");

static PyObject *FastPath_handle(FastPath *f, PyObject *const *args, Py_ssize_t nargs) {
    if (not_initialised(f->ready, "FastPath"))
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "handle(peer, message)");
        return NULL;
    }
    int64_t t0 = now_ns();
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return Py_NewRef(NOT_HANDLED);
    }
    const char *buf = view.buf;
    PyObject *result = NOT_HANDLED;
    int op = view.len >= HEADER_BYTES ? (unsigned char)buf[3] : 0;
    PyObject *peer = NULL;
    if (f->allowed[op] == NULL)
        goto done;
    int may = peer_may_send(f, f->peers, args[0], op, &peer);
    if (may <= 0) {
        result = may < 0 ? NULL : NOT_HANDLED;
        goto done;
    }
    Layout *layout;
    uint32_t request_id;
    int parsed = parse(f->codec, buf, view.len, f->max_bytes, &layout, &request_id);
    if (parsed != PARSED) {
        if (parsed == FAILED) /* the general path decodes it again and answers the WireError */
            PyErr_Clear();
        goto done;
    }
    if (!values_pass(layout, buf)) {
        Py_DECREF(layout);
        goto done;
    }
    if (op == f->op_insert)
        result = fast_insert(f, args[0], peer, layout, buf, request_id, t0);
    else if (op == f->op_sample)
        result = fast_sample(f, layout, buf, request_id, t0);
    else
        result = fast_update(f, layout, buf, t0);
    if (result != NULL && result != NOT_HANDLED) { /* (an INSERT checked the budget before its reply) */
        long long produced;
        if ((op != f->op_insert && (get_ll(f->state_fields, S_produced, &produced) < 0 ||
                                    check_deadline(f, produced, now_ns()) < 0)) || drain_if_full(f) < 0)
            Py_CLEAR(result);
    }
    Py_DECREF(layout);
    Py_DECREF(peer);
    PyBuffer_Release(&view);
    return result;
done:
    Py_XDECREF(peer);
    PyBuffer_Release(&view);
    if (result == NOT_HANDLED)
        Py_INCREF(result);
    return result;
}

PyDoc_STRVAR(batch_doc,
"batch(batch_size, beta, request_id=0)\n--\n\n"
"A BATCH message drawn now (memory sample, then the rate limiter's sampled), or None when the\n"
"general path must draw it (the memory would refuse).");

static PyObject *FastPath_batch(FastPath *f, PyObject *args) {
    if (not_initialised(f->ready, "FastPath"))
        return NULL;
    Py_ssize_t n;
    double beta;
    unsigned long request_id = 0;
    if (!PyArg_ParseTuple(args, "nd|k", &n, &beta, &request_id))
        return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be at least 1");
        return NULL;
    }
    int64_t memory_time;
    return build_batch(f, n, beta, (uint32_t)request_id, &memory_time);
}

PyDoc_STRVAR(take_timings_doc,
"take_timings()\n--\n\n"
"{'serve.OP': int64 ns, 'memory.OP': int64 ns} of the messages served since the last call.");

static PyObject *FastPath_take_timings(FastPath *f, PyObject *unused) {
    PyObject *timings = PyDict_New();
    if (timings == NULL)
        return NULL;
    for (int k = 0; k < N_TIMED; k++) {
        npy_intp count = f->timed[k];
        if (!count)
            continue;
        int64_t *sources[2] = {f->serve_ns[k], f->memory_ns[k]};
        const char *prefixes[2] = {"serve.", "memory."};
        for (int which = 0; which < 2; which++) {
            PyObject *array = PyArray_SimpleNew(1, &count, NPY_INT64);
            PyObject *key = array ? PyUnicode_FromFormat("%s%s", prefixes[which], TIMED_NAMES[k]) : NULL;
            if (key == NULL || PyDict_SetItem(timings, key, array) < 0) {
                Py_XDECREF(array);
                Py_XDECREF(key);
                Py_DECREF(timings);
                return NULL;
            }
            memcpy(PyArray_DATA((PyArrayObject *)array), sources[which], count * sizeof(int64_t));
            Py_DECREF(array);
            Py_DECREF(key);
        }
        f->timed[k] = 0;
    }
    return timings;
}

static PyObject *FastPath_handled(FastPath *f, void *closure) {
    PyObject *counts = PyDict_New();
    for (int k = 0; counts && k < N_TIMED; k++) {
        PyObject *value = PyLong_FromLongLong(f->handled[k]);
        if (value == NULL || PyDict_SetItemString(counts, TIMED_NAMES[k], value) < 0) {
            Py_XDECREF(value);
            Py_CLEAR(counts);
            break;
        }
        Py_DECREF(value);
    }
    return counts;
}

static int FastPath_init(FastPath *f, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"codec", "memory", "tree", "rng", "int64", "peers", "state", "pending_samples",
                               "limiter", "allowed", "ops", "total_steps", "deadline", "capacity", "max_message_bytes",
                               "max_credit", "prioritized", "check_deadline", "hold_insert", "drain", "max_held",
                               "mass", NULL};
    PyObject *codec, *memory, *tree, *rng, *int64_type, *peers, *state, *pending, *limiter, *allowed, *ops;
    PyObject *check_deadline, *hold_insert, *drain;
    if (f->codec != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a FastPath is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOO!OOOO!O!LdnnLpOOOL|p", keywords, &CodecType, &codec, &memory,
                                     &tree, &rng, &int64_type, &PyDict_Type, &peers, &state, &pending, &limiter,
                                     &PyDict_Type, &allowed, &PyDict_Type, &ops, &f->total_steps, &f->deadline_s,
                                     &f->capacity, &f->max_bytes, &f->max_credit, &f->prioritized, &check_deadline,
                                     &hold_insert, &drain, &f->max_held, &f->mass))
        return -1;
    f->codec = (Codec *)Py_NewRef(codec);
    f->memory = Py_NewRef(memory);
    f->tree = Py_NewRef(tree);
    f->int64_type = Py_NewRef(int64_type);
    f->peers = Py_NewRef(peers);
    f->state = Py_NewRef(state);
    f->pending_samples = Py_NewRef(pending);
    f->check_deadline = Py_NewRef(check_deadline);
    f->hold_insert = Py_NewRef(hold_insert);
    f->drain = Py_NewRef(drain);
    PyObject *holders[2] = {state, memory};
    PyObject **fields[2] = {&f->state_fields, &f->memory_fields};
    for (int i = 0; i < 2; i++) {
        *fields[i] = PyObject_GenericGetDict(holders[i], NULL);
        if (*fields[i] == NULL) { /* no instance dict (slots): attributes, then */
            PyErr_Clear();
            *fields[i] = Py_NewRef(holders[i]);
        }
    }
    if (f->capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "the fast path needs a memory of known capacity");
        return -1;
    }
    PyObject *sumtree = PyImport_ImportModule("rlbench._sumtree"); /* PyCapsule_Import imports only "rlbench" */
    if (sumtree == NULL)
        return -1;
    Py_DECREF(sumtree);
    f->tree_api = PyCapsule_Import(SUMTREE_CAPSULE, 0);
    if (f->tree_api == NULL)
        return -1;
    if (f->tree != Py_None && !PyObject_TypeCheck(f->tree, f->tree_api->type)) {
        PyErr_SetString(PyExc_TypeError, "tree must be an rlbench._sumtree.SumTree or None");
        return -1;
    }
    f->inserted = PyObject_GetAttrString(limiter, "inserted");
    f->can_insert = PyObject_GetAttrString(limiter, "can_insert");
    f->can_sample = PyObject_GetAttrString(limiter, "can_sample");
    f->sampled = PyObject_GetAttrString(limiter, "sampled");
    f->rng_random = PyObject_GetAttrString(rng, "random");
    f->rng_integers = PyObject_GetAttrString(rng, "integers");
    f->zero = PyLong_FromLong(0);
    f->dtype_keyword = Py_BuildValue("(s)", "dtype");
    if (!f->inserted || !f->can_insert || !f->can_sample || !f->sampled || !f->rng_random || !f->rng_integers ||
        !f->zero || !f->dtype_keyword)
        return -1;
    /* allowed: {op code: frozenset of roles} for the ops served here (messages.ALLOWED_ROLES) */
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(allowed, &position, &key, &value)) {
        long op = PyLong_AsLong(key);
        if (op < 0 || op > 255 || !PyAnySet_Check(value)) {
            PyErr_SetString(PyExc_ValueError, "allowed maps op codes to sets of roles");
            return -1;
        }
        Py_INCREF(value);
        Py_XSETREF(f->allowed[op], value);
    }
    /* ops: {"INSERT": code, ...} of the ops this code builds or serves */
    const char *names[] = {"INSERT", "INSERTED", "SAMPLE", "BATCH", "UPDATE_PRIORITIES"};
    int *codes[] = {&f->op_insert, &f->op_inserted, &f->op_sample, &f->op_batch, &f->op_update};
    for (int i = 0; i < 5; i++) {
        PyObject *code = PyDict_GetItemString(ops, names[i]);
        if (code == NULL) {
            PyErr_Format(PyExc_KeyError, "ops lacks %s", names[i]);
            return -1;
        }
        *codes[i] = (int)PyLong_AsLong(code);
    }
    for (int op = 0; op < 256; op++)
        if (f->allowed[op] != NULL && op != f->op_insert && op != f->op_sample && op != f->op_update) {
            PyErr_Format(PyExc_ValueError, "the fast path serves INSERT, SAMPLE and UPDATE_PRIORITIES, not op %d", op);
            return -1;
        }
    if (PyErr_Occurred())
        return -1;
    f->ready = 1;
    return 0;
}

static int FastPath_traverse(FastPath *f, visitproc visit, void *arg) {
    Py_VISIT(f->codec);
    Py_VISIT(f->memory);
    Py_VISIT(f->tree);
    Py_VISIT(f->peers);
    Py_VISIT(f->state);
    Py_VISIT(f->state_fields);
    Py_VISIT(f->memory_fields);
    Py_VISIT(f->pending_samples);
    Py_VISIT(f->inserted);
    Py_VISIT(f->can_insert);
    Py_VISIT(f->can_sample);
    Py_VISIT(f->sampled);
    Py_VISIT(f->rng_random);
    Py_VISIT(f->rng_integers);
    Py_VISIT(f->check_deadline);
    Py_VISIT(f->hold_insert);
    Py_VISIT(f->drain);
    Py_VISIT(f->fit_columns);
    return 0;
}

static int FastPath_clear(FastPath *f) {
    Py_CLEAR(f->codec);
    Py_CLEAR(f->memory);
    Py_CLEAR(f->tree);
    Py_CLEAR(f->int64_type);
    Py_CLEAR(f->peers);
    Py_CLEAR(f->state);
    Py_CLEAR(f->state_fields);
    Py_CLEAR(f->memory_fields);
    Py_CLEAR(f->pending_samples);
    Py_CLEAR(f->inserted);
    Py_CLEAR(f->can_insert);
    Py_CLEAR(f->can_sample);
    Py_CLEAR(f->sampled);
    Py_CLEAR(f->rng_random);
    Py_CLEAR(f->rng_integers);
    Py_CLEAR(f->zero);
    Py_CLEAR(f->dtype_keyword);
    Py_CLEAR(f->check_deadline);
    Py_CLEAR(f->hold_insert);
    Py_CLEAR(f->drain);
    Py_CLEAR(f->fit_columns);
    Py_CLEAR(f->fit_layout);
    for (int op = 0; op < 256; op++)
        Py_CLEAR(f->allowed[op]);
    return 0;
}

static void FastPath_dealloc(FastPath *f) {
    PyObject_GC_UnTrack(f);
    FastPath_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyMethodDef FastPath_methods[] = {
    {"handle", (PyCFunction)(void (*)(void))FastPath_handle, METH_FASTCALL, handle_doc},
    {"batch", (PyCFunction)FastPath_batch, METH_VARARGS, batch_doc},
    {"take_timings", (PyCFunction)FastPath_take_timings, METH_NOARGS, take_timings_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FastPath_getset[] = {
    {"handled", (getter)FastPath_handled, NULL, "messages served here, per op", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlbench._wire.FastPath",
    .tp_basicsize = sizeof(FastPath),
    .tp_dealloc = (destructor)FastPath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("The replay node's fast path for the core memories (see the module notes)."),
    .tp_traverse = (traverseproc)FastPath_traverse,
    .tp_clear = (inquiry)FastPath_clear,
    .tp_methods = FastPath_methods,
    .tp_getset = FastPath_getset,
    .tp_init = (initproc)FastPath_init,
    .tp_new = PyType_GenericNew,
};

/* ============================================================================ module */

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT, "_wire", "The wire's codec and the replay node's fast path (see wire.c).", -1, NULL,
};

static int intern_names(void) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&S_refused, "refused"}, {&S_authenticated, "authenticated"}, {&S_role, "role"},
        {&S_last_insert, "last_insert"}, {&S_held, "held"}, {&S_produced, "produced"}, {&S_stored, "stored"}, {&S_done, "done"},
        {&S_first_insert_t, "first_insert_t"}, {&S_last_insert_t, "last_insert_t"},
        {&S_params_version, "params_version"}, {&S_learner_updates, "learner_updates"}, {&S_credit, "credit"},
        {&S_beta, "beta"}, {&S_size, "_size"}, {&S_cursor, "_cursor"}, {&S_adds, "_adds"},
        {&S_add_calls, "_add_calls"}, {&S_samples, "_samples"}, {&S_sampled_items, "_sampled_items"},
        {&S_updates, "_updates"}, {&S_updated_items, "_updated_items"}, {&S_columns, "_columns"},
        {&S_indices, "indices"}, {&S_weights, "weights"}, {&S_step, "step"}, {&S_finished, "finished"},
        {&S_mass, "mass"}, {&S_min_mass, "min_mass"}, {&S_total, "total"}, {&S_min, "min"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__wire(void) {
    import_array();
    if (PyType_Ready(&LayoutType) < 0 || PyType_Ready(&CodecType) < 0 || PyType_Ready(&FastPathType) < 0 ||
        intern_names() < 0)
        return NULL;
    NOT_HANDLED = Py_None;
    PyObject *module = PyModule_Create(&wire_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&CodecType);
    Py_INCREF(&FastPathType);
    if (PyModule_AddObject(module, "Codec", (PyObject *)&CodecType) < 0 ||
        PyModule_AddObject(module, "FastPath", (PyObject *)&FastPathType) < 0 ||
        PyModule_AddObject(module, "FORMATS", Py_BuildValue("(ssss)", HEADER_FORMAT, DESCRIPTOR_FORMAT, SHAPE_FORMAT,
                                                            NBYTES_FORMAT)) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* Exact, in-order tabular TD updates (Q-learning and SARSA) over a batch of transitions.
 *
 * One call applies a whole batch (or `sweeps` passes over a whole offline dataset) so the Python
 * overhead is paid once per batch. Transition i sees every update of transitions < i: this is the
 * sequential semantics a PIM or FPGA engine is compared against.
 *
 * The Python layer (rlbench.builtin.tabular_cpu) checks keys, dtypes and shapes and converts each
 * batch; this module checks buffer formats and lengths again and every index's range in a first
 * pass, before touching the table, so no call can write out of bounds or half-apply a batch.
 *
 * Build flags matter for exactness: -std=c11 keeps GCC from contracting a*b+c into an FMA, so the
 * arithmetic matches a float64 Python reference bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { N_ARRAYS = 7 };
enum { Q, OBS, ACTION, REWARD, NEXT_OBS, NEXT_ACTION, DONE };
static const char *NAMES[N_ARRAYS] = {"q", "obs", "action", "reward", "next_obs", "next_action", "done"};

/* The last character of a struct-module format, ignoring byte-order prefixes ('<', '=', '@'). */
static char format_code(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    size_t n = strlen(f);
    return n ? f[n - 1] : 'B';
}

static int format_ok(const Py_buffer *view, int which) {
    char code = format_code(view);
    switch (which) {
    case Q:
    case REWARD:
        return view->itemsize == 8 && code == 'd';
    case DONE:
        return view->itemsize == 1 && (code == 'B' || code == '?' || code == 'b');
    default:
        return view->itemsize == 8 && (code == 'l' || code == 'q');
    }
}

static const char *format_expected(int which) {
    return which == Q || which == REWARD ? "float64" : which == DONE ? "uint8" : "int64";
}

static void release_all(Py_buffer *views, const int *held) {
    for (int i = 0; i < N_ARRAYS; i++)
        if (held[i]) PyBuffer_Release(&views[i]);
}

/* Returns the first out-of-range (array index, row) or row -1 when every index is in range. */
static Py_ssize_t first_bad_row(const int64_t *a, Py_ssize_t n, int64_t limit) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] < 0 || a[i] >= limit) return i;
    return -1;
}

static void apply(double *q, Py_ssize_t n_actions, const int64_t *obs, const int64_t *action,
                  const double *reward, const int64_t *next_obs, const int64_t *next_action,
                  const uint8_t *done, Py_ssize_t n, int sarsa, double alpha, double gamma, long sweeps) {
    for (long sweep = 0; sweep < sweeps; sweep++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            double target = reward[i];
            if (!done[i]) {
                const double *row = q + (Py_ssize_t)next_obs[i] * n_actions;
                double bootstrap;
                if (sarsa) {
                    bootstrap = row[next_action[i]];
                } else {
                    bootstrap = row[0];
                    for (Py_ssize_t k = 1; k < n_actions; k++)
                        if (row[k] > bootstrap) bootstrap = row[k];
                }
                target = target + gamma * bootstrap;
            }
            double *qa = q + (Py_ssize_t)obs[i] * n_actions + action[i];
            *qa = *qa + alpha * (target - *qa);
        }
    }
}

PyDoc_STRVAR(td_update_doc,
"td_update(q, obs, action, reward, next_obs, next_action, done, sarsa, alpha, gamma, sweeps)\n\n"
"Apply `sweeps` in-order passes of TD updates to q (float64, C-contiguous, 2-D) in place.\n"
"Index arrays are int64, reward float64, done uint8; next_action may be None unless sarsa.\n"
"Returns None, or (name, row, value) for the first out-of-range index (q is then untouched).");

static PyObject *td_update(PyObject *self, PyObject *args) {
    PyObject *objects[N_ARRAYS];
    int sarsa;
    double alpha, gamma;
    long sweeps;
    if (!PyArg_ParseTuple(args, "OOOOOOOpddl:td_update", &objects[Q], &objects[OBS], &objects[ACTION],
                          &objects[REWARD], &objects[NEXT_OBS], &objects[NEXT_ACTION], &objects[DONE], &sarsa,
                          &alpha, &gamma, &sweeps))
        return NULL;
    if (sweeps < 0) {
        PyErr_SetString(PyExc_ValueError, "sweeps must be >= 0");
        return NULL;
    }
    if (sarsa && objects[NEXT_ACTION] == Py_None) {
        PyErr_SetString(PyExc_ValueError, "the sarsa rule needs next_action");
        return NULL;
    }

    Py_buffer views[N_ARRAYS];
    int held[N_ARRAYS] = {0};
    for (int i = 0; i < N_ARRAYS; i++) {
        if (i == NEXT_ACTION && objects[i] == Py_None) continue;
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (i == Q ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objects[i], &views[i], flags) < 0) {
            release_all(views, held);
            return NULL;
        }
        held[i] = 1;
        if (!format_ok(&views[i], i)) {
            PyErr_Format(PyExc_TypeError, "%s must be %s, got format '%s' with itemsize %zd", NAMES[i],
                         format_expected(i), views[i].format ? views[i].format : "B", views[i].itemsize);
            release_all(views, held);
            return NULL;
        }
    }
    if (views[Q].ndim != 2) {
        PyErr_SetString(PyExc_ValueError, "q must be 2-D (n_states, n_actions)");
        release_all(views, held);
        return NULL;
    }
    Py_ssize_t n_states = views[Q].shape[0], n_actions = views[Q].shape[1];
    if (n_states < 1 || n_actions < 1) {
        PyErr_SetString(PyExc_ValueError, "q must have at least one state and one action");
        release_all(views, held);
        return NULL;
    }
    Py_ssize_t n = views[OBS].len / views[OBS].itemsize;
    for (int i = OBS; i < N_ARRAYS; i++) {
        if (held[i] && views[i].len / views[i].itemsize != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd rows, obs has %zd", NAMES[i],
                         views[i].len / views[i].itemsize, n);
            release_all(views, held);
            return NULL;
        }
    }

    const int64_t *obs = views[OBS].buf, *action = views[ACTION].buf, *next_obs = views[NEXT_OBS].buf;
    const int64_t *next_action = held[NEXT_ACTION] ? views[NEXT_ACTION].buf : NULL;
    struct { int which; const int64_t *a; Py_ssize_t limit; } checks[] = {
        {OBS, obs, n_states}, {ACTION, action, n_actions}, {NEXT_OBS, next_obs, n_states},
        {NEXT_ACTION, sarsa ? next_action : NULL, n_actions}};
    for (size_t c = 0; c < sizeof checks / sizeof checks[0]; c++) {
        if (checks[c].a == NULL) continue;
        Py_ssize_t row = first_bad_row(checks[c].a, n, (int64_t)checks[c].limit);
        if (row >= 0) {
            PyObject *bad = Py_BuildValue("(snL)", NAMES[checks[c].which], row, (long long)checks[c].a[row]);
            release_all(views, held);
            return bad;
        }
    }

    double *q = views[Q].buf;
    const double *reward = views[REWARD].buf;
    const uint8_t *done = views[DONE].buf;
    Py_BEGIN_ALLOW_THREADS
    apply(q, n_actions, obs, action, reward, next_obs, next_action, done, n, sarsa, alpha, gamma, sweeps);
    Py_END_ALLOW_THREADS
    release_all(views, held);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"td_update", td_update, METH_VARARGS, td_update_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tabular",
    "Exact in-order tabular Q-learning / SARSA updates (the CPU tabular engine's inner loop).", -1, methods,
};

PyMODINIT_FUNC PyInit__tabular(void) { return PyModule_Create(&module); }

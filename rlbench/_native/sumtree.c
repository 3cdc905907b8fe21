/* placeholder: replaced by the real module */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_sumtree", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__sumtree(void) { return PyModule_Create(&mod); }

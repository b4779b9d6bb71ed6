/* A read of a packed record from the page cache without letting go of the GIL (optional: built by
 * `pip install` where a C compiler and the Python headers are there; shadefs/cache/segments.py falls back to
 * os.pread otherwise).
 *
 * os.pread lets go of the GIL for its system call, as every blocking call must. A packed NVMe hit reads a few
 * hundred bytes that are nearly always in the page cache (a microsecond); letting go of the GIL for that
 * may hand it to another FUSE reader thread, and taking it back then waits until that thread lets go in
 * turn: a GIL hand-off (a futex wake and a context switch each way) for a copy of a microsecond.
 *
 * pread_cached(fd, n, offset) reads with preadv2(RWF_NOWAIT) while holding the GIL: the kernel copies the bytes
 * only if every page is in the page cache and answers EAGAIN instead of starting any I/O, so the GIL is never
 * held across a device read. It returns the n bytes, or an int when they are not all there at once: the errno
 * (EAGAIN: not all in the page cache; EOPNOTSUPP: the file system, tmpfs for one, reads nothing this way;
 * any other error), or 0 for a short read. The caller then reads with os.pread, which waits for the device,
 * raises the error, or finds the end of the file.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sys/uio.h>

static PyObject *pread_cached(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t n;
    long long offset;
    if (!PyArg_ParseTuple(args, "inL", &fd, &n, &offset))
        return NULL;
    if (n < 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length or offset");
        return NULL;
    }
#ifdef RWF_NOWAIT
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        return NULL;
    struct iovec iov = {PyBytes_AS_STRING(out), (size_t)n};
    ssize_t got = preadv2(fd, &iov, 1, (off_t)offset, RWF_NOWAIT);  /* the GIL held: never waits for I/O */
    int err = got < 0 ? errno : 0;
    if (got == n)
        return out;
    Py_DECREF(out);
    return PyLong_FromLong(err);
#else
    return PyLong_FromLong(EOPNOTSUPP);
#endif
}

static PyMethodDef methods[] = {
    {"pread_cached", pread_cached, METH_VARARGS,
     "pread_cached(fd, n, offset) -> bytes or int: n bytes at offset if all are in the page cache, read "
     "without letting go of the GIL; otherwise the errno (0: a short read), and the caller reads with os.pread"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pread",
                                    "Reads of packed records from the page cache, the GIL held.", -1, methods};

PyMODINIT_FUNC PyInit__pread(void) { return PyModule_Create(&module); }

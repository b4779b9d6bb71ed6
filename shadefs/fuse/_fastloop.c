/* The kernel front end's reader loop in C (optional: built by `pip install` when a C compiler and the
 * Python headers are there; shadefs/fuse/kernel.py falls back to its Python loop otherwise).
 *
 * serve(fd, buf, dispatch, release, stop, open=None) reads FUSE requests from `fd` (a clone of /dev/fuse, or a
 * SOCK_SEQPACKET socket in the tests) into the bytearray `buf` without holding the GIL and:
 *
 * - answers RELEASE itself, without the GIL (the reply is the bare out header, whatever the handle), and
 *   keeps the released file handle numbers; `release(list_of_fh)` drops them in one Python call the next
 *   time this loop takes the GIL: before it dispatches any other request (an OPEN pays for the RELEASEs
 *   before it), when 256 are kept, and 2 ms after the first of them was answered (the fd is non-blocking;
 *   a read that finds no request polls until then; a run of RELEASEs checks the clock after each). A
 *   released handle therefore never outlives its thread's next dispatch, 255 more RELEASEs, or ~2 ms (and
 *   the wait for the GIL): an OPEN of the same file on another thread that must see the release (a
 *   passthrough backing file of a dropped entry generation) waits that long, not for the next request.
 * - answers IOCTL itself, without the GIL: ENOTTY (shadefs implements no ioctl; the kernel sends one per
 *   isatty() of an open file, e.g. Python's buffered open(), and has no way to be told to stop: it turns
 *   an ENOSYS reply into ENOTTY for that call only, fs/fuse/ioctl.c);
 * - hands OPEN to `open(fd, unique, nodeid, flags, pid)` with the GIL: it returns (fh, open_flags,
 *   backing_id) for the reply this loop writes (a reply the kernel refuses, its opener interrupted, puts
 *   fh with the released ones), or None when it replied itself or handed the open to a worker;
 * - hands every other request to `dispatch(fd, buf, opcode, unique, nodeid, n)` with the GIL (n: the
 *   request's length in bytes; opcode 0 for a request shorter than its header).
 *
 * It returns when the fd ends or fails (0 for end of file, else the errno: ENODEV when unmounted), or
 * when `stop.stopped` is true after a dispatch. So a kernel-cached open (OPEN + RELEASE) takes the GIL once,
 * not twice, and the loop's own work (the read, the header, the RELEASE reply) is no interpreted code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FUSE_RELEASE 18
#define IN_HEADER 40   /* struct fuse_in_header */
#define RELEASE_IN 24  /* struct fuse_release_in: fh flags release_flags lock_owner */
#define KEPT_MAX 256
#define IDLE_FLUSH_MS 2
#define FUSE_OPEN 14
#define FUSE_IOCTL 39

struct in_header { uint32_t len, opcode; uint64_t unique, nodeid; uint32_t uid, gid, pid; uint16_t total_extlen, padding; };
struct out_header { uint32_t len; int32_t error; uint64_t unique; };

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static long long release_replies;   /* RELEASEs answered here (read under the GIL by released()) */
static long long ioctl_replies;     /* IOCTLs answered here (atomic: counted without the GIL) */

static int flush(PyObject *release, uint64_t *kept, int *nkept) {
    if (*nkept == 0)
        return 0;
    PyObject *list = PyList_New(*nkept);
    if (list == NULL)
        return -1;
    for (int i = 0; i < *nkept; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(kept[i]);
        if (v == NULL) { Py_DECREF(list); return -1; }
        PyList_SET_ITEM(list, i, v);
    }
    release_replies += *nkept;
    *nkept = 0;
    PyObject *r = PyObject_CallOneArg(release, list);
    Py_DECREF(list);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *serve(PyObject *self, PyObject *args) {
    int fd;
    PyObject *buf, *dispatch, *release, *stop, *open_cb = Py_None;
    if (!PyArg_ParseTuple(args, "iO!OOO|O", &fd, &PyByteArray_Type, &buf, &dispatch, &release, &stop, &open_cb))
        return NULL;
    Py_ssize_t size = PyByteArray_GET_SIZE(buf);
    if (size < IN_HEADER + RELEASE_IN) {
        PyErr_SetString(PyExc_ValueError, "buffer too small for a FUSE request");
        return NULL;
    }
    PyObject *stopped_name = PyUnicode_InternFromString("stopped");
    if (stopped_name == NULL)
        return NULL;
    Py_INCREF(buf);  /* this loop reads into it without the GIL: it must not go away (nor be resized: private) */
    char *p = PyByteArray_AS_STRING(buf);
    uint64_t kept[KEPT_MAX];
    int nkept = 0;
    long long kept_since = 0;  /* now_us() when the first kept handle was answered */
    long result = -1;
    for (;;) {
        ssize_t n;
        int err = 0;
        Py_BEGIN_ALLOW_THREADS
        for (;;) {
            n = read(fd, p, (size_t)size);
            if (n < 0) {
                err = errno;
                if (err == EINTR || err == ENOENT)   /* ENOENT: interrupted before we got it */
                    continue;
                if (err == EAGAIN) {
                    /* no request: wait for one; with handles kept, until IDLE_FLUSH_MS after the first,
                       then hand them back (a busy loop gives them back with its next dispatch) */
                    int wait_ms = -1;
                    if (nkept) {
                        long long left = kept_since + IDLE_FLUSH_MS * 1000 - now_us();
                        if (left <= 0)
                            break;
                        wait_ms = (int)((left + 999) / 1000);
                    }
                    struct pollfd pf = {fd, POLLIN, 0};
                    if (poll(&pf, 1, wait_ms) == 0)
                        break;
                    continue;
                }
                break;
            }
            if (n >= IN_HEADER + 8 && ((struct in_header *)p)->opcode == FUSE_RELEASE && nkept < KEPT_MAX) {
                struct out_header out = {sizeof out, 0, ((struct in_header *)p)->unique};
                uint64_t fh;
                memcpy(&fh, p + IN_HEADER, sizeof fh);
                (void)!write(fd, &out, sizeof out);  /* ENOENT: the kernel no longer waits; nothing to undo */
                long long t = now_us();
                if (nkept == 0)
                    kept_since = t;
                kept[nkept++] = fh;
                if (nkept == KEPT_MAX || t - kept_since >= IDLE_FLUSH_MS * 1000)
                    break;
                continue;
            }
            if (n >= IN_HEADER && ((struct in_header *)p)->opcode == FUSE_IOCTL) {
                struct out_header out = {sizeof out, -ENOTTY, ((struct in_header *)p)->unique};
                (void)!write(fd, &out, sizeof out);
                __atomic_add_fetch(&ioctl_replies, 1, __ATOMIC_RELAXED);
                if (nkept && now_us() - kept_since >= IDLE_FLUSH_MS * 1000)
                    break;
                continue;
            }
            break;
        }
        Py_END_ALLOW_THREADS
        if (flush(release, kept, &nkept) < 0)
            goto out;
        if (n < 0) {
            if (err == EAGAIN)
                continue;
            result = err;
            break;
        }
        if (n == 0) {
            result = 0;
            break;
        }
        if ((n >= IN_HEADER + 8 && ((struct in_header *)p)->opcode == FUSE_RELEASE) ||
            (n >= IN_HEADER && ((struct in_header *)p)->opcode == FUSE_IOCTL))
            continue;  /* answered above (a RELEASE filled the kept list) */
        struct in_header *h = (struct in_header *)p;
        PyObject *r;
        if (n >= IN_HEADER + 8 && h->opcode == FUSE_OPEN && open_cb != Py_None) {
            uint32_t oflags;
            memcpy(&oflags, p + IN_HEADER, sizeof oflags);
            uint64_t unique = h->unique;
            r = PyObject_CallFunction(open_cb, "iKKIk", fd, (unsigned long long)unique,
                                      (unsigned long long)h->nodeid, (unsigned int)oflags, (unsigned long)h->pid);
            if (r == NULL)
                goto out;
            if (r != Py_None) {  /* (fh, open_flags, backing_id): the reply is written here */
                unsigned long long fh;
                unsigned int fl;
                int bid;
                if (!PyArg_ParseTuple(r, "KIi", &fh, &fl, &bid)) {
                    Py_DECREF(r);
                    goto out;
                }
                struct { struct out_header h; uint64_t fh; uint32_t open_flags; int32_t backing_id; } rep =
                    {{sizeof rep, 0, unique}, fh, fl, bid};
                ssize_t w;
                Py_BEGIN_ALLOW_THREADS
                w = write(fd, &rep, sizeof rep);
                Py_END_ALLOW_THREADS
                if (w != (ssize_t)sizeof rep) {
                    if (nkept == 0)
                        kept_since = now_us();
                    kept[nkept++] = fh;  /* the opener was interrupted: no RELEASE will come for this fh */
                }
            }
        } else if (n < IN_HEADER)
            r = PyObject_CallFunction(dispatch, "iOiKKn", fd, buf, 0, 0ULL, 0ULL, (Py_ssize_t)n);
        else
            r = PyObject_CallFunction(dispatch, "iOiKKn", fd, buf, (int)h->opcode, (unsigned long long)h->unique,
                                      (unsigned long long)h->nodeid, (Py_ssize_t)n);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        PyObject *s = PyObject_GetAttr(stop, stopped_name);
        if (s == NULL)
            goto out;
        int done = PyObject_IsTrue(s);
        Py_DECREF(s);
        if (done < 0)
            goto out;
        if (done) {
            result = 0;
            break;
        }
    }
out:
    Py_DECREF(buf);
    Py_DECREF(stopped_name);
    if (result < 0)
        return NULL;
    return PyLong_FromLong(result);
}

static PyObject *released(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(release_replies);
}

static PyObject *ioctls(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(__atomic_load_n(&ioctl_replies, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS, "serve(fd, buf, dispatch, release, stop, open=None) -> 0 or errno: the reader loop"},
    {"released", released, METH_NOARGS, "RELEASE requests answered by the compiled loop so far"},
    {"ioctls", ioctls, METH_NOARGS, "IOCTL requests answered (ENOTTY) by the compiled loop so far"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastloop", "The kernel front end's reader loop in C.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__fastloop(void) { return PyModule_Create(&module); }

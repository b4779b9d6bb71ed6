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
 *   a read that finds no request polls until then; a run of RELEASEs checks the clock after each; with no
 *   handle kept the fd is blocking, so that the kernel wakes one reader thread per request). A
 *   released handle therefore never outlives its thread's next dispatch, 255 more RELEASEs, or ~2 ms (and
 *   the wait for the GIL): an OPEN of the same file on another thread that must see the release (a
 *   passthrough backing file of a dropped entry generation) waits that long, not for the next request.
 * - answers IOCTL itself, without the GIL: ENOTTY (shadefs implements no ioctl; the kernel sends one per
 *   isatty() of an open file, e.g. Python's buffered open(), and has no way to be told to stop: it turns
 *   an ENOSYS reply into ENOTTY for that call only, fs/fuse/ioctl.c);
 * - hands OPEN to `open(fd, unique, nodeid, flags, pid)` with the GIL: it returns (fh, open_flags,
 *   backing_id) for the reply this loop writes (a reply the kernel refuses, its opener interrupted, puts
 *   fh with the released ones), or None when it replied itself or handed the open to a worker;
 * - with `residents` (a Residents, below) and `drain`: answers the OPEN of a file published there, and the
 *   READ and RELEASE of the handles it gave, without the GIL, logging each open; while requests keep
 *   coming, `drain()` is called with the GIL (the cache applies the log) ~2 ms after the first open this
 *   loop logged, or after 256, and whenever the loop takes the GIL anyway (a loop that goes idle leaves
 *   the log to the front end's periodic apply, KernelFrontend.run);
 * - hands every other request to `dispatch(fd, buf, opcode, unique, nodeid, n)` with the GIL (n: the
 *   request's length in bytes; opcode 0 for a request shorter than its header).
 *
 * It returns when the fd ends or fails (0 for end of file, else the errno: ENODEV when unmounted), or
 * when `stop.stopped` is true after a dispatch (the handles kept for release are dropped first). So a kernel-cached open (OPEN + RELEASE) takes the GIL once,
 * not twice, and the loop's own work (the read, the header, the RELEASE reply) is no interpreted code.
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* PTHREAD_MUTEX_ADAPTIVE_NP */
#endif
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/uio.h>
#include <fcntl.h>
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
#define FUSE_READ 15
#define READ_IN 40     /* struct fuse_read_in: fh offset size read_flags lock_owner flags padding */
#define LOG_MAX 4096   /* hits logged and not yet drained, at most (beyond: the OPEN goes to Python) */
#define DRAIN_AT 256   /* a loop that logged this many hits (or 2 ms ago) drains the log */
#define SLOTS 65536    /* opens answered here and not yet released, at most */
#define C_FH ((uint64_t)1 << 62)  /* file handles of opens answered here: C_FH | slot (Python's count from 1) */

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


/* ---- the RAM tier's residents: OPEN and READ of a RAM hit answered without the GIL ----------------------
 *
 * Residents(num_files, open_flags) is a table fid -> entry (the RAM store's own bytes object, a strong
 * reference) that the cache fills under its lock (publish: at a Python RAM hit of the file) and empties
 * under its lock (retire: a RAM victim, before the eviction decides on its pins). serve() answers an OPEN of
 * a published file itself: a file handle C_FH | slot, `open_flags` (FOPEN_KEEP_CACHE with kernel_cache), one
 * ref on the entry, and a hit logged (fid, opener pid, size); a READ of such a handle is answered from the
 * entry's bytes, its RELEASE drops the ref. take() (under the cache lock, with the GIL) hands the log to the
 * cache, which counts, tells the policy, the plans and the trace, in order; and the Pins of retired entries
 * whose last C-answered open was released since. An entry retired while C-answered opens hold it keeps
 * its bytes (the reference) until the last of them is released; retire() ties a Python Pin to it, so that
 * the cache counts those bytes as held (pinned) exactly as for its own open handles.
 * One mutex guards the table, the slots and the log (held for a few loads and stores, never with the GIL
 * wanted: the Python side takes it with the GIL held, the C side never asks for the GIL while holding it). */
typedef struct entry {
    PyObject *bytes;         /* the RAM store's bytes object (strong) */
    const char *data;
    uint64_t size;
    uint32_t fid;
    uint32_t refs;           /* C-answered opens holding it, + 1 while in the table */
    PyObject *pin;           /* the cache's Pin tied to it at retire() while opens held it, or NULL */
    struct entry *next;      /* on the dead list */
} entry;

struct hit { uint32_t fid, pid; uint64_t size; };

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    uint32_t nfiles;
    uint32_t open_flags;
    entry **table;
    entry **slots;
    uint32_t *free_slots;
    uint32_t nfree;
    struct hit *log;
    uint32_t nlog;
    entry *dead;             /* retired, last C open released: freed (and their Pins handed back) by take() */
    uint32_t ndead;
    long long opens, reads, log_full, published;  /* under mu */
} Residents;

static void entry_free(entry *e) {   /* with the GIL */
    Py_XDECREF(e->bytes);
    Py_XDECREF(e->pin);
    PyMem_RawFree(e);
}

static PyObject *Residents_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    unsigned int nfiles, open_flags;
    if (!PyArg_ParseTuple(args, "II", &nfiles, &open_flags))
        return NULL;
    Residents *r = (Residents *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    pthread_mutexattr_t attr;   /* held for a few loads and stores: spin a little before sleeping in futex */
    pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&r->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    r->nfiles = nfiles;
    r->open_flags = open_flags;
    r->table = PyMem_RawCalloc(nfiles ? nfiles : 1, sizeof(entry *));
    r->slots = PyMem_RawCalloc(SLOTS, sizeof(entry *));
    r->free_slots = PyMem_RawMalloc(SLOTS * sizeof(uint32_t));
    r->log = PyMem_RawMalloc(LOG_MAX * sizeof(struct hit));
    if (!r->table || !r->slots || !r->free_slots || !r->log) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    for (uint32_t i = 0; i < SLOTS; i++)
        r->free_slots[i] = SLOTS - 1 - i;
    r->nfree = SLOTS;
    return (PyObject *)r;
}

static void Residents_dealloc(Residents *r) {
    if (r->table) {
        for (uint32_t i = 0; i < r->nfiles; i++)
            if (r->table[i] && --r->table[i]->refs == 0)
                entry_free(r->table[i]);
        PyMem_RawFree(r->table);
    }
    if (r->slots) {   /* opens still held at unmount: the kernel sends no more RELEASEs */
        for (uint32_t i = 0; i < SLOTS; i++)
            if (r->slots[i] && --r->slots[i]->refs == 0)
                entry_free(r->slots[i]);
        PyMem_RawFree(r->slots);
    }
    while (r->dead) {
        entry *e = r->dead;
        r->dead = e->next;
        entry_free(e);
    }
    PyMem_RawFree(r->free_slots);
    PyMem_RawFree(r->log);
    pthread_mutex_destroy(&r->mu);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* publish(fid, data) -> bool: answer opens of fid from the bytes object data (the RAM store's) until
   retire(fid); False (nothing done) when it is published already, or data is not bytes */
static PyObject *Residents_publish(Residents *r, PyObject *args) {
    unsigned int fid;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "IO", &fid, &data))
        return NULL;
    if (fid >= r->nfiles || !PyBytes_Check(data))
        Py_RETURN_FALSE;   /* (bytes only: immutable, and their buffer never moves) */
    pthread_mutex_lock(&r->mu);
    entry *old = r->table[fid];
    pthread_mutex_unlock(&r->mu);
    if (old != NULL)
        Py_RETURN_FALSE;   /* published already (its bytes: the store holds one object per residency) */
    entry *e = PyMem_RawMalloc(sizeof *e);
    if (e == NULL)
        return PyErr_NoMemory();
    Py_INCREF(data);
    e->bytes = data;
    e->data = PyBytes_AS_STRING(data);
    e->size = (uint64_t)PyBytes_GET_SIZE(data);
    e->fid = fid;
    e->refs = 1;
    e->pin = NULL;
    e->next = NULL;
    pthread_mutex_lock(&r->mu);
    r->table[fid] = e;   /* only the cache (under its lock) writes the table: nobody published it meanwhile */
    r->published++;
    pthread_mutex_unlock(&r->mu);
    Py_RETURN_TRUE;
}

/* retire(fid, pin) -> bool: no more opens of fid are answered here. True when C-answered opens still hold
   its entry: `pin` is tied to it (the caller counts one ref of pin for them, handed back by take() when the
   last of them is released). */
static PyObject *Residents_retire(Residents *r, PyObject *args) {
    unsigned int fid;
    PyObject *pin;
    if (!PyArg_ParseTuple(args, "IO", &fid, &pin))
        return NULL;
    if (fid >= r->nfiles)
        Py_RETURN_FALSE;
    entry *free_it = NULL;
    int held = 0;
    pthread_mutex_lock(&r->mu);
    entry *e = r->table[fid];
    if (e != NULL) {
        r->table[fid] = NULL;
        if (--e->refs == 0)
            free_it = e;
        else {
            held = 1;
            Py_INCREF(pin);
            e->pin = pin;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (free_it)
        entry_free(free_it);
    return PyBool_FromLong(held);
}

/* take() -> (fids, pids, sizes, pins): the hits logged since the last take, in order, and the Pins of
   retired entries whose last C-answered open was released; frees those entries */
static PyObject *Residents_take(Residents *r, PyObject *unused) {
    struct hit local[256];
    struct hit *hits = local;
    pthread_mutex_lock(&r->mu);
    uint32_t n = r->nlog;
    if (n > 256) {
        hits = PyMem_RawMalloc(n * sizeof(struct hit));
        if (hits == NULL) {
            pthread_mutex_unlock(&r->mu);
            return PyErr_NoMemory();
        }
    }
    memcpy(hits, r->log, n * sizeof(struct hit));
    r->nlog = 0;
    entry *dead = r->dead;
    r->dead = NULL;
    r->ndead = 0;
    pthread_mutex_unlock(&r->mu);
    PyObject *fids = PyList_New(n), *pids = PyList_New(n), *sizes = PyList_New(n), *pins = PyList_New(0);
    PyObject *out = NULL;
    if (fids && pids && sizes && pins) {
        uint32_t i;
        for (i = 0; i < n; i++) {
            PyObject *a = PyLong_FromUnsignedLong(hits[i].fid), *b = PyLong_FromUnsignedLong(hits[i].pid),
                     *c = PyLong_FromUnsignedLongLong(hits[i].size);
            if (!a || !b || !c) {
                Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c);
                break;
            }
            PyList_SET_ITEM(fids, i, a);
            PyList_SET_ITEM(pids, i, b);
            PyList_SET_ITEM(sizes, i, c);
        }
        if (i == n)
            out = PyTuple_Pack(4, fids, pids, sizes, pins);
    }
    while (dead) {   /* handed back even on an error above: the entries go */
        entry *e = dead;
        dead = e->next;
        if (e->pin && out && PyList_Append(pins, e->pin) < 0)
            Py_CLEAR(out);
        entry_free(e);
    }
    if (hits != local)
        PyMem_RawFree(hits);
    Py_XDECREF(fids); Py_XDECREF(pids); Py_XDECREF(sizes); Py_XDECREF(pins);
    return out;
}

/* pending() -> int: hits logged plus dead entries not taken yet (0: take() has nothing to do) */
static PyObject *Residents_pending(Residents *r, PyObject *unused) {
    return PyLong_FromUnsignedLong(__atomic_load_n(&r->nlog, __ATOMIC_RELAXED) +
                                   __atomic_load_n(&r->ndead, __ATOMIC_RELAXED));
}

static PyObject *Residents_counters(Residents *r, PyObject *unused) {
    pthread_mutex_lock(&r->mu);
    long long o = r->opens, rd = r->reads, lf = r->log_full, pb = r->published;
    uint32_t held = SLOTS - r->nfree;
    pthread_mutex_unlock(&r->mu);
    return Py_BuildValue("{sLsLsLsLsI}", "opens", o, "reads", rd, "log_full", lf, "published", pb, "held", held);
}

static PyMethodDef Residents_methods[] = {
    {"publish", (PyCFunction)Residents_publish, METH_VARARGS, "publish(fid, data) -> bool"},
    {"retire", (PyCFunction)Residents_retire, METH_VARARGS, "retire(fid, pin) -> bool (held by open handles)"},
    {"take", (PyCFunction)Residents_take, METH_NOARGS, "take() -> (fids, pids, sizes, pins)"},
    {"pending", (PyCFunction)Residents_pending, METH_NOARGS, "pending() -> hits and dead entries not taken"},
    {"counters", (PyCFunction)Residents_counters, METH_NOARGS, "counters() -> dict"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ResidentsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shadefs.fuse._fastloop.Residents",
    .tp_basicsize = sizeof(Residents),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The RAM tier's residents whose OPEN and READ the compiled loop answers without the GIL.",
    .tp_new = Residents_new,
    .tp_dealloc = (destructor)Residents_dealloc,
    .tp_methods = Residents_methods,
};

/* Without the GIL: answer an OPEN of a published file (1), or leave it to Python (0). */
static int c_open(Residents *r, int fd, const char *p, ssize_t n, uint32_t *slot_out) {
    const struct in_header *h = (const struct in_header *)p;
    uint32_t oflags;
    memcpy(&oflags, p + IN_HEADER, sizeof oflags);
    if (oflags & (O_WRONLY | O_RDWR | O_TRUNC | O_APPEND) || h->nodeid < 2 || h->nodeid - 2 >= r->nfiles)
        return 0;
    uint32_t fid = (uint32_t)(h->nodeid - 2);
    pthread_mutex_lock(&r->mu);
    entry *e = r->table[fid];
    if (e == NULL || r->nfree == 0 || r->nlog >= LOG_MAX) {
        if (e != NULL)
            r->log_full++;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    e->refs++;
    uint32_t slot = r->free_slots[--r->nfree];
    *slot_out = slot;
    __atomic_store_n(&r->slots[slot], e, __ATOMIC_RELEASE);
    struct hit *hl = &r->log[r->nlog];
    hl->fid = fid;
    hl->pid = h->pid;
    hl->size = e->size;
    __atomic_store_n(&r->nlog, r->nlog + 1, __ATOMIC_RELAXED);
    r->opens++;
    pthread_mutex_unlock(&r->mu);
    struct { struct out_header h; uint64_t fh; uint32_t open_flags; int32_t backing_id; } rep =
        {{sizeof rep, 0, h->unique}, C_FH | slot, r->open_flags, 0};
    return 1 + (write(fd, &rep, sizeof rep) != (ssize_t)sizeof rep);  /* 2: not delivered (interrupted) */
}

/* Without the GIL: the RELEASE of a handle answered here (or an OPEN reply the kernel refused); 1 when it
   was the last hold on a retired entry (take() frees it). */
static int c_release(Residents *r, uint64_t fh) {
    uint32_t slot = (uint32_t)(fh & ~C_FH);
    int dead = 0;
    if (slot >= SLOTS)
        return 0;
    pthread_mutex_lock(&r->mu);
    entry *e = r->slots[slot];
    if (e != NULL) {
        r->slots[slot] = NULL;
        r->free_slots[r->nfree++] = slot;
        if (--e->refs == 0) {   /* retired meanwhile: freed (its Pin handed back) by the next take() */
            e->next = r->dead;
            r->dead = e;
            __atomic_store_n(&r->ndead, r->ndead + 1, __ATOMIC_RELAXED);
            dead = 1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return dead;
}

/* Without the GIL: a READ of a handle answered here, from the entry's bytes. */
static void c_read(Residents *r, int fd, const char *p) {
    uint64_t fh, off;
    uint32_t size;
    memcpy(&fh, p + IN_HEADER, 8);
    memcpy(&off, p + IN_HEADER + 8, 8);
    memcpy(&size, p + IN_HEADER + 16, 4);
    uint32_t slot = (uint32_t)(fh & ~C_FH);
    /* the slot was filled before the OPEN reply was written and is emptied only by this handle's RELEASE,
       which the kernel sends after its last READ */
    entry *e = slot < SLOTS ? __atomic_load_n(&r->slots[slot], __ATOMIC_ACQUIRE) : NULL;
    struct out_header out = {sizeof out, 0, ((const struct in_header *)p)->unique};
    struct iovec iov[2] = {{&out, sizeof out}, {NULL, 0}};
    if (e == NULL) {
        out.error = -EBADF;
        (void)!writev(fd, iov, 1);
        return;
    }
    size_t len = 0;
    if (off < e->size) {
        len = e->size - off;
        if (len > size)
            len = size;
    }
    iov[1].iov_base = (void *)(e->data + (len ? off : 0));
    iov[1].iov_len = len;
    out.len = (uint32_t)(sizeof out + len);
    (void)!writev(fd, iov, len ? 2 : 1);
    __atomic_add_fetch(&r->reads, 1, __ATOMIC_RELAXED);
}

static PyObject *serve(PyObject *self, PyObject *args) {
    int fd;
    PyObject *buf, *dispatch, *release, *stop, *open_cb = Py_None, *res_obj = Py_None, *drain = Py_None;
    if (!PyArg_ParseTuple(args, "iO!OOO|OOO", &fd, &PyByteArray_Type, &buf, &dispatch, &release, &stop, &open_cb,
                          &res_obj, &drain))
        return NULL;
    if (res_obj != Py_None && !PyObject_TypeCheck(res_obj, &ResidentsType)) {
        PyErr_SetString(PyExc_TypeError, "residents must be a Residents or None");
        return NULL;
    }
    Residents *res = res_obj == Py_None || drain == Py_None ? NULL : (Residents *)res_obj;
    long long logged_since = 0;  /* now_us() when this loop first logged a hit (or freed an entry) since its drain */
    int logged = 0;
    Py_ssize_t size = PyByteArray_GET_SIZE(buf);
    if (size < IN_HEADER + RELEASE_IN) {
        PyErr_SetString(PyExc_ValueError, "buffer too small for a FUSE request");
        return NULL;
    }
    PyObject *stopped_name = PyUnicode_InternFromString("stopped");
    if (stopped_name == NULL)
        return NULL;
    Py_INCREF(buf);  /* this loop reads into it without the GIL: it must not go away (nor be resized: private) */
    Py_XINCREF(res_obj);
    char *p = PyByteArray_AS_STRING(buf);
    uint64_t kept[KEPT_MAX];
    int nkept = 0;
    /* With residents (most opens answered here, so few handles kept), the fd is blocking while no released
       handle is kept: the kernel wakes one blocked reader per request (an exclusive wait), where a poll()
       wakes every reader thread polling the connection. With handles kept it is non-blocking, so that a
       read that finds no request hands them back after IDLE_FLUSH_MS. Without residents every OPEN keeps
       its RELEASE: the fd stays non-blocking (two fcntl calls per open would cost more than the wake-ups). */
    int fl0 = res != NULL ? fcntl(fd, F_GETFL) : -1;
    int nonblock = fl0 >= 0 && (fl0 & O_NONBLOCK);
    long long kept_since = 0;  /* now_us() when the first kept handle was answered */
    long result = -1;
    for (;;) {
        ssize_t n;
        int err = 0, answered = 0;
        Py_BEGIN_ALLOW_THREADS
        for (;;) {
            if (fl0 >= 0 && (nkept > 0) != nonblock &&
                fcntl(fd, F_SETFL, nkept > 0 ? fl0 | O_NONBLOCK : fl0 & ~O_NONBLOCK) == 0)
                nonblock = nkept > 0;
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
            if (res != NULL && n >= IN_HEADER + 8) {
                uint32_t op = ((struct in_header *)p)->opcode;
                uint64_t fh;
                memcpy(&fh, p + IN_HEADER, sizeof fh);
                int mine = 0;
                if (op == FUSE_OPEN) {
                    uint32_t slot;
                    int r = c_open(res, fd, p, n, &slot);
                    if (r) {
                        mine = 1;
                        logged++;
                        if (r == 2 && c_release(res, C_FH | slot))
                            logged++;  /* the opener was interrupted: no RELEASE comes for it */
                    }
                } else if (op == FUSE_RELEASE && (fh & C_FH)) {
                    struct out_header out = {sizeof out, 0, ((struct in_header *)p)->unique};
                    (void)!write(fd, &out, sizeof out);
                    mine = 1;
                    if (c_release(res, fh))
                        logged++;
                } else if (op == FUSE_READ && n >= IN_HEADER + READ_IN && (fh & C_FH)) {
                    c_read(res, fd, p);
                    mine = 1;
                }
                if (mine) {
                    long long t = 0;
                    if (logged && !logged_since)
                        logged_since = t = now_us();
                    if (logged >= DRAIN_AT) {
                        answered = 1;
                        break;
                    }
                    if (logged || nkept) {
                        if (!t)
                            t = now_us();
                        if ((logged && t - logged_since >= IDLE_FLUSH_MS * 1000) ||
                            (nkept && t - kept_since >= IDLE_FLUSH_MS * 1000)) {
                            answered = 1;
                            break;
                        }
                    }
                    continue;
                }
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
                if (nkept == KEPT_MAX || t - kept_since >= IDLE_FLUSH_MS * 1000 ||
                    (logged_since && t - logged_since >= IDLE_FLUSH_MS * 1000)) {
                    answered = 1;
                    break;
                }
                continue;
            }
            if (n >= IN_HEADER && ((struct in_header *)p)->opcode == FUSE_IOCTL) {
                struct out_header out = {sizeof out, -ENOTTY, ((struct in_header *)p)->unique};
                (void)!write(fd, &out, sizeof out);
                __atomic_add_fetch(&ioctl_replies, 1, __ATOMIC_RELAXED);
                if ((nkept && now_us() - kept_since >= IDLE_FLUSH_MS * 1000) ||
                    (logged_since && now_us() - logged_since >= IDLE_FLUSH_MS * 1000)) {
                    answered = 1;
                    break;
                }
                continue;
            }
            break;
        }
        Py_END_ALLOW_THREADS
        if (flush(release, kept, &nkept) < 0)
            goto out;
        if (logged_since) {  /* this loop's hits (and freed entries) go to the cache within ~2 ms, or 256 */
            logged_since = 0;
            logged = 0;
            PyObject *d = PyObject_CallNoArgs(drain);
            if (d == NULL)
                goto out;
            Py_DECREF(d);
        }
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
        if (answered)
            continue;  /* answered above (a RELEASE filled the kept list, or a drain is due) */
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
        if (done) {  /* the front end stops, or this reader retires (a spare serves in its place) */
            if (flush(release, kept, &nkept) < 0)
                goto out;
            result = 0;
            break;
        }
    }
out:
    Py_DECREF(buf);
    Py_XDECREF(res_obj);
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
    {"serve", serve, METH_VARARGS,
     "serve(fd, buf, dispatch, release, stop, open=None, residents=None, drain=None) -> 0 or errno: the reader loop"},
    {"released", released, METH_NOARGS, "RELEASE requests answered by the compiled loop so far"},
    {"ioctls", ioctls, METH_NOARGS, "IOCTL requests answered (ENOTTY) by the compiled loop so far"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastloop", "The kernel front end's reader loop in C.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__fastloop(void) {
    if (PyType_Ready(&ResidentsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ResidentsType);
    if (PyModule_AddObject(m, "Residents", (PyObject *)&ResidentsType) < 0) {
        Py_DECREF(&ResidentsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* The native anchor of `python -m shadefs.bench hit_native --ramfs BINARY`: a native libfuse3 low-level server that holds a whole source tree in RAM and
 * serves it read-only with keep_cache (what a shadefs RAM hit does, minus the interpreter). Usage: ramfs SRC MNT
 * [-s] (single-threaded loop) [-n] (no-open mode: OPEN answered ENOSYS, so the kernel sends no OPEN/RELEASE and
 * keeps the pages). Build: gcc -O2 -o /tmp/ramfs shadefs/bench/ramfs.c $(pkg-config --cflags --libs fuse3)  (apt: libfuse3-dev,
 * pkg-config, gcc). Not part of shadefs: a reference point only. */
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { char *name; fuse_ino_t parent; int isdir; char *data; size_t size; } node_t;
static node_t *nodes; static size_t nn, cap; static int no_open;
static fuse_ino_t add(const char *name, fuse_ino_t parent, int isdir, char *data, size_t size) {
    if (nn == cap) { cap = cap ? cap * 2 : 1024; nodes = realloc(nodes, cap * sizeof(node_t)); }
    nodes[nn] = (node_t){strdup(name), parent, isdir, data, size}; return ++nn; /* ino = index + 1 */
}
static void scan(const char *path, fuse_ino_t ino) {
    DIR *d = opendir(path); struct dirent *e; char p[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name); struct stat st; stat(p, &st);
        if (S_ISDIR(st.st_mode)) { fuse_ino_t c = add(e->d_name, ino, 1, NULL, 0); scan(p, c); }
        else { int fd = open(p, O_RDONLY); char *b = malloc(st.st_size ? st.st_size : 1); size_t o = 0; ssize_t r;
               while (o < (size_t)st.st_size && (r = read(fd, b + o, st.st_size - o)) > 0) o += r; close(fd);
               add(e->d_name, ino, 0, b, st.st_size); }
    }
    closedir(d);
}
static void fill(fuse_ino_t ino, struct stat *st) {
    memset(st, 0, sizeof *st); st->st_ino = ino;
    if (ino == FUSE_ROOT_ID || nodes[ino - 1].isdir) { st->st_mode = S_IFDIR | 0755; st->st_nlink = 2; }
    else { st->st_mode = S_IFREG | 0444; st->st_nlink = 1; st->st_size = nodes[ino - 1].size; }
}
static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    for (size_t i = 0; i < nn; i++) if (nodes[i].parent == parent && !strcmp(nodes[i].name, name)) {
        struct fuse_entry_param e = {0}; e.ino = i + 1; e.attr_timeout = 3600; e.entry_timeout = 3600; fill(e.ino, &e.attr);
        fuse_reply_entry(req, &e); return; }
    fuse_reply_err(req, ENOENT);
}
static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct stat st; fill(ino, &st); fuse_reply_attr(req, &st, 3600);
}
static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    if (nodes[ino - 1].isdir) { fuse_reply_err(req, EISDIR); return; }
    if (no_open) { fuse_reply_err(req, ENOSYS); return; } /* the kernel stops sending OPEN/RELEASE, keeps pages */
    fi->keep_cache = 1; fuse_reply_open(req, fi);
}
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    node_t *n = &nodes[ino - 1];
    if ((size_t)off >= n->size) { fuse_reply_buf(req, NULL, 0); return; }
    if (off + size > n->size) size = n->size - off;
    fuse_reply_buf(req, n->data + off, size);
}
static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) { fuse_reply_err(req, 0); }
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    char *buf = calloc(1, size); size_t pos = 0; size_t k = 0;
    for (size_t i = 0; i < nn; i++) if (nodes[i].parent == ino) {
        if ((off_t)k++ < off) continue;
        struct stat st; fill(i + 1, &st);
        size_t l = fuse_add_direntry(req, buf + pos, size - pos, nodes[i].name, &st, k);
        if (l > size - pos) break; pos += l; }
    fuse_reply_buf(req, buf, pos); free(buf);
}
static const struct fuse_lowlevel_ops ops = { .lookup = op_lookup, .getattr = op_getattr, .open = op_open,
    .read = op_read, .release = op_release, .readdir = op_readdir };
int main(int argc, char **argv) {
    int single = 0; const char *src = argv[1], *mnt = argv[2];
    for (int i = 3; i < argc; i++) { if (!strcmp(argv[i], "-s")) single = 1; if (!strcmp(argv[i], "-n")) no_open = 1; }
    add("", 0, 1, NULL, 0); /* ino 1 = the root */
    scan(src, FUSE_ROOT_ID);
    char *fargv[] = {argv[0], "-o", "ro,default_permissions", NULL}; struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_session_mount(se, mnt)) return 1;
    fprintf(stderr, "ramfs: %zu nodes\n", nn);
    int r = single ? fuse_session_loop(se) : ({ struct fuse_loop_config *c = fuse_loop_cfg_create(); fuse_session_loop_mt(se, c); });
    fuse_session_unmount(se); fuse_session_destroy(se); return r;
}

/*
 * A CPU stand-in for NCCL + the CUDA runtime and HCCL + ACL, for hpfsdp's CI.
 *
 * It proves our FFI plumbing (symbol names, argument order, types, counts, displacements,
 * roots, peers, events, teardown), NOT the vendor libraries. Ranks are threads of the test
 * process; "device memory" is host memory from malloc, every device pointer passed to a
 * collective is checked to lie inside a live allocation, and every operation runs to
 * completion inside the call (streams are tokens, events are host timestamps).
 *
 * Reductions combine ranks in ascending order in float (bf16 widened, rounded once).
 * Build: cc -shared -fPIC -O1 -o libfake_collectives.so fake_collectives.c -lpthread
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define MAX_COMMS 256
#define MAX_ALLOCS 4096
#define ID_BYTES_MAX 4108

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;

/* ---------- allocations ---------- */
static struct { char *ptr; size_t size; } g_allocs[MAX_ALLOCS];

static int track(void *p, size_t size) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!g_allocs[i].ptr) { g_allocs[i].ptr = p; g_allocs[i].size = size; return 0; }
  return -1;
}
static int untrack(void *p) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (g_allocs[i].ptr == p) { g_allocs[i].ptr = NULL; return 0; }
  return -1;
}
/* 1 if [p, p+bytes) lies inside one live allocation. */
static int inside(const void *p, size_t bytes) {
  const char *c = p;
  int ok = 0;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < MAX_ALLOCS && !ok; i++)
    if (g_allocs[i].ptr && c >= g_allocs[i].ptr && c + bytes <= g_allocs[i].ptr + g_allocs[i].size) ok = 1;
  pthread_mutex_unlock(&g_lock);
  return ok;
}

/* ---------- element types and reductions ---------- */
enum { T_F32 = 0, T_BF16 = 1, T_BAD = -1 };
enum { R_SUM = 0, R_PROD = 1, R_MAX = 2, R_MIN = 3, R_AVG = 4 };

static size_t esize(int t) { return t == T_F32 ? 4 : 2; }
static float bf16_to_f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static float load(const void *p, int t, size_t i) {
  if (t == T_F32) { float f; memcpy(&f, (const char *)p + 4 * i, 4); return f; }
  uint16_t b; memcpy(&b, (const char *)p + 2 * i, 2); return bf16_to_f(b);
}
static void store(void *p, int t, size_t i, float v) {
  if (t == T_F32) memcpy((char *)p + 4 * i, &v, 4);
  else { uint16_t b = f_to_bf16(v); memcpy((char *)p + 2 * i, &b, 2); }
}
static float combine(int op, float a, float x) {
  switch (op) {
    case R_PROD: return a * x;
    case R_MAX: return (a != a || x != x) ? a + x : (x > a ? x : a);
    case R_MIN: return (a != a || x != x) ? a + x : (x < a ? x : a);
    default: return a + x;
  }
}

/* ---------- communicators ---------- */
typedef struct {
  const void *send; void *recv; size_t count; int dtype, op, root;
  const uint64_t *scounts, *sdispls, *rcounts, *rdispls;
  int color, key;
} Args;

typedef struct Comm {
  char id[ID_BYTES_MAX]; size_t id_len; int nranks, joined;
  long bgen; int bcount;         /* generation barrier */
  Args args[MAX_RANKS];
  long splits;                   /* split generation */
  struct Comm *split_children[MAX_RANKS];
} Comm;

typedef struct { Comm *c; int rank; int magic; } RankComm;
#define RC_MAGIC 0x5eed

static Comm *g_comms[MAX_COMMS];
static long g_id_counter;
static long g_split_calls;

static Comm *find_or_create(const char *id, size_t len, int nranks) {
  for (int i = 0; i < MAX_COMMS; i++)
    if (g_comms[i] && g_comms[i]->id_len == len && !memcmp(g_comms[i]->id, id, len) && g_comms[i]->joined < g_comms[i]->nranks)
      return g_comms[i];
  for (int i = 0; i < MAX_COMMS; i++)
    if (!g_comms[i]) {
      Comm *c = calloc(1, sizeof(Comm));
      memcpy(c->id, id, len); c->id_len = len; c->nranks = nranks;
      g_comms[i] = c; return c;
    }
  return NULL;
}

static void barrier(Comm *c) {
  pthread_mutex_lock(&g_lock);
  long g = c->bgen;
  if (++c->bcount == c->nranks) { c->bcount = 0; c->bgen++; pthread_cond_broadcast(&g_cond); }
  else while (g == c->bgen) pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
}

static RankComm *init_rank(const char *id, size_t len, int nranks, int rank) {
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return NULL;
  pthread_mutex_lock(&g_lock);
  Comm *c = find_or_create(id, len, nranks);
  if (!c || c->nranks != nranks) { pthread_mutex_unlock(&g_lock); return NULL; }
  c->joined++;
  pthread_cond_broadcast(&g_cond);
  while (c->joined < c->nranks) pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  RankComm *rc = calloc(1, sizeof(RankComm));
  rc->c = c; rc->rank = rank; rc->magic = RC_MAGIC;
  return rc;
}

static void make_id(char *out, size_t len) {
  memset(out, 0, len);
  pthread_mutex_lock(&g_lock);
  long n = ++g_id_counter;
  pthread_mutex_unlock(&g_lock);
  snprintf(out, len, "FAKE-ID pid=%ld n=%ld", (long)getpid(), n);
}

/* ---------- the collectives (each rank computes its own output) ---------- */
enum { K_AG, K_RS, K_AR, K_BC, K_A2A, K_A2AV };

static int run(RankComm *rc, int kind, Args a) {
  if (!rc || rc->magic != RC_MAGIC || a.dtype == T_BAD) return -1;
  Comm *c = rc->c; int n = c->nranks, me = rc->rank; size_t es = esize(a.dtype);
  size_t in_elems = 0, out_elems = 0;
  switch (kind) {
    case K_AG: in_elems = a.count; out_elems = a.count * n; break;
    case K_RS: in_elems = a.count * n; out_elems = a.count; break;
    case K_AR: case K_BC: in_elems = out_elems = a.count; break;
    case K_A2A: in_elems = out_elems = a.count * n; break;
    case K_A2AV:
      for (int j = 0; j < n; j++) {
        if (a.sdispls[j] + a.scounts[j] > in_elems) in_elems = a.sdispls[j] + a.scounts[j];
        if (a.rdispls[j] + a.rcounts[j] > out_elems) out_elems = a.rdispls[j] + a.rcounts[j];
      }
      break;
  }
  if ((kind == K_BC ? 0 : !inside(a.send, in_elems * es)) || !inside(a.recv, out_elems * es)) return -1;
  if (kind == K_BC && (a.root < 0 || a.root >= n)) return -1;
  c->args[me] = a;
  barrier(c);
  int err = 0;
  for (int j = 0; j < n; j++) if (c->args[j].count != a.count && kind != K_A2AV) err = 1;
  char *tmp = malloc(out_elems * es + 1);
  switch (kind) {
    case K_AG:
      for (int j = 0; j < n; j++) memcpy(tmp + j * a.count * es, c->args[j].send, a.count * es);
      break;
    case K_RS: case K_AR: {
      size_t off = kind == K_RS ? me * a.count : 0;
      for (size_t i = 0; i < a.count; i++) {
        float acc = load(c->args[0].send, a.dtype, off + i);
        for (int j = 1; j < n; j++) acc = combine(a.op, acc, load(c->args[j].send, a.dtype, off + i));
        if (a.op == R_AVG) acc /= (float)n;
        store(tmp, a.dtype, i, acc);
      }
      break;
    }
    case K_BC: memcpy(tmp, c->args[a.root].recv, a.count * es); break;
    case K_A2A:
      for (int j = 0; j < n; j++)
        memcpy(tmp + j * a.count * es, (const char *)c->args[j].send + me * a.count * es, a.count * es);
      break;
    case K_A2AV:
      for (int j = 0; j < n; j++) {
        const Args *p = &c->args[j];
        if (p->scounts[me] != a.rcounts[j]) { err = 1; continue; }
        memcpy(tmp + a.rdispls[j] * es, (const char *)p->send + p->sdispls[me] * es, a.rcounts[j] * es);
      }
      break;
  }
  barrier(c);
  if (!err) {
    if (kind == K_A2AV) {
      for (int j = 0; j < n; j++) memcpy((char *)a.recv + a.rdispls[j] * es, tmp + a.rdispls[j] * es, a.rcounts[j] * es);
    } else memcpy(a.recv, tmp, out_elems * es);
  }
  free(tmp);
  return err ? -1 : 0;
}

/* ---------- point to point: buffered mailbox, flushed at group end ---------- */
typedef struct Msg { Comm *c; int src, dst; size_t bytes; char *data; struct Msg *next; } Msg;
static Msg *g_mail;
typedef struct { int is_send; void *buf; size_t count; int dtype, peer; RankComm *rc; } P2p;
static __thread P2p t_ops[1024];
static __thread int t_nops, t_depth;

static int p2p_flush(void) {
  int err = 0;
  for (int i = 0; i < t_nops; i++) {
    P2p *o = &t_ops[i];
    if (!o->is_send) continue;
    size_t bytes = o->count * esize(o->dtype);
    if (!inside(o->buf, bytes) || o->peer < 0 || o->peer >= o->rc->c->nranks) { err = 1; continue; }
    Msg *m = calloc(1, sizeof(Msg));
    m->c = o->rc->c; m->src = o->rc->rank; m->dst = o->peer; m->bytes = bytes;
    m->data = malloc(bytes + 1); memcpy(m->data, o->buf, bytes);
    pthread_mutex_lock(&g_lock);
    Msg **tail = &g_mail; while (*tail) tail = &(*tail)->next; *tail = m;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
  }
  for (int i = 0; i < t_nops; i++) {
    P2p *o = &t_ops[i];
    if (o->is_send) continue;
    size_t bytes = o->count * esize(o->dtype);
    if (!inside(o->buf, bytes)) { err = 1; continue; }
    pthread_mutex_lock(&g_lock);
    Msg *m = NULL;
    for (;;) {
      Msg **pp = &g_mail;
      for (; *pp; pp = &(*pp)->next)
        if ((*pp)->c == o->rc->c && (*pp)->src == o->peer && (*pp)->dst == o->rc->rank) break;
      if (*pp) { m = *pp; *pp = m->next; break; }
      pthread_cond_wait(&g_cond, &g_lock);
    }
    pthread_mutex_unlock(&g_lock);
    if (m->bytes != bytes) err = 1; else memcpy(o->buf, m->data, bytes);
    free(m->data); free(m);
  }
  t_nops = 0;
  return err ? -1 : 0;
}
static int p2p_queue(int is_send, void *buf, size_t count, int dtype, int peer, RankComm *rc) {
  if (!rc || rc->magic != RC_MAGIC || dtype == T_BAD || t_nops >= 1024) return -1;
  P2p o = {is_send, buf, count, dtype, peer, rc};
  t_ops[t_nops++] = o;
  return t_depth == 0 ? p2p_flush() : 0;
}

/* ---------- split (collective over the parent) ---------- */
static RankComm *split(RankComm *rc, int color, int key, int *err) {
  Comm *c = rc->c; int n = c->nranks, me = rc->rank;
  Args a = {0}; a.color = color; a.key = key;
  c->args[me] = a;
  barrier(c);
  int newrank = 0, size = 0, first = -1;
  for (int j = 0; j < n; j++) {
    if (c->args[j].color != color || color < 0) continue;
    if (first < 0) first = j;
    size++;
    if (c->args[j].key < key || (c->args[j].key == key && j < me)) newrank++;
  }
  char id[64]; memset(id, 0, sizeof id);
  snprintf(id, sizeof id, "SPLIT %p gen=%ld color=%d", (void *)c, c->splits, color);
  barrier(c);
  if (me == 0) { pthread_mutex_lock(&g_lock); c->splits++; g_split_calls++; pthread_mutex_unlock(&g_lock); }
  barrier(c);
  *err = 0;
  if (color < 0) return NULL;
  RankComm *out = init_rank(id, sizeof id, size, newrank);
  if (!out) *err = 1;
  return out;
}

/* Test hook: how many splits were performed. */
long fake_split_calls(void) { pthread_mutex_lock(&g_lock); long n = g_split_calls; pthread_mutex_unlock(&g_lock); return n; }

/* ---------- timing ---------- */
static double now_ms(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6; }
typedef struct { double t; int recorded; } Ev;

/* =================== CUDA runtime =================== */
int cudaGetDeviceCount(int *n) { *n = 8; return 0; }
int cudaSetDevice(int d) { return d >= 0 && d < 8 ? 0 : 101; }
int cudaStreamCreate(void **s) { *s = malloc(16); return 0; }
int cudaStreamDestroy(void *s) { free(s); return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); pthread_mutex_lock(&g_lock); int r = track(*p, n); pthread_mutex_unlock(&g_lock); return r ? 2 : 0; }
int cudaFree(void *p) { pthread_mutex_lock(&g_lock); int r = untrack(p); pthread_mutex_unlock(&g_lock); if (r) return 1; free(p); return 0; }
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  if ((kind == 1 && !inside(dst, n)) || (kind == 2 && !inside(src, n))) return 1;
  memcpy(dst, src, n); return 0;
}
int cudaEventCreate(void **e) { *e = calloc(1, sizeof(Ev)); return 0; }
int cudaEventRecord(void *e, void *s) { (void)s; ((Ev *)e)->t = now_ms(); ((Ev *)e)->recorded = 1; return 0; }
int cudaEventSynchronize(void *e) { return ((Ev *)e)->recorded ? 0 : 400; }
int cudaEventQuery(void *e) { return ((Ev *)e)->recorded ? 0 : 600; }
int cudaEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(((Ev *)b)->t - ((Ev *)a)->t); return 0; }
int cudaEventDestroy(void *e) { free(e); return 0; }
const char *cudaGetErrorString(int code) { return code ? "fake cuda error" : "no error"; }

/* =================== NCCL =================== */
typedef struct { char internal[128]; } ncclUniqueId;
static int nt(int t) { return t == 7 ? T_F32 : t == 9 ? T_BF16 : T_BAD; }
static int nr(int code) { return code ? 4 /* ncclInvalidArgument */ : 0; }
int ncclGetVersion(int *v) { *v = 22005; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) { make_id(id->internal, 128); return 0; }
int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
  *comm = init_rank(id.internal, 128, nranks, rank); return *comm ? 0 : 4;
}
int ncclCommSplit(void *comm, int color, int key, void **out, void *config) {
  (void)config; int err; *out = split(comm, color, key, &err); return err ? 3 : 0;
}
int ncclCommDestroy(void *comm) { if (!comm || ((RankComm *)comm)->magic != RC_MAGIC) return 4; ((RankComm *)comm)->magic = 0; free(comm); return 0; }
const char *ncclGetErrorString(int r) { return r ? "fake nccl: invalid argument" : "no error"; }
int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *comm, void *st) {
  (void)st; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.op = op; return nr(run(comm, K_AR, a));
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *comm, void *st) {
  (void)st; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.op = op; return nr(run(comm, K_RS, a));
}
int ncclAllGather(const void *s, void *r, size_t n, int t, void *comm, void *st) {
  (void)st; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); return nr(run(comm, K_AG, a));
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, void *comm, void *st) {
  (void)st; if (s != r) return 4; /* hpfsdp always broadcasts in place */
  Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.root = root; return nr(run(comm, K_BC, a));
}
int ncclSend(const void *b, size_t n, int t, int peer, void *comm, void *st) { (void)st; return nr(p2p_queue(1, (void *)b, n, nt(t), peer, comm)); }
int ncclRecv(void *b, size_t n, int t, int peer, void *comm, void *st) { (void)st; return nr(p2p_queue(0, b, n, nt(t), peer, comm)); }
int ncclGroupStart(void) { t_depth++; return 0; }
int ncclGroupEnd(void) { if (t_depth <= 0) return 5; if (--t_depth == 0) return nr(p2p_flush()); return 0; }

/* =================== ACL =================== */
int aclInit(const char *cfg) { (void)cfg; return 0; }
int aclrtGetDeviceCount(uint32_t *n) { *n = 8; return 0; }
int aclrtSetDevice(int32_t d) { return d >= 0 && d < 8 ? 0 : 107001; }
int aclrtCreateStream(void **s) { return cudaStreamCreate(s); }
int aclrtDestroyStream(void *s) { return cudaStreamDestroy(s); }
int aclrtSynchronizeStream(void *s) { (void)s; return 0; }
int aclrtMalloc(void **p, size_t n, int policy) { (void)policy; return cudaMalloc(p, n) ? 207001 : 0; }
int aclrtFree(void *p) { return cudaFree(p) ? 100000 : 0; }
int aclrtMemcpy(void *dst, size_t max, const void *src, size_t n, int kind) {
  if (n > max) return 100000;
  return cudaMemcpy(dst, src, n, kind) ? 100000 : 0;
}
int aclrtCreateEventWithFlag(void **e, uint32_t flag) { if (!(flag & 0x8)) return 100000; return cudaEventCreate(e); }
int aclrtRecordEvent(void *e, void *s) { return cudaEventRecord(e, s); }
int aclrtSynchronizeEvent(void *e) { return cudaEventSynchronize(e) ? 100000 : 0; }
int aclrtEventElapsedTime(float *ms, void *a, void *b) { return cudaEventElapsedTime(ms, a, b); }
int aclrtDestroyEvent(void *e) { return cudaEventDestroy(e); }
const char *aclGetRecentErrMsg(void) { return "fake acl error"; }

/* =================== HCCL =================== */
typedef struct { char internal[4108]; } HcclRootInfo;
typedef struct { int type; void *buf; uint64_t count; int dataType; uint32_t remoteRank; } HcclSendRecvItem;
static int ht(int t) { return t == 4 ? T_F32 : t == 11 ? T_BF16 : T_BAD; }
static int hr(int code) { return code ? 1 /* HCCL_E_PARA */ : 0; }
int HcclGetRootInfo(HcclRootInfo *info) { make_id(info->internal, 4108); return 0; }
int HcclCommInitRootInfo(uint32_t n, const HcclRootInfo *info, uint32_t rank, void **comm) {
  *comm = init_rank(info->internal, 4108, (int)n, (int)rank); return *comm ? 0 : 1;
}
int HcclCommDestroy(void *comm) { return ncclCommDestroy(comm) ? 1 : 0; }
const char *HcclGetErrorString(int r) { return r ? "fake hccl: parameter error" : "no error"; }
int HcclAllReduce(void *s, void *r, uint64_t n, int t, int op, void *comm, void *st) {
  (void)st; if (op > R_MIN) return 1; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = ht(t); a.op = op; return hr(run(comm, K_AR, a));
}
int HcclReduceScatter(void *s, void *r, uint64_t n, int t, int op, void *comm, void *st) {
  (void)st; if (op > R_MIN) return 1; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = ht(t); a.op = op; return hr(run(comm, K_RS, a));
}
int HcclAllGather(void *s, void *r, uint64_t n, int t, void *comm, void *st) {
  (void)st; Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = ht(t); return hr(run(comm, K_AG, a));
}
int HcclBroadcast(void *b, uint64_t n, int t, uint32_t root, void *comm, void *st) {
  (void)st; Args a = {0}; a.send = b; a.recv = b; a.count = n; a.dtype = ht(t); a.root = (int)root; return hr(run(comm, K_BC, a));
}
int HcclAlltoAll(const void *s, uint64_t sc, int st_, const void *r, uint64_t rc, int rt, void *comm, void *st) {
  (void)st; if (sc != rc || st_ != rt) return 1;
  Args a = {0}; a.send = s; a.recv = (void *)r; a.count = sc; a.dtype = ht(st_); return hr(run(comm, K_A2A, a));
}
int HcclAlltoAllV(const void *s, const void *sc, const void *sd, int st_, const void *r, const void *rc, const void *rd, int rt, void *comm, void *st) {
  (void)st; if (st_ != rt) return 1;
  Args a = {0}; a.send = s; a.recv = (void *)r; a.dtype = ht(st_);
  a.scounts = sc; a.sdispls = sd; a.rcounts = rc; a.rdispls = rd; return hr(run(comm, K_A2AV, a));
}
int HcclBatchSendRecv(HcclSendRecvItem *items, uint32_t n, void *comm, void *st) {
  (void)st; t_depth++;
  int err = 0;
  for (uint32_t i = 0; i < n; i++)
    err |= p2p_queue(items[i].type == 0, items[i].buf, items[i].count, ht(items[i].dataType), (int)items[i].remoteRank, comm);
  t_depth--;
  err |= p2p_flush();
  return hr(err);
}

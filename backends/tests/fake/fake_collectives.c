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
 * It also stands in for the CUDA driver API (device name, PTX modules, the replay spin
 * kernel) and cuBLAS (a column-major bf16 GEMM computed on the host), and logs every call
 * per thread (fake_log_take) so tests can check what ran inside a timed region.
 * Build: cc -shared -fPIC -O1 -o libfake_collectives.so fake_collectives.c -lpthread
 */
#include <pthread.h>
#include <stdarg.h>
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

/* ---------- per-thread call log (test hook) ----------
 * Every runtime, driver, cuBLAS and collective entry point appends one line naming itself
 * (and the copy direction for copies), so a test can check what ran between two events. */
#define LOG_BYTES (1 << 20)
static __thread char *t_log;
static __thread size_t t_log_len;
static __thread int t_log_overflow;
static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  if (!t_log) { t_log = malloc(LOG_BYTES); t_log_len = 0; }
  if (!t_log || t_log_len + 256 >= LOG_BYTES) { t_log_overflow = 1; return; }
  va_list ap; va_start(ap, fmt);
  int n = vsnprintf(t_log + t_log_len, 255, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > 254) n = 254;
  t_log_len += (size_t)n;
  t_log[t_log_len++] = '\n';
}
/* Test hook: clear this thread's log. */
void fake_log_reset(void) { t_log_len = 0; t_log_overflow = 0; }
/* Test hook: copy this thread's log into out (NUL-terminated); returns its length, or -1 if
 * it overflowed or does not fit. */
long fake_log_take(char *out, size_t cap) {
  if (t_log_overflow || t_log_len + 1 > cap) return -1;
  if (t_log_len) memcpy(out, t_log, t_log_len);
  out[t_log_len] = 0;
  return (long)t_log_len;
}

/* =================== CUDA runtime =================== */
int cudaGetDeviceCount(int *n) { *n = 8; return 0; }
int cudaSetDevice(int d) { return d >= 0 && d < 8 ? 0 : 101; }
int cudaStreamCreate(void **s) { *s = malloc(16); return 0; }
int cudaStreamDestroy(void *s) { free(s); return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaMalloc(void **p, size_t n) { logf_("cudaMalloc %zu", n); *p = malloc(n ? n : 1); pthread_mutex_lock(&g_lock); int r = track(*p, n); pthread_mutex_unlock(&g_lock); return r ? 2 : 0; }
int cudaFree(void *p) { logf_("cudaFree"); pthread_mutex_lock(&g_lock); int r = untrack(p); pthread_mutex_unlock(&g_lock); if (r) return 1; free(p); return 0; }
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  logf_("cudaMemcpy %s %zu", kind == 1 ? "H2D" : kind == 2 ? "D2H" : "other", n);
  if ((kind == 1 && !inside(dst, n)) || (kind == 2 && !inside(src, n))) return 1;
  memcpy(dst, src, n); return 0;
}
/* Device-to-device only (what replay enqueues); both ends must be live allocations. */
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
  (void)stream; logf_("cudaMemcpyAsync %s %zu", kind == 3 ? "D2D" : "other", n);
  if (kind != 3 || !inside(dst, n) || !inside(src, n)) return 1;
  memmove(dst, src, n); return 0;
}
int cudaStreamWaitEvent(void *s, void *e, unsigned flags) {
  (void)s; logf_("cudaStreamWaitEvent %p", e);
  return flags == 0 ? 0 : 1;
}
int cudaEventCreate(void **e) { *e = calloc(1, sizeof(Ev)); return 0; }
int cudaEventRecord(void *e, void *s) { (void)s; logf_("cudaEventRecord %p", e); ((Ev *)e)->t = now_ms(); ((Ev *)e)->recorded = 1; return 0; }
int cudaEventSynchronize(void *e) { return ((Ev *)e)->recorded ? 0 : 400; }
int cudaEventQuery(void *e) { return ((Ev *)e)->recorded ? 0 : 600; }
int cudaEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(((Ev *)b)->t - ((Ev *)a)->t); return 0; }
int cudaEventDestroy(void *e) { free(e); return 0; }
const char *cudaGetErrorString(int code) { return code ? "fake cuda error" : "no error"; }

/* =================== CUDA driver API =================== */
/* The device name comes from FAKE_CUDA_DEVICE_NAME (default "NVIDIA H200"). Modules are PTX
 * text that must name a .version, a .target and the requested .entry; the one kernel the
 * stand-in can "run" is hpfsdp_spin(u64 ns), which sleeps that long on the host. */
typedef struct { char *text; } Module;
typedef struct { Module *m; char name[64]; } Function;
static long g_spin_launches;
static unsigned long long g_spin_ns;
static unsigned g_spin_grid, g_spin_block;
int cuInit(unsigned flags) { return flags ? 1 : 0; }
int cuDeviceGet(int *dev, int ordinal) { if (ordinal < 0 || ordinal >= 8) return 101; *dev = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int dev) {
  if (dev < 0 || dev >= 8 || len < 1) return 101;
  const char *n = getenv("FAKE_CUDA_DEVICE_NAME");
  snprintf(name, (size_t)len, "%s", n ? n : "NVIDIA H200");
  return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int dev) { (void)dev; if (attr != 16) return 1; *v = 4; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { static int ctxs[8]; if (dev < 0 || dev >= 8) return 101; *ctx = &ctxs[dev]; return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx ? 0 : 201; }
int cuModuleLoadData(void **module, const void *image) {
  const char *t = image;
  logf_("cuModuleLoadData");
  if (!t || !strstr(t, ".version") || !strstr(t, ".target") || !strstr(t, ".entry")) return 218; /* CUDA_ERROR_INVALID_PTX */
  Module *m = calloc(1, sizeof(Module)); m->text = strdup(t); *module = m; return 0;
}
int cuModuleGetFunction(void **f, void *module, const char *name) {
  Module *m = module; char want[80];
  if (!m || !name || strlen(name) > 60) return 400;
  snprintf(want, sizeof want, ".entry %s(", name);
  if (!strstr(m->text, want)) return 500; /* CUDA_ERROR_NOT_FOUND */
  Function *fn = calloc(1, sizeof(Function)); fn->m = m; snprintf(fn->name, sizeof fn->name, "%s", name); *f = fn; return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
  (void)stream; (void)extra; Function *fn = f;
  if (!fn || strcmp(fn->name, "hpfsdp_spin") || !params || !params[0] || gx < 1 || bx < 1 || gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem) return 1;
  unsigned long long ns; memcpy(&ns, params[0], 8);
  logf_("cuLaunchKernel hpfsdp_spin grid=%u block=%u ns=%llu", gx, bx, ns);
  pthread_mutex_lock(&g_lock); g_spin_launches++; g_spin_ns += ns; g_spin_grid = gx; g_spin_block = bx; pthread_mutex_unlock(&g_lock);
  struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
  while (nanosleep(&ts, &ts) != 0) {}
  return 0;
}
int cuGetErrorString(int code, const char **s) { *s = code ? "fake cuda driver error" : "no error"; return 0; }
/* Test hook: spin launches so far, their total nanoseconds, and the last grid and block. */
long fake_spin_launches(unsigned long long *ns, unsigned *grid, unsigned *block) {
  pthread_mutex_lock(&g_lock); long n = g_spin_launches; *ns = g_spin_ns; *grid = g_spin_grid; *block = g_spin_block; pthread_mutex_unlock(&g_lock); return n;
}

/* =================== cuBLAS =================== */
/* Column-major, op N only, bf16 operands (CUDA_R_16BF = 14), f32 compute (68), host alpha/beta. */
typedef struct { void *stream; int magic; } Blas;
int cublasCreate_v2(void **h) { Blas *b = calloc(1, sizeof(Blas)); b->magic = 0xb1a5; *h = b; return 0; }
int cublasDestroy_v2(void *h) { Blas *b = h; if (!b || b->magic != 0xb1a5) return 1; b->magic = 0; free(b); return 0; }
int cublasSetStream_v2(void *h, void *s) { Blas *b = h; if (!b || b->magic != 0xb1a5) return 1; b->stream = s; return 0; }
const char *cublasGetStatusString(int s) { return s ? "fake cublas: invalid value" : "CUBLAS_STATUS_SUCCESS"; }
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
    const void *A, int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
    const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute, int algo) {
  Blas *bl = h; (void)algo;
  logf_("cublasGemmStridedBatchedEx m=%d n=%d k=%d batch=%d", m, n, k, batch);
  if (!bl || bl->magic != 0xb1a5 || ta || tb || at != 14 || bt != 14 || ct != 14 || compute != 68) return 7;
  if (m < 1 || n < 1 || k < 1 || batch < 1 || lda < m || ldb < k || ldc < m || sa < 0 || sb < 0 || sc < 0) return 7;
  size_t spanA = (size_t)sa * (batch - 1) + (size_t)lda * k, spanB = (size_t)sb * (batch - 1) + (size_t)ldb * n;
  size_t spanC = (size_t)sc * (batch - 1) + (size_t)ldc * n;
  if (!inside(A, 2 * spanA) || !inside(B, 2 * spanB) || !inside(C, 2 * spanC)) return 7;
  float al, be; memcpy(&al, alpha, 4); memcpy(&be, beta, 4);
  for (int q = 0; q < batch; q++)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        float acc = 0;
        for (int l = 0; l < k; l++)
          acc += load(A, T_BF16, (size_t)sa * q + i + (size_t)l * lda) * load(B, T_BF16, (size_t)sb * q + l + (size_t)j * ldb);
        size_t c = (size_t)sc * q + i + (size_t)j * ldc;
        float old = be != 0 ? load(C, T_BF16, c) : 0;
        store(C, T_BF16, c, al * acc + be * old);
      }
  return 0;
}

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
  (void)st; logf_("ncclAllReduce %zu", n); Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.op = op; return nr(run(comm, K_AR, a));
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *comm, void *st) {
  (void)st; logf_("ncclReduceScatter %zu", n); Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.op = op; return nr(run(comm, K_RS, a));
}
int ncclAllGather(const void *s, void *r, size_t n, int t, void *comm, void *st) {
  (void)st; logf_("ncclAllGather %zu", n); Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); return nr(run(comm, K_AG, a));
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, void *comm, void *st) {
  (void)st; logf_("ncclBroadcast %zu", n); if (s != r) return 4; /* hpfsdp always broadcasts in place */
  Args a = {0}; a.send = s; a.recv = r; a.count = n; a.dtype = nt(t); a.root = root; return nr(run(comm, K_BC, a));
}
int ncclSend(const void *b, size_t n, int t, int peer, void *comm, void *st) { (void)st; logf_("ncclSend %zu", n); return nr(p2p_queue(1, (void *)b, n, nt(t), peer, comm)); }
int ncclRecv(void *b, size_t n, int t, int peer, void *comm, void *st) { (void)st; logf_("ncclRecv %zu", n); return nr(p2p_queue(0, b, n, nt(t), peer, comm)); }
int ncclGroupStart(void) { logf_("ncclGroupStart"); t_depth++; return 0; }
int ncclGroupEnd(void) { logf_("ncclGroupEnd"); if (t_depth <= 0) return 5; if (--t_depth == 0) return nr(p2p_flush()); return 0; }

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
int aclrtStreamWaitEvent(void *s, void *e) { return cudaStreamWaitEvent(s, e, 0) ? 100000 : 0; }
int aclrtMemcpyAsync(void *dst, size_t max, const void *src, size_t n, int kind, void *s) {
  if (n > max) return 100000;
  return cudaMemcpyAsync(dst, src, n, kind, s) ? 100000 : 0;
}
/* The SoC name comes from FAKE_ASCEND_SOC_NAME (default "Ascend910B2"). */
const char *aclrtGetSocName(void) { const char *n = getenv("FAKE_ASCEND_SOC_NAME"); return n ? n : "Ascend910B2"; }

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

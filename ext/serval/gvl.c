/*
 * Serval::Native::GVL - per-thread GVL accounting and a bounded trace buffer.
 *
 * On Ruby 3.2+ one process-wide internal thread event hook (READY, RESUMED,
 * SUSPENDED, EXITED) keeps, for every Ruby thread, nanoseconds spent
 *   running  - holding the GVL (RESUMED .. SUSPENDED)
 *   idle     - without the GVL and not asking for it: I/O, sleep, waiting in
 *              Core#next (SUSPENDED .. READY)
 *   stalled  - asking for the GVL, not yet holding it (READY .. RESUMED)
 *
 * A send overlaps the remote's work. A request that writes a query (the
 * write releases the GVL for a few microseconds), asks for the GVL back,
 * runs a few microseconds and blocks again on the answer has its database
 * working all the while it waited for the GVL. Inside a request, the hook
 * files such a wait as idle ("the link"): a short idle span (<=
 * SV_SEND_MAX_NS), a wait, a short run (< SV_LINK_RUN_NS), then an idle span
 * of at least SV_LINK_IN_NS - the answer still had not come when the GVL
 * came back. A short second idle span files nothing: a chain of local
 * system calls (Rack's static-file stat()s, 4 us each, a few us of Ruby
 * between) looks the same and its waits are real stall; an answer that came
 * while the thread waited for the GVL stays stall too, as before. The
 * request's shape gets the filed wait on the second idle span, so the model
 * (lib/serval/advice/workload.rb) sees the remote's whole time from the
 * send: without this, the more threads contend, the shorter the measured
 * I/O looks.
 *
 * Waiting for a CPU. One in-request idle span in SV_RQ_EVERY, drawn at
 * random, also has the thread's run-queue wait read at both ends (the
 * second figure of Linux's /proc/thread-self/schedstat, one pread on a
 * descriptor the native thread keeps): the part of the span in which the thread's wait
 * was over - its answer had come - but it could not run to ask for the GVL
 * because the CPU was busy. The hook files that time as idle; the advice
 * model (lib/serval/advice/window.rb) takes it out of the I/O, because a
 * thread that stands ready while another holds the GVL is, to the model, a
 * thread waiting for the GVL. sv_gvl_idle_wait sums the sampled spans for
 * ext/serval/steadiness.c.
 *
 * The hook never allocates and never calls Ruby: per-thread state lives in a
 * fixed table of SV_GVL_SLOTS slots, claimed with a CAS on a thread's first
 * event and released on EXITED. The slot of a thread is found through
 * rb_internal_thread_specific_get (3.3+) or a __thread pointer (3.2, where
 * every Ruby thread is one native thread). While a trace records, the hook also
 * appends (time, native tid, new state) to a preallocated buffer of
 * SV_GVL_TRACE_CAP events; once full, further events are counted as dropped.
 *
 * Without the hook API (Ruby 3.1) only Native::GVL.sample's clock readings
 * work; supported? is false and the rest raises NotImplementedError.
 *
 * Lock waits (Ruby 3.3+: rb_profile_thread_frames). A thread that blocks on
 * a Thread::Mutex, a Monitor, a ConditionVariable or a Thread::Queue /
 * SizedQueue releases the GVL exactly as one that blocks on a socket, so
 * SUSPENDED cannot tell them apart. RESUMED can: the thread holds the GVL
 * again and its stack still shows what it was blocked in. When an
 * in-request idle span ends, the hook reads the top two frames of the
 * thread (no allocation, nothing run; only for spans of SV_IO_MIN_NS or
 * more, where the look costs under a 20th of the span) and, if they are a lock wait (see
 * lock_frames), moves the span from idle to lock: lock_ns, which
 * ext/serval/timing.c reports per request (Timing#lock). The span stays in
 * the request's shape with length 0: the thread gave the GVL up and asked
 * again, which the model plays; its length is the lock's, modelled apart
 * (lib/serval/advice/lock.rb). A span inside a pool wait (PoolWait: Active
 * Record waits on a condition variable) stays the pool's.
 *
 * Serval::Native::PoolWait keeps a fourth per-thread figure: time blocked
 * checking out a database connection (lib/serval/db_pools.rb wraps Active
 * Record's blocking wait in enter/leave). It records the wall time of each
 * wait and the run/idle/stall time that fell inside it, so a request's
 * Timing can take the wait out of those three (ext/serval/timing.c). Only a
 * checkout that blocks calls it; a free connection costs nothing. It works
 * on every Ruby: without the hook only the wall time is kept.
 */
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "gvl.h"


#ifdef HAVE_RUBY_THREAD_H
#include <ruby/thread.h>
#endif

#if defined(HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK)
#define SV_GVL_HOOK 1
#endif
#if defined(SV_GVL_HOOK) && defined(HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET) && defined(HAVE_RB_PROFILE_THREAD_FRAMES)
#include <ruby/debug.h>
#define SV_GVL_LOCK 1               /* lock waits told from I/O (top of file) */
#endif

#define SV_PW_FIGURES 4             /* pool wait: wall, run, idle, stall */
#define SV_GVL_TRACE_CAP 262144     /* events per trace (16 bytes each) */
#define SV_IO_MIN_NS 10000          /* an idle period this long or longer counts as an I/O wait */
#define SV_SEND_MAX_NS 200000       /* an idle span this short may be a send (link, below) */
#define SV_LINK_RUN_NS 100000       /* a held span this short between two I/O spans joins them (link) */
#define SV_LINK_IN_NS 100000        /* a second idle span at least this long: the answer was still out (link) */
#define SV_RQ_EVERY 16              /* one in-request idle span in this many, at random, has its run-queue wait read */
#define SV_SEND_MIN_OCTAVE 12       /* sampled sends are counted by the time to their answer's read in half-octave
                                     * bins from 2^12 ns (4 us) up (send_bin) */

enum { SV_GVL_RUN = 0, SV_GVL_IDLE = 1, SV_GVL_WAIT = 2 };

static uint64_t now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One thread's pool waits: totals so far and the counters when the wait in
 * progress began. Touched only by the owner thread, with the GVL held. */
typedef struct {
    uint64_t total[SV_PW_FIGURES];
    uint64_t at[SV_PW_FIGURES];
    int open;
} sv_pool_wait;

static int pool_wait_on;             /* PoolWait.enable was called in this process */
static __thread sv_pool_wait tls_pool_wait; /* threads without a GVL slot (Ruby 3.1) */

#ifdef SV_GVL_HOOK

typedef struct {
    _Atomic int used;
    int gen;                    /* enable generation at claim: stale after fork */
    int tid;                    /* native thread id (Thread#native_thread_id) */
    int state;                  /* SV_GVL_*; owner thread only */
    uint64_t since;             /* when state began; owner thread only */
    _Atomic uint64_t ns[3];     /* totals per state; written by the owner, read by anyone */
    sv_pool_wait pool;          /* owner thread only */
    uint64_t idle_periods;      /* idle spans of >= SV_IO_MIN_NS ended; owner thread only */
    int in_request;             /* between Timing begin and end; owner thread only */
    uint64_t req_at;            /* when the current request began; owner thread only */
    uint64_t req_idle0;         /* ns[SV_GVL_IDLE] when it began; owner thread only */
    int nseg;                   /* the request's shape so far (sv_gvl_segments); owner thread only */
    int link;                   /* the link (top of file): 1 waiting/running after a short idle, 2 idle again */
    uint64_t link_wait;         /* that wait's ns */
    float seg[SV_SEGS];
    clockid_t clk;              /* the thread's CPU clock, valid once has_clk (steadiness.c reads it) */
    _Atomic int has_clk;
    _Atomic uint32_t claim;     /* bumped on every claim: a reader's values from another owner are stale */
    uint32_t rq_rand;           /* xorshift state choosing the sampled spans; owner thread only */
    int rq_on;                  /* the idle span in progress is sampled; owner thread only */
    uint64_t rq_mark;           /* its run-queue wait and clock at the start; owner thread only */
    uint64_t rq_at;
    int rq_send;                /* the sampled span that just ended was a send's (own time <= SV_SEND_MAX_NS):
                                 * 1 the link follows it, 2 the link followed it only because it was sampled */
    uint64_t rq_send_cw;        /* its run-queue wait */
    uint64_t rq_send_len;       /* its length */
    uint64_t link_run;          /* the link's short run, ns */
    int rq_next_on;             /* the link's second idle span has its run-queue wait read too (rq_next_mark) */
    uint64_t rq_next_mark;
    uint64_t lock_idle;         /* the in-request idle span that just ended (lock_step); owner thread only */
    _Atomic uint64_t lock_ns;   /* idle spans found to be lock waits, ns; written by the owner */
    uint64_t lock_spans;        /* how many; owner thread only */
} sv_gvl_slot;

typedef struct {
    uint64_t ts;
    int32_t tid;
    int32_t state;
} sv_gvl_event;

static sv_gvl_slot slots[SV_GVL_SLOTS];
static rb_internal_thread_event_hook_t *hook;
static pid_t hook_pid;
static _Atomic int gen = 1;
static _Atomic uint64_t run_total;  /* GVL held, all threads, finished slices */
static _Atomic uint64_t outside_total; /* of which outside a request's measured span */
static _Atomic uint64_t released_at;   /* when some thread last gave the GVL up */
static _Atomic uint64_t handoff_total; /* GVL free while a thread waited for it, summed */
static _Atomic uint64_t handoffs;      /* grants to a thread that was waiting when it came free */
static _Atomic uint64_t rq_wait_total; /* sampled idle spans: run-queue wait in them, ns */
static _Atomic uint64_t rq_span_total; /* their length, ns */
static _Atomic uint64_t rq_spans;      /* how many */
static _Atomic uint64_t rq_send_cw;    /* of the wait, what fell in sends whose answer was still out, ns */
static _Atomic uint64_t rq_send_wait;  /* GVL waits after sampled sends the link missed (long: preempted), ns */
static _Atomic uint64_t rq_filed_wait; /* GVL waits the link filed after sampled sends whose answer was in, ns */
static _Atomic uint64_t rq_filed_out;  /* GVL waits the link filed after sampled sends whose answer was still out, ns */
static _Atomic uint64_t send_n[2][SV_SEND_BINS]; /* sampled sends by send_bin: [0] answer still out, [1] already in */
static _Atomic uint64_t send_t[SV_SEND_BINS];    /* their times from the send to the answer's read, ns */
static __thread int rq_fd = -1;        /* this native thread's schedstat; -2: unreadable */
static __thread int rq_gen;            /* the enable generation it was opened in (fork) */
static __thread sv_gvl_slot *rq_slot;  /* the slot whose span this native thread marked */

/* The calling native thread's run-queue wait so far, ns, in *out; 0 when
 * it cannot be read (no /proc, a kernel without schedstat). */
static int rq_read(uint64_t *out)
{
    int g = atomic_load_explicit(&gen, memory_order_relaxed);
    if (rq_gen != g) { /* first use, or a forked child's inherited descriptor */
        if (rq_fd >= 0)
            close(rq_fd);
        rq_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (rq_fd < 0)
            rq_fd = -2;
        rq_gen = g;
    }
    if (rq_fd < 0)
        return 0;
    char buf[96];
    ssize_t n = pread(rq_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = buf;
    while (*p >= '0' && *p <= '9') /* time on a CPU */
        p++;
    if (*p != ' ')
        return 0;
    p++;
    uint64_t w = 0;
    const char *digits = p;
    while (*p >= '0' && *p <= '9')
        w = w * 10 + (uint64_t)(*p++ - '0');
    if (p == digits)
        return 0;
    *out = w;
    return 1;
}

/* One call in SV_RQ_EVERY, at random: a request's spans come in a fixed
 * order (send, answer, send, answer), and every Nth span would sample the
 * same kind of span over and over. */
static int rq_pick(sv_gvl_slot *s)
{
    uint32_t x = s->rq_rand ? s->rq_rand : (uint32_t)(uintptr_t)s | 1u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s->rq_rand = x;
    return x % SV_RQ_EVERY == 0;
}

/* Samples one in-request idle span in SV_RQ_EVERY (top of file): ev has
 * just moved s to next at now. */
static void rq_step(sv_gvl_slot *s, rb_event_flag_t ev, int next, uint64_t now)
{
    uint64_t w;
    if (s->rq_on) {
        s->rq_on = 0;
        if (ev == RUBY_INTERNAL_THREAD_EVENT_READY && rq_slot == s && rq_read(&w) && w >= s->rq_mark && now > s->rq_at) {
            uint64_t cw = w - s->rq_mark, len = now - s->rq_at;
            atomic_fetch_add_explicit(&rq_wait_total, cw, memory_order_relaxed);
            atomic_fetch_add_explicit(&rq_span_total, len, memory_order_relaxed);
            atomic_fetch_add_explicit(&rq_spans, 1, memory_order_relaxed);
            if (cw < len && len - cw <= SV_SEND_MAX_NS && s->in_request) {
                /* short but for the wait for a CPU: maybe a send (a preempted one when long) */
                s->rq_send = len > SV_SEND_MAX_NS ? 2 : 1;
                s->rq_send_cw = cw;
                s->rq_send_len = len;
                if (s->rq_send == 2) { /* the link (link_step) follows it too */
                    s->link = 1;
                    s->link_wait = 0;
                }
            }
        }
    }
    if (next == SV_GVL_IDLE && ev == RUBY_INTERNAL_THREAD_EVENT_SUSPENDED && s->rq_send && s->link == 2 && rq_read(&w)) {
        s->rq_next_on = 1; /* a sampled send's link: its second span is read too, kept out of the sample (link_step) */
        s->rq_next_mark = w;
        rq_slot = s;
    } else if (next == SV_GVL_IDLE && ev == RUBY_INTERNAL_THREAD_EVENT_SUSPENDED && s->in_request && rq_pick(s) && rq_read(&w)) {
        s->rq_on = 1;
        s->rq_mark = w;
        s->rq_at = now;
        rq_slot = s;
    }
}

/* Adds dt of kind 0 (GVL held) or 1 (idle) to the request's shape: even
 * entries are held, odd ones idle; a span of the kind just recorded extends
 * it (a time slice ended and the GVL came back), and past SV_SEGS entries
 * the last entry of the kind takes it. */
static void seg_add(sv_gvl_slot *s, int kind, uint64_t dt)
{
    float v = (float)((double)dt / 1e9);
    int n = s->nseg;
    if (n > 0 && ((n - 1) & 1) == kind) {
        s->seg[n - 1] += v;
    } else if (n == 0 && kind == 1) {
        s->seg[0] = 0.0f;
        s->seg[1] = v;
        s->nseg = 2;
    } else if (n < SV_SEGS) {
        s->seg[n] = v;
        s->nseg = n + 1;
    } else {
        s->seg[kind ? SV_SEGS - 2 : SV_SEGS - 1] += v;
    }
}

/* The bin of a sampled send's time to its answer's read: 0 below
 * 2^SV_SEND_MIN_OCTAVE ns, then two per octave (the top bin takes the rest). */
static int send_bin(uint64_t t)
{
    if (t < (1ull << SV_SEND_MIN_OCTAVE))
        return 0;
    int o = 63 - __builtin_clzll(t);
    int b = 1 + 2 * (o - SV_SEND_MIN_OCTAVE) + (int)((t >> (o - 1)) & 1);
    return b < SV_SEND_BINS ? b : SV_SEND_BINS - 1;
}

/* The link (top of file), stepped on every change of state inside a request:
 * dt is the span of state s->state that just ended. */
static void link_step(sv_gvl_slot *s, int next, uint64_t dt)
{
    if (s->state == SV_GVL_IDLE && next == SV_GVL_WAIT) {
        uint64_t w;
        if (s->link == 2 && s->rq_send && s->rq_next_on && rq_slot == s && rq_read(&w) && w >= s->rq_next_mark) {
            /* a sampled send's answer was still out when the second span was that long without its wait for a CPU */
            int out = dt >= w - s->rq_next_mark + SV_LINK_IN_NS;
            uint64_t t = s->rq_send_len + s->link_wait + s->link_run; /* the send to the answer's read */
            int b = send_bin(t);
            atomic_fetch_add_explicit(&send_n[out ? 0 : 1][b], 1, memory_order_relaxed);
            if (!out && dt >= SV_LINK_IN_NS && s->rq_send == 1) /* long only for its wait for a CPU: filed below */
                atomic_fetch_add_explicit(&rq_filed_wait, s->link_wait, memory_order_relaxed);
            atomic_fetch_add_explicit(&send_t[b], t, memory_order_relaxed);
            if (out && s->rq_send == 1) /* filed below: idle the histograms count and the sampled spans do not */
                atomic_fetch_add_explicit(&rq_filed_out, s->link_wait, memory_order_relaxed);
            if (out) {
                atomic_fetch_add_explicit(&rq_send_cw, s->rq_send_cw, memory_order_relaxed);
                if (s->rq_send == 2)
                    atomic_fetch_add_explicit(&rq_send_wait, s->link_wait, memory_order_relaxed);
            }
        }
        s->rq_next_on = 0;
        if (s->link == 2 && dt >= SV_LINK_IN_NS && s->rq_send != 2) { /* the answer was still out: the wait was the remote's */
            atomic_fetch_sub_explicit(&s->ns[SV_GVL_WAIT], s->link_wait, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->ns[SV_GVL_IDLE], s->link_wait, memory_order_relaxed);
            seg_add(s, 1, s->link_wait);
        }
        s->rq_send = 0;
        s->link = dt <= SV_SEND_MAX_NS ? 1 : 0;
        s->link_wait = 0;
    } else if (s->state == SV_GVL_WAIT && next == SV_GVL_RUN && s->link == 1) {
        s->link_wait = dt;
    } else if (s->state == SV_GVL_RUN && next == SV_GVL_IDLE && s->link == 1 && s->link_wait) {
        s->link = dt < SV_LINK_RUN_NS ? 2 : 0;
        s->link_run = dt;
    } else {
        s->link = 0;
    }
}

#ifdef SV_GVL_LOCK
static int lock_on = 1; /* Native::GVL.lock_split= (benchmarks compare the cost) */

static int name_is(VALUE str, const char *name, long len)
{
    return RB_TYPE_P(str, T_STRING) && RSTRING_LEN(str) == len && memcmp(RSTRING_PTR(str), name, (size_t)len) == 0;
}

#define NAME_IS(str, lit) name_is((str), (lit), (long)sizeof(lit) - 1)

/* Whether thread th, which has just got the GVL back after an idle span,
 * was blocked waiting for a lock: its top frame is a C method that blocks
 * only on a lock (Mutex#lock / #synchronize, Monitor#enter / #synchronize,
 * Queue and SizedQueue operations before 3.3), a method of
 * <internal:thread_sync> (Queue#pop, SizedQueue#push on 3.3), or Mutex#sleep
 * called by ConditionVariable#wait (both C methods; a Ruby method named wait
 * that sleeps is not one). Reads frames, runs nothing, allocates nothing. */
static int lock_frames(VALUE th)
{
    VALUE f[2];
    int lines[2];
    if (rb_profile_thread_frames(th, 0, 1, f, lines) < 1) /* the second frame only for sleep, below */
        return 0;
    VALUE path = rb_profile_frame_path(f[0]);
    if (!NIL_P(path)) {
        static const char sync[] = "<internal:thread_sync";
        return RB_TYPE_P(path, T_STRING) && RSTRING_LEN(path) >= (long)sizeof(sync) - 1 &&
               memcmp(RSTRING_PTR(path), sync, sizeof(sync) - 1) == 0;
    }
    VALUE name = rb_profile_frame_method_name(f[0]);
    if (NAME_IS(name, "lock") || NAME_IS(name, "synchronize") || NAME_IS(name, "enter") ||
        NAME_IS(name, "mon_enter") || NAME_IS(name, "pop") || NAME_IS(name, "shift") || NAME_IS(name, "deq") ||
        NAME_IS(name, "push") || NAME_IS(name, "<<") || NAME_IS(name, "enq"))
        return 1;
    if (!NAME_IS(name, "sleep") || rb_profile_thread_frames(th, 0, 2, f, lines) < 2 ||
        !NIL_P(rb_profile_frame_path(f[1])))
        return 0;
    return NAME_IS(rb_profile_frame_method_name(f[1]), "wait");
}

/* Files span ns, just filed as idle, as a lock wait (top of file). */
static void lock_file(sv_gvl_slot *s, uint64_t span)
{
    uint64_t idle = atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed);
    if (span > idle)
        span = idle;
    atomic_fetch_sub_explicit(&s->ns[SV_GVL_IDLE], span, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->lock_ns, span, memory_order_relaxed);
    s->lock_spans++;
    int n = s->nseg, i = -1;
    if (n >= 2 && ((n - 1) & 1) == 1)
        i = n - 1;
    else if (n == SV_SEGS)
        i = SV_SEGS - 2;
    if (i >= 0) {
        float v = s->seg[i] - (float)((double)span / 1e9);
        s->seg[i] = v > 0.0f ? v : 0.0f;
    }
}

/* On every change of state inside a request: ev has moved s from s->state
 * to next after dt ns. An idle span that ends is remembered until the
 * thread runs again, then filed as a lock wait if its frames say so. */
static void lock_step(sv_gvl_slot *s, rb_event_flag_t ev, VALUE th, int next, uint64_t dt)
{
    if (s->state == SV_GVL_IDLE && next == SV_GVL_WAIT) {
        s->lock_idle = dt;
        return;
    }
    uint64_t span = 0;
    if (ev == RUBY_INTERNAL_THREAD_EVENT_RESUMED && next == SV_GVL_RUN)
        span = s->state == SV_GVL_IDLE ? dt : s->state == SV_GVL_WAIT ? s->lock_idle : 0;
    s->lock_idle = 0;
    if (span >= SV_IO_MIN_NS && !s->pool.open && lock_frames(th)) /* a shorter span: little time, not worth the look */
        lock_file(s, span);
}
#endif

static sv_gvl_event *trace_buf;
static _Atomic int tracing;
static _Atomic size_t trace_n;
static uint64_t trace_start;

#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
static rb_internal_thread_specific_key_t slot_key;
#define SLOT_GET(th) ((sv_gvl_slot *)rb_internal_thread_specific_get((th), slot_key))
#define SLOT_SET(th, s) rb_internal_thread_specific_set((th), slot_key, (s))
#define EVENT_THREAD(d) ((d)->thread)
#else
static __thread sv_gvl_slot *tls_slot;
#define SLOT_GET(th) ((void)(th), tls_slot)
#define SLOT_SET(th, s) ((void)(th), tls_slot = (s))
#define EVENT_THREAD(d) ((void)(d), Qnil)
#endif

static void trace_push(uint64_t ts, int tid, int state)
{
    size_t i = atomic_fetch_add_explicit(&trace_n, 1, memory_order_relaxed);
    if (i < SV_GVL_TRACE_CAP) {
        trace_buf[i].ts = ts;
        trace_buf[i].tid = tid;
        trace_buf[i].state = state;
    }
}

/* The slot of thread th, claiming a free one on first use; NULL when full.
 * own: the caller runs on th's native thread (RESUMED, SUSPENDED, EXITED and
 * calls from the thread itself). Ruby 3.3 fires READY for a new or woken
 * thread from another native thread, so the native id is learnt only on the
 * thread's own events. */
static void learn_thread(sv_gvl_slot *s)
{
    s->tid = (int)syscall(SYS_gettid);
    if (pthread_getcpuclockid(pthread_self(), &s->clk) == 0)
        atomic_store_explicit(&s->has_clk, 1, memory_order_release);
}

static sv_gvl_slot *slot_of(VALUE th, int state, uint64_t now, int own)
{
    sv_gvl_slot *s = SLOT_GET(th);
    int g = atomic_load_explicit(&gen, memory_order_relaxed);
    if (s && s->gen == g) {
        if (own && !s->tid)
            learn_thread(s);
        return s;
    }
    for (int i = 0; i < SV_GVL_SLOTS; i++) {
        int expect = 0;
        sv_gvl_slot *c = &slots[i];
        if (!atomic_compare_exchange_strong(&c->used, &expect, 1))
            continue;
        atomic_store_explicit(&c->has_clk, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->claim, 1, memory_order_release);
        c->gen = g;
        c->tid = 0;
        if (own)
            learn_thread(c);
        c->state = state;
        c->since = now;
        for (int k = 0; k < 3; k++)
            atomic_store_explicit(&c->ns[k], 0, memory_order_relaxed);
        memset(&c->pool, 0, sizeof(c->pool));
        c->idle_periods = 0;
        c->in_request = 0;
        c->req_at = 0;
        c->req_idle0 = 0;
        c->nseg = 0;
        c->link = 0;
        c->rq_on = 0;
        c->rq_send = 0;
        c->rq_next_on = 0;
        c->lock_idle = 0;
        atomic_store_explicit(&c->lock_ns, 0, memory_order_relaxed);
        c->lock_spans = 0;
        SLOT_SET(th, c);
        return c;
    }
    return NULL;
}

static void on_event(rb_event_flag_t ev, const rb_internal_thread_event_data_t *d, void *data)
{
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    int next = ev == RUBY_INTERNAL_THREAD_EVENT_RESUMED ? SV_GVL_RUN
             : ev == RUBY_INTERNAL_THREAD_EVENT_READY ? SV_GVL_WAIT : SV_GVL_IDLE;
    if (ev == RUBY_INTERNAL_THREAD_EVENT_SUSPENDED && sv_gvl_yielding)
        next = SV_GVL_WAIT; /* a fairness preemption: waiting for its next turn, not idle */
    sv_gvl_slot *s = slot_of(EVENT_THREAD(d), next, now, ev != RUBY_INTERNAL_THREAD_EVENT_READY);
    if (!s)
        return;
    if (s->state != next || s->since != now) {
        uint64_t dt = now - s->since;
        if (next == SV_GVL_RUN && s->state == SV_GVL_WAIT) {
            /* waited since s->since; the GVL came free at released_at: if that
             * was after the wait began, the gap until now is the handoff */
            uint64_t rel = atomic_load_explicit(&released_at, memory_order_relaxed);
            if (rel >= s->since && rel <= now) {
                atomic_fetch_add_explicit(&handoff_total, now - rel, memory_order_relaxed);
                atomic_fetch_add_explicit(&handoffs, 1, memory_order_relaxed);
            }
        } else if (s->state == SV_GVL_RUN) {
            atomic_store_explicit(&released_at, now, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&s->ns[s->state], dt, memory_order_relaxed);
        if (s->state == SV_GVL_RUN) {
            atomic_fetch_add_explicit(&run_total, dt, memory_order_relaxed);
            if (!s->in_request)
                atomic_fetch_add_explicit(&outside_total, dt, memory_order_relaxed);
            else
                seg_add(s, 0, dt);
        } else if (s->state == SV_GVL_IDLE) {
            if (dt >= SV_IO_MIN_NS)
                s->idle_periods++;
            if (s->in_request)
                seg_add(s, 1, dt);
        }
        if (s->in_request)
            link_step(s, next, dt);
#ifdef SV_GVL_LOCK
        if (s->in_request && lock_on)
            lock_step(s, ev, EVENT_THREAD(d), next, dt);
#endif
        s->state = next;
        s->since = now;
    }
    if (s->rq_on || s->in_request)
        rq_step(s, ev, next, now);
    if (s->tid && atomic_load_explicit(&tracing, memory_order_relaxed))
        trace_push(now, s->tid, next);
    if (ev == RUBY_INTERNAL_THREAD_EVENT_EXITED) {
        if (rq_fd >= 0) { /* the native thread ends with its Ruby thread */
            close(rq_fd);
            rq_fd = -1;
            rq_gen = 0;
        }
        s->rq_on = 0;
        rq_slot = NULL;
        SLOT_SET(EVENT_THREAD(d), NULL);
        atomic_store(&s->used, 0);
    }
}

static sv_gvl_slot *current_slot(uint64_t now)
{
    return hook ? slot_of(rb_thread_current(), SV_GVL_RUN, now, 1) : NULL;
}

/* For ext/serval/steadiness.c, from its own native thread without the GVL:
 * slot i's claim count, the GVL time its thread has held in finished
 * slices and the one in progress, and the thread's CPU time so far. 0 when the slot is free, of an
 * older generation, or its CPU clock is unknown or unreadable (the thread
 * has just exited). A slot reclaimed between two probes shows another
 * claim count: the caller then starts over from the new values. */
int sv_gvl_probe(int i, uint32_t *claim, uint64_t *held, uint64_t *cpu)
{
    if (!hook || i < 0 || i >= SV_GVL_SLOTS)
        return 0;
    sv_gvl_slot *s = &slots[i];
    if (!atomic_load_explicit(&s->used, memory_order_acquire) ||
        !atomic_load_explicit(&s->has_clk, memory_order_acquire) || s->gen != atomic_load(&gen))
        return 0;
    *claim = atomic_load_explicit(&s->claim, memory_order_acquire);
    /* finished slices first, then the slice in progress: read in this order,
     * a slice that ends in between is missed now and counted at the next
     * probe, never counted twice (the owner adds to ns before it changes
     * state); the owner's plain fields are read racily, as in
     * gvl_idle_in_request */
    uint64_t h = atomic_load_explicit(&s->ns[SV_GVL_RUN], memory_order_acquire);
    int state = *(volatile int *)&s->state;
    uint64_t since = *(volatile uint64_t *)&s->since;
    struct timespec ts;
    if (clock_gettime(s->clk, &ts) != 0)
        return 0;
    *cpu = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    if (state == SV_GVL_RUN && since <= now)
        h += now - since;
    *held = h;
    return 1;
}

/* GVL time held outside a request's measured span, finished slices, ns
 * (ext/serval/steadiness.c notes it per step). */
uint64_t sv_gvl_outside_ns(void)
{
    return atomic_load_explicit(&outside_total, memory_order_relaxed);
}

/* The sampled in-request idle spans so far (top of file): run-queue wait
 * in them and their length, ns, and how many. */
void sv_gvl_idle_wait(uint64_t out[SV_IDLE_WAIT_FIGURES])
{
    out[0] = atomic_load_explicit(&rq_wait_total, memory_order_relaxed);
    out[1] = atomic_load_explicit(&rq_span_total, memory_order_relaxed);
    out[2] = atomic_load_explicit(&rq_spans, memory_order_relaxed);
    out[3] = atomic_load_explicit(&rq_send_cw, memory_order_relaxed);
    out[4] = atomic_load_explicit(&rq_send_wait, memory_order_relaxed);
    out[5] = atomic_load_explicit(&rq_filed_wait, memory_order_relaxed);
    out[6] = atomic_load_explicit(&rq_filed_out, memory_order_relaxed);
}

/* The sampled sends so far by send_bin: how many found the answer still
 * out, how many found it already in, and their times to the answer's read,
 * ns (Advice::HiddenRemote estimates the remote's time the second kind hid). */
void sv_gvl_sends(uint64_t out[SV_SEND_FIGURES][SV_SEND_BINS])
{
    for (int b = 0; b < SV_SEND_BINS; b++) {
        out[0][b] = atomic_load_explicit(&send_n[0][b], memory_order_relaxed);
        out[1][b] = atomic_load_explicit(&send_n[1][b], memory_order_relaxed);
        out[2][b] = atomic_load_explicit(&send_t[b], memory_order_relaxed);
    }
}

/* Called after the hook is registered, once per process (sv_gvl_on_enable). */
static void (*on_enable)(void);

void sv_gvl_on_enable(void (*fn)(void))
{
    on_enable = fn;
}

/* Registers the hook once per process; in a forked child the inherited
 * registration is replaced and every slot (the parent's threads) dropped. */
static VALUE gvl_enable(VALUE mod)
{
    pid_t pid = getpid();
    if (hook && hook_pid == pid)
        return Qfalse;
    if (hook) {
        rb_internal_thread_remove_event_hook(hook);
        hook = NULL;
        atomic_store(&tracing, 0);
        atomic_fetch_add(&gen, 1);
        for (int i = 0; i < SV_GVL_SLOTS; i++)
            atomic_store(&slots[i].used, 0);
        atomic_store(&run_total, 0);
        atomic_store(&outside_total, 0);
        atomic_store(&released_at, 0);
        atomic_store(&handoff_total, 0);
        atomic_store(&handoffs, 0);
    }
    hook = rb_internal_thread_add_event_hook(on_event,
        RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED |
        RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_EXITED, NULL);
    hook_pid = pid;
    if (on_enable)
        on_enable();
    return Qtrue;
}

static VALUE gvl_enabled_p(VALUE mod)
{
    return hook && hook_pid == getpid() ? Qtrue : Qfalse;
}

/* [run_ns_total, waiting_threads, outside_ns_total, handoff_ns_total,
 * handoffs]: GVL held by all threads since enable, how many threads are
 * waiting for it now, the part of the first held outside a request's
 * measured span (app and library threads, Serval's own between requests),
 * and the handoffs: grants to a thread that was already waiting when the
 * GVL came free, with the time it stayed free before that thread ran (the
 * waker signals, the kernel schedules the waiter: GVL capacity lost). */
static VALUE gvl_global(VALUE mod)
{
    if (!hook)
        return Qnil;
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    uint64_t run = atomic_load_explicit(&run_total, memory_order_relaxed);
    uint64_t outside = atomic_load_explicit(&outside_total, memory_order_relaxed);
    sv_gvl_slot *self = current_slot(now);
    if (self && self->state == SV_GVL_RUN) {
        run += now - self->since;
        if (!self->in_request)
            outside += now - self->since;
    }
    int g = atomic_load(&gen);
    long waiting = 0;
    for (int i = 0; i < SV_GVL_SLOTS; i++) {
        sv_gvl_slot *s = &slots[i];
        if (atomic_load_explicit(&s->used, memory_order_relaxed) && s->gen == g && s->state == SV_GVL_WAIT)
            waiting++;
    }
    return rb_ary_new_from_args(5, ULL2NUM(run), LONG2NUM(waiting), ULL2NUM(outside),
                                ULL2NUM(atomic_load_explicit(&handoff_total, memory_order_relaxed)),
                                ULL2NUM(atomic_load_explicit(&handoffs, memory_order_relaxed)));
}

/* Native::GVL.idle_in_request(min_seconds) -> Integer: the threads inside a
 * request that has so far spent at least min_seconds idle (without the GVL
 * and not asking for it: I/O, sleep, a streaming write waiting for its
 * client) and at least 3/4 of its time idle - the requests the I/O lane
 * (lib/serval/auto/io_lane.rb) makes room beside. The owners' fields are
 * read without their lock: a thread changing state during the scan is at
 * worst miscounted once. */
static VALUE gvl_idle_in_request(VALUE mod, VALUE min_seconds)
{
    double min = NUM2DBL(min_seconds);
    if (!(min >= 0.0 && min < 1e9))
        rb_raise(rb_eArgError, "min_seconds must be >= 0");
    if (!hook || hook_pid != getpid())
        return Qnil;
    uint64_t min_ns = (uint64_t)(min * 1e9);
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    int g = atomic_load(&gen);
    long n = 0;
    for (int i = 0; i < SV_GVL_SLOTS; i++) {
        sv_gvl_slot *s = &slots[i];
        if (!atomic_load_explicit(&s->used, memory_order_relaxed) || s->gen != g || !s->in_request)
            continue;
        uint64_t at = s->req_at, since = s->since, idle0 = s->req_idle0;
        int state = s->state;
        if (at == 0 || now <= at)
            continue;
        uint64_t total = atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed);
        uint64_t idle = total > idle0 ? total - idle0 : 0;
        if (state == SV_GVL_IDLE && now > since && since >= at)
            idle += now - since;
        if (idle >= min_ns && idle * 4 >= (now - at) * 3)
            n++;
    }
    return LONG2NUM(n);
}

/* Native::GVL.idle_wait -> [run-queue wait, length, count, wait in sends,
 * waits after long sends, waits filed after answered sends]: the sampled
 * in-request idle spans so far (top of file), seconds; nil without the hook. */
static VALUE gvl_idle_wait(VALUE mod)
{
    if (!hook || hook_pid != getpid())
        return Qnil;
    uint64_t v[SV_IDLE_WAIT_FIGURES];
    sv_gvl_idle_wait(v);
    return rb_ary_new_from_args(6, DBL2NUM((double)v[0] / 1e9), DBL2NUM((double)v[1] / 1e9), ULL2NUM(v[2]),
                                DBL2NUM((double)v[3] / 1e9), DBL2NUM((double)v[4] / 1e9), DBL2NUM((double)v[5] / 1e9));
}

/* Native::GVL.lock_split? / lock_split=: whether in-request lock waits are
 * told from idle (Ruby 3.3+; on by default; off only to measure its cost). */
static VALUE gvl_lock_split_p(VALUE mod)
{
#ifdef SV_GVL_LOCK
    return lock_on ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

static VALUE gvl_set_lock_split(VALUE mod, VALUE on)
{
#ifdef SV_GVL_LOCK
    lock_on = RTEST(on);
#endif
    return on;
}

/* Native::GVL.lock_sample -> [lock seconds, lock spans] of the calling
 * thread so far; nil when lock waits are not told apart. */
static VALUE gvl_lock_sample(VALUE mod)
{
#ifdef SV_GVL_LOCK
    sv_gvl_slot *s = current_slot(now_ns(CLOCK_MONOTONIC));
    if (s)
        return rb_ary_new_from_args(2, DBL2NUM((double)atomic_load(&s->lock_ns) / 1e9), ULL2NUM(s->lock_spans));
#endif
    return Qnil;
}

static VALUE gvl_trace_start(VALUE mod)
{
    if (!hook)
        rb_raise(rb_eRuntimeError, "GVL hook not enabled");
    if (!trace_buf)
        trace_buf = ruby_xcalloc(SV_GVL_TRACE_CAP, sizeof(sv_gvl_event));
    atomic_store(&tracing, 0);
    atomic_store(&trace_n, 0);
    trace_start = now_ns(CLOCK_MONOTONIC);
    current_slot(trace_start); /* the caller is running: make sure it has a slot */
    int g = atomic_load(&gen);
    for (int i = 0; i < SV_GVL_SLOTS; i++) { /* every known thread's state now */
        sv_gvl_slot *s = &slots[i];
        if (atomic_load(&s->used) && s->gen == g)
            trace_push(trace_start, s->tid, s->state);
    }
    atomic_store(&tracing, 1);
    return ULL2NUM(trace_start);
}

/* Stops recording; returns [end_ns, dropped, flat [ts, tid, state, ...]]. */
static VALUE gvl_trace_stop(VALUE mod)
{
    uint64_t end = now_ns(CLOCK_MONOTONIC);
    atomic_store(&tracing, 0);
    size_t n = atomic_load(&trace_n);
    size_t keep = n < SV_GVL_TRACE_CAP ? n : SV_GVL_TRACE_CAP;
    VALUE flat = rb_ary_new_capa((long)keep * 3);
    for (size_t i = 0; trace_buf && i < keep; i++) {
        if (trace_buf[i].ts < trace_start || trace_buf[i].ts > end)
            continue;
        rb_ary_push(flat, ULL2NUM(trace_buf[i].ts));
        rb_ary_push(flat, INT2NUM(trace_buf[i].tid));
        rb_ary_push(flat, INT2NUM(trace_buf[i].state));
    }
    return rb_ary_new_from_args(3, ULL2NUM(end), SIZET2NUM(n - keep), flat);
}

#endif /* SV_GVL_HOOK */

/*
 * [monotonic_ns, thread_cpu_ns, run_ns, idle_ns, stall_ns] for the calling
 * thread; the last three are nil without the hook. One call at request start
 * and one at its end give every per-request figure but GC time.
 */
static VALUE gvl_sample(VALUE mod)
{
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    VALUE cpu = ULL2NUM(now_ns(CLOCK_THREAD_CPUTIME_ID));
    VALUE run = Qnil, idle = Qnil, stall = Qnil;
#ifdef SV_GVL_HOOK
    sv_gvl_slot *s = current_slot(now);
    if (s) {
        uint64_t r = atomic_load_explicit(&s->ns[SV_GVL_RUN], memory_order_relaxed);
        if (s->state == SV_GVL_RUN)
            r += now - s->since;
        run = ULL2NUM(r);
        idle = ULL2NUM(atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed));
        stall = ULL2NUM(atomic_load_explicit(&s->ns[SV_GVL_WAIT], memory_order_relaxed));
    }
#endif
    return rb_ary_new_from_args(5, ULL2NUM(now), cpu, run, idle, stall);
}

/* The calling thread's run/idle/stall nanoseconds so far; 0 without the hook. */
int sv_gvl_counters(uint64_t out[3])
{
#ifdef SV_GVL_HOOK
    if (!hook)
        return 0;
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    sv_gvl_slot *s = current_slot(now);
    if (!s)
        return 0;
    uint64_t r = atomic_load_explicit(&s->ns[SV_GVL_RUN], memory_order_relaxed);
    if (s->state == SV_GVL_RUN)
        r += now - s->since;
    out[0] = r;
    out[1] = atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed);
    out[2] = atomic_load_explicit(&s->ns[SV_GVL_WAIT], memory_order_relaxed);
    return 1;
#else
    (void)out;
    return 0;
#endif
}

/* The calling thread's last (or current) request's shape, SV_SEGS at most
 * entries, [held, idle, ..., held]; 0 without the hook. now: CLOCK_MONOTONIC
 * ns, read by the caller (one clock read serves the request's timing). */
int sv_gvl_segments(float out[SV_SEGS], uint64_t now)
{
#ifdef SV_GVL_HOOK
    if (!hook)
        return 0;
    sv_gvl_slot *s = current_slot(now);
    if (!s || s->nseg == 0)
        return 0;
    int n = s->nseg;
    memcpy(out, s->seg, sizeof(float) * (size_t)n);
    if ((n & 1) == 0)      /* ended idle (cannot, the thread runs): close with a zero hold */
        out[n++] = 0.0f;
    return n;
#else
    (void)out;
    return 0;
#endif
}

/* Marks the calling thread as inside (1) or outside (0) a request's measured
 * span, closing its running slice at now (CLOCK_MONOTONIC ns, the caller's
 * clock read) so the GVL it held so far
 * is filed on the right side; fills out with its run/idle/stall ns, idle
 * periods and lock-wait ns so far. 0 without the hook. */
int sv_gvl_mark(int in_request, uint64_t out[SV_GVL_MARKS], uint64_t now)
{
#ifdef SV_GVL_HOOK
    if (!hook)
        return 0;
    sv_gvl_slot *s = current_slot(now);
    if (!s)
        return 0;
    if (s->state == SV_GVL_RUN) {
        uint64_t dt = now - s->since;
        atomic_fetch_add_explicit(&s->ns[SV_GVL_RUN], dt, memory_order_relaxed);
        atomic_fetch_add_explicit(&run_total, dt, memory_order_relaxed);
        if (!s->in_request)
            atomic_fetch_add_explicit(&outside_total, dt, memory_order_relaxed);
        else
            seg_add(s, 0, dt);
        s->since = now;
    }
    s->link = 0;
    s->lock_idle = 0;
    if (in_request) {
        s->nseg = 0;
        s->req_at = now;
        s->req_idle0 = atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed);
    }
    s->in_request = in_request;
    out[0] = atomic_load_explicit(&s->ns[SV_GVL_RUN], memory_order_relaxed);
    out[1] = atomic_load_explicit(&s->ns[SV_GVL_IDLE], memory_order_relaxed);
    out[2] = atomic_load_explicit(&s->ns[SV_GVL_WAIT], memory_order_relaxed);
    out[3] = s->idle_periods;
    out[4] = atomic_load_explicit(&s->lock_ns, memory_order_relaxed);
    return 1;
#else
    (void)in_request;
    (void)out;
    return 0;
#endif
}

int sv_gvl_lock_split(void)
{
#ifdef SV_GVL_LOCK
    return lock_on && hook != NULL;
#else
    return 0;
#endif
}

/* The calling thread's pool-wait record: in its GVL slot when the hook runs
 * (3.3+ may run Ruby threads on shared native threads), else thread-local. */
static sv_pool_wait *pool_wait_state(void)
{
#ifdef SV_GVL_HOOK
    if (hook) {
        sv_gvl_slot *s = SLOT_GET(rb_thread_current()); /* claimed already: no clock read */
        if (!s || s->gen != atomic_load_explicit(&gen, memory_order_relaxed))
            s = current_slot(now_ns(CLOCK_MONOTONIC));
        if (s)
            return &s->pool;
    }
#endif
    return &tls_pool_wait;
}

/* PoolWait.enter: a connection checkout is about to block. Notes the clock
 * and the thread's run/idle/stall counters. */
static VALUE pw_enter(VALUE mod)
{
    sv_pool_wait *p = pool_wait_state();
    uint64_t g[3] = {0, 0, 0};
    int split = sv_gvl_counters(g);
    p->at[0] = now_ns(CLOCK_MONOTONIC);
    for (int k = 0; k < 3; k++)
        p->at[k + 1] = g[k];
    p->open = split ? 2 : 1;
#ifdef SV_GVL_HOOK
    if (hook) { /* a wait before the checkout must not be filed inside it */
        sv_gvl_slot *s = SLOT_GET(rb_thread_current());
        if (s)
            s->link = 0;
    }
#endif
    return Qnil;
}

/* PoolWait.leave: the checkout returned (or raised). Adds the wait to the
 * thread's totals; returns its wall seconds, nil without a matching enter. */
static VALUE pw_leave(VALUE mod)
{
    sv_pool_wait *p = pool_wait_state();
    if (!p->open)
        return Qnil;
    uint64_t g[3] = {0, 0, 0};
    int split = sv_gvl_counters(g) && p->open == 2;
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    uint64_t wall = now > p->at[0] ? now - p->at[0] : 0;
    p->total[0] += wall;
    for (int k = 0; split && k < 3; k++) {
        if (g[k] > p->at[k + 1])
            p->total[k + 1] += g[k] - p->at[k + 1];
    }
    p->open = 0;
    return DBL2NUM((double)wall / 1e9);
}

/* PoolWait.enable: from now on requests in this process report pool_wait. */
static VALUE pw_enable(VALUE mod)
{
    pool_wait_on = 1;
    return Qtrue;
}

static VALUE pw_enabled_p(VALUE mod)
{
    return pool_wait_on ? Qtrue : Qfalse;
}

/* PoolWait.sample: the calling thread's totals in seconds, [wall, run, idle,
 * stall] (run/idle/stall 0 without the hook). */
static VALUE pw_sample(VALUE mod)
{
    sv_pool_wait *p = pool_wait_state();
    VALUE out = rb_ary_new_capa(SV_PW_FIGURES);
    for (int k = 0; k < SV_PW_FIGURES; k++)
        rb_ary_push(out, DBL2NUM((double)p->total[k] / 1e9));
    return out;
}

/* The calling thread's pool-wait totals (ns: wall, run, idle, stall); 0 when
 * no PoolWait.enable in this process (no Active Record: pool_wait absent). */
int sv_pool_wait_counters(uint64_t out[SV_PW_FIGURES])
{
    if (!pool_wait_on)
        return 0;
    sv_pool_wait *p = pool_wait_state();
    memcpy(out, p->total, sizeof(p->total));
    return 1;
}

static VALUE gvl_supported_p(VALUE mod)
{
#ifdef SV_GVL_HOOK
    return Qtrue;
#else
    return Qfalse;
#endif
}

#ifndef SV_GVL_HOOK
static VALUE gvl_unsupported(VALUE mod)
{
    rb_raise(rb_eNotImpError, "GVL instrumentation needs Ruby 3.2+ (rb_internal_thread_add_event_hook); "
                              "this Ruby has no GVL event hook");
    return Qnil;
}

static VALUE gvl_false(VALUE mod)
{
    return Qfalse;
}

static VALUE gvl_nil(VALUE mod)
{
    return Qnil;
}

static VALUE gvl_idle_nil(VALUE mod, VALUE min_seconds)
{
    (void)min_seconds;
    return Qnil;
}
#endif

void sv_init_gvl(VALUE mNative)
{
    VALUE pw = rb_define_module_under(mNative, "PoolWait");
    rb_define_singleton_method(pw, "enter", pw_enter, 0);
    rb_define_singleton_method(pw, "leave", pw_leave, 0);
    rb_define_singleton_method(pw, "enable", pw_enable, 0);
    rb_define_singleton_method(pw, "enabled?", pw_enabled_p, 0);
    rb_define_singleton_method(pw, "sample", pw_sample, 0);

    VALUE m = rb_define_module_under(mNative, "GVL");
    rb_define_singleton_method(m, "supported?", gvl_supported_p, 0);
    rb_define_singleton_method(m, "sample", gvl_sample, 0);
    rb_define_const(m, "TRACE_CAPACITY", INT2NUM(SV_GVL_TRACE_CAP));
    /* the link's bounds (top of file), for the model to join the same spans */
    rb_define_const(m, "LINK_SEND_MAX", DBL2NUM(SV_SEND_MAX_NS / 1e9));
    rb_define_const(m, "LINK_RUN_MAX", DBL2NUM(SV_LINK_RUN_NS / 1e9));
    /* the lower bound of each bin Native::GVL.sends counts in, seconds (send_bin) */
    VALUE floors = rb_ary_new_capa(SV_SEND_BINS);
    rb_ary_push(floors, DBL2NUM(0.0));
    for (int b = 1; b < SV_SEND_BINS; b++) {
        int o = SV_SEND_MIN_OCTAVE + (b - 1) / 2;
        rb_ary_push(floors, DBL2NUM((double)(1ull << o) * ((b - 1) % 2 ? 1.5 : 1.0) / 1e9));
    }
    rb_define_const(m, "SEND_BINS", rb_ary_freeze(floors));
#ifdef SV_GVL_HOOK
#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
    slot_key = rb_internal_thread_specific_key_create();
#endif
    rb_define_singleton_method(m, "enable", gvl_enable, 0);
    rb_define_singleton_method(m, "enabled?", gvl_enabled_p, 0);
    rb_define_singleton_method(m, "global", gvl_global, 0);
    rb_define_singleton_method(m, "trace_start", gvl_trace_start, 0);
    rb_define_singleton_method(m, "trace_stop", gvl_trace_stop, 0);
    rb_define_singleton_method(m, "idle_in_request", gvl_idle_in_request, 1);
    rb_define_singleton_method(m, "idle_wait", gvl_idle_wait, 0);
    rb_define_singleton_method(m, "lock_split?", gvl_lock_split_p, 0);
    rb_define_singleton_method(m, "lock_split=", gvl_set_lock_split, 1);
    rb_define_singleton_method(m, "lock_sample", gvl_lock_sample, 0);
#else
    rb_define_singleton_method(m, "enable", gvl_false, 0);
    rb_define_singleton_method(m, "enabled?", gvl_false, 0);
    rb_define_singleton_method(m, "global", gvl_nil, 0);
    rb_define_singleton_method(m, "trace_start", gvl_unsupported, 0);
    rb_define_singleton_method(m, "trace_stop", gvl_unsupported, 0);
    rb_define_singleton_method(m, "idle_in_request", gvl_idle_nil, 1);
    rb_define_singleton_method(m, "idle_wait", gvl_nil, 0);
    rb_define_singleton_method(m, "lock_split?", gvl_false, 0);
    rb_define_singleton_method(m, "lock_split=", gvl_idle_nil, 1);
    rb_define_singleton_method(m, "lock_sample", gvl_nil, 0);
#endif
}

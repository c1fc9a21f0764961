/*
 * CPU steadiness: how much of the time this process holds the GVL its
 * holder is really on a CPU. A native thread ("serval-cpu") wakes every
 * SV_STEADY_STEP_NS and, for every Ruby thread the GVL hook tracks
 * (gvl.c's slots), reads the GVL time held in finished slices and the
 * thread's CPU clock; one step is the sums of their increases. On a
 * dedicated CPU a thread that holds the GVL runs, and cpu / held is 1;
 * when the hypervisor takes the virtual CPU away, a cgroup quota throttles
 * the process or other processes share its CPU, the holder keeps the GVL
 * while it does not run and the ratio drops for that step. The advice
 * model replays these ratios (lib/serval/advice/simulation.rb): dips
 * clustered in time are what lengthens a queue's tail near capacity.
 *
 * Each step also notes the whole process's CPU time (CLOCK_PROCESS_CPUTIME_ID):
 * what it used beyond the GVL's holders (the event loop, system calls made
 * without the GVL, switches between threads) is CPU a process with one CPU
 * takes from the GVL's holder once the GVL is busy (Timing::Window's
 * outside_cpu, the model's tail_cpu). And the GVL time held outside any
 * request (gvl.c: Serval's own work between requests, the app's threads):
 * GVL capacity every request pays for beyond its own run (Timing::Window's
 * gvl_between). And what gvl.c's sampled idle spans found (sv_gvl_idle_wait):
 * the run-queue wait inside them, their length and count - on a busy CPU a
 * thread whose I/O has finished waits for the CPU before it can even ask
 * for the GVL, time the GVL hook files as idle (Timing::Window's cpu_wait).
 *
 * Costs: one wake-up and 2 clock reads per Ruby thread and one for the
 * process every step, on a thread of its own; requests pay nothing. The last SV_STEADY_STEPS steps
 * are kept. Started by Native::GVL.enable (Ruby 3.2+), again in a forked
 * child. Linux: CPU clocks of other threads of the process.
 */
#define _GNU_SOURCE 1 /* pthread_setname_np; as ruby/config.h */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "steadiness.h"
#include "gvl.h"
#include "window.h"

#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK /* the GVL hook (gvl.c): Ruby 3.2+ */

#define SV_STEADY_STEP_NS 250000000ull /* 0.25 s */
#define SV_STEADY_STEPS 240            /* 60 s */

typedef struct {
    double at;                          /* monotonic seconds at the end of the step */
    uint64_t held;                      /* GVL held, ns, by the threads probed */
    uint64_t cpu;                       /* their CPU time, ns */
    uint64_t proc;                      /* the whole process's CPU time, ns (every thread: the loop too) */
    uint64_t outside;                   /* GVL held outside requests, ns (finished slices) */
    uint64_t idle_wait[SV_IDLE_WAIT_FIGURES]; /* sampled in-request idle spans: run-queue wait, length (ns), count,
                                         * wait in sends, GVL waits after long sends, waits the link
                                         * filed after sends answered / still out (gvl.c) */
    uint64_t done;                      /* requests that ended in the step (window.c) */
    uint64_t wall;                      /* their wall time, ns: / step = requests in flight (Little) */
} sv_steady_step;

/* gvl.c's sampled sends (sv_gvl_sends) that ended in a step, beside
 * ring[]: kept apart so that Native::GVL.steadiness copies no bins. */
typedef struct {
    uint32_t n[2][SV_SEND_BINS];        /* answer still out, answer already in */
    uint64_t t[SV_SEND_BINS];           /* their times to the answer's read, ns */
} sv_steady_sends;

static sv_steady_step ring[SV_STEADY_STEPS];
static sv_steady_sends send_ring[SV_STEADY_STEPS];
static uint64_t ring_n;                 /* steps written; guarded by mu */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t running_pid;               /* the process whose sampler runs */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t proc_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *sampler(void *arg)
{
    static uint32_t claim[SV_GVL_SLOTS];
    static uint64_t held[SV_GVL_SLOTS], cpu[SV_GVL_SLOTS];
    static char known[SV_GVL_SLOTS];
    (void)arg;
    uint64_t next = mono_ns();
    uint64_t proc0 = proc_ns();
    uint64_t out0 = sv_gvl_outside_ns();
    uint64_t done0, wall0, done1, wall1;
    sv_win_totals(&done0, &wall0);
    uint64_t iw0[SV_IDLE_WAIT_FIGURES], iw1[SV_IDLE_WAIT_FIGURES];
    static uint64_t sd0[SV_SEND_FIGURES][SV_SEND_BINS], sd1[SV_SEND_FIGURES][SV_SEND_BINS];
    sv_gvl_idle_wait(iw0);
    sv_gvl_sends(sd0);
    for (;;) {
        next += SV_STEADY_STEP_NS;
        uint64_t now = mono_ns();
        if (next + SV_STEADY_STEP_NS < now)
            next = now; /* fell behind by more than a step: the step just ends later */
        struct timespec ts = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ; /* any other error: take the step now rather than spin */
        uint64_t dh = 0, dc = 0;
        for (int i = 0; i < SV_GVL_SLOTS; i++) {
            uint32_t c;
            uint64_t h, u;
            if (!sv_gvl_probe(i, &c, &h, &u)) {
                known[i] = 0;
                continue;
            }
            if (known[i] && claim[i] == c && h >= held[i] && u >= cpu[i]) {
                dh += h - held[i];
                dc += u - cpu[i];
            }
            claim[i] = c;
            held[i] = h;
            cpu[i] = u;
            known[i] = 1;
        }
        uint64_t proc1 = proc_ns();
        uint64_t out1 = sv_gvl_outside_ns();
        sv_win_totals(&done1, &wall1);
        sv_gvl_idle_wait(iw1);
        sv_gvl_sends(sd1);
        pthread_mutex_lock(&mu);
        sv_steady_step *s = &ring[ring_n % SV_STEADY_STEPS];
        s->at = (double)mono_ns() / 1e9;
        s->held = dh;
        s->cpu = dc;
        s->proc = proc1 >= proc0 ? proc1 - proc0 : 0;
        proc0 = proc1;
        s->outside = out1 >= out0 ? out1 - out0 : 0;
        out0 = out1;
        s->done = done1 >= done0 ? done1 - done0 : 0;
        s->wall = wall1 >= wall0 ? wall1 - wall0 : 0;
        done0 = done1;
        wall0 = wall1;
        for (int k = 0; k < SV_IDLE_WAIT_FIGURES; k++) {
            s->idle_wait[k] = iw1[k] >= iw0[k] ? iw1[k] - iw0[k] : 0;
            iw0[k] = iw1[k];
        }
        sv_steady_sends *sd = &send_ring[ring_n % SV_STEADY_STEPS];
        for (int b = 0; b < SV_SEND_BINS; b++) {
            for (int k = 0; k < 2; k++) {
                uint64_t d = sd1[k][b] >= sd0[k][b] ? sd1[k][b] - sd0[k][b] : 0;
                sd->n[k][b] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
            }
            sd->t[b] = sd1[2][b] >= sd0[2][b] ? sd1[2][b] - sd0[2][b] : 0;
        }
        memcpy(sd0, sd1, sizeof(sd0));
        ring_n++;
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

/* Starts the sampler once per process (Native::GVL.enable, after the hook is
 * added: sv_gvl_on_enable). In a forked child the parent's thread is gone
 * and its steps are the parent's: both start over. */
static void start(void)
{
    pid_t pid = getpid();
    if (running_pid == pid)
        return;
    pthread_mutex_init(&mu, NULL);
    memset(ring, 0, sizeof(ring));
    memset(send_ring, 0, sizeof(send_ring));
    ring_n = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    if (pthread_create(&th, &attr, sampler, NULL) == 0) {
        running_pid = pid;
        pthread_setname_np(th, "serval-cpu");
    }
    pthread_attr_destroy(&attr);
}

/* Native::GVL.steadiness -> [step seconds, [[at, held, cpu, proc, outside,
 * idle_wait, idle_sampled, spans, send_wait, send_gvl, filed_gvl, requests, wall, filed_out], ...] oldest first,
 * seconds; proc is the
 * whole process's CPU time in the step, outside the GVL time held outside
 * requests (part of held); gvl.c's sampled in-request idle spans that
 * ended in the step: the run-queue wait in them, their length, their
 * count, the part of that wait in sends whose answer was still out, the
 * GVL waits after those of them the link missed, the GVL waits the link
 * filed after sends whose answer had come (a read held up by its wait for
 * a CPU looks like an answer still out), the requests that ended in the
 * step and their wall time summed (window.c), and the GVL waits the link
 * filed after sampled sends whose answer was still out],
 * the last SV_STEADY_STEPS steps; no steps before Native::GVL.enable in
 * this process. */
static VALUE steadiness(VALUE mod)
{
    sv_steady_step copy[SV_STEADY_STEPS];
    uint64_t n = 0;
    if (running_pid == getpid()) {
        pthread_mutex_lock(&mu);
        memcpy(copy, ring, sizeof(copy));
        n = ring_n;
        pthread_mutex_unlock(&mu);
    }
    uint64_t from = n > SV_STEADY_STEPS ? n - SV_STEADY_STEPS : 0;
    VALUE steps = rb_ary_new_capa((long)(n - from));
    for (uint64_t k = from; k < n; k++) {
        sv_steady_step *s = &copy[k % SV_STEADY_STEPS];
        rb_ary_push(steps, rb_ary_new_from_args(14, DBL2NUM(s->at), DBL2NUM((double)s->held / 1e9),
                                                DBL2NUM((double)s->cpu / 1e9), DBL2NUM((double)s->proc / 1e9),
                                                DBL2NUM((double)s->outside / 1e9),
                                                DBL2NUM((double)s->idle_wait[0] / 1e9),
                                                DBL2NUM((double)s->idle_wait[1] / 1e9), ULL2NUM(s->idle_wait[2]),
                                                DBL2NUM((double)s->idle_wait[3] / 1e9),
                                                DBL2NUM((double)s->idle_wait[4] / 1e9),
                                                DBL2NUM((double)s->idle_wait[5] / 1e9), ULL2NUM(s->done),
                                                DBL2NUM((double)s->wall / 1e9),
                                                DBL2NUM((double)s->idle_wait[6] / 1e9)));
    }
    return rb_ary_new_from_args(2, DBL2NUM((double)SV_STEADY_STEP_NS / 1e9), steps);
}

/* Native::GVL.sends(from) -> [answered, in_wait, times]: gvl.c's sampled
 * sends that ended in the steps since monotonic second `from`, by the time
 * from the send to its answer's read (SEND_BINS' half-octave bins from
 * 4 us): how many found the answer still out, how many found it already
 * in, and those times summed, seconds. nil before any step. */
static VALUE sends(VALUE mod, VALUE from_v)
{
    double from = NUM2DBL(from_v);
    uint64_t n[2][SV_SEND_BINS], t[SV_SEND_BINS];
    memset(n, 0, sizeof(n));
    memset(t, 0, sizeof(t));
    uint64_t steps = 0;
    if (running_pid == getpid()) {
        pthread_mutex_lock(&mu);
        uint64_t first = ring_n > SV_STEADY_STEPS ? ring_n - SV_STEADY_STEPS : 0;
        for (uint64_t k = first; k < ring_n; k++) {
            if (ring[k % SV_STEADY_STEPS].at < from)
                continue;
            sv_steady_sends *sd = &send_ring[k % SV_STEADY_STEPS];
            for (int b = 0; b < SV_SEND_BINS; b++) {
                for (int j = 0; j < 2; j++)
                    n[j][b] += sd->n[j][b];
                t[b] += sd->t[b];
            }
            steps++;
        }
        pthread_mutex_unlock(&mu);
    }
    if (!steps)
        return Qnil;
    VALUE out = rb_ary_new_capa(3);
    for (int k = 0; k < 3; k++) {
        VALUE a = rb_ary_new_capa(SV_SEND_BINS);
        for (int b = 0; b < SV_SEND_BINS; b++)
            rb_ary_push(a, k < 2 ? ULL2NUM(n[k][b]) : DBL2NUM((double)t[b] / 1e9));
        rb_ary_push(out, a);
    }
    return out;
}

/* After sv_init_gvl: Native::GVL.steadiness and .sends, where the GVL hook
 * exists (Ruby 3.2+); the sampler starts with the hook. */
void sv_init_steadiness(VALUE mNative)
{
    VALUE mGVL = rb_const_get(mNative, rb_intern("GVL"));
    rb_define_singleton_method(mGVL, "steadiness", steadiness, 0);
    rb_define_singleton_method(mGVL, "sends", sends, 1);
    sv_gvl_on_enable(start);
}

#else
void sv_init_steadiness(VALUE mNative)
{
    (void)mNative; /* no GVL hook, no sampler (Ruby 3.1) */
}
#endif

/*
 * Serval::Native::Fairness - a shorter GVL time slice for request threads.
 *
 * Ruby lets a thread that computes keep the GVL for its whole time slice
 * (100 ms) while a thread that woke from I/O waits for it. An I/O-bound
 * request beside a CPU-bound one then waits up to a slice after every
 * blocking call (docs/tuning.md, "Fairness between CPU- and I/O-bound
 * requests").
 *
 * On Ruby 3.3+ this file shortens the slice of marked threads (the request
 * threads, ThreadPool marks them through lib/serval/fairness.rb):
 *
 *   - an internal thread event hook counts the threads waiting for the GVL
 *     (READY .. RESUMED, one flag per thread in thread-specific storage) and
 *     notes when the current holder took the GVL and whether it is marked;
 *   - a native ticker thread (no Ruby thread, no GVL) looks whenever the
 *     holder's slice would end; if a marked thread has held the GVL for the
 *     slice while another thread waits, it triggers a postponed job;
 *   - the job runs on the holder at its next interrupt check and gives the
 *     GVL away: rb_nogvl with an empty function releases it and queues the
 *     thread behind the waiters (RB_NOGVL_INTR_FAIL: no interrupt is handled
 *     inside the job, where an exception would be lost).
 *
 * The ticker parks on a condition variable once no thread has waited for
 * PARK_TICKS checks in a row; the hook wakes it (one signal per park). An
 * idle process has no wake-ups; a busy one at most one per slice.
 *
 * Older Rubies have no rb_postponed_job_trigger callable from a non-Ruby
 * thread (3.3+) or no per-thread storage for the hook (3.3+): supported? is
 * false there and lib/serval/fairness.rb falls back to Thread#priority.
 */
#define _GNU_SOURCE 1 /* pthread_setname_np; as ruby/config.h */
#include <stdint.h>
#include <stdatomic.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "fairness.h"
#include "hooks.h"

#ifdef HAVE_RUBY_THREAD_H
#include <ruby/thread.h>
#endif
#ifdef HAVE_RUBY_DEBUG_H
#include <ruby/debug.h>
#endif

#if defined(HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK) && defined(HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET) && \
    defined(HAVE_RB_POSTPONED_JOB_TRIGGER)
#define SV_FAIR 1
#endif

#define MIN_SLICE_NS 200000ull     /* the slices Fairness.start accepts */
#define MAX_SLICE_NS 1000000000ull

#ifdef SV_FAIR

#define FLAG_WAITING 1u  /* READY seen, RESUMED not yet (counted in generation flags >> 2) */
#define FLAG_MARKED 2u   /* a request thread: its slice is shortened */
#define GEN_SHIFT 2
#define PARK_TICKS 64    /* checks without a waiter before the ticker parks */

static rb_internal_thread_specific_key_t key;
static rb_internal_thread_event_hook_t *hook;
static rb_postponed_job_handle_t job = POSTPONED_JOB_HANDLE_INVALID;

static _Atomic int waiting;          /* threads waiting for the GVL */
static _Atomic int holding;          /* some thread holds the GVL (RESUMED .. SUSPENDED) */
static _Atomic int holder_marked;    /* and it is a marked thread */
static _Atomic uint64_t held_since;  /* when it took the GVL */
static _Atomic uint64_t slice_ns;
static _Atomic uint64_t preemptions; /* jobs that gave the GVL away */
static _Atomic uint64_t triggers;    /* jobs triggered */
static _Atomic int parked;
static _Atomic uintptr_t gen = 1;    /* bumped by start: waiting flags of older starts do not count */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_t ticker;
static int running;                  /* under mu */
static pid_t ticker_pid;             /* the process the ticker runs in */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uintptr_t flags_of(VALUE th)
{
    return (uintptr_t)rb_internal_thread_specific_get(th, key);
}

static void set_flags(VALUE th, uintptr_t f)
{
    rb_internal_thread_specific_set(th, key, (void *)f);
}

/* Whether th's READY was counted in waiting since the last start. */
static int counted(uintptr_t f)
{
    return (f & FLAG_WAITING) && (f >> GEN_SHIFT) == atomic_load(&gen);
}

/* waiting - 1, never below 0 (a READY counted before a start's reset). */
static void dec_waiting(void)
{
    int w = atomic_load(&waiting);
    while (w > 0 && !atomic_compare_exchange_weak(&waiting, &w, w - 1))
        ;
}

static void wake_ticker(void)
{
    pthread_mutex_lock(&mu);
    atomic_store(&parked, 0);
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* Never allocates, never calls Ruby; Ruby 3.3 may fire READY for a thread
 * from another native thread, so every event names its thread. */
static void on_event(rb_event_flag_t ev, const rb_internal_thread_event_data_t *d, void *data)
{
    VALUE th = d->thread;
    uintptr_t f = flags_of(th);
    switch (ev) {
    case RUBY_INTERNAL_THREAD_EVENT_READY:
        if (!counted(f)) {
            set_flags(th, (atomic_load(&gen) << GEN_SHIFT) | (f & FLAG_MARKED) | FLAG_WAITING);
            atomic_fetch_add(&waiting, 1);
            if (atomic_load(&parked))
                wake_ticker();
        }
        break;
    case RUBY_INTERNAL_THREAD_EVENT_RESUMED:
        if (counted(f))
            dec_waiting();
        if (f & FLAG_WAITING)
            set_flags(th, f & FLAG_MARKED);
        atomic_store(&held_since, mono_ns());
        atomic_store(&holder_marked, (f & FLAG_MARKED) != 0);
        atomic_store(&holding, 1);
        break;
    case RUBY_INTERNAL_THREAD_EVENT_SUSPENDED:
        atomic_store(&holding, 0);
        break;
    case RUBY_INTERNAL_THREAD_EVENT_EXITED:
        if (counted(f))
            dec_waiting();
        set_flags(th, 0);
        break;
    }
}

/* True when a marked thread has held the GVL for a slice while another waits. */
static int slice_over(uint64_t now)
{
    return atomic_load(&waiting) > 0 && atomic_load(&holding) && atomic_load(&holder_marked) &&
           now - atomic_load(&held_since) >= atomic_load(&slice_ns);
}

static void *noop(void *arg)
{
    return arg;
}

/* Runs on the GVL holder at its next interrupt check. */
static void give_way(void *arg)
{
    if (!(flags_of(rb_thread_current()) & FLAG_MARKED) || !slice_over(mono_ns()))
        return;
    atomic_fetch_add(&preemptions, 1);
    sv_gvl_yielding = 1; /* the GVL hook files this release as stall (gvl.c) */
    rb_nogvl(noop, NULL, NULL, NULL, RB_NOGVL_INTR_FAIL);
    sv_gvl_yielding = 0;
}

static struct timespec abs_time(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    return ts;
}

static void *ticker_main(void *arg)
{
    int quiet = 0;
    pthread_mutex_lock(&mu);
    while (running) {
        uint64_t now = mono_ns(), slice = atomic_load(&slice_ns), next = now + slice;
        if (slice_over(now)) {
            atomic_fetch_add(&triggers, 1);
            rb_postponed_job_trigger(job);
        } else if (atomic_load(&waiting) > 0 && atomic_load(&holding) && atomic_load(&holder_marked)) {
            next = atomic_load(&held_since) + slice; /* when this holder's slice ends */
            if (next <= now)
                next = now + MIN_SLICE_NS;
        }
        quiet = atomic_load(&waiting) > 0 ? 0 : quiet + 1;
        if (quiet >= PARK_TICKS) {
            atomic_store(&parked, 1);
            if (atomic_load(&waiting) == 0) {
                while (running && atomic_load(&parked))
                    pthread_cond_wait(&cv, &mu);
            }
            atomic_store(&parked, 0);
            quiet = 0;
            continue;
        }
        struct timespec ts = abs_time(next);
        pthread_cond_timedwait(&cv, &mu, &ts);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void init_sync(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &attr);
    pthread_condattr_destroy(&attr);
}

/* Fairness.start(slice_seconds): hook and ticker for this process (again in
 * a forked child, where the parent's ticker does not exist); a running
 * ticker takes the new slice. */
static VALUE fair_start(VALUE mod, VALUE seconds)
{
    double s = NUM2DBL(seconds);
    if (!(s * 1e9 >= (double)MIN_SLICE_NS && s * 1e9 <= (double)MAX_SLICE_NS))
        rb_raise(rb_eArgError, "fairness slice must be within %.4f..%.0f s", MIN_SLICE_NS / 1e9, MAX_SLICE_NS / 1e9);
    atomic_store(&slice_ns, (uint64_t)(s * 1e9));
    pid_t pid = getpid();
    if (running && ticker_pid == pid) {
        wake_ticker();
        return Qtrue;
    }
    if (ticker_pid != pid) { /* first start, or a fork: the parent's ticker and lock state are not ours */
        pthread_mutex_init(&mu, NULL);
        init_sync();
        running = 0;
        atomic_store(&waiting, 0);
        atomic_store(&holding, 1);
        atomic_store(&holder_marked, 0);
        atomic_store(&parked, 0);
    }
    atomic_fetch_add(&gen, 1);
    atomic_store(&waiting, 0);
    if (!hook)
        hook = rb_internal_thread_add_event_hook(on_event,
                                                 RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED |
                                                 RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_EXITED,
                                                 NULL);
    running = 1;
    ticker_pid = pid;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals go to Ruby's threads */
    int err = pthread_create(&ticker, NULL, ticker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        running = 0;
        rb_syserr_fail(err, "fairness: pthread_create");
    }
    pthread_setname_np(ticker, "serval-fair");
    return Qtrue;
}

/* Fairness.stop: ends the ticker and removes the hook (tests; shutdown). */
static VALUE fair_stop(VALUE mod)
{
    if (running && ticker_pid == getpid()) {
        pthread_mutex_lock(&mu);
        running = 0;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(ticker, NULL);
    }
    running = 0;
    if (hook) {
        rb_internal_thread_remove_event_hook(hook);
        hook = NULL;
    }
    atomic_store(&waiting, 0);
    return Qnil;
}

static VALUE fair_running_p(VALUE mod)
{
    return running && ticker_pid == getpid() ? Qtrue : Qfalse;
}

/* Fairness.mark(thread, on): whether thread's slice is shortened. */
static VALUE fair_mark(VALUE mod, VALUE th, VALUE on)
{
    if (!rb_obj_is_kind_of(th, rb_cThread))
        rb_raise(rb_eTypeError, "expected a Thread");
    uintptr_t f = flags_of(th);
    set_flags(th, RTEST(on) ? f | FLAG_MARKED : f & ~(uintptr_t)FLAG_MARKED);
    return on;
}

static VALUE fair_marked_p(VALUE mod, VALUE th)
{
    if (!rb_obj_is_kind_of(th, rb_cThread))
        rb_raise(rb_eTypeError, "expected a Thread");
    return flags_of(th) & FLAG_MARKED ? Qtrue : Qfalse;
}

/* {preemptions:, triggers:, slice:, running:} */
static VALUE fair_stats(VALUE mod)
{
    VALUE h = rb_hash_new();
    rb_hash_aset(h, ID2SYM(rb_intern("preemptions")), ULL2NUM(atomic_load(&preemptions)));
    rb_hash_aset(h, ID2SYM(rb_intern("triggers")), ULL2NUM(atomic_load(&triggers)));
    rb_hash_aset(h, ID2SYM(rb_intern("slice")), DBL2NUM(atomic_load(&slice_ns) / 1e9));
    rb_hash_aset(h, ID2SYM(rb_intern("running")), fair_running_p(mod));
    return h;
}

#endif /* SV_FAIR */

static VALUE fair_supported_p(VALUE mod)
{
#ifdef SV_FAIR
    return Qtrue;
#else
    return Qfalse;
#endif
}

void sv_init_fairness(VALUE mNative)
{
    VALUE m = rb_define_module_under(mNative, "Fairness");
    rb_define_singleton_method(m, "supported?", fair_supported_p, 0);
    rb_define_const(m, "MIN_SLICE", DBL2NUM(MIN_SLICE_NS / 1e9));
    rb_define_const(m, "MAX_SLICE", DBL2NUM(MAX_SLICE_NS / 1e9));
#ifdef SV_FAIR
    key = rb_internal_thread_specific_key_create();
    job = rb_postponed_job_preregister(0, give_way, NULL);
    if (job == POSTPONED_JOB_HANDLE_INVALID)
        rb_raise(rb_eRuntimeError, "fairness: Ruby's postponed job table is full");
    init_sync();
    rb_define_singleton_method(m, "start", fair_start, 1);
    rb_define_singleton_method(m, "stop", fair_stop, 0);
    rb_define_singleton_method(m, "running?", fair_running_p, 0);
    rb_define_singleton_method(m, "mark", fair_mark, 2);
    rb_define_singleton_method(m, "marked?", fair_marked_p, 1);
    rb_define_singleton_method(m, "stats", fair_stats, 0);
#endif
}

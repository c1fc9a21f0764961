/*
 * Serval::Timing - where one request's time went, measured in C.
 *
 * Attached to the core through its hooks (hooks.h, Timing.attach): sv_tm_begin
 * runs just before the app (Request#start / #timing_begin) and sv_tm_end just
 * after the response is handed to the core (Request#finish / #timing_end). Both run with the GVL held, so the process-wide histograms below need no lock. The cheap
 * figures (queue, wall, GC, and on Ruby 3.2+ the GVL split from the hook) are
 * taken for every request; the thread CPU clock is a system call (~0.6 us
 * measured here), so it is read only when the caller asks (sampled).
 *
 * With Active Record loaded (lib/serval/db_pools.rb) a request also reports
 * pool_wait: time blocked checking out a database connection. The run, idle
 * and stall time that fell inside those waits is taken out of the three, so
 * run + idle + stall + pool_wait = wall (3.2+); on 3.1 it comes out of wait.
 *
 * On Ruby 3.3+ a request also reports lock: the idle spans the GVL hook
 * found to be waits for a Ruby lock (Mutex, Monitor, ConditionVariable,
 * Queue; ext/serval/gvl.c), already taken out of idle there, so
 * run + idle + stall + lock + pool_wait = wall.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "timing.h"
#include "hooks.h"
#include "gvl.h"
#include "window.h"

#define SV_TM_METRICS 7          /* queue, run, idle, stall, upstream queue, pool_wait, lock */
#define SV_TM_BUCKETS 13
#define SV_TM_SLOTS (SV_TM_BUCKETS + 1)
#define SV_UPSTREAM_MAX 60.0     /* seconds; larger upstream queue times are clamped (skew) */

static const double bucket_le[SV_TM_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
};

enum { TM_QUEUE = 0, TM_RUN, TM_IDLE, TM_STALL, TM_UPSTREAM, TM_POOL, TM_LOCK };

/* Process-wide aggregates: touched only with the GVL held. */
static uint64_t agg_counts[SV_TM_METRICS][SV_TM_SLOTS];
static double agg_sums[SV_TM_METRICS];
static double agg_cpu;
static double agg_wall;          /* wall seconds of every timed request */
static uint64_t agg_timed;       /* timed requests */


static VALUE cTiming, k_timing, k_xrs, k_xqs;
static unsigned long sample_cap = 1000; /* Timing.sample_cap= (timing_sample_cap); 0: no cap */
static ID id_total_time;

/* A sampled request's record, embedded in its object on Ruby 3.3+ (no
 * calloc and free per sampled request). */
static const rb_data_type_t tm_type = {
    "Serval::Timing",
    {NULL, RUBY_TYPED_DEFAULT_FREE, NULL},
    NULL, NULL, RUBY_TYPED_FREE_IMMEDIATELY | SV_TYPED_EMBEDDABLE,
};

static uint64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t gc_ns(void)
{
    return NUM2ULL(rb_funcall(rb_mGC, id_total_time, 0));
}

static sv_tm *get(VALUE self)
{
    sv_tm *t;
    TypedData_Get_Struct(self, sv_tm, &tm_type, t);
    return t;
}

/* Seconds since the epoch stamped by a proxy: "t=1700000000.123", a bare
 * number, in s, ms, us or ns (told by magnitude). NaN when there is no number. */
double sv_upstream_epoch(const char *p, long n)
{
    long i = 0;
    while (i < n && (p[i] < '0' || p[i] > '9'))
        i++;
    if (i == n)
        return NAN;
    double v = 0, scale = 0;
    int digits = 0;
    for (; i < n && digits < 40; i++) {
        char ch = p[i];
        if (ch >= '0' && ch <= '9') {
            v = v * 10 + (ch - '0');
            if (scale > 0)
                scale *= 10;
            digits++;
        } else if (ch == '.' && scale == 0) {
            scale = 1;
        } else {
            break;
        }
    }
    if (scale > 1)
        v /= scale;
    if (v >= 1e17) return v / 1e9;
    if (v >= 1e14) return v / 1e6;
    if (v >= 1e11) return v / 1e3;
    return v;
}

static double upstream_seconds(VALUE header)
{
    if (!RB_TYPE_P(header, T_STRING))
        return NAN;
    double stamp = sv_upstream_epoch(RSTRING_PTR(header), RSTRING_LEN(header));
    if (isnan(stamp))
        return NAN;
    double now = (double)clock_ns(CLOCK_REALTIME) / 1e9;
    double d = now - stamp;
    return d < 0 ? 0 : (d > SV_UPSTREAM_MAX ? SV_UPSTREAM_MAX : d);
}

/* Notes the clocks at the start of a request. `detailed` requests (the sampled
 * ones, which get a Timing object in the env) also read the thread CPU clock
 * (a system call) and GC.total_time. */
void sv_tm_begin(sv_tm *t, double queued_at, VALUE env, int detailed, int upstream)
{
    /* no memset of the whole record: it lives in the connection (four cache
     * lines, cold with many connections); the fields a flag guards are set
     * only when the flag is */
    t->has_cpu = t->has_gc = t->finished = 0;
    t->end_ns = 0;
    t->start_ns = clock_ns(CLOCK_MONOTONIC);
    double q = (double)t->start_ns / 1e9 - queued_at;
    t->queue = q < 0 ? 0 : q;
    t->upstream = NAN;
    t->has_gvl = sv_gvl_mark(1, t->gvl0, t->start_ns);
    t->has_pool = sv_pool_wait_counters(t->pw0);
    /* the upstream queue histogram: two hash lookups, only when the env
     * builder saw one of the headers (or did not build this env) */
    if (upstream) {
        VALUE h = rb_hash_lookup2(env, k_xrs, Qnil);
        if (NIL_P(h))
            h = rb_hash_lookup2(env, k_xqs, Qnil);
        if (!NIL_P(h))
            t->upstream = upstream_seconds(h);
    }
    if (!detailed)
        return;
    t->has_gc = 1;
    t->gc0 = gc_ns();
    t->has_cpu = 1;
    t->cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

static void add(int metric, double v)
{
    int i = 0;
    while (i < SV_TM_BUCKETS && v > bucket_le[i])
        i++;
    agg_counts[metric][i]++;
    agg_sums[metric] += v;
}

/* Pool-wait figure k (0 wall, 1 run, 2 idle, 3 stall) over the request, ns. */
static uint64_t pw_delta(const sv_tm *t, int k)
{
    return t->has_pool && t->pw1[k] > t->pw0[k] ? t->pw1[k] - t->pw0[k] : 0;
}

/* GVL figure k (0 run, 1 idle, 2 stall) over the request without the part
 * spent waiting for a database connection, ns. */
static uint64_t gvl_part(const sv_tm *t, int k)
{
    uint64_t d = t->gvl1[k] - t->gvl0[k], p = pw_delta(t, k + 1);
    return d > p ? d - p : 0;
}

/* Lock waits over the request, ns (0 before 3.3: told apart nowhere). */
static uint64_t lock_part(const sv_tm *t)
{
    return t->gvl1[4] > t->gvl0[4] ? t->gvl1[4] - t->gvl0[4] : 0;
}

/* wall - cpu - pool_wait of a request with the CPU clock (3.1), seconds. */
static double cpu_wait(const sv_tm *t)
{
    double w = (double)(t->end_ns - t->start_ns) / 1e9 - (double)(t->cpu1 - t->cpu0) / 1e9
             - (double)pw_delta(t, 0) / 1e9;
    return w > 0 ? w : 0;
}

/* Notes the clocks at the end and adds the request to the histograms. */
void sv_tm_end(sv_tm *t)
{
    if (t->finished)
        return;
    t->finished = 1;
    t->end_ns = clock_ns(CLOCK_MONOTONIC);
    if (t->has_gvl) /* at end_ns: the GVL span lies inside start_ns .. end_ns */
        t->has_gvl = sv_gvl_mark(0, t->gvl1, t->end_ns);
    if (t->has_gc)
        t->gc1 = gc_ns();
    if (t->has_cpu)
        t->cpu1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (t->has_pool)
        t->has_pool = sv_pool_wait_counters(t->pw1);
    double wall = (double)(t->end_ns - t->start_ns) / 1e9;
    double f[SV_WIN_FIG] = {t->queue, NAN, NAN, NAN, NAN, wall, NAN, NAN};
    long idle_periods = -1;
    agg_wall += wall;
    agg_timed++;
    add(TM_QUEUE, t->queue);
    if (!isnan(t->upstream))
        add(TM_UPSTREAM, t->upstream);
    f[SV_WIN_POOL] = t->has_pool ? (double)pw_delta(t, 0) / 1e9 : NAN; /* absent without Active Record */
    if (t->has_pool)
        add(TM_POOL, f[SV_WIN_POOL]);
    if (t->has_cpu)
        f[SV_WIN_CPU] = (double)(t->cpu1 - t->cpu0) / 1e9;
    if (t->has_gvl) {
        for (int k = 0; k < 3; k++) {
            f[SV_WIN_RUN + k] = (double)gvl_part(t, k) / 1e9;
            add(TM_RUN + k, f[SV_WIN_RUN + k]);
        }
        idle_periods = (long)(t->gvl1[3] - t->gvl0[3]);
        if (sv_gvl_lock_split()) {
            f[SV_WIN_LOCK] = (double)lock_part(t) / 1e9;
            add(TM_LOCK, f[SV_WIN_LOCK]);
        }
    } else if (t->has_cpu) {
        agg_cpu += f[SV_WIN_CPU];
        f[SV_WIN_RUN] = f[SV_WIN_CPU];
        f[SV_WIN_IDLE] = cpu_wait(t);
        add(TM_RUN, f[SV_WIN_RUN]);
        add(TM_IDLE, f[SV_WIN_IDLE]);
    }
    void *entry = sv_win_record((double)t->end_ns / 1e9, f, idle_periods);
    if (entry && t->has_gvl) { /* in the reservoir: its shape too */
        float segs[SV_SEGS];
        sv_win_set_shape(entry, segs, sv_gvl_segments(segs, t->end_ns));
    }
}

#define NS(x) DBL2NUM((double)(x) / 1e9)

static VALUE tm_queue(VALUE self) { return DBL2NUM(get(self)->queue); }
static VALUE tm_upstream(VALUE self)
{
    double u = get(self)->upstream;
    return isnan(u) ? Qnil : DBL2NUM(u);
}
static VALUE tm_started_ns(VALUE self) { return ULL2NUM(get(self)->start_ns); }
static VALUE tm_finished_ns(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished ? ULL2NUM(t->end_ns) : Qnil;
}
static VALUE tm_wall(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished ? NS(t->end_ns - t->start_ns) : Qnil;
}
static VALUE tm_gc(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished && t->has_gc ? NS(t->gc1 - t->gc0) : Qnil;
}
static VALUE tm_cpu(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished && t->has_cpu ? NS(t->cpu1 - t->cpu0) : Qnil;
}
static VALUE tm_gvl(VALUE self, int k)
{
    sv_tm *t = get(self);
    return t->finished && t->has_gvl ? NS(gvl_part(t, k)) : Qnil;
}
static VALUE tm_run(VALUE self) { return tm_gvl(self, 0); }
static VALUE tm_idle(VALUE self) { return tm_gvl(self, 1); }
static VALUE tm_stall(VALUE self) { return tm_gvl(self, 2); }

/* Time blocked checking out a database connection; nil without Active Record. */
static VALUE tm_pool_wait(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished && t->has_pool ? NS(pw_delta(t, 0)) : Qnil;
}

/* Time waiting for a Ruby lock (Ruby 3.3+); nil where not told apart. */
static VALUE tm_lock(VALUE self)
{
    sv_tm *t = get(self);
    return t->finished && t->has_gvl && sv_gvl_lock_split() ? NS(lock_part(t)) : Qnil;
}

/* idle + stall + lock with the hook; else wall - cpu; nil when neither.
 * Either way without pool_wait. */
static VALUE tm_wait(VALUE self)
{
    sv_tm *t = get(self);
    if (!t->finished)
        return Qnil;
    if (t->has_gvl)
        return NS(gvl_part(t, 1) + gvl_part(t, 2) + lock_part(t));
    if (!t->has_cpu)
        return Qnil;
    return DBL2NUM(cpu_wait(t));
}

static VALUE tm_gvl_split_p(VALUE self)
{
    return get(self)->has_gvl ? Qtrue : Qfalse;
}

/* [flat counts (metric-major, SV_TM_SLOTS each), sums, cpu_total, bucket
 * bounds, wall_total, timed requests]. */
static VALUE tm_aggregate(VALUE klass)
{
    VALUE counts = rb_ary_new_capa(SV_TM_METRICS * SV_TM_SLOTS);
    VALUE sums = rb_ary_new_capa(SV_TM_METRICS);
    for (int m = 0; m < SV_TM_METRICS; m++) {
        for (int i = 0; i < SV_TM_SLOTS; i++)
            rb_ary_push(counts, ULL2NUM(agg_counts[m][i]));
        rb_ary_push(sums, DBL2NUM(agg_sums[m]));
    }
    VALUE le = rb_ary_new_capa(SV_TM_BUCKETS);
    for (int i = 0; i < SV_TM_BUCKETS; i++)
        rb_ary_push(le, DBL2NUM(bucket_le[i]));
    return rb_ary_new_from_args(6, counts, sums, DBL2NUM(agg_cpu), le, DBL2NUM(agg_wall), ULL2NUM(agg_timed));
}

/* Zeroes the aggregates (a forked child starts its own). */
static VALUE tm_reset(VALUE klass)
{
    memset(agg_counts, 0, sizeof(agg_counts));
    memset(agg_sums, 0, sizeof(agg_sums));
    agg_cpu = 0;
    agg_wall = 0;
    agg_timed = 0;
    return Qnil;
}

static VALUE tm_upstream_epoch(VALUE klass, VALUE s)
{
    StringValue(s);
    double v = sv_upstream_epoch(RSTRING_PTR(s), RSTRING_LEN(s));
    return isnan(v) ? Qnil : DBL2NUM(v);
}

static VALUE fstr(const char *s)
{
    VALUE v = rb_obj_freeze(rb_str_new_cstr(s));
    rb_gc_register_mark_object(v);
    return v;
}

static int64_t cap_second = -1;  /* the second (of queued_at) cap_used counts in */
static unsigned long cap_used;

/* Request#start, for a request the sampling rate picked when the rate is
 * below 1 (every > 1): at most sample_cap
 * requests a second are sampled (0: no cap): the CPU clock is a system call,
 * and past a few hundred a second more samples add cost, not precision. The
 * second is the one the request became complete in (no clock read). */
int sv_timing_under_cap(double queued_at)
{
    unsigned long cap = sample_cap;
    if (cap == 0)
        return 1;
    int64_t second = (int64_t)queued_at;
    if (second != cap_second) {
        cap_second = second;
        cap_used = 0;
    }
    if (cap_used >= cap)
        return 0;
    cap_used++;
    return 1;
}

/* Timing.sample_cap: sampled requests a second at most (0: no cap), for a
 * sampling rate below 1; process-wide, set by the request handler. */
static VALUE tm_sample_cap(VALUE klass)
{
    (void)klass;
    return ULONG2NUM(sample_cap);
}

static VALUE tm_set_sample_cap(VALUE klass, VALUE cap)
{
    (void)klass;
    long v = NUM2LONG(cap);
    if (v < 0)
        rb_raise(rb_eArgError, "sample_cap must be >= 0");
    sample_cap = (unsigned long)v;
    cap_second = -1; /* a new cap counts afresh */
    cap_used = 0;
    return cap;
}

/* A new Timing object for env["serval.timing"]; *out is its record. */
static VALUE timing_new(sv_tm **out)
{
    sv_tm *t;
    VALUE obj = TypedData_Make_Struct(cTiming, sv_tm, &tm_type, t);
    *out = t;
    return obj;
}

/* hooks.h begin: every request is measured into the histograms; one in
 * `every` (0 = none) also gets a Timing object in env["serval.timing"] with
 * CPU and GC time. Process-wide counter, GVL held. */
static unsigned long sample_n;

static sv_tm *hook_begin(sv_tm *plain, VALUE env, double queued_at, unsigned long every, int upstream, VALUE *obj)
{
    int detailed = every > 0 && ++sample_n % every == 0;
    if (detailed && every > 1)
        detailed = sv_timing_under_cap(queued_at);
    sv_tm *t = plain;
    if (detailed) {
        *obj = timing_new(&t);
        rb_hash_aset(env, k_timing, *obj);
    }
    sv_tm_begin(t, queued_at, env, detailed, upstream);
    return t;
}

/* Timing.attach: the core calls this module at each request from now on
 * (hooks.h); idempotent. Without it (timing false) the core times nothing. */
static VALUE tm_attach(VALUE klass)
{
    (void)klass;
    sv_hooks.end = sv_tm_end;
    sv_hooks.begin = hook_begin;
    return Qtrue;
}

static VALUE tm_attached_p(VALUE klass)
{
    (void)klass;
    return sv_hooks.begin == hook_begin ? Qtrue : Qfalse;
}

void sv_init_timing(VALUE mServal)
{
    id_total_time = rb_intern("total_time");
    k_timing = fstr("serval.timing");
    k_xrs = fstr("HTTP_X_REQUEST_START");
    k_xqs = fstr("HTTP_X_QUEUE_START");
    cTiming = rb_define_class_under(mServal, "Timing", rb_cObject);
    rb_undef_alloc_func(cTiming);
    rb_define_singleton_method(cTiming, "aggregate", tm_aggregate, 0);
    rb_define_singleton_method(cTiming, "reset_aggregate", tm_reset, 0);
    rb_define_singleton_method(cTiming, "upstream_epoch", tm_upstream_epoch, 1);
    rb_define_singleton_method(cTiming, "sample_cap", tm_sample_cap, 0);
    rb_define_singleton_method(cTiming, "attach", tm_attach, 0);
    rb_define_singleton_method(cTiming, "attached?", tm_attached_p, 0);
    rb_define_singleton_method(cTiming, "sample_cap=", tm_set_sample_cap, 1);
    rb_define_const(cTiming, "UPSTREAM_MAX", DBL2NUM(SV_UPSTREAM_MAX));
    rb_define_method(cTiming, "queue", tm_queue, 0);
    rb_define_method(cTiming, "upstream_queue", tm_upstream, 0);
    rb_define_method(cTiming, "wall", tm_wall, 0);
    rb_define_method(cTiming, "cpu", tm_cpu, 0);
    rb_define_method(cTiming, "gc", tm_gc, 0);
    rb_define_method(cTiming, "run", tm_run, 0);
    rb_define_method(cTiming, "idle", tm_idle, 0);
    rb_define_method(cTiming, "stall", tm_stall, 0);
    rb_define_method(cTiming, "wait", tm_wait, 0);
    rb_define_method(cTiming, "pool_wait", tm_pool_wait, 0);
    rb_define_method(cTiming, "lock", tm_lock, 0);
    rb_define_method(cTiming, "started_ns", tm_started_ns, 0);
    rb_define_method(cTiming, "finished_ns", tm_finished_ns, 0);
    rb_define_method(cTiming, "gvl_split?", tm_gvl_split_p, 0);
    sv_init_window(cTiming);
}

/*
 * The rolling window of one process's requests (Serval::Timing.window_*):
 * the last SV_WIN_BUCKETS x SV_WIN_SPAN seconds, one bucket per span. Each
 * bucket keeps, per figure (queue, run, idle, stall, pool_wait, wall, cpu, lock),
 * a histogram on fixed half-octave bounds and the sum, and a reservoir of up
 * to SV_WIN_RES requests sampled uniformly over the bucket (Vitter's
 * algorithm R), so memory and the cost of a request are fixed however busy
 * the process is. sv_win_record runs at the end of every request with the
 * GVL held, as do the readers: no lock, no allocation, no Ruby call.
 *
 * A bucket is reused when its slot comes round again (epoch = now / span);
 * a reader takes the buckets younger than the window and merges them in Ruby
 * (lib/serval/timing/window.rb).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "winslot.h"
#include "window.h"
#include "gvl.h" /* SV_SEGS: a request's shape */

#define SV_WIN_BUCKETS 6
#define SV_WIN_SPAN 10.0          /* seconds per bucket */
#define SV_WIN_RES 512            /* sampled requests kept per bucket */
#define SV_WIN_SLOTS (SV_WIN_BOUNDS + 1) /* SV_WIN_BOUNDS, SV_WIN_LOW: winslot.h */

typedef struct {
    double f[SV_WIN_FIG];
    uint8_t nseg;                 /* 0: no shape (no GVL hook) */
    float seg[SV_SEGS];           /* held, idle, ..., held (sv_gvl_segments) */
} sv_win_sample;

typedef struct {
    int64_t epoch;                /* -1: never used */
    uint64_t requests;            /* every request of the bucket */
    uint64_t split;               /* requests with the GVL split */
    uint64_t idle_periods;        /* their idle periods, summed */
    uint64_t counts[SV_WIN_FIG][SV_WIN_SLOTS];
    double sums[SV_WIN_FIG];
    uint64_t seen;                /* requests offered to the reservoir */
    uint64_t next_in;             /* full reservoir: the next request offered that goes in (Algorithm L) */
    double w;                     /* Algorithm L's running weight */
    uint32_t n;                   /* held in the reservoir */
    sv_win_sample res[SV_WIN_RES];
} sv_win_bucket;

static sv_win_bucket buckets[SV_WIN_BUCKETS];
/* Every request recorded since the process started and their wall time
 * (ns), never reset: steadiness.c's sampler reads them each step without
 * the GVL (sv_win_totals), so they are written and read atomically. */
static uint64_t done_total, wall_total_ns;
static double started;            /* monotonic seconds of the last reset */
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Uniform in (0, 1). */
static double unit_rand(void)
{
    return ((double)(next_rand() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Algorithm L (Li, 1994): once the reservoir is full, how many requests on
 * the next one to go in is, drawn at once, so the requests in between cost
 * a compare instead of a random number and a division each. */
static void next_entry(sv_win_bucket *b)
{
    double skip = floor(log(unit_rand()) / log1p(-b->w));
    b->next_in = isfinite(skip) && skip < 1e18 ? b->seen + (uint64_t)skip + 1 : UINT64_MAX;
    b->w *= exp(log(unit_rand()) / SV_WIN_RES);
}

static void reset_all(double now)
{
    memset(buckets, 0, sizeof(buckets));
    for (int b = 0; b < SV_WIN_BUCKETS; b++)
        buckets[b].epoch = -1;
    started = now;
}

/* The bucket of the span in progress, kept: a request in it finds it by two
 * compares instead of a floor and two divisions. */
static struct {
    double from, to;
    int64_t epoch;
    sv_win_bucket *b;
} cur = {0, -1, -1, NULL};

static sv_win_bucket *bucket_at(double now)
{
    if (now >= cur.from && now < cur.to && cur.b->epoch == cur.epoch)
        return cur.b;
    int64_t epoch = (int64_t)floor(now / SV_WIN_SPAN);
    sv_win_bucket *b = &buckets[((epoch % SV_WIN_BUCKETS) + SV_WIN_BUCKETS) % SV_WIN_BUCKETS];
    if (b->epoch > epoch)
        return NULL; /* older than the window: its slot holds a newer bucket */
    if (b->epoch != epoch) {
        memset(b, 0, offsetof(sv_win_bucket, res)); /* the reservoir is overwritten as it refills */
        b->epoch = epoch;
    }
    cur.from = (double)epoch * SV_WIN_SPAN;
    cur.to = (double)(epoch + 1) * SV_WIN_SPAN;
    cur.epoch = epoch;
    cur.b = b;
    return b;
}

/* One request ending at now (monotonic seconds): f[k] in seconds, NaN when figure k was not measured. Only
 * requests with run and idle (the GVL split, or a sampled CPU clock) enter
 * the reservoir and the run/idle/stall/cpu histograms. idle_periods < 0:
 * unknown. Returns where the request's shape goes when it went into the
 * reservoir (the caller fills it: sv_win_set_shape), else NULL: the shape of
 * the many requests that do not is never read. */
void *sv_win_record(double now, const double f[SV_WIN_FIG], long idle_periods)
{
    __atomic_fetch_add(&done_total, 1, __ATOMIC_RELAXED);
    if (!isnan(f[SV_WIN_WALL]) && f[SV_WIN_WALL] > 0)
        __atomic_fetch_add(&wall_total_ns, (uint64_t)(f[SV_WIN_WALL] * 1e9), __ATOMIC_RELAXED);
    sv_win_bucket *b = bucket_at(now);
    if (!b)
        return NULL;
    b->requests++;
    if (idle_periods >= 0) {
        b->split++;
        b->idle_periods += (uint64_t)idle_periods;
    }
    for (int k = 0; k < SV_WIN_FIG; k++) {
        if (isnan(f[k]))
            continue;
        b->counts[k][sv_win_slot(f[k])]++;
        b->sums[k] += f[k];
    }
    if (isnan(f[SV_WIN_RUN]) || isnan(f[SV_WIN_IDLE]))
        return NULL;
    uint64_t seen = ++b->seen;
    uint64_t j;
    if (seen <= SV_WIN_RES) {
        j = seen - 1;
        b->n = (uint32_t)seen;
        if (seen == SV_WIN_RES) {
            b->w = exp(log(unit_rand()) / SV_WIN_RES);
            next_entry(b);
        }
    } else if (seen == b->next_in) {
        j = next_rand() % SV_WIN_RES;
        next_entry(b);
    } else {
        return NULL;
    }
    memcpy(b->res[j].f, f, sizeof(b->res[j].f));
    b->res[j].nseg = 0;
    return &b->res[j];
}

void sv_win_totals(uint64_t *done, uint64_t *wall_ns)
{
    *done = __atomic_load_n(&done_total, __ATOMIC_RELAXED);
    *wall_ns = __atomic_load_n(&wall_total_ns, __ATOMIC_RELAXED);
}

/* The shape of the request sv_win_record just put in at entry (nseg spans). */
void sv_win_set_shape(void *entry, const float *segs, int nseg)
{
    sv_win_sample *s = entry;
    if (nseg <= 0 || nseg > SV_SEGS)
        return;
    memcpy(s->seg, segs, sizeof(float) * (size_t)nseg);
    s->nseg = (uint8_t)nseg;
}

static double opt_now(int argc, VALUE *argv)
{
    return argc > 0 && !NIL_P(argv[0]) ? NUM2DBL(argv[0]) : mono();
}

/* Timing.window_buckets(now = monotonic) -> [seconds covered, bounds,
 * buckets younger than the window, newest first], each bucket
 * [start, requests, split, idle_periods, counts (figure-major), sums,
 * samples (flat, SV_WIN_FIG per request, nil where not measured), requests
 * the samples were drawn from, the samples' shapes (an Array of seconds
 * [held, idle, ..., held] per sample, nil without one)]. */
static VALUE win_buckets(int argc, VALUE *argv, VALUE klass)
{
    rb_check_arity(argc, 0, 1);
    double now = opt_now(argc, argv);
    int64_t epoch = (int64_t)floor(now / SV_WIN_SPAN);
    double from = (double)(epoch - SV_WIN_BUCKETS + 1) * SV_WIN_SPAN;
    double covered = now - (from > started ? from : started);
    VALUE bounds = rb_ary_new_capa(SV_WIN_BOUNDS);
    for (int i = 0; i < SV_WIN_BOUNDS; i++)
        rb_ary_push(bounds, DBL2NUM(SV_WIN_LOW * pow(2.0, i / 2.0)));
    VALUE out = rb_ary_new();
    for (int64_t e = epoch; e > epoch - SV_WIN_BUCKETS; e--) {
        sv_win_bucket *b = &buckets[((e % SV_WIN_BUCKETS) + SV_WIN_BUCKETS) % SV_WIN_BUCKETS];
        if (b->epoch != e || b->requests == 0)
            continue;
        VALUE counts = rb_ary_new_capa(SV_WIN_FIG * SV_WIN_SLOTS);
        VALUE sums = rb_ary_new_capa(SV_WIN_FIG);
        for (int k = 0; k < SV_WIN_FIG; k++) {
            for (int i = 0; i < SV_WIN_SLOTS; i++)
                rb_ary_push(counts, ULL2NUM(b->counts[k][i]));
            rb_ary_push(sums, DBL2NUM(b->sums[k]));
        }
        VALUE samples = rb_ary_new_capa((long)b->n * SV_WIN_FIG);
        VALUE shapes = rb_ary_new_capa((long)b->n);
        for (uint32_t s = 0; s < b->n; s++) {
            for (int k = 0; k < SV_WIN_FIG; k++)
                rb_ary_push(samples, isnan(b->res[s].f[k]) ? Qnil : DBL2NUM(b->res[s].f[k]));
            VALUE shape = Qnil;
            if (b->res[s].nseg > 0) {
                shape = rb_ary_new_capa(b->res[s].nseg);
                for (int k = 0; k < b->res[s].nseg; k++)
                    rb_ary_push(shape, DBL2NUM((double)b->res[s].seg[k]));
            }
            rb_ary_push(shapes, shape);
        }
        VALUE row = rb_ary_new_from_args(9, DBL2NUM((double)e * SV_WIN_SPAN), ULL2NUM(b->requests),
                                         ULL2NUM(b->split), ULL2NUM(b->idle_periods), counts, sums, samples,
                                         ULL2NUM(b->seen), shapes);
        rb_ary_push(out, row);
    }
    return rb_ary_new_from_args(3, DBL2NUM(covered < 0 ? 0 : covered), bounds, out);
}

/* Timing.window_record(now, [queue, run, idle, stall, pool_wait, wall, cpu(, lock)],
 * idle_periods, shape = nil): a request at a given clock, for tests (nil:
 * not measured; shape: [held, idle, ..., held] seconds, SV_SEGS at most). */
static VALUE win_record(int argc, VALUE *argv, VALUE klass)
{
    rb_check_arity(argc, 3, 4);
    VALUE now = argv[0], figures = argv[1], idle_periods = argv[2];
    VALUE shape = argc > 3 ? argv[3] : Qnil;
    double f[SV_WIN_FIG];
    float segs[SV_SEGS];
    int nseg = 0;
    if (!NIL_P(shape)) {
        Check_Type(shape, T_ARRAY);
        long n = RARRAY_LEN(shape);
        if (n > SV_SEGS || (n & 1) == 0)
            rb_raise(rb_eArgError, "a shape has an odd number of spans, at most %d", SV_SEGS);
        for (long k = 0; k < n; k++)
            segs[k] = (float)NUM2DBL(rb_ary_entry(shape, k));
        nseg = (int)n;
    }
    Check_Type(figures, T_ARRAY);
    long nf = RARRAY_LEN(figures);
    if (nf != SV_WIN_FIG && nf != SV_WIN_FIG - 1) /* lock may be left out */
        rb_raise(rb_eArgError, "window_record takes %d or %d figures", SV_WIN_FIG - 1, SV_WIN_FIG);
    for (int k = 0; k < SV_WIN_FIG; k++) {
        VALUE v = k < nf ? rb_ary_entry(figures, k) : Qnil;
        f[k] = NIL_P(v) ? NAN : NUM2DBL(v);
    }
    void *entry = sv_win_record(NUM2DBL(now), f, NIL_P(idle_periods) ? -1 : NUM2LONG(idle_periods));
    if (entry)
        sv_win_set_shape(entry, segs, nseg);
    return Qnil;
}

/* Timing.window_reset(now = monotonic): empties the window (a forked child, tests). */
static VALUE win_reset(int argc, VALUE *argv, VALUE klass)
{
    rb_check_arity(argc, 0, 1);
    reset_all(opt_now(argc, argv));
    return Qnil;
}

void sv_init_window(VALUE cTiming)
{
    reset_all(mono());
    rb_define_singleton_method(cTiming, "window_buckets", win_buckets, -1);
    rb_define_singleton_method(cTiming, "window_record", win_record, -1);
    rb_define_const(cTiming, "WINDOW_SHAPE_SPANS", INT2NUM(SV_SEGS));
    rb_define_singleton_method(cTiming, "window_reset", win_reset, -1);
    rb_define_const(cTiming, "WINDOW_SPAN", DBL2NUM(SV_WIN_SPAN));
    rb_define_const(cTiming, "WINDOW_BUCKETS", INT2NUM(SV_WIN_BUCKETS));
    rb_define_const(cTiming, "WINDOW_RESERVOIR", INT2NUM(SV_WIN_RES));
}

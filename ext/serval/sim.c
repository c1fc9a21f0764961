/* The advice's discrete-event loop (Serval::Advice::Simulation#play) in C.
 *
 * Pure computation for `servalctl advise` and `/advice`: no part of the
 * serving core calls it. lib/serval/advice/simulation.rb documents the
 * model and keeps the same loop in Ruby (play_ruby); the two must give the
 * same figures to the last bit (test/advice/native_sim_test.rb), so this
 * file follows that loop step for step, in the same order of floating-point
 * operations. A change to the model goes into both.
 *
 * Serval::Native::Sim.play(segs, offs, marks, threads, arrivals, opts, speeds, pick)
 *   segs      String of doubles: every profile's segments, one after another
 *   offs      String of int64: where each profile starts in segs (n + 1)
 *   marks     nil or String of bytes, one per segment: 1 where that wait
 *             holds the lock
 *   threads   Integer >= 1
 *   arrivals  nil (closed loop) or String of n doubles
 *   opts      Array [quantum, handoff, scale, loop_cpu, between, offset,
 *             step, pool]: Floats, pool an Integer (0: none)
 *   speeds    nil or String of doubles (used only with arrivals)
 *   pick      nil (order: :fifo) or the Random to draw a waiter from
 * returns [finished, latency, wall, stall, pool_wait, queue, lock, busy]:
 * seven Strings of doubles, one per request in finishing order, and a
 * Float. Simulation::Packed reads them with the three below, which work on
 * a slice [from, to] of such a String:
 *
 * Serval::Native::Sim.order(str, from, to, ranks)  the slice's values at
 *   these ranks (0: the least), as sorting it would give them
 * Serval::Native::Sim.sum(str, from, to)  its sum, compensated as Ruby's
 *   Array#sum compensates (Kahan-Babuska), so that a mean agrees to the bit
 * Serval::Native::Sim.positive(str, from, to)  how many values are > 0
 *
 * and two that draw from a Random as the Ruby loop's Simulation does
 * (rb_random_real is Random#rand), packing what they draw:
 *
 * Serval::Native::Sim.arrivals(n, rate, rng)  n Poisson arrival times
 * Serval::Native::Sim.marks(segs, offs, rng, share, within)  a byte per
 *   segment, 1 for a wait held under the lock: each wait with probability
 *   share, and only if it lasts at most `within` seconds (nil: any)
 */
#include "serval_ruby.h"
#include "sim.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

static ID id_rand;

enum { OUT_FINISHED, OUT_LATENCY, OUT_WALL, OUT_STALL, OUT_PWAIT, OUT_QUEUE, OUT_LOCK, OUT_COUNT };

static const double *doubles_of(VALUE str, long *count)
{
    StringValue(str);
    *count = RSTRING_LEN(str) / (long)sizeof(double);
    return (const double *)RSTRING_PTR(str);
}

static double opt_at(VALUE opts, long i)
{
    return NUM2DBL(rb_ary_entry(opts, i));
}

static VALUE packed(const double *v, long n)
{
    return rb_str_new((const char *)v, (long)sizeof(double) * n);
}

/* The slice [from, to] of a String of doubles, checked. */
static const double *slice(VALUE str, VALUE vfrom, VALUE vto, long *len)
{
    long n;
    const double *v = doubles_of(str, &n);
    long from = NUM2LONG(vfrom), to = NUM2LONG(vto);
    if (from < 0 || to < from || to >= n) rb_raise(rb_eIndexError, "slice %ld..%ld of %ld values", from, to, n);
    *len = to - from + 1;
    return v + from;
}

/* Puts the value of rank k of a[lo, hi) at a[k], the lesser before it and
 * the greater after it (Hoare's selection, median-of-three pivot). */
static void select_rank(double *a, long lo, long hi, long k)
{
    while (hi - lo > 1) {
        double x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
        double pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        long i = lo, j = hi - 1;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (k <= j) hi = j + 1;
        else if (k >= i) lo = i;
        else return; /* between them: equal to the pivot, in place */
    }
}

static int by_value(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static VALUE order(VALUE self, VALUE str, VALUE vfrom, VALUE vto, VALUE ranks)
{
    long len;
    const double *v = slice(str, vfrom, vto, &len);
    Check_Type(ranks, T_ARRAY);
    long nr = RARRAY_LEN(ranks);
    VALUE vbuf, vwant;
    double *a = ALLOCV_N(double, vbuf, len);
    long *want = ALLOCV_N(long, vwant, 2 * nr + 1), *sorted = want + nr;
    for (long r = 0; r < nr; r++) {
        want[r] = NUM2LONG(rb_ary_entry(ranks, r));
        if (want[r] < 0 || want[r] >= len) rb_raise(rb_eIndexError, "rank %ld of %ld values", want[r], len);
    }
    memcpy(a, v, sizeof(double) * (size_t)len);
    memcpy(sorted, want, sizeof(long) * (size_t)nr);
    qsort(sorted, (size_t)nr, sizeof(long), by_value);
    long lo = 0;
    for (long r = 0; r < nr; r++) { /* ascending: each rank's selection leaves the greater after it */
        if (r > 0 && sorted[r] == sorted[r - 1]) continue;
        select_rank(a, lo, len, sorted[r]);
        lo = sorted[r] + 1;
    }
    VALUE out = rb_ary_new_capa(nr);
    for (long r = 0; r < nr; r++) rb_ary_push(out, DBL2NUM(a[want[r]]));
    ALLOCV_END(vbuf);
    ALLOCV_END(vwant);
    RB_GC_GUARD(str);
    return out;
}

static VALUE sum(VALUE self, VALUE str, VALUE vfrom, VALUE vto)
{
    long len;
    const double *v = slice(str, vfrom, vto, &len);
    double f = 0.0, c = 0.0; /* the running sum and what rounding took from it */
    for (long i = 0; i < len; i++) {
        double x = v[i];
        if (isnan(f)) continue;
        if (isnan(x) || isinf(x)) {
            f = isinf(f) && isinf(x) && signbit(x) != signbit(f) ? NAN : x;
            continue;
        }
        if (isinf(f)) continue;
        double t = f + x;
        c += fabs(f) >= fabs(x) ? (f - t) + x : (x - t) + f;
        f = t;
    }
    RB_GC_GUARD(str);
    return DBL2NUM(f + c);
}

static VALUE positive(VALUE self, VALUE str, VALUE vfrom, VALUE vto)
{
    long len, count = 0;
    const double *v = slice(str, vfrom, vto, &len);
    for (long i = 0; i < len; i++) count += v[i] > 0.0;
    RB_GC_GUARD(str);
    return LONG2NUM(count);
}

static VALUE play(VALUE self, VALUE vsegs, VALUE voffs, VALUE vmarks, VALUE vthreads, VALUE varrivals, VALUE opts,
                  VALUE vspeeds, VALUE pick)
{
    long nseg, noff, narr = 0, nspeeds = 1;
    const double *segs = doubles_of(vsegs, &nseg);
    StringValue(voffs);
    noff = RSTRING_LEN(voffs) / (long)sizeof(int64_t);
    const int64_t *offs = (const int64_t *)RSTRING_PTR(voffs);
    const long n = noff - 1;
    if (n < 1) rb_raise(rb_eArgError, "no request profiles");
    for (long p = 0; p < n; p++)
        if (offs[p] < 0 || offs[p + 1] <= offs[p] || offs[p + 1] > nseg || (offs[p + 1] - offs[p]) % 2 == 0)
            rb_raise(rb_eArgError, "profile %ld is not [cpu, io, ..., cpu] within the segments", p);
    const unsigned char *marks = NULL;
    if (!NIL_P(vmarks)) {
        StringValue(vmarks);
        if (RSTRING_LEN(vmarks) < nseg) rb_raise(rb_eArgError, "marks are shorter than the segments");
        marks = (const unsigned char *)RSTRING_PTR(vmarks);
    }
    const long threads = NUM2LONG(vthreads);
    if (threads < 1) rb_raise(rb_eArgError, "threads must be >= 1");
    const double *arrivals = NULL;
    if (!NIL_P(varrivals)) {
        arrivals = doubles_of(varrivals, &narr);
        if (narr < n) rb_raise(rb_eArgError, "fewer arrivals than profiles");
    }
    Check_Type(opts, T_ARRAY);
    if (RARRAY_LEN(opts) != 8) rb_raise(rb_eArgError, "opts is [quantum, handoff, scale, loop_cpu, between, offset, step, pool]");
    const double quantum = opt_at(opts, 0), handoff = opt_at(opts, 1), scale = opt_at(opts, 2);
    const double loop_cpu = opt_at(opts, 3), between = opt_at(opts, 4), offset = opt_at(opts, 5);
    const double step = opt_at(opts, 6);
    const long npool = NUM2LONG(rb_ary_entry(opts, 7));
    if (npool < 0) rb_raise(rb_eArgError, "pool must be >= 0");
    const double *speeds = NULL;
    if (!NIL_P(vspeeds) && arrivals) {
        speeds = doubles_of(vspeeds, &nspeeds);
        if (nspeeds < 1) rb_raise(rb_eArgError, "speeds are empty");
    }
    const int random_pick = !NIL_P(pick);

    /* Scratch: per thread, the pool, the lock's line, the outputs; freed
     * by the GC if pick.rand raises (ALLOCV). */
    const long per = 11;
    const long ndbl = threads * per + npool + (long)OUT_COUNT * n;
    VALUE vdbl, vlng;
    double *dbl = ALLOCV_N(double, vdbl, ndbl);
    long *lng = ALLOCV_N(long, vlng, threads * 4);
    memset(dbl, 0, sizeof(double) * (size_t)ndbl);
    memset(lng, 0, sizeof(long) * (size_t)(threads * 4));
    double *ready = dbl, *rem = ready + threads, *arrived = rem + threads, *began = arrived + threads;
    double *stall = began + threads, *asked = stall + threads, *granted = asked + threads;
    double *iostart = granted + threads, *pwait = iostart + threads, *lfrom = pwait + threads;
    double *lwait = lfrom + threads, *pool = lwait + threads;
    double *out[OUT_COUNT];
    out[0] = pool + npool;
    for (int k = 1; k < OUT_COUNT; k++) out[k] = out[k - 1] + n;
    long *seg = lng, *pidx = seg + threads, *line = pidx + threads, *waiting = line + threads;
    long line_head = 0, line_len = 0; /* a ring of at most `threads` */

    const double inf = INFINITY;
    long nxt = 0, nout = 0;
    double gvl_free = 0.0, busy = 0.0, due = 0.0;
    long holder = -1;

    for (long i = 0; i < threads; i++) ready[i] = inf;
    for (long i = 0; i < threads; i++) {
        if (nxt >= n) break;
        double arr = arrivals ? arrivals[nxt] : 0.0;
        const double *p = segs + offs[nxt];
        long size = (long)(offs[nxt + 1] - offs[nxt]);
        pidx[i] = nxt;
        rem[i] = (p[0] * scale) + (size == 1 ? between : 0.0);
        arrived[i] = began[i] = ready[i] = arr;
        nxt++;
    }

    for (;;) {
        double t = inf;
        long i = -1;
        for (long j = 0; j < threads; j++)
            if (ready[j] < t) { t = ready[j]; i = j; }
        if (i < 0) break;

        if (random_pick && t < gvl_free) {
            long nw = 0;
            for (long j = 0; j < threads; j++)
                if (ready[j] <= gvl_free) waiting[nw++] = j;
            if (nw > 1) {
                VALUE r = rb_funcall(pick, id_rand, 1, LONG2NUM(nw));
                long at = NUM2LONG(r);
                if (at < 0 || at >= nw) rb_raise(rb_eRuntimeError, "pick.rand(%ld) gave %ld", nw, at);
                i = waiting[at];
                t = ready[i];
            }
        }
        double start = gvl_free > t ? gvl_free + handoff : t;
        if (due > 0.0) {
            if (start > gvl_free) due -= start - gvl_free;
            if (due > 0.0) rem[i] += due;
            due = 0.0;
        }
        stall[i] += start - t;
        asked[i] = t;
        granted[i] = start;
        if (holder == i) {
            holder = -1;
            if (line_len > 0) {
                long w = line[line_head];
                line_head = (line_head + 1) % threads;
                line_len--;
                lwait[w] += start - lfrom[w];
                ready[w] = start;
            }
        }
        double c = rem[i];
        double sp = 1.0;
        if (speeds) {
            long at = (long)floor((start + offset) / step) % nspeeds;
            sp = speeds[at];
            c /= sp;
        }
        if (c > quantum) {
            double other = inf;
            for (long j = 0; j < threads; j++)
                if (j != i && ready[j] < other) other = ready[j];
            if (other < start + c) {
                double k = other <= start ? 1.0 : ceil((other - start) / quantum);
                double cut = start + (k * quantum);
                if (cut < start + c) {
                    busy += cut - start;
                    gvl_free = cut;
                    rem[i] = (c - (cut - start)) * sp;
                    ready[i] = cut;
                    continue;
                }
            }
        }
        gvl_free = start + c;
        busy += c;
        long s = seg[i] + 1;
        const double *p = segs + offs[pidx[i]];
        long size = (long)(offs[pidx[i] + 1] - offs[pidx[i]]);
        if (s >= size) {
            double done = gvl_free - between;
            if (done < start) done = start;
            due += loop_cpu;
            out[OUT_FINISHED][nout] = done;
            out[OUT_LATENCY][nout] = done - arrived[i];
            out[OUT_LOCK][nout] = lwait[i];
            out[OUT_WALL][nout] = done - began[i];
            out[OUT_STALL][nout] = stall[i];
            out[OUT_PWAIT][nout] = pwait[i];
            out[OUT_QUEUE][nout] = began[i] - arrived[i];
            nout++;
            if (nxt < n) {
                double arr = arrivals ? arrivals[nxt] : done;
                p = segs + offs[nxt];
                size = (long)(offs[nxt + 1] - offs[nxt]);
                pidx[i] = nxt;
                nxt++;
                seg[i] = 0;
                rem[i] = (p[0] * scale) + (size == 1 ? between : 0.0);
                arrived[i] = arr;
                began[i] = ready[i] = arr > gvl_free ? arr : gvl_free;
                stall[i] = pwait[i] = lwait[i] = 0.0;
            } else {
                ready[i] = inf;
            }
        } else {
            if (marks && marks[offs[pidx[i]] + s]) {
                if (holder < 0) {
                    holder = i;
                } else {
                    lfrom[i] = gvl_free;
                    line[(line_head + line_len) % threads] = i;
                    line_len++;
                    ready[i] = inf;
                    rem[i] = 0.0;
                    continue;
                }
            }
            double io = p[s];
            if (io < 0.0) {
                double fin = iostart[i] - io;
                double overlap = (fin < granted[i] ? fin : granted[i]) - asked[i];
                if (overlap > 0.0) stall[i] -= overlap;
                iostart[i] = gvl_free;
                ready[i] = fin > gvl_free ? fin : gvl_free;
            } else if (npool > 0) {
                long k = 0;
                for (long j = 1; j < npool; j++)
                    if (pool[j] < pool[k]) k = j;
                double at = pool[k] > gvl_free ? pool[k] : gvl_free;
                pwait[i] += at - gvl_free;
                double hold = io;
                if (s + 2 < size && p[s + 2] < 0.0) hold = -p[s + 2];
                pool[k] = at + hold;
                iostart[i] = at;
                ready[i] = at + io;
            } else {
                iostart[i] = gvl_free;
                ready[i] = gvl_free + io;
            }
            seg[i] = s + 1;
            rem[i] = (p[s + 1] * scale) + (s + 2 == size ? between : 0.0);
        }
    }

    VALUE result = rb_ary_new_capa(OUT_COUNT + 1);
    for (int k = 0; k < OUT_COUNT; k++) rb_ary_push(result, packed(out[k], nout));
    rb_ary_push(result, DBL2NUM(busy));
    ALLOCV_END(vdbl);
    ALLOCV_END(vlng);
    RB_GC_GUARD(vsegs);
    RB_GC_GUARD(voffs);
    RB_GC_GUARD(vmarks);
    RB_GC_GUARD(varrivals);
    RB_GC_GUARD(vspeeds);
    return result;
}

static VALUE arrivals(VALUE self, VALUE vn, VALUE vrate, VALUE rng)
{
    const long n = NUM2LONG(vn);
    const double rate = NUM2DBL(vrate);
    if (n < 0 || !(rate > 0.0)) rb_raise(rb_eArgError, "arrivals need n >= 0 and a rate > 0");
    VALUE out = rb_str_new(NULL, (long)sizeof(double) * n);
    double t = 0.0;
    for (long i = 0; i < n; i++) {
        t += -log(1.0 - rb_random_real(rng)) / rate;
        memcpy(RSTRING_PTR(out) + (long)sizeof(double) * i, &t, sizeof(double));
    }
    return out;
}

static VALUE marks(VALUE self, VALUE vsegs, VALUE voffs, VALUE rng, VALUE vshare, VALUE vwithin)
{
    long nseg;
    const double *segs = doubles_of(vsegs, &nseg);
    StringValue(voffs);
    const long n = RSTRING_LEN(voffs) / (long)sizeof(int64_t) - 1;
    const double share = NUM2DBL(vshare);
    const int any = NIL_P(vwithin);
    const double within = any ? 0.0 : NUM2DBL(vwithin);
    VALUE out = rb_str_new(NULL, nseg);
    memset(RSTRING_PTR(out), 0, (size_t)nseg);
    for (long p = 0; p < n; p++) {
        /* re-read each time: rb_random_real may call Ruby (a Random of the user's) */
        const int64_t *offs = (const int64_t *)RSTRING_PTR(voffs);
        int64_t from = offs[p], to = offs[p + 1];
        if (from < 0 || to < from || to > nseg) rb_raise(rb_eArgError, "profile %ld is outside the segments", p);
        for (int64_t j = from + 1; j < to; j += 2) {
            double r = rb_random_real(rng);
            segs = (const double *)RSTRING_PTR(vsegs);
            if (r < share && (any || fabs(segs[j]) <= within)) RSTRING_PTR(out)[j] = 1;
        }
    }
    RB_GC_GUARD(vsegs);
    RB_GC_GUARD(voffs);
    return out;
}

void sv_init_sim(VALUE mNative)
{
    id_rand = rb_intern("rand");
    VALUE mSim = rb_define_module_under(mNative, "Sim");
    rb_define_singleton_method(mSim, "play", play, 8);
    rb_define_singleton_method(mSim, "order", order, 4);
    rb_define_singleton_method(mSim, "sum", sum, 3);
    rb_define_singleton_method(mSim, "positive", positive, 3);
    rb_define_singleton_method(mSim, "arrivals", arrivals, 3);
    rb_define_singleton_method(mSim, "marks", marks, 5);
}

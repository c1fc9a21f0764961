/* Serval::Native::Core - the Ruby face of the I/O core. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ruby.h>
#include <ruby/thread.h>
#include "serval.h"
#include "serval_ruby.h"
#include "core.h"
#include "conn.h"
#include "errlog.h"
#include "loop.h"
#include "request.h"
#include "hooks.h"
#include "tls.h"

static VALUE sv_cCore;

/* The Core object holds one reference to its sv_core, every live Request
 * another (sv_core_ref, loop.c): the last one frees it. */
static void core_free(void *p)
{
    sv_core **slot = p;
    if (*slot && (*slot)->pid != getpid()) {
        /* inherited through fork: the loop thread and its locks belong to
           the parent, so joining would hang; leave the memory alone */
        xfree(slot);
        return;
    }
    if (*slot) {
        sv_core_stop_and_join(*slot, 0);
        sv_core_unref(*slot);
    }
    xfree(slot);
}

static size_t core_memsize(const void *p)
{
    return sizeof(sv_core);
}

static const rb_data_type_t core_type = {
    "Serval::Native::Core",
    {NULL, core_free, core_memsize},
    NULL, NULL, RUBY_TYPED_FREE_IMMEDIATELY,
};

sv_core *sv_core_get(VALUE self)
{
    sv_core **slot;
    TypedData_Get_Struct(self, sv_core *, &core_type, slot);
    if (!*slot)
        rb_raise(rb_eRuntimeError, "core is not initialized");
    return *slot;
}

static VALUE core_alloc(VALUE klass)
{
    sv_core **slot;
    VALUE obj = TypedData_Make_Struct(klass, sv_core *, &core_type, slot);
    *slot = NULL;
    return obj;
}

/* The core's numeric options: the one source of their defaults and bounds.
 * Serval::Native::Core::OPTIONS exports this table and the configuration
 * validates against it (lib/serval/configuration.rb), so a value the
 * configuration accepts is one Core.new accepts. */
typedef struct {
    const char *name;
    double def, min, max;
} sv_opt_spec;

#define SV_DAY 86400.0
static const sv_opt_spec opt_specs[] = {
    {"max_request_line", 8192, 64, 1 << 20},
    {"max_head", 65536, 256, 16 << 20},
    {"max_headers", SV_HEADERS_CAP, 1, SV_HEADERS_CAP},
    {"body_spill", 262144, 0, 1 << 30},
    {"max_chunk_ext", 1024, 0, 1 << 20},
    {"first_data_timeout", 30, 0.001, SV_DAY},
    {"read_timeout", 30, 0.001, SV_DAY},
    {"persistent_timeout", 20, 0.001, SV_DAY},
    {"write_timeout", 30, 0.001, SV_DAY},
    {"max_connections", 1024, 1, 1000000},
    {"output_buffer", 4194304, 4096, 1 << 30},
    {"output_budget", 67108864, 0, 1099511627776.0},   /* 64 MiB .. 1 TiB */
    {"max_spill", 4294967296.0, 0, 1125899906842624.0}, /* 4 GiB .. 1 PiB */
    {"max_keepalive_requests", 1000, 1, 2147483647.0},
    {"min_body_rate", 500, 0, 1e12},
    {"max_queue_time", 0, 0, 60}, /* seconds; 0: no load shedding (shed_core.c) */
};
#define SV_OPT_SPECS (sizeof(opt_specs) / sizeof(opt_specs[0]))

static double opt_num(VALUE opts, const char *key)
{
    const sv_opt_spec *spec = NULL;
    for (size_t i = 0; i < SV_OPT_SPECS; i++)
        if (strcmp(opt_specs[i].name, key) == 0)
            spec = &opt_specs[i];
    if (!spec)
        rb_raise(rb_eRuntimeError, "no option spec for %s", key);
    VALUE v = rb_hash_lookup2(opts, ID2SYM(rb_intern(key)), Qundef);
    if (v == Qundef || NIL_P(v))
        return spec->def;
    double d = NUM2DBL(v);
    if (!(d >= spec->min && d <= spec->max)) /* also refuses NaN */
        rb_raise(rb_eArgError, "%s must be in %.15g..%.15g (got %.15g)", key, spec->min, spec->max, d);
    return d;
}

/* Serval::Native::Core::OPTIONS: {name => [default, min, max]} */
static VALUE option_table(void)
{
    VALUE h = rb_hash_new();
    for (size_t i = 0; i < SV_OPT_SPECS; i++) {
        const sv_opt_spec *o = &opt_specs[i];
        int integral = o->min == (double)(long long)o->min && o->def == (double)(long long)o->def &&
                       strstr(o->name, "time") == NULL && strstr(o->name, "rate") == NULL;
        VALUE triple = integral ? rb_ary_new_from_args(3, LL2NUM((long long)o->def), LL2NUM((long long)o->min),
                                                      LL2NUM((long long)o->max))
                                : rb_ary_new_from_args(3, DBL2NUM(o->def), DBL2NUM(o->min), DBL2NUM(o->max));
        rb_ary_freeze(triple);
        rb_hash_aset(h, ID2SYM(rb_intern(o->name)), triple);
    }
    rb_hash_freeze(h);
    return h;
}

/* Serval::Native::Core::REMOTE_LIMITS: the bounds of set_remote_address's
 * values and of the PROXY headers (parser.h), for the configuration, the
 * docs and the tests. */
static VALUE remote_limits(void)
{
    VALUE h = rb_hash_new();
    rb_hash_aset(h, ID2SYM(rb_intern("value")), INT2FIX(SV_REMOTE_MAX - 1));
    rb_hash_aset(h, ID2SYM(rb_intern("header")), INT2FIX(SV_REMOTE_HEADER_MAX - 1));
    rb_hash_aset(h, ID2SYM(rb_intern("proxy_v1")), INT2FIX(SV_PROXY_V1_MAX));
    rb_hash_aset(h, ID2SYM(rb_intern("proxy_v2")), INT2FIX(SV_PROXY_V2_MAX));
    rb_hash_freeze(h);
    return h;
}

/* set_remote_address, as Server#core_options passes it: proxy_protocol
 * (:v1, :v2 or :any), remote_header (a field name) or remote_value (the
 * address of every request); at most one. */
static void read_remote(sv_options *o, VALUE opts)
{
    VALUE proxy = rb_hash_lookup2(opts, ID2SYM(rb_intern("proxy_protocol")), Qnil);
    VALUE header = rb_hash_lookup2(opts, ID2SYM(rb_intern("remote_header")), Qnil);
    VALUE value = rb_hash_lookup2(opts, ID2SYM(rb_intern("remote_value")), Qnil);
    if (RTEST(proxy) + !NIL_P(header) + !NIL_P(value) > 1)
        rb_raise(rb_eArgError, "proxy_protocol, remote_header and remote_value exclude each other");
    if (RTEST(proxy)) {
        ID v = SYM2ID(rb_to_symbol(proxy));
        if (v == rb_intern("v1"))
            o->proxy_versions = SV_PROXY_V1;
        else if (v == rb_intern("v2"))
            o->proxy_versions = SV_PROXY_V2;
        else if (v == rb_intern("any"))
            o->proxy_versions = SV_PROXY_V1 | SV_PROXY_V2;
        else
            rb_raise(rb_eArgError, "proxy_protocol must be :v1, :v2 or :any");
    }
    if (!NIL_P(header)) {
        const char *h = StringValueCStr(header);
        size_t n = strlen(h);
        if (n == 0 || n >= sizeof(o->remote_header))
            rb_raise(rb_eArgError, "remote_header must be 1..%d bytes", (int)sizeof(o->remote_header) - 1);
        for (size_t i = 0; i < n; i++)
            if (!sv_is_tchar((unsigned char)h[i]) || h[i] == '_')
                rb_raise(rb_eArgError, "remote_header must be a field name without '_'");
        memcpy(o->remote_header, h, n + 1);
        o->remote_header_len = n;
    }
    if (!NIL_P(value)) {
        const char *v = StringValueCStr(value);
        size_t n = strlen(v);
        if (n == 0 || n >= sizeof(o->remote_value))
            rb_raise(rb_eArgError, "remote_value must be 1..%d bytes", (int)sizeof(o->remote_value) - 1);
        memcpy(o->remote_value, v, n + 1);
    }
}

static void read_options(sv_options *o, VALUE opts)
{
    o->lim.max_request_line = (size_t)opt_num(opts, "max_request_line");
    o->lim.max_head = (size_t)opt_num(opts, "max_head");
    o->lim.max_headers = (size_t)opt_num(opts, "max_headers");
    /* nil or absent: no limit (bodies past body_spill go to disk either way) */
    VALUE max_body = rb_hash_lookup2(opts, ID2SYM(rb_intern("max_body")), Qnil);
    if (NIL_P(max_body)) {
        o->max_body = UINT64_MAX;
    } else {
        double mb = NUM2DBL(max_body);
        if (!(mb >= 0 && mb <= 4.6e18))
            rb_raise(rb_eArgError, "max_body must be nil or in 0..2**62 (got %g)", mb);
        o->max_body = (uint64_t)mb;
    }
    o->body_spill = (size_t)opt_num(opts, "body_spill");
    o->max_chunk_ext = (size_t)opt_num(opts, "max_chunk_ext");
    o->first_data_timeout = opt_num(opts, "first_data_timeout");
    o->read_timeout = opt_num(opts, "read_timeout");
    o->persistent_timeout = opt_num(opts, "persistent_timeout");
    o->write_timeout = opt_num(opts, "write_timeout");
    o->max_connections = (size_t)opt_num(opts, "max_connections");
    o->output_buffer = (size_t)opt_num(opts, "output_buffer");
    o->output_budget = (size_t)opt_num(opts, "output_budget");
    o->max_spill = (uint64_t)opt_num(opts, "max_spill");
    o->max_keepalive_requests = (unsigned)opt_num(opts, "max_keepalive_requests");
    o->min_body_rate = opt_num(opts, "min_body_rate");
    o->max_queue_time = opt_num(opts, "max_queue_time");
    VALUE polls = rb_hash_lookup2(opts, ID2SYM(rb_intern("thread_polls")), Qtrue);
    o->thread_polls = RTEST(polls); /* absent: on where possible (request.c) */
    o->balance = RTEST(rb_hash_lookup(opts, ID2SYM(rb_intern("balance"))));
    o->balance_close = o->balance && RTEST(rb_hash_lookup(opts, ID2SYM(rb_intern("balance_close"))));
    read_remote(o, opts);
    VALUE tmp = rb_hash_lookup2(opts, ID2SYM(rb_intern("tmpdir")), Qnil);
    const char *dir = NIL_P(tmp) ? "/tmp" : StringValueCStr(tmp);
    if (strlen(dir) >= sizeof(o->tmpdir))
        rb_raise(rb_eArgError, "tmpdir is too long");
    strcpy(o->tmpdir, dir);
}

static VALUE core_initialize(int argc, VALUE *argv, VALUE self)
{
    VALUE opts;
    rb_scan_args(argc, argv, "01", &opts);
    if (NIL_P(opts))
        opts = rb_hash_new();
    Check_Type(opts, T_HASH);
    sv_core **slot;
    TypedData_Get_Struct(self, sv_core *, &core_type, slot);
    if (*slot)
        rb_raise(rb_eRuntimeError, "already initialized");
    sv_core *core = calloc(1, sizeof(*core));
    if (!core)
        rb_raise(rb_eNoMemError, "cannot allocate core");
    core->epfd = core->wakefd = -1;
    atomic_store(&core->refs, 1);
    core->pid = getpid();
    read_options(&core->opt, opts);
    if (sv_core_init(core) != 0) {
        int e = errno;
        sv_core_destroy(core);
        free(core);
        rb_syserr_fail(e, "serval core init");
    }
    *slot = core;
    if (sv_hooks.core_init) /* load shedding: shed_core.c (may raise: the core is in its object) */
        sv_hooks.core_init(core);
    return self;
}

/* listen(fd, server_name, server_port, tls_context = nil) */
static VALUE core_listen(int argc, VALUE *argv, VALUE self)
{
    VALUE fd, name, port, tls;
    rb_scan_args(argc, argv, "31", &fd, &name, &port, &tls);
    sv_core *core = sv_core_get(self);
    if (core->started)
        rb_raise(rb_eRuntimeError, "listen before start");
    if (core->nlisteners >= SV_MAX_LISTENERS)
        rb_raise(rb_eArgError, "at most %d listeners", SV_MAX_LISTENERS);
    if (!NIL_P(tls) && core->opt.proxy_versions)
        rb_raise(rb_eArgError, "proxy_protocol is not supported on ssl:// listeners");
    sv_listener *l = &core->listeners[core->nlisteners];
    const char *n = StringValueCStr(name);
    if (strlen(n) >= sizeof(l->name))
        rb_raise(rb_eArgError, "server name too long");
    /* The loop accepts in batches until EAGAIN: a blocking listener (a
     * systemd socket is one) would stop the loop in accept4. */
    int lfd = NUM2INT(fd);
    int fl = fcntl(lfd, F_GETFL);
    if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(lfd, F_SETFL, fl | O_NONBLOCK) < 0))
        rb_sys_fail("serval listener: O_NONBLOCK");
    l->kind = SV_KIND_LISTENER;
    l->fd = lfd;
    l->port = NUM2INT(port);
    strcpy(l->name, n);
    l->tls_ctx = NIL_P(tls) ? NULL : sv_tls_ctx_get(tls);
    core->nlisteners++;
    return Qnil;
}

static VALUE core_start(VALUE self)
{
    sv_core *core = sv_core_get(self);
    if (core->started)
        rb_raise(rb_eRuntimeError, "already started");
    sv_polls_start(core); /* before the loop runs: it reads polls_on */
    if (sv_core_start(core) != 0)
        rb_sys_fail("pthread_create");
    return self;
}

/* ---- Core#next ---------------------------------------------------------- */

typedef struct {
    sv_core *core;
    double deadline;
    int interrupted;
    sv_conn *got;
    sv_waiter *waiter;   /* while asleep (for wait_ubf); set and cleared under core->mu */
    int yielding;        /* thread polls: sleep though requests are queued, until woken (request.c) */
    int retry;           /* thread polls: woken for a queued request; take it holding the GVL */
    int polling;         /* thread polls: waiting on the epoll (sv_polls_wait); set and cleared under core->mu */
} wait_args;

/* Draining, threads leave once the loop has seen the drain (accept_closed:
 * it has marked the keep-alive connections it still waits on as partial,
 * loop.c housekeeping), nothing is partial and the queue is empty. */
static int nothing_more(sv_core *core)
{
    if (core->stopping)
        return 1;
    int seen = core->accept_closed || !core->started || core->joined;
    return core->draining && seen && atomic_load(&core->partial) == 0;
}

static sv_conn *pop_locked(sv_core *core, double now)
{
    sv_conn *c = core->q_head;
    if (c) {
        core->q_head = c->next;
        if (!core->q_head)
            core->q_tail = NULL;
        c->next = NULL;
        core->queued--;
        if (core->admission) /* load shedding measures the queue (hooks.h taken) */
            sv_hooks.taken(core, c, sv_now());
        if (core->polls_on) /* counted from here: a thread waiting for the GVL with it is running */
            sv_polls_took(core, now);
    }
    return c;
}

/* Sleeps on its own condition variable (conn.c) until a request is queued
 * for it, the deadline passes, the core stops or Ruby interrupts it. A
 * thread woken for a request another thread took first sleeps again. */
static void *wait_nogvl(void *p)
{
    wait_args *a = p;
    sv_core *core = a->core;
    struct timespec ts;
    ts.tv_sec = (time_t)a->deadline;
    ts.tv_nsec = (long)((a->deadline - (double)ts.tv_sec) * 1e9);
    sv_waiter w;
    memset(&w, 0, sizeof(w));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&core->mu);
    core->waiting++;
    if (core->balance_paused && !atomic_load(&core->balance_hold) &&
        core->waiting > (int)core->queued + (int)atomic_load(&core->partial)) {
        core->balance_paused = 0; /* only on the transition: one wake per pause */
        sv_core_wake(core);
    }
    a->waiter = &w;
    if (!core->q_head && !a->yielding && core->polls_on && !a->interrupted && !nothing_more(core)) {
        a->polling = 1; /* thread polls: nothing to do, wait on the epoll (wait_ubf wakes it) */
        pthread_mutex_unlock(&core->mu);
        sv_polls_wait(core);
        pthread_mutex_lock(&core->mu);
        a->polling = 0;
    }
    if (!core->q_head && !a->yielding)
        sv_loop_unpark_locked(core); /* thread polls: nothing to do, the loop reads again */
    while ((!core->q_head || (a->yielding && !w.woken)) && !a->interrupted && !nothing_more(core)) {
        if (w.woken) { /* woken, but a thread in the fast path took the request */
            w.woken = 0;
            core->waking--;
        }
        if (!w.listed)
            sv_waiter_push(core, &w);
        if (pthread_cond_timedwait(&w.cv, &core->mu, &ts) == ETIMEDOUT)
            break;
    }
    a->waiter = NULL;
    sv_waiter_remove(core, &w);
    if (w.woken)
        core->waking--;
    core->waiting--;
    if (atomic_load(&core->duty) && core->q_head && !nothing_more(core))
        a->retry = 1; /* take it with the GVL (core_next): not hold it while others run */
    else if ((a->got = pop_locked(core, 0)) && core->polls_on)
        atomic_fetch_add(&core->unstarted, 1); /* until this thread has the GVL (request.c) */
    pthread_mutex_unlock(&core->mu);
    pthread_cond_destroy(&w.cv);
    return NULL;
}

static void wait_ubf(void *p)
{
    wait_args *a = p;
    pthread_mutex_lock(&a->core->mu);
    a->interrupted = 1;
    if (a->waiter)
        pthread_cond_signal(&a->waiter->cv);
    if (a->polling)
        sv_core_wake(a->core); /* ends its epoll wait */
    pthread_mutex_unlock(&a->core->mu);
}

static sv_conn *pop(sv_core *core, double now)
{
    pthread_mutex_lock(&core->mu);
    sv_conn *c = pop_locked(core, now);
    pthread_mutex_unlock(&core->mu);
    return c;
}

static VALUE wait_protected(VALUE p)
{
    wait_args *a = (wait_args *)p;
    rb_thread_call_without_gvl(wait_nogvl, a, wait_ubf, a);
    return Qnil;
}

/* With thread polls (request.c) the thread may first leave the queue to
 * another (sv_polls_yield) or run a round of the loop's events itself
 * (sv_polls_poll); without, it takes the queue's head or sleeps. */
static VALUE core_next(VALUE self, VALUE timeout)
{
    sv_core *core = sv_core_get(self);
    wait_args a = {core, 0, 0, NULL, NULL, 0, 0};
    double wait = NIL_P(timeout) ? 86400.0 * 365 : NUM2DBL(timeout);
    a.yielding = sv_polls_yield(core);
    for (;;) {
        if (!a.yielding) {
            double now = 0; /* one clock read for the poll and the take */
            int polled = sv_polls_poll(core, !core->q_head, &now); /* q_head read unlocked: a hint */
            a.got = pop(core, now); /* fast path: keep the GVL when work is waiting */
            if (!a.got && !polled && sv_polls_poll(core, 1, &now))
                a.got = pop(core, now);
            if (a.got)
                break;
        }
        if (a.deadline == 0) /* the clock is read only when the thread waits */
            a.deadline = sv_now() + wait;
        a.retry = 0;
        int state = 0;
        rb_protect(wait_protected, (VALUE)&a, &state);
        a.yielding = 0;
        if (a.got && core->polls_on)
            atomic_fetch_sub(&core->unstarted, 1);
        if (state) { /* interrupted (Thread#raise, #kill) after the wait took a request: close it */
            if (a.got)
                sv_conn_give_to_loop_dead(a.got);
            rb_jump_tag(state);
        }
        if (a.got || !a.retry)
            break;
    }
    if (!a.got)
        return Qnil;
    return sv_request_new(self, core, a.got);
}

/* ---- stopping ----------------------------------------------------------- */

/* Waits (at most SV_DRAIN_ACK_SECONDS) until the loop no longer accepts, so the
 * caller may close the listening sockets right after. */
static void *drain_nogvl(void *p)
{
    sv_core *core = p;
    double deadline = sv_now() + SV_DRAIN_ACK_SECONDS;
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&core->mu);
    core->draining = 1;
    sv_wake_all(core);
    pthread_cond_signal(&core->park_cv); /* a parked loop stops accepting at once */
    pthread_mutex_unlock(&core->mu);
    sv_core_wake(core);
    pthread_mutex_lock(&core->mu);
    while (core->started && !core->joined && !core->accept_closed)
        if (pthread_cond_timedwait(&core->cv, &core->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&core->mu);
    return NULL;
}

static VALUE core_drain(VALUE self)
{
    rb_thread_call_without_gvl(drain_nogvl, sv_core_get(self), RUBY_UBF_IO, NULL);
    return Qnil;
}

typedef struct {
    sv_core *core;
    double grace;
} stop_args;

static void *stop_nogvl(void *p)
{
    stop_args *a = p;
    sv_core_stop_and_join(a->core, a->grace);
    return NULL;
}

static VALUE core_shutdown(int argc, VALUE *argv, VALUE self)
{
    VALUE grace;
    rb_scan_args(argc, argv, "01", &grace);
    stop_args a = {sv_core_get(self), NIL_P(grace) ? 0.0 : NUM2DBL(grace)};
    rb_thread_call_without_gvl(stop_nogvl, &a, RUBY_UBF_IO, NULL);
    return Qnil;
}

static VALUE core_stats(VALUE self)
{
    sv_core *core = sv_core_get(self);
    pthread_mutex_lock(&core->mu);
    long queued = (long)core->queued, waiting = core->waiting, waking = core->waking;
    int draining = core->draining, stopping = core->stopping;
    pthread_mutex_unlock(&core->mu);
    VALUE h = rb_hash_new();
    rb_hash_aset(h, ID2SYM(rb_intern("connections")), LONG2NUM(atomic_load(&core->open)));
    rb_hash_aset(h, ID2SYM(rb_intern("queued")), LONG2NUM(queued));
    rb_hash_aset(h, ID2SYM(rb_intern("waiting")), LONG2NUM(waiting));
    rb_hash_aset(h, ID2SYM(rb_intern("waking")), LONG2NUM(waking)); /* conn.c */
    rb_hash_aset(h, ID2SYM(rb_intern("accepted")), ULONG2NUM(atomic_load(&core->accepted)));
    rb_hash_aset(h, ID2SYM(rb_intern("evicted")), ULONG2NUM(atomic_load(&core->evicted)));
    rb_hash_aset(h, ID2SYM(rb_intern("requests")), ULONG2NUM(atomic_load(&core->requests)));
    rb_hash_aset(h, ID2SYM(rb_intern("errors")), ULONG2NUM(atomic_load(&core->errors)));
    rb_hash_aset(h, ID2SYM(rb_intern("shed")), ULONG2NUM(atomic_load(&core->shed_total)));
    if (core->admission && sv_hooks.stats) /* load shedding: queue_wait_estimate */
        sv_hooks.stats(core, h);
    rb_hash_aset(h, ID2SYM(rb_intern("output_buffered_bytes")), SIZET2NUM(atomic_load(&core->out_bytes)));
    rb_hash_aset(h, ID2SYM(rb_intern("output_spilled_bytes")), ULL2NUM(atomic_load(&core->spill_used)));
    rb_hash_aset(h, ID2SYM(rb_intern("output_spills")), ULONG2NUM(atomic_load(&core->spills)));
    rb_hash_aset(h, ID2SYM(rb_intern("output_waits")), ULONG2NUM(atomic_load(&core->spill_waits)));
    rb_hash_aset(h, ID2SYM(rb_intern("thread_polls")), core->polls_on ? Qtrue : Qfalse); /* request.c */
    rb_hash_aset(h, ID2SYM(rb_intern("polled_rounds")), ULONG2NUM(atomic_load(&core->polled_rounds)));
    rb_hash_aset(h, ID2SYM(rb_intern("polled_waits")), ULONG2NUM(atomic_load(&core->polled_waits)));
    rb_hash_aset(h, ID2SYM(rb_intern("draining")), draining ? Qtrue : Qfalse);
    rb_hash_aset(h, ID2SYM(rb_intern("stopping")), stopping ? Qtrue : Qfalse);
    return h;
}

static VALUE core_waiting(VALUE self)
{
    return INT2NUM(sv_core_get(self)->waiting);
}

/* ---- error events (errlog.c) -------------------------------------------- */

#define SV_ERRLOG_BATCH 64

typedef struct {
    sv_errlog *log;
    double deadline;
    sv_err_event ev[SV_ERRLOG_BATCH];
    size_t n;
    unsigned long dropped;
} errlog_args;

static void *errlog_take_nogvl(void *p)
{
    errlog_args *a = p;
    a->n = sv_errlog_take(a->log, a->ev, SV_ERRLOG_BATCH, &a->dropped, a->deadline);
    return NULL;
}

static void errlog_ubf(void *p)
{
    sv_errlog_wake(((errlog_args *)p)->log);
}

/* error_events(timeout) -> [[[status, reason, detail, peer], ...], dropped]
 * Waits without the GVL up to timeout seconds (or until #wake_error_events)
 * for the error responses the loop answered; at most SV_ERRLOG_BATCH at a
 * time. dropped: records lost to a full ring since the previous call. */
static VALUE core_error_events(VALUE self, VALUE timeout)
{
    sv_core *core = sv_core_get(self);
    errlog_args args, *a = &args;
    a->log = &core->errlog;
    a->deadline = sv_now() + NUM2DBL(timeout);
    a->n = 0;
    a->dropped = 0;
    rb_thread_call_without_gvl(errlog_take_nogvl, a, errlog_ubf, a);
    VALUE list = rb_ary_new_capa((long)a->n);
    for (size_t i = 0; i < a->n; i++) {
        sv_err_event *e = &a->ev[i];
        rb_ary_push(list, rb_ary_new_from_args(4, INT2NUM(e->status), rb_str_new_cstr(e->reason),
                                               rb_str_new_cstr(e->detail), rb_str_new_cstr(e->peer)));
    }
    return rb_ary_new_from_args(2, list, ULONG2NUM(a->dropped));
}

/* Makes a waiting (or the next) #error_events return at once. */
static VALUE core_wake_error_events(VALUE self)
{
    sv_errlog_wake(&sv_core_get(self)->errlog);
    return Qnil;
}

/* error_fd -> Integer: a descriptor that is readable while error records
 * wait for #error_events (an eventfd the core owns and closes with itself:
 * wrap it with autoclose false), or nil. */
static VALUE core_error_fd(VALUE self)
{
    int fd = sv_errlog_fd(&sv_core_get(self)->errlog);
    return fd >= 0 ? INT2NUM(fd) : Qnil;
}

static VALUE core_error_events_stats(VALUE self)
{
    size_t queued;
    unsigned long dropped, total;
    sv_errlog_stats(&sv_core_get(self)->errlog, &queued, &dropped, &total);
    VALUE h = rb_hash_new();
    rb_hash_aset(h, ID2SYM(rb_intern("capacity")), INT2NUM(SV_ERRLOG_CAP));
    rb_hash_aset(h, ID2SYM(rb_intern("queued")), SIZET2NUM(queued));
    rb_hash_aset(h, ID2SYM(rb_intern("dropped")), ULONG2NUM(dropped));
    rb_hash_aset(h, ID2SYM(rb_intern("total")), ULONG2NUM(total));
    return h;
}

VALUE sv_init_core(VALUE mNative)
{
    sv_cCore = rb_define_class_under(mNative, "Core", rb_cObject);
    rb_define_const(sv_cCore, "OPTIONS", option_table());
    rb_define_const(sv_cCore, "REMOTE_LIMITS", remote_limits());
    rb_define_alloc_func(sv_cCore, core_alloc);
    rb_define_method(sv_cCore, "initialize", core_initialize, -1);
    rb_define_method(sv_cCore, "listen", core_listen, -1);
    rb_define_method(sv_cCore, "start", core_start, 0);
    rb_define_method(sv_cCore, "next", core_next, 1);
    rb_define_method(sv_cCore, "drain", core_drain, 0);
    rb_define_method(sv_cCore, "shutdown", core_shutdown, -1);
    rb_define_method(sv_cCore, "stats", core_stats, 0);
    rb_define_method(sv_cCore, "waiting", core_waiting, 0);
    rb_define_method(sv_cCore, "error_events", core_error_events, 1);
    rb_define_method(sv_cCore, "wake_error_events", core_wake_error_events, 0);
    rb_define_method(sv_cCore, "error_events_stats", core_error_events_stats, 0);
    rb_define_method(sv_cCore, "error_fd", core_error_fd, 0);
    return sv_cCore;
}

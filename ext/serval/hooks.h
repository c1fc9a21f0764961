/*
 * The serving core's hooks: the one interface through which the optional
 * parts (timing, the request window and the GVL split through it; load
 * shedding) watch and steer requests. The core (loop, conn, request, core,
 * polls ...) knows nothing of them: it calls the hooks in sv_hooks at fixed
 * points, each a NULL check when nothing is attached, and keeps the records
 * they work on (sv_tm in each connection, opaque to it).
 *
 * Points, in a request's order:
 *   queued   loop thread, core->mu held: a complete request would join the
 *            ready queue; 0 answers it 503 instead (shed_core.c:
 *            max_queue_time).
 *   taken    core->mu held: a Ruby thread took it (Core#next).
 *   begin    GVL held, just before the app (Request#start / #timing_begin
 *            with timing on): starts the request's record.
 *   end      GVL held, once, just after the response is handed to the core
 *            (Request#finish / #timing_end): ends it.
 * Thread state: sv_gvl_yielding.
 *
 * An optional module attaches by setting its fields, with the GVL held,
 * before the requests it should see (timing: Timing.attach; load shedding:
 * when the extension loads); a field is never cleared while requests run.
 */
#ifndef SERVAL_HOOKS_H
#define SERVAL_HOOKS_H

#include <ruby.h>
#include "serval.h"

#define SV_REFUSED_RETRY_AFTER "1" /* seconds, the retry-after of a request queued refused (bench/NOTES.md "The answer") */

typedef struct {
    /* begin: plain is the record the core keeps for the request (in its
     * connection, or one of its own); every and upstream as Request#start
     * got them (every: one in every requests is sampled; upstream: the env
     * may carry an X-Request-Start header). Returns the record to end:
     * plain, or a sampled one whose Timing object it puts in *obj (else
     * *obj stays Qnil). */
    sv_tm *(*begin)(sv_tm *plain, VALUE env, double queued_at, unsigned long every, int upstream, VALUE *obj);
    void (*end)(sv_tm *t);
    /* Admission, per core: core_init runs at Core.new once the options are
     * read, and may set core->admission (malloc'd; the core frees it). The
     * three others are called only for a core whose core->admission is set.
     * queued: c->q_ahead is the number of requests in front of it that no
     * idle thread will take, or -1 when an idle thread is there for it;
     * returns 1 to admit it, 0 to have it answered 503.
     * taken: c->queued_at and c->q_ahead are the request's.
     * stats: adds figures to Core#stats' Hash h (core->mu not held). */
    void (*core_init)(sv_core *core);
    int (*queued)(sv_core *core, sv_conn *c, double now);
    void (*taken)(sv_core *core, sv_conn *c, double now);
    void (*stats)(sv_core *core, VALUE h);
} sv_hook_table;

extern sv_hook_table sv_hooks;

/* Set by fairness.c around the GVL release that gives a waiting thread its
 * turn: the GVL hook counts that release as stall (the thread wants the GVL
 * back at once), not as idle, and thread polls (request.c) as a preemption.
 * Owner thread only. */
extern __thread int sv_gvl_yielding;

#endif

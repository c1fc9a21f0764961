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
 *            ready queue; 0 answers it 503 instead (shed.c: max_queue_time).
 *            Called only for a core whose opt.max_queue_time > 0.
 *   taken    core->mu held: a Ruby thread took it (Core#next).
 *   begin    GVL held, just before the app (Request#start / #timing_begin
 *            with timing on): starts the request's record.
 *   end      GVL held, once, just after the response is handed to the core
 *            (Request#finish / #timing_end): ends it.
 * Thread state: sv_gvl_yielding.
 *
 * An optional module attaches by setting its fields (sv_hooks_attach_*),
 * with the GVL held, before the requests it should see; each field is set
 * at most once per process and never cleared while requests run.
 */
#ifndef SERVAL_HOOKS_H
#define SERVAL_HOOKS_H

#include <ruby.h>
#include "serval.h"

typedef struct {
    /* begin: plain is the record the core keeps for the request (in its
     * connection, or one of its own); every and upstream as Request#start
     * got them (every: one in every requests is sampled; upstream: the env
     * may carry an X-Request-Start header). Returns the record to end:
     * plain, or a sampled one whose Timing object it puts in *obj (else
     * *obj stays Qnil). */
    sv_tm *(*begin)(sv_tm *plain, VALUE env, double queued_at, unsigned long every, int upstream, VALUE *obj);
    void (*end)(sv_tm *t);
    /* queued: ahead as shed.h says; 1 admits. taken: c->queued_at and
     * c->q_ahead are the request's. */
    int (*queued)(sv_core *core, sv_conn *c, double now);
    void (*taken)(sv_core *core, sv_conn *c, double now);
    /* Core#stats: adds its figures to the Hash h (core->mu not held). */
    void (*stats)(sv_core *core, VALUE h);
} sv_hook_table;

extern sv_hook_table sv_hooks;

/* Set by fairness.c around the GVL release that gives a waiting thread its
 * turn: the GVL hook counts that release as stall (the thread wants the GVL
 * back at once), not as idle, and thread polls (polls.c) as a preemption.
 * Owner thread only. */
extern __thread int sv_gvl_yielding;

#endif

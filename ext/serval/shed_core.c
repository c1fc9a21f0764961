/*
 * Load shedding attached to the serving core (hooks.h admission): a core
 * whose max_queue_time is over 0 gets an sv_shed (shed.h, the arithmetic)
 * and the core asks it, through the hooks, whether a complete request may
 * join the ready queue, tells it when a thread takes one, and shows its
 * estimate in Core#stats. docs/tuning.md "Load shedding".
 */
#include <stdlib.h>
#include "serval_ruby.h"
#include "hooks.h"
#include "conn.h" /* sv_now */
#include "shed.h"
#include "shed_core.h"

static void shed_core_init(sv_core *core)
{
    if (core->opt.max_queue_time <= 0)
        return;
    sv_shed *s = malloc(sizeof(*s));
    if (!s)
        rb_raise(rb_eNoMemError, "cannot allocate load shedding state");
    sv_shed_init(s, core->opt.max_queue_time, sv_now());
    core->admission = s;
}

/* core->mu held */
static int shed_queued(sv_core *core, sv_conn *c, double now)
{
    return sv_shed_admit(core->admission, now, c->q_ahead, core->q_head ? core->q_head->queued_at : -1);
}

/* core->mu held */
static void shed_taken(sv_core *core, sv_conn *c, double now)
{
    sv_shed_taken(core->admission, now, c->queued_at, c->q_ahead);
}

/* queue_wait_estimate: the wait predicted for a request arriving now. */
static void shed_stats(sv_core *core, VALUE h)
{
    pthread_mutex_lock(&core->mu);
    long queued = (long)core->queued, waiting = core->waiting;
    double estimate = sv_shed_predict(core->admission, sv_now(), queued >= waiting ? queued - waiting : -1,
                                      core->q_head ? core->q_head->queued_at : -1);
    pthread_mutex_unlock(&core->mu);
    rb_hash_aset(h, ID2SYM(rb_intern("queue_wait_estimate")), DBL2NUM(estimate));
}

void sv_init_shed_core(void)
{
    sv_hooks.core_init = shed_core_init;
    sv_hooks.queued = shed_queued;
    sv_hooks.taken = shed_taken;
    sv_hooks.stats = shed_stats;
}

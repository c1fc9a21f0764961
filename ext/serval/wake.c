/*
 * Which Ruby thread to wake for a queued request, and when.
 *
 * Only one Ruby thread runs Ruby code at a time (the GVL), so waking a
 * second thread while a first one is running requests buys nothing when the
 * requests are short: the woken thread takes the request, then waits for the
 * GVL, and the two trade it (futex calls and context switches) while the
 * first one would have taken the request itself a few microseconds later, in
 * Core#next's fast path. So a sleeping thread is woken for a new request only
 * when no thread is on its way to the queue: none running a request (from
 * Core#next's return to its next call, core.c) or already woken, or none that
 * made progress (took a request or was woken) within SV_WAKE_STALL.
 *
 * A running thread that blocks (I/O without the GVL, a long computation)
 * stops taking requests: once nothing was taken for SV_WAKE_STALL while
 * requests wait, the loop wakes sleeping threads for them (sv_wake_check,
 * called after every epoll batch; the loop's epoll timeout is set to the
 * moment the check is due). A queued request therefore waits for a thread
 * that is free at most SV_WAKE_STALL longer than before.
 *
 * Sleeping threads wait on their own condition variable, most recent first
 * (sv_waiter, on the waiting thread's stack), so a wake-up goes to exactly
 * one thread, the one whose memory is warm, and `waking` counts the threads
 * woken and not yet back at the queue exactly. Everything here runs with
 * core->mu held.
 */
#include "serval.h"

void sv_waiter_push(sv_core *core, sv_waiter *w)
{
    w->prev = NULL;
    w->next = core->idle;
    if (core->idle)
        core->idle->prev = w;
    core->idle = w;
    w->listed = 1;
}

void sv_waiter_remove(sv_core *core, sv_waiter *w)
{
    if (!w->listed)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        core->idle = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->listed = 0;
}

static int wake_one(sv_core *core, double now)
{
    sv_waiter *w = core->idle;
    if (!w)
        return 0;
    sv_waiter_remove(core, w);
    w->woken = 1;
    core->waking++;
    core->last_progress = now;
    pthread_cond_signal(&w->cv);
    return 1;
}

void sv_wake_all(sv_core *core)
{
    for (sv_waiter *w = core->idle; w; w = w->next)
        pthread_cond_signal(&w->cv); /* each re-checks why it waits; none is marked woken */
    pthread_cond_broadcast(&core->cv);
}

/* A thread is on its way to the queue and has moved recently. */
static int covered(sv_core *core, double now)
{
    return core->running + core->waking > 0 && now - core->last_progress < SV_WAKE_STALL;
}

void sv_wake_dispatched(sv_core *core, double now)
{
    if (!covered(core, now))
        wake_one(core, now);
}

void sv_wake_taken(sv_core *core, double now)
{
    core->running++;
    core->last_progress = now;
}

double sv_wake_check(sv_core *core, double now)
{
    if (!core->q_head || !core->idle)
        return -1;
    double due = core->last_progress + SV_WAKE_STALL;
    if (core->running + core->waking > 0 && now < due)
        return due - now;
    /* stalled (or nobody on the way): a thread for every request no woken thread will take */
    long want = (long)core->queued - (long)core->waking;
    for (long i = 0; i < want && wake_one(core, now); i++)
        ;
    return core->idle ? SV_WAKE_STALL : -1;
}

/*
 * Waking Ruby threads for queued requests.
 *
 * Each Ruby thread asleep in Core#next waits on its own condition variable
 * (sv_waiter, on the waiting thread's stack), listed most recent first. A
 * request that joins the ready queue wakes the thread at the head of that
 * list, so a wake-up reaches exactly one thread that is asleep and not woken
 * yet (never one already on its way, as a signal on one shared condition
 * variable could), and the thread whose memory is warm is the one reused;
 * `waking` counts the threads woken and not yet back at the queue. A thread
 * woken for a request another thread took first (Core#next's fast path)
 * lists itself again and sleeps on.
 *
 * Waking a thread only when no running thread would take the request soon
 * was measured and dropped: it halved the futex calls but woke the loop
 * more often and cost more CPU per hello request (bench/NOTES.md "Hot
 * path"). Everything here runs with core->mu held.
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

void sv_wake_all(sv_core *core)
{
    for (sv_waiter *w = core->idle; w; w = w->next)
        pthread_cond_signal(&w->cv); /* each re-checks why it waits; none is marked woken */
    pthread_cond_broadcast(&core->cv);
}

void sv_wake_dispatched(sv_core *core)
{
    sv_waiter *w = core->idle;
    if (!w)
        return; /* every thread is busy or already woken: one of them takes it */
    sv_waiter_remove(core, w);
    w->woken = 1;
    core->waking++;
    pthread_cond_signal(&w->cv);
}

/*
 * Thread polls: request threads run the event loop's rounds themselves
 * between requests, so that a request arriving while Ruby runs wakes no
 * thread (docs/DESIGN.md "Thread polls", bench/NOTES.md).
 *
 * Without it every burst of arrivals wakes the loop thread, which preempts
 * the thread that holds the GVL, reads, queues and wakes a sleeping request
 * thread, which preempts again only to wait for the GVL: 0.4 context
 * switches per hello request. With it:
 *
 *   - after a round that queued work for running threads, the loop thread
 *     parks (loop.c park) instead of waiting on the epoll: core->duty;
 *   - a request thread in Core#next whose queue is empty, or whose last poll
 *     is SV_POLL_EVERY_MS old, takes poll_mu (trylock), runs one round
 *     without waiting (sv_loop_poll) and takes the first request queued;
 *   - a queued request wakes no sleeping thread (loop.c dispatch): one
 *     thread takes them in turn while it can run. A second thread is woken
 *     when the running one gives the GVL away inside a request (Ruby's
 *     thread event hook, SUSPENDED: a database call, or a fairness switch
 *     away from a long computation), or by the parked loop when no request
 *     was taken for SV_PARK_MS;
 *   - a thread that holds a request and waits for the GVL goes first: one
 *     that took it while asleep (woken before the duty began), or one whose
 *     young request (under SV_YOUNG_MS) a fairness switch interrupted (the
 *     thread had held the GVL for a slice of back-to-back requests). The
 *     thread that has the GVL goes to sleep at its next Core#next
 *     (sv_polls_yield) instead of taking the queue for a whole slice;
 *   - a thread that goes to sleep with nothing to do ends the duty (core.c
 *     wait_nogvl): the loop waits on the epoll again, so that arrivals are
 *     read while the remaining threads compute. A parked loop that sees no
 *     poll for SV_PARK_MS does the same and wakes threads for what waits.
 *
 * It needs the thread event hook (Ruby 3.3 here: the same test as gvl.c); on
 * Ruby 3.1 and 3.2 the loop thread reads every request and wakes a thread for
 * it. On 3.3 it is the one dispatch path of every mode:
 *
 *   - cluster balancing (loop.c): a thread running a round from Core#next
 *     counts as a free thread (it takes a request right after); the
 *     listeners follow the free threads and the hold after every round,
 *     whoever ran it (balance_listeners), and an accept obeys a hold at once;
 *   - load shedding (loop.c shed): the same takers, the waiting threads and
 *     the one polling, decide whether a request waits behind others;
 *   - TLS: a round run with the GVL leaves a connection still in its
 *     handshake to the loop thread (loop.c leave_to_loop_thread: armed
 *     again, and the duty ends), so that the handshake's CPU is spent
 *     without the GVL; an open session's reads are a request thread's work;
 *   - threads :auto and the I/O lane measure requests as before: a request's
 *     queue time runs until a thread starts it, whether it waited for a
 *     woken thread and the GVL or for the running thread.
 */
#include <stdatomic.h>
#include <ruby.h>
#include <ruby/thread.h>
#include "serval.h"
#include "serval_ruby.h"
#include "polls.h"
#include "conn.h"
#include "hooks.h"
#include "loop.h"

/* The core whose request this thread holds (for the hook), when it took
 * it, and whether a fairness switch took the GVL from it mid-request. */
static __thread sv_core *held_core;
static __thread double held_since;
static __thread int held_preempted;

#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
/* SUSPENDED: a thread that holds a request gave the GVL away. A blocking
 * call in the application: while requests wait, a sleeping thread is woken
 * to take one; with none queued the loop thread takes its epoll back, to
 * read what arrives while this one waits. A fairness switch (fairness.c): the GVL goes to a thread
 * already waiting; noted, so that when that thread reaches Core#next it
 * leaves the queue to this one if its request is young (sv_polls_yield).
 * RESUMED: that thread has the GVL again. Runs on the thread itself. */
static void polls_hook(rb_event_flag_t ev, const rb_internal_thread_event_data_t *d, void *data)
{
    (void)d;
    (void)data;
    sv_core *core = held_core;
    if (!core)
        return;
    if (ev == RUBY_INTERNAL_THREAD_EVENT_RESUMED) {
        if (held_preempted) {
            held_preempted = 0;
            atomic_fetch_sub(&core->preempted, 1);
        }
        return;
    }
    if (sv_gvl_yielding) {
        if (!held_preempted) {
            held_preempted = 1;
            atomic_store(&core->preempted_since, held_since);
            atomic_fetch_add(&core->preempted, 1);
        }
        if (sv_now() - held_since < SV_YOUNG_MS / 1000.0)
            return;
        /* a long computation: the requests that wait get their own thread
         * to share the GVL with it, as without thread polls */
    }
    if (!atomic_load(&core->duty))
        return;
    pthread_mutex_lock(&core->mu);
    if (core->q_head) {
        if (core->waking < (int)core->queued)
            sv_wake_dispatched(core);
    } else {
        /* nothing queued: while this thread waits, the loop thread reads
         * what arrives (no thread would poll before this one is back) */
        sv_loop_unpark_locked(core);
    }
    pthread_mutex_unlock(&core->mu);
}
#endif

void sv_polls_start(sv_core *core)
{
    core->polls_on = 0;
#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
    if (!core->opt.thread_polls)
        return;
    static int hooked;
    if (!hooked) {
        hooked = 1;
        rb_internal_thread_add_event_hook(polls_hook,
                                          RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_RESUMED, NULL);
    }
    core->polls_on = 1;
#endif
}

void sv_polls_took(sv_core *core, double now)
{
    atomic_fetch_add(&core->running, 1);
    if (now <= 0)
        now = sv_now();
    atomic_store(&core->last_take, now);
    held_since = now;
    held_core = core;
}

/* This thread no longer holds a request of held_core. */
static void release_held(void)
{
    if (held_core && held_preempted)
        atomic_fetch_sub(&held_core->preempted, 1);
    held_preempted = 0;
    held_core = NULL;
}

void sv_polls_done(sv_core *core)
{
    atomic_fetch_sub(&core->running, 1);
    if (held_core == core)
        release_held(); /* on another thread (a hijacked socket's), Core#next clears it */
}

/* With the GVL: without it a thread that waits for the GVL would overtake
 * this one; the round is short and never waits (timeout 0). */
int sv_polls_poll(sv_core *core, int queue_empty, double *now)
{
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    if (!queue_empty) {
        *now = sv_now();
        if (*now - atomic_load(&core->last_poll) <= SV_POLL_EVERY_MS / 1000.0)
            return 0;
    }
    if (pthread_mutex_trylock(&core->poll_mu) != 0)
        return 0; /* the loop thread has the epoll, or another thread polls */
    int ran = atomic_load(&core->duty);
    if (ran) {
        core->gvl_round = 1; /* this thread is a taker; TLS handshakes go to the loop thread (loop.c) */
        sv_loop_poll(core, 0);
        core->gvl_round = 0;
        *now = atomic_load(&core->last_poll); /* the round's start */
        atomic_fetch_add(&core->polled_rounds, 1);
    }
    pthread_mutex_unlock(&core->poll_mu);
    return ran;
}

/* Nothing is queued and this thread has nothing to do: rather than give the
 * epoll back to the loop thread and sleep (the loop thread would wake for
 * the next arrival, dispatch it and wake this thread: three context
 * switches), it waits on the epoll itself, so the arrival wakes the thread
 * that takes it. At most SV_PARK_MS: after that the loop thread takes the
 * epoll back as before (wait_nogvl), and last_poll keeps the parked loop
 * from doing so while this one waits. */
int sv_polls_wait(sv_core *core)
{
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    if (pthread_mutex_trylock(&core->poll_mu) != 0)
        return 0; /* the loop thread has the epoll, or another thread polls */
    int ran = atomic_load(&core->duty);
    if (ran) {
        atomic_store(&core->poll_waiting, 1);
        atomic_store(&core->last_poll, sv_now());
        sv_loop_poll(core, SV_PARK_MS);
        atomic_store(&core->poll_waiting, 0);
        atomic_fetch_add(&core->polled_rounds, 1);
        atomic_fetch_add(&core->polled_waits, 1);
    }
    pthread_mutex_unlock(&core->poll_mu);
    return ran;
}

int sv_polls_yield(sv_core *core)
{
    release_held(); /* this thread's request has ended */
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    return atomic_load(&core->unstarted) > 0 ||
           (atomic_load(&core->preempted) > 0 &&
            sv_now() - atomic_load(&core->preempted_since) < SV_YOUNG_MS / 1000.0);
}

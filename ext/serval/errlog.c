/*
 * The error-event ring: one small fixed-size record for every error response
 * the event loop answers itself (400, 408, 413, ...), read by Ruby that
 * writes the log lines (lib/serval/error_log.rb): the supervising loop of a
 * serving process, which waits on the ring's eventfd beside its other
 * descriptors (sv_errlog_fd), or a thread of its own waiting on the
 * condition variable (sv_errlog_take with a deadline).
 *
 * The loop thread only appends, under a mutex held for a copy of one record;
 * it never waits for the reader. When the ring is full the record is dropped
 * and counted, so memory stays at SV_ERRLOG_CAP records whatever the rate.
 * The eventfd is readable exactly while something waits to be taken: the
 * first record (or drop) after an empty ring signals it, a take resets it
 * and signals it again when it left records behind.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include "serval.h"
#include "errlog.h"

static void signal_fd(sv_errlog *l)
{
    uint64_t one = 1;
    if (l->efd >= 0)
        (void)!write(l->efd, &one, sizeof(one)); /* nonblocking: a full counter is still readable */
}

static void reset_fd(sv_errlog *l)
{
    uint64_t n;
    if (l->efd >= 0)
        (void)!read(l->efd, &n, sizeof(n));
}

void sv_errlog_init(sv_errlog *l)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* -1: no poller can wait, a thread still can */
    l->ready = 1;
}

void sv_errlog_destroy(sv_errlog *l)
{
    if (!l->ready)
        return;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    if (l->efd >= 0)
        close(l->efd);
    l->efd = -1;
    l->ready = 0;
}

/* Loop thread. reason and detail must be static strings. */
void sv_errlog_push(sv_errlog *l, int status, const char *reason, const char *detail, const char *peer)
{
    pthread_mutex_lock(&l->mu);
    if (l->len == 0 && l->dropped == 0)
        signal_fd(l);
    if (l->len == SV_ERRLOG_CAP) {
        l->dropped++;
    } else {
        sv_err_event *e = &l->ev[(l->head + l->len) % SV_ERRLOG_CAP];
        e->status = status;
        e->reason = reason;
        e->detail = detail;
        strncpy(e->peer, peer, sizeof(e->peer) - 1);
        e->peer[sizeof(e->peer) - 1] = '\0';
        l->len++;
        if (l->len == 1)
            pthread_cond_signal(&l->cv);
    }
    l->total++;
    pthread_mutex_unlock(&l->mu);
}

/* Reader, without the GVL: waits until a record is there, the deadline
 * (CLOCK_MONOTONIC seconds) passes, or sv_errlog_wake; then moves at most max
 * records to out and the drop count (since the previous take) to *dropped. */
size_t sv_errlog_take(sv_errlog *l, sv_err_event *out, size_t max, unsigned long *dropped, double deadline)
{
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&l->mu);
    while (l->len == 0 && l->dropped == 0 && !l->wake) {
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    }
    l->wake = 0;
    reset_fd(l);
    size_t n = 0;
    while (n < max && l->len > 0) {
        out[n++] = l->ev[l->head];
        l->head = (l->head + 1) % SV_ERRLOG_CAP;
        l->len--;
    }
    *dropped = l->dropped;
    l->dropped = 0;
    if (l->len > 0)
        signal_fd(l); /* more than max: still readable for the next take */
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* The eventfd a poller waits on (readable while records wait), or -1. */
int sv_errlog_fd(sv_errlog *l)
{
    return l->ready ? l->efd : -1;
}

/* Makes the current (or next) sv_errlog_take return at once. */
void sv_errlog_wake(sv_errlog *l)
{
    pthread_mutex_lock(&l->mu);
    l->wake = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void sv_errlog_stats(sv_errlog *l, size_t *queued, unsigned long *dropped, unsigned long *total)
{
    pthread_mutex_lock(&l->mu);
    *queued = l->len;
    *dropped = l->dropped;
    *total = l->total;
    pthread_mutex_unlock(&l->mu);
}

/*
 * Load shedding (option max_queue_time): whether a complete request may join
 * the ready queue, decided by the event loop from what the queue has been
 * measured to do. Pure arithmetic on times the caller passes in: no clock, no
 * lock, no allocation (the caller holds core->mu), so test/c/test_shed.c
 * drives it with simulated timings. docs/tuning.md "Load shedding".
 *
 * Measured (sv_shed_taken, as a Ruby thread takes a request in Core#next):
 *   - per_position: a moving average of wait / (ahead + 1), where ahead is the
 *     number of requests in front of it that no idle thread was there to take
 *     when it joined: the seconds one position of the queue costs;
 *   - CoDel's check: the least wait of the requests taken in each interval of
 *     SV_SHED_INTERVAL; when even that one waited longer than the budget, the
 *     queue stands above it (the average is behind, e.g. the app slowed down)
 *     and every request that would have to queue is shed until an interval's
 *     least wait is back under the budget.
 * Decided (sv_shed_admit, in dispatch): a request an idle thread will take is
 * always admitted; another is shed when its predicted wait,
 *   (ahead + 1) x max(per_position, seconds the queue has not moved),
 * is over the budget. The second term covers threads held long (nothing is
 * taken, so no average moves): the queue's stall is itself a measurement.
 */
#ifndef SERVAL_SHED_H
#define SERVAL_SHED_H

#define SV_SHED_INTERVAL 0.1       /* seconds: CoDel's interval for the least wait */
#define SV_SHED_WEIGHT 0.125       /* weight of one sample in per_position's average */

typedef struct {
    double budget;        /* max_queue_time, seconds; 0: never shed */
    double per_position;  /* average seconds of wait per queue position; 0 until measured */
    double last_take;     /* when a request was last taken from the queue */
    double window_start;  /* the current CoDel interval began */
    double window_min;    /* least wait taken in it; < 0: none yet */
    int standing;         /* the last whole interval's least wait was over the budget */
} sv_shed;

void sv_shed_init(sv_shed *s, double budget, double now);

/* ahead: requests in front that no idle thread will take (queued - waiting
 * threads), or -1 when an idle thread is there for this one. head_since: when
 * the queue's head joined, or -1 for an empty queue. */
double sv_shed_predict(const sv_shed *s, double now, long ahead, double head_since);
int sv_shed_admit(const sv_shed *s, double now, long ahead, double head_since);

/* A thread took a request that joined at queued_at with `ahead` as above. */
void sv_shed_taken(sv_shed *s, double now, double queued_at, long ahead);

#endif

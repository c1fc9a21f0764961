/* Load shedding's decision and measurements; see shed.h. */
#include "shed.h"

void sv_shed_init(sv_shed *s, double budget, double now)
{
    s->budget = budget > 0 ? budget : 0;
    s->per_position = 0;
    s->last_take = now;
    s->window_start = now;
    s->window_min = -1;
    s->standing = 0;
}

double sv_shed_predict(const sv_shed *s, double now, long ahead, double head_since)
{
    if (ahead < 0)
        return 0;
    double per = s->per_position;
    if (head_since >= 0) {
        /* the queue holds requests and none has been taken since this */
        double since = head_since > s->last_take ? head_since : s->last_take;
        if (now - since > per)
            per = now - since;
    }
    return (double)(ahead + 1) * per;
}

int sv_shed_admit(const sv_shed *s, double now, long ahead, double head_since)
{
    if (s->budget <= 0 || ahead < 0)
        return 1;
    if (s->standing)
        return 0;
    return sv_shed_predict(s, now, ahead, head_since) <= s->budget;
}

void sv_shed_taken(sv_shed *s, double now, double queued_at, long ahead)
{
    double wait = now > queued_at ? now - queued_at : 0;
    s->last_take = now;
    if (ahead >= 0) {
        double sample = wait / (double)(ahead + 1);
        s->per_position = s->per_position > 0 ? s->per_position + SV_SHED_WEIGHT * (sample - s->per_position) : sample;
    }
    if (s->window_min < 0 || wait < s->window_min)
        s->window_min = wait;
    if (now - s->window_start >= SV_SHED_INTERVAL) {
        s->standing = s->window_min > s->budget;
        s->window_start = now;
        s->window_min = -1;
    }
}

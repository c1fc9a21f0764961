/* window.c: the rolling window of request figures (Timing::Window) */
#ifndef SERVAL_WINDOW_H
#define SERVAL_WINDOW_H

#include <stdint.h>
#include "serval_ruby.h"

/* The figures, in this order. */
enum { SV_WIN_QUEUE = 0, SV_WIN_RUN, SV_WIN_IDLE, SV_WIN_STALL, SV_WIN_POOL, SV_WIN_WALL, SV_WIN_CPU, SV_WIN_LOCK, SV_WIN_FIG };
void *sv_win_record(double now, const double f[SV_WIN_FIG], long idle_periods);
/* Requests recorded since the process started and their wall time, ns (any thread, no GVL needed). */
void sv_win_totals(uint64_t *done, uint64_t *wall_ns);
void sv_win_set_shape(void *entry, const float *segs, int nseg);
void sv_init_window(VALUE cTiming);

#endif

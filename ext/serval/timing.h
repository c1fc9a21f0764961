/* timing.c: a request's timing record (Serval::Timing) */
#ifndef SERVAL_TIMING_H
#define SERVAL_TIMING_H

#include "serval_ruby.h"

void sv_tm_begin(sv_tm *t, double queued_at, VALUE env, int detailed, int upstream);
void sv_tm_end(sv_tm *t);
int sv_timing_under_cap(double queued_at); /* whether a picked request may be sampled this second */
double sv_upstream_epoch(const char *p, long n);
void sv_init_timing(VALUE mServal);

#endif

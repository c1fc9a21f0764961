/* Declarations shared by the Ruby-facing C files. */
#ifndef SERVAL_RUBY_H
#define SERVAL_RUBY_H

#include <ruby.h>
#include <ruby/version.h>

/* Ruby 3.3+: a typed object's struct can live inside the object's own slot
 * (RUBY_TYPED_EMBEDDABLE): no calloc and no free per object. */
#if defined(RUBY_API_VERSION_CODE) && RUBY_API_VERSION_CODE >= 30300
#define SV_EMBED 1
#define SV_TYPED_EMBEDDABLE RUBY_TYPED_EMBEDDABLE
#else
#define SV_EMBED 0
#define SV_TYPED_EMBEDDABLE 0
#endif
#include "serval.h"

sv_core *sv_core_get(VALUE core_obj);
VALUE sv_request_new(VALUE core_obj, sv_core *core, sv_conn *conn);
VALUE sv_init_core(VALUE mNative);           /* returns Native::Core */
void sv_init_balance(VALUE cCore);
void sv_init_request(VALUE mNative);
void sv_init_env(void);
void sv_define_env_fill(VALUE mNative);
void sv_init_strcache(void);
VALUE sv_strcache_get(const char *p, size_t n);
void sv_init_tls(VALUE mNative);
void *sv_tls_ctx_get(VALUE tls_context);
VALUE sv_build_env(sv_conn *c, VALUE tmpl, VALUE hijack, VALUE *finished, VALUE *after, int *upstream);

void sv_tm_begin(sv_tm *t, double queued_at, VALUE env, int detailed, int upstream);
void sv_tm_end(sv_tm *t);
VALUE sv_timing_new(sv_tm **out);
VALUE sv_timing_env_key(void);
double sv_request_queued_at(VALUE req);
int sv_gvl_counters(uint64_t out[3]);
int sv_gvl_mark(int in_request, uint64_t out[4], uint64_t now);
/* Set by fairness.c around the GVL release that gives a waiting thread its
 * turn: the GVL hook counts that release as stall (the thread wants the GVL
 * back at once), not as idle. Owner thread only. */
extern __thread int sv_gvl_yielding;
/* A request's shape: its GVL-held and idle spans in order, [cpu, io, cpu,
 * ..., cpu], at most SV_SEGS (odd) entries; spans past that fold into the
 * last two (totals kept). */
#define SV_SEGS 17
int sv_gvl_segments(float out[SV_SEGS], uint64_t now);
int sv_timing_under_cap(double queued_at); /* timing.c: whether a picked request may be sampled this second */
/* GVL slots gvl.c tracks; sv_gvl_probe reads one for ext/serval/steadiness.c. */
#define SV_GVL_SLOTS 512
int sv_gvl_probe(int i, uint32_t *claim, uint64_t *held, uint64_t *cpu);
uint64_t sv_gvl_outside_ns(void);
/* gvl.c's sampled idle spans: run-queue wait, length, count, wait in sends, waits after long sends,
 * waits filed after answered sends */
#define SV_IDLE_WAIT_FIGURES 6
void sv_gvl_idle_wait(uint64_t out[SV_IDLE_WAIT_FIGURES]);
/* gvl.c's sampled sends by the time to their answer's read: half-octave bins from 4 us */
#define SV_SEND_BINS 40
#define SV_SEND_FIGURES 3 /* answer out, answer in, times */
void sv_gvl_sends(uint64_t out[SV_SEND_FIGURES][SV_SEND_BINS]);
/* A function to call when Native::GVL.enable adds the hook in this process
 * (steadiness.c's sampler); Ruby 3.2+. */
void sv_gvl_on_enable(void (*fn)(void));
void sv_init_gvl(VALUE mNative);
void sv_init_fairness(VALUE mNative);
void sv_init_steadiness(VALUE mNative);      /* after sv_init_gvl */
/* The rolling window (ext/serval/window.c): figures in this order. */
enum { SV_WIN_QUEUE = 0, SV_WIN_RUN, SV_WIN_IDLE, SV_WIN_STALL, SV_WIN_POOL, SV_WIN_WALL, SV_WIN_CPU, SV_WIN_FIG };
void *sv_win_record(double now, const double f[SV_WIN_FIG], long idle_periods);
void sv_win_set_shape(void *entry, const float *segs, int nseg);
void sv_init_window(VALUE cTiming);
int sv_pool_wait_counters(uint64_t out[4]);
void sv_init_timing(VALUE mServal);
double sv_upstream_epoch(const char *p, long n);
/* head.c: the response head; flags: */
#define SV_HEAD_RAW 1        /* partial hijack: no framing headers */
#define SV_HEAD_NO_HIJACK 2  /* a rack.hijack header: return -1, nothing written */
int sv_write_head(sv_conn *c, VALUE status, VALUE headers, VALUE length, int flags);
void sv_head_rollback(sv_conn *c); /* takes a head that raised midway back out of c->out */
extern VALUE sv_eBadResponse;    /* Serval::BadResponse: an application's response the head refuses */
void sv_init_head(void);

#endif

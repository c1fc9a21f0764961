/* gvl.c: the GVL event hook (Ruby 3.2+) and the pool-wait counters */
#ifndef SERVAL_GVL_H
#define SERVAL_GVL_H

#include "serval_ruby.h"
#include "hooks.h"

int sv_gvl_counters(uint64_t out[3]);
/* sv_gvl_mark's figures: run, idle, stall ns, idle periods, lock-wait ns */
#define SV_GVL_MARKS 5
/* Whether lock waits are told from idle (Ruby 3.3+, Native::GVL.lock_split?). */
int sv_gvl_lock_split(void);
int sv_gvl_mark(int in_request, uint64_t out[SV_GVL_MARKS], uint64_t now);
/* sv_gvl_yielding (fairness.c's preemption in progress) is the core's thread
 * state: hooks.h. */
/* A request's shape: its GVL-held and idle spans in order, [cpu, io, cpu,
 * ..., cpu], at most SV_SEGS (odd) entries; spans past that fold into the
 * last two (totals kept). */
#define SV_SEGS 17
int sv_gvl_segments(float out[SV_SEGS], uint64_t now);
/* GVL slots gvl.c tracks; sv_gvl_probe reads one for ext/serval/steadiness.c. */
#define SV_GVL_SLOTS 512
int sv_gvl_probe(int i, uint32_t *claim, uint64_t *held, uint64_t *cpu);
uint64_t sv_gvl_outside_ns(void);
/* gvl.c's sampled idle spans: run-queue wait, length, count, wait in sends, waits after long sends,
 * waits filed after answered sends */
#define SV_IDLE_WAIT_FIGURES 7
void sv_gvl_idle_wait(uint64_t out[SV_IDLE_WAIT_FIGURES]);
/* gvl.c's sampled sends by the time to their answer's read: half-octave bins from 4 us */
#define SV_SEND_BINS 40
#define SV_SEND_FIGURES 3 /* answer out, answer in, times */
void sv_gvl_sends(uint64_t out[SV_SEND_FIGURES][SV_SEND_BINS]);
/* A function to call when Native::GVL.enable adds the hook in this process
 * (steadiness.c's sampler); Ruby 3.2+. */
void sv_gvl_on_enable(void (*fn)(void));
int sv_pool_wait_counters(uint64_t out[4]);
void sv_init_gvl(VALUE mNative);

#endif

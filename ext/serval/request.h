/* request.c: Serval::Native::Request, one request owned by one Ruby thread; the response
 * head; thread polls, request threads that run the loop's rounds while it parks */
#ifndef SERVAL_REQUEST_H
#define SERVAL_REQUEST_H

#include "serval_ruby.h"

/* ---- the response head ---- */
/* sv_write_head's flags: */
#define SV_HEAD_RAW 1        /* partial hijack: no framing headers */
#define SV_HEAD_NO_HIJACK 2  /* a rack.hijack header: return -1, nothing written */
int sv_write_head(sv_conn *c, VALUE status, VALUE headers, VALUE length, int flags);
void sv_head_rollback(sv_conn *c); /* takes a head that raised midway back out of c->out */
extern VALUE sv_eBadResponse;    /* Serval::BadResponse: an application's response the head refuses */
void sv_init_head(void);

/* ---- the Request object ---- */
/* Core#next: the request of a connection just taken from the ready queue. */
VALUE sv_request_new(VALUE core_obj, sv_core *core, sv_conn *conn);
double sv_request_queued_at(VALUE req);
void sv_init_request(VALUE mNative);

/* ---- thread polls ---- */
void sv_polls_start(sv_core *core);          /* Core#start: decides core->thread_polls, installs the hook */
void sv_polls_took(sv_core *core, double now); /* Core#next took a request (core->mu held, polls on): core->running;
                                                * now: a clock read moments ago, or 0 */
void sv_polls_done(sv_core *core);           /* that request ended (finish, abort, hijack, GC) */
/* Core#next, GVL held: runs a round of the loop's events when the loop is
 * parked and the queue is empty or the last round SV_POLL_EVERY_MS old; 1 if it ran one.
 * *now: the clock it read (the round's start, or the check's), for the take that follows */
int sv_polls_poll(sv_core *core, int queue_empty, double *now);
/* Core#next, without the GVL, core->mu not held: a thread with nothing to
 * do waits on the epoll itself, at most SV_PARK_MS; 1 if it ran that round */
int sv_polls_wait(sv_core *core);
/* Core#next, GVL held: whether this thread should sleep and leave the queue to a thread that
 * waits for the GVL with a request it took while asleep, or a young one a fairness switch interrupted */
int sv_polls_yield(sv_core *core);

#endif

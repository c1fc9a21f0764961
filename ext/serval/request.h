/* request.c: Serval::Native::Request, one request owned by one Ruby thread, and the response head */
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

#endif

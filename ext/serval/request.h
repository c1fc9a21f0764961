/* request.c: Serval::Native::Request, one request owned by one Ruby thread */
#ifndef SERVAL_REQUEST_H
#define SERVAL_REQUEST_H

#include "serval_ruby.h"

/* Core#next: the request of a connection just taken from the ready queue. */
VALUE sv_request_new(VALUE core_obj, sv_core *core, sv_conn *conn);
double sv_request_queued_at(VALUE req);
void sv_init_request(VALUE mNative);

#endif

/* head.c: the response head */
#ifndef SERVAL_HEAD_H
#define SERVAL_HEAD_H

#include "serval_ruby.h"

/* sv_write_head's flags: */
#define SV_HEAD_RAW 1        /* partial hijack: no framing headers */
#define SV_HEAD_NO_HIJACK 2  /* a rack.hijack header: return -1, nothing written */
int sv_write_head(sv_conn *c, VALUE status, VALUE headers, VALUE length, int flags);
void sv_head_rollback(sv_conn *c); /* takes a head that raised midway back out of c->out */
extern VALUE sv_eBadResponse;    /* Serval::BadResponse: an application's response the head refuses */
void sv_init_head(void);

#endif

/* errlog.c: the error responses the loop answered, for lib/serval/error_log.rb */
#ifndef SERVAL_ERRLOG_H
#define SERVAL_ERRLOG_H

#include "serval.h"

void sv_errlog_init(sv_errlog *l);
void sv_errlog_destroy(sv_errlog *l);
void sv_errlog_push(sv_errlog *l, int status, const char *reason, const char *detail, const char *peer);
size_t sv_errlog_take(sv_errlog *l, sv_err_event *out, size_t max, unsigned long *dropped, double deadline);
void sv_errlog_wake(sv_errlog *l);
void sv_errlog_stats(sv_errlog *l, size_t *queued, unsigned long *dropped, unsigned long *total);
int sv_errlog_fd(sv_errlog *l);            /* eventfd readable while records wait, for a poller */

#endif

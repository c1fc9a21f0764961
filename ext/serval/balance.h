/* balance.c: the Core methods that set the balancing switches (cluster workers) */
#ifndef SERVAL_BALANCE_H
#define SERVAL_BALANCE_H

#include "serval_ruby.h"

void sv_init_balance(VALUE cCore);

#endif

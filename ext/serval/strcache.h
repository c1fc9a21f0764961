/* strcache.c: frozen strings for the header names and values that recur */
#ifndef SERVAL_STRCACHE_H
#define SERVAL_STRCACHE_H

#include "serval_ruby.h"

VALUE sv_strcache_get(const char *p, size_t n);
void sv_init_strcache(void);

#endif

/* env.c: the Rack env of a request, and the frozen strings it shares between requests */
#ifndef SERVAL_ENV_H
#define SERVAL_ENV_H

#include "serval_ruby.h"

/* ---- the string cache: frozen strings for the header names and values that recur ---- */
VALUE sv_strcache_get(const char *p, size_t n);
void sv_init_strcache(void);

/* ---- the env ---- */
VALUE sv_build_env(sv_conn *c, VALUE tmpl, VALUE hijack, VALUE *finished, VALUE *after, int *upstream);
void sv_init_env(void);
void sv_define_env_fill(VALUE mNative);

#endif

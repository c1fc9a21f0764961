/* env.c: the Rack env of a request */
#ifndef SERVAL_ENV_H
#define SERVAL_ENV_H

#include "serval_ruby.h"

VALUE sv_build_env(sv_conn *c, VALUE tmpl, VALUE hijack, VALUE *finished, VALUE *after, int *upstream);
void sv_init_env(void);
void sv_define_env_fill(VALUE mNative);

#endif

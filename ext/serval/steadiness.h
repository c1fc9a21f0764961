/* steadiness.c: how steadily the GVL's holder is on a CPU (Native::GVL.steadiness) */
#ifndef SERVAL_STEADINESS_H
#define SERVAL_STEADINESS_H

#include "serval_ruby.h"

void sv_init_steadiness(VALUE mNative);      /* after sv_init_gvl */

#endif

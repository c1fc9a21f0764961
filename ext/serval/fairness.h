/* fairness.c: giving a waiting thread its turn at the GVL (Ruby 3.3+) */
#ifndef SERVAL_FAIRNESS_H
#define SERVAL_FAIRNESS_H

#include "serval_ruby.h"

void sv_init_fairness(VALUE mNative);

#endif

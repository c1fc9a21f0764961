/* The advice's simulation loop (sim.c): Serval::Native::Sim. */
#ifndef SV_SIM_H
#define SV_SIM_H
#include "serval_ruby.h"

void sv_init_sim(VALUE mNative);

#endif

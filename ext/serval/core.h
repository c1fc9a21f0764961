/* core.c: Serval::Native::Core, the Ruby face of the I/O core */
#ifndef SERVAL_CORE_H
#define SERVAL_CORE_H

#include "serval_ruby.h"

sv_core *sv_core_get(VALUE core_obj);
VALUE sv_init_core(VALUE mNative);           /* returns Native::Core */

#endif

/* shed_core.c: load shedding attached to the core's hooks (hooks.h) */
#ifndef SERVAL_SHED_CORE_H
#define SERVAL_SHED_CORE_H

void sv_init_shed_core(void); /* attaches it, when the extension loads */

#endif

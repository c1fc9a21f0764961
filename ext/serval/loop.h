/* loop.c: the event-loop thread, and the core's lifetime */
#ifndef SERVAL_LOOP_H
#define SERVAL_LOOP_H

#include "serval.h"

int sv_core_init(sv_core *core);
int sv_core_start(sv_core *core);
void sv_core_stop_and_join(sv_core *core, double grace);
void sv_core_destroy(sv_core *core);
void sv_core_ref(sv_core *core);
void sv_core_unref(sv_core *core);           /* the last reference destroys and frees the core */
/* A request thread holding poll_mu while the loop is parked: one round of
 * the events ready now, or within timeout_ms (without the GVL only).
 * Returns how many. */
int sv_loop_poll(sv_core *core, int timeout_ms);
/* core->mu held: thread polls end, the parked loop thread takes its epoll back */
void sv_loop_unpark_locked(sv_core *core);
/* Loop thread only: parse what is buffered and dispatch. */
void sv_loop_process_input(sv_conn *c);

#endif

/* wake.c: waking the Ruby threads asleep in Core#next (core->mu held), and the loop thread */
#ifndef SERVAL_WAKE_H
#define SERVAL_WAKE_H

#include "serval.h"

void sv_waiter_push(sv_core *core, sv_waiter *w);
void sv_waiter_remove(sv_core *core, sv_waiter *w);
/* Every waiting thread re-checks its wait (draining, stopping, interrupts); core->cv too. */
void sv_wake_all(sv_core *core);
/* A request joined the queue: wake the most recent sleeping thread not woken yet. */
void sv_wake_dispatched(sv_core *core);
/* Without core->mu too: the loop thread's epoll wait returns. */
void sv_core_wake(sv_core *core);

#endif

/*
 * GVL-aware balancing across cluster workers: the native half. The decisions
 * are Ruby's (lib/serval/cluster/balancer.rb, a thread that wakes every
 * 100 ms); the core only obeys two switches:
 *
 *   hold  - the listeners stay out of epoll (balance_listeners in loop.c), so
 *           the kernel hands new connections to a sibling worker;
 *   moves - a count of keep-alive connections to end: the next response whose
 *           head is written while one is granted says "connection: close"
 *           (request.c take_move), and the connection closes once that response
 *           is complete, never in the middle of a request.
 *
 * Only a core in balance mode (cluster worker) reads them. This file is the
 * Ruby methods (on Core) that set them: the core never calls in here.
 */
#include "serval.h"
#include "serval_ruby.h"
#include "balance.h"
#include "core.h"
#include "conn.h"

/* Core#balance_hold = true/false; the loop re-reads it at once. */
static VALUE core_balance_hold_set(VALUE self, VALUE on)
{
    sv_core *core = sv_core_get(self);
    int v = RTEST(on) ? 1 : 0;
    if (atomic_exchange(&core->balance_hold, v) != v && core->started)
        sv_core_wake(core);
    return on;
}

static VALUE core_balance_hold_p(VALUE self)
{
    return atomic_load(&sv_core_get(self)->balance_hold) ? Qtrue : Qfalse;
}

/* Core#balance_move: grant one move. Moves granted and not yet taken do not
 * add up: at most one is pending, so a quiet worker never ends a burst of
 * connections later. */
static VALUE core_balance_move(VALUE self)
{
    atomic_store(&sv_core_get(self)->balance_moves, 1);
    return Qnil;
}

/* Core#balance_moved: connections ended to move their clients, so far. */
static VALUE core_balance_moved(VALUE self)
{
    return ULONG2NUM(atomic_load(&sv_core_get(self)->moved));
}

void sv_init_balance(VALUE cCore)
{
    rb_define_method(cCore, "balance_hold=", core_balance_hold_set, 1);
    rb_define_method(cCore, "balance_hold?", core_balance_hold_p, 0);
    rb_define_method(cCore, "balance_move", core_balance_move, 0);
    rb_define_method(cCore, "balance_moved", core_balance_moved, 0);
}

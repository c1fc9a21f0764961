/* conn.c: buffers, the pools of free blocks, the clock; waking the Ruby
 * threads asleep in Core#next and the loop thread; a connection's steps,
 * shared by the loop and the Ruby threads */
#ifndef SERVAL_CONN_H
#define SERVAL_CONN_H

#include "serval.h"

/* ---- buffers, the pools of free blocks, the clock ---- */
void sv_pool_init(sv_pool *p, size_t size);
void sv_pool_destroy(sv_pool *p);
void *sv_pool_get(sv_pool *p);           /* a block of p->size bytes (malloc when none is kept), or NULL */
void sv_pool_put(sv_pool *p, void *blk); /* keep it, or free it when SV_POOL_MAX are kept */
int sv_buf_reserve(sv_buf *b, size_t extra, size_t limit);
void sv_buf_keep(sv_buf *b, size_t keep);    /* sv_buf_shrink, but an empty pool block stays */
/* Also within `budget` bytes for all buffers sharing b->acct (to SV_OUT_MIN a buffer grows freely). */
int sv_buf_reserve_budget(sv_buf *b, size_t extra, size_t limit, size_t budget);
int sv_buf_append(sv_buf *b, const void *p, size_t n, size_t limit);
void sv_buf_consume_front(sv_buf *b, size_t n);
void sv_buf_free(sv_buf *b);
void sv_buf_shrink(sv_buf *b, size_t keep);
/* Loop only: give freed output memory back to the system (malloc_trim), rate-limited. */
void sv_out_trim(sv_core *core, double now);

/* The monotonic clock in seconds */
double sv_now(void);

/* ---- waking the Ruby threads asleep in Core#next (core->mu held), and the loop thread ---- */
void sv_waiter_push(sv_core *core, sv_waiter *w);
void sv_waiter_remove(sv_core *core, sv_waiter *w);
/* Every waiting thread re-checks its wait (draining, stopping, interrupts); core->cv too. */
void sv_wake_all(sv_core *core);
/* A request joined the queue: wake the most recent sleeping thread not woken yet. */
void sv_wake_dispatched(sv_core *core);
/* Without core->mu too: the loop thread's epoll wait returns. */
void sv_core_wake(sv_core *core);

/* ---- a connection's steps ---- */
/* An edge-triggered connection (plain TCP) is registered for both directions,
 * once. EPOLLRDHUP: the peer's FIN can come in the same edge as its last
 * bytes, and a short read of those leaves the EOF with no edge of its own. */
#define SV_ET_EVENTS (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET)
sv_conn *sv_conn_new(sv_core *core, int fd, sv_listener *l);
/* The owner (either side): wait on the loop's epoll for `events` (as the
 * connection's transport translates them), once (EPOLLONESHOT); for an
 * edge-triggered connection nothing, unless input may be waiting unannounced
 * (c->rd_more): then the registration is renewed, which reports it again. */
void sv_conn_arm(sv_conn *c, uint32_t events);
void sv_conn_free(sv_conn *c);
/* Write what the socket takes now, through the transport; closes the
 * response's file once it is sent. 1 = all written, 0 = would block, -1 = error. */
int sv_conn_flush(sv_conn *c);
/* What follows a flush that returned r, decided in one place for both
 * sides: the owner closes the connection, parses a pipelined request
 * already buffered, or waits for *events (the rest of the response, a
 * lingering close, or the next request); c->state and c->deadline are set. */
typedef enum { SV_NEXT_CLOSE, SV_NEXT_PARSE, SV_NEXT_WAIT } sv_next;
/* now: the clock read moments ago, or 0 (read it when needed) */
sv_next sv_conn_after_flush(sv_conn *c, int r, uint32_t *events, double now);
/* Ruby side, without the GVL: the response is complete; the connection goes
 * back to the loop (or is closed). now: as for sv_conn_after_flush. */
void sv_conn_response_done(sv_conn *c, double now);
void sv_conn_give_to_loop_dead(sv_conn *c);
void sv_conn_release_idle(sv_conn *c);         /* the loop: an idle connection's buffers go back to the pools */
/* An unlinked temp file in tmpdir (O_TMPFILE, else mkostemp + unlink), mode 0600; or -1. */
int sv_tmpfile(sv_core *core);
/* Owner only: append to the response's spill file (opened on first use)
 * within max_spill. Returns the bytes taken, fewer than n (then
 * c->spill_failed is set) when max_spill is reached or the disk refuses. */
size_t sv_conn_spill(sv_conn *c, const char *p, size_t n);

#endif

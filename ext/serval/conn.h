/* conn.c: a connection's steps, shared by the loop and the Ruby threads */
#ifndef SERVAL_CONN_H
#define SERVAL_CONN_H

#include "serval.h"

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

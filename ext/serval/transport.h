/*
 * A connection's transport: how its bytes cross the socket. Plain TCP
 * (conn.c, sv_plain_transport) and TLS (tls.c) implement the same operations, and every
 * caller (loop.c, conn.c, request.c) goes through c->io without knowing
 * which one a connection has.
 *
 * Calls go one way: a transport works on the connection's socket, its
 * output buffer and its response file, and never calls back into the loop,
 * the ready queue or the connection's state machine. Only the connection's
 * owner calls it (see serval.h), so no transport needs a lock.
 */
#ifndef SERVAL_TRANSPORT_H
#define SERVAL_TRANSPORT_H

#include <stdint.h>
#include <sys/types.h>
#include "serval.h"

struct sv_transport {
    /* read(2) semantics: > 0 bytes, 0 at EOF, -1 with errno (EAGAIN: wait
     * for the events `events` gives for EPOLLIN). */
    ssize_t (*read)(sv_conn *c, void *p, size_t n);
    /* send(2) semantics (never SIGPIPE); -1 with EAGAIN when full. */
    ssize_t (*write)(sv_conn *c, const void *p, size_t n);
    /* Write c->out, then c->file_rem bytes of c->file_fd from c->file_off:
     * 1 all written, 0 would block, -1 error. The file stays open (the
     * caller, sv_conn_flush, closes it). */
    int (*flush)(sv_conn *c);
    /* The epoll events to wait for when the caller wants `events`: the same
     * for plain TCP; TLS may need the other direction, or EPOLLOUT to come
     * back at once for bytes OpenSSL has already decrypted. */
    uint32_t (*events)(sv_conn *c, uint32_t events);
    /* No more output (lingering close): TLS sends close_notify, then the
     * socket's write side is shut down. Input is afterwards only discarded,
     * read(2) from the socket, and `events` asks for what it is given. */
    void (*shutdown)(sv_conn *c);
    /* Close the socket (TLS: close_notify first, if not sent) and release
     * the transport's state; c->fd becomes -1. Idempotent. */
    void (*close)(sv_conn *c);
};

extern const sv_transport sv_plain_transport;

#endif

/*
 * TLS for ssl:// listeners (tls.c), with OpenSSL when the extension was built
 * with it (HAVE_OPENSSL_SSL_H). A TLS connection carries an SSL* in c->tls;
 * plain connections pay one pointer test in sv_io_read / sv_io_write /
 * sv_conn_flush / sv_loop_arm.
 *
 * Non-blocking: when OpenSSL needs the socket readable or writable, the call
 * returns -1 with errno EAGAIN and c->tls_want holds the epoll event to wait
 * for; sv_loop_arm uses it instead of the caller's event.
 */
#ifndef SERVAL_TLS_H
#define SERVAL_TLS_H

#include <stdint.h>
#include <unistd.h>
#include <sys/socket.h>
#include "serval.h"

#define SV_TLS_FILE_CHUNK 65536   /* file bytes read per SSL_write of a to_path body */

/* Attach an SSL to a freshly accepted connection: 0, or -1. */
int sv_tls_conn_init(sv_conn *c, void *ctx);
/* Continue the handshake: 1 done, 0 wait for c->tls_want, -1 failed. */
int sv_tls_handshake(sv_conn *c);
/* read(2)/send(2) semantics: >0 bytes, 0 EOF (read), -1 with errno set. */
ssize_t sv_tls_read(sv_conn *c, void *p, size_t n);
ssize_t sv_tls_write(sv_conn *c, const void *p, size_t n);
/* sv_conn_flush for TLS: out buffer, then the file through a bounded buffer. */
int sv_tls_flush(sv_conn *c);
/* The epoll events to arm for a TLS connection that asked for `events`. */
uint32_t sv_tls_events(sv_conn *c, uint32_t events);
/* Send close_notify once (before the socket's write side closes); never waits. */
void sv_tls_close_notify(sv_conn *c);
void sv_tls_conn_free(sv_conn *c);
void sv_tls_ctx_free(void *ctx);

static inline ssize_t sv_io_read(sv_conn *c, void *p, size_t n)
{
    if (c->tls)
        return sv_tls_read(c, p, n);
    return read(c->fd, p, n);
}

static inline ssize_t sv_io_write(sv_conn *c, const void *p, size_t n)
{
    if (c->tls)
        return sv_tls_write(c, p, n);
    return send(c->fd, p, n, MSG_NOSIGNAL);
}

#endif

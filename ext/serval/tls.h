/*
 * TLS for ssl:// listeners (tls.c): a connection accepted on one gets the
 * TLS transport (transport.h), an SSL* in c->tls. Built with OpenSSL when
 * its headers were found (HAVE_OPENSSL_SSL_H, extconf.rb); without it
 * sv_tls_conn_init fails, and Binder refuses an ssl:// bind at boot.
 */
#ifndef SERVAL_TLS_H
#define SERVAL_TLS_H

#include "serval.h"

/* Attach an SSL (from the listener's SSL_CTX) to a connection just
 * accepted and make TLS its transport: 0, or -1. */
int sv_tls_conn_init(sv_conn *c, void *ctx);
/* A TLS connection whose handshake is not done: its next read may spend
 * a handshake's CPU (thread polls leave it to the loop thread, loop.c). */
int sv_tls_handshaking(const sv_conn *c);
/* Drop a listener's reference to its SSL_CTX. */
void sv_tls_ctx_free(void *ctx);

#endif

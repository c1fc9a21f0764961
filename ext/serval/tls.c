/*
 * The TLS transport (transport.h) with OpenSSL, and Serval::Native::TLSContext,
 * the Ruby object that owns an SSL_CTX built from certificate and key files.
 *
 * Non-blocking: when OpenSSL needs the socket readable or writable, a call
 * returns -1 with errno EAGAIN and c->tls_want holds the epoll event to wait
 * for, which tls_events gives the loop instead of the caller's event. The
 * handshake runs inside the first read. No sendfile through TLS: a file body
 * goes through the output buffer in SV_TLS_FILE_CHUNK pieces.
 *
 * Threads: an SSL* is used only by the connection's current owner (the loop
 * or one Ruby thread, see serval.h), so it needs no lock. OpenSSL's error
 * queue is per thread and cleared before every call whose result we examine.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "tls.h"
#include "transport.h"
#include "conn.h"

#ifdef HAVE_OPENSSL_SSL_H
#include <openssl/err.h>
#include <openssl/ssl.h>

#define SV_TLS_FILE_CHUNK 65536   /* file bytes read per SSL_write of a to_path body */

/* c->tls_state; CLOSED: our close_notify is sent (or the session is given
 * up), only raw input is discarded from now on */
enum { SV_TLS_HANDSHAKE = 0, SV_TLS_OPEN = 1, SV_TLS_FAILED = -1, SV_TLS_CLOSED = 2 };

/* ---- the transport (no GVL, no Ruby objects) ---------------------------- */

/* Map an SSL result <= 0 to errno: EAGAIN (with c->tls_want), or a failure. */
static ssize_t tls_error(sv_conn *c, int rc)
{
    switch (SSL_get_error(c->tls, rc)) {
    case SSL_ERROR_WANT_READ:
        c->tls_want = EPOLLIN;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        c->tls_want = EPOLLOUT;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        c->tls_want = 0;
        return 0; /* close_notify: a clean EOF */
    default:
        c->tls_state = SV_TLS_FAILED; /* protocol error, reset, plain HTTP on a TLS port */
        ERR_clear_error();
        errno = ECONNRESET;
        return -1;
    }
}

/* Continue the handshake: 1 done, 0 wait for c->tls_want, -1 failed. */
static int tls_handshake(sv_conn *c)
{
    if (c->tls_state == SV_TLS_OPEN)
        return 1;
    if (c->tls_state != SV_TLS_HANDSHAKE)
        return -1;
    ERR_clear_error();
    int rc = SSL_do_handshake(c->tls);
    if (rc == 1) {
        c->tls_state = SV_TLS_OPEN;
        c->tls_want = 0;
        return 1;
    }
    if (tls_error(c, rc) < 0 && errno == EAGAIN)
        return 0;
    c->tls_state = SV_TLS_FAILED;
    return -1;
}

static ssize_t tls_read(sv_conn *c, void *p, size_t n)
{
    if (c->tls_state != SV_TLS_OPEN) {
        int h = tls_handshake(c);
        if (h <= 0) {
            errno = h == 0 ? EAGAIN : ECONNRESET;
            return -1;
        }
    }
    if (n > INT32_MAX)
        n = INT32_MAX;
    ERR_clear_error();
    int rc = SSL_read(c->tls, p, (int)n);
    if (rc > 0) {
        c->tls_want = 0;
        return rc;
    }
    return tls_error(c, rc);
}

static ssize_t tls_write(sv_conn *c, const void *p, size_t n)
{
    if (c->tls_state != SV_TLS_OPEN) {
        errno = c->tls_state == SV_TLS_HANDSHAKE ? EAGAIN : EPIPE;
        return -1;
    }
    if (n == 0)
        return 0;
    if (n > INT32_MAX)
        n = INT32_MAX;
    ERR_clear_error();
    int rc = SSL_write(c->tls, p, (int)n);
    if (rc > 0) {
        c->tls_want = 0;
        return rc;
    }
    ssize_t r = tls_error(c, rc);
    if (r == 0)
        errno = EPIPE; /* peer closed while we write */
    return -1;
}

/* Write c->out; 1 all written, 0 would block, -1 error. */
static int flush_out(sv_conn *c)
{
    while (c->out.off < c->out.len) {
        ssize_t n = tls_write(c, c->out.data + c->out.off, c->out.len - c->out.off);
        if (n > 0)
            c->out.off += (size_t)n;
        else
            return errno == EAGAIN ? 0 : -1;
    }
    c->out.len = c->out.off = 0;
    return 1;
}

/* The next file chunk becomes output bytes. */
static int load_file_chunk(sv_conn *c)
{
    size_t want = c->file_rem > SV_TLS_FILE_CHUNK ? SV_TLS_FILE_CHUNK : (size_t)c->file_rem;
    if (c->out.cap > SV_TLS_FILE_CHUNK + SV_OUT_MIN)
        sv_buf_free(&c->out); /* empty here: a large buffer goes back, the chunks need little */
    if (sv_buf_reserve(&c->out, want, want + SV_OUT_MIN) != 0)
        return -1;
    ssize_t got;
    do {
        got = pread(c->file_fd, c->out.data, want, c->file_off);
    } while (got < 0 && errno == EINTR);
    if (got <= 0)
        return -1; /* error, or the file shrank under us */
    c->out.len = (size_t)got;
    c->file_off += got;
    c->file_rem -= (uint64_t)got;
    return 0;
}

static int tls_flush(sv_conn *c)
{
    for (;;) {
        int r = flush_out(c);
        if (r <= 0)
            return r;
        if (c->file_rem == 0)
            return 1;
        if (load_file_chunk(c) != 0)
            return -1;
    }
}

static uint32_t tls_events(sv_conn *c, uint32_t events)
{
    if (c->tls_state == SV_TLS_CLOSED)
        return events; /* lingering: raw input is discarded, OpenSSL is done */
    if (c->tls_want)
        return c->tls_want;
    /* Decrypted bytes already inside OpenSSL never make the socket readable:
     * ask for EPOLLOUT too, which fires at once on an idle socket. */
    if ((events & EPOLLIN) && SSL_has_pending(c->tls))
        return events | EPOLLOUT;
    return events;
}

/* Send close_notify once, on an open session; never waits for the peer's. */
static void close_notify(sv_conn *c)
{
    SSL *ssl = c->tls;
    if (ssl && c->fd >= 0 && c->tls_state == SV_TLS_OPEN && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN)) {
        ERR_clear_error();
        SSL_shutdown(ssl); /* one attempt */
        ERR_clear_error();
    }
    c->tls_state = SV_TLS_CLOSED;
    c->tls_want = 0;
}

static void tls_shutdown(sv_conn *c)
{
    close_notify(c);
    shutdown(c->fd, SHUT_WR);
}

static void tls_close(sv_conn *c)
{
    if (c->tls) {
        close_notify(c);
        SSL_free(c->tls);
        c->tls = NULL;
    }
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

static const sv_transport tls_transport = {
    tls_read, tls_write, tls_flush, tls_events, tls_shutdown, tls_close,
};

int sv_tls_conn_init(sv_conn *c, void *ctx)
{
    SSL *ssl = SSL_new((SSL_CTX *)ctx);
    if (!ssl)
        return -1;
    if (SSL_set_fd(ssl, c->fd) != 1) {
        SSL_free(ssl);
        return -1;
    }
    SSL_set_accept_state(ssl);
    c->tls = ssl;
    c->tls_state = SV_TLS_HANDSHAKE;
    c->tls_want = EPOLLIN;
    c->io = &tls_transport;
    return 0;
}

int sv_tls_handshaking(const sv_conn *c)
{
    return c->tls && c->tls_state == SV_TLS_HANDSHAKE;
}

void sv_tls_ctx_free(void *ctx)
{
    SSL_CTX_free((SSL_CTX *)ctx);
}

/* ---- Serval::Native::TLSContext (Ruby side, GVL held) ------------------- */

static void ctx_free(void *p)
{
    if (p)
        SSL_CTX_free(p);
}

static const rb_data_type_t ctx_type = {
    "Serval::Native::TLSContext",
    {NULL, ctx_free, NULL},
    NULL, NULL, RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE ctx_alloc(VALUE klass)
{
    return TypedData_Wrap_Struct(klass, &ctx_type, NULL);
}

/* Raise ArgumentError "what PATH: reason" with OpenSSL's first error. */
static void raise_ssl(SSL_CTX *ctx, const char *what, const char *path)
{
    char reason[256] = "unknown OpenSSL error";
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, reason, sizeof(reason));
    ERR_clear_error();
    SSL_CTX_free(ctx);
    rb_raise(rb_eArgError, "%s %s: %s", what, path, reason);
}

static void check_readable(SSL_CTX *ctx, const char *what, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        SSL_CTX_free(ctx);
        rb_raise(rb_eArgError, "%s %s: %s", what, path, strerror(e));
    }
    fclose(f);
}

/* TLSContext.new(cert_path, key_path, ca_path_or_nil, verify_peer) */
static VALUE ctx_initialize(VALUE self, VALUE cert, VALUE key, VALUE ca, VALUE verify)
{
    const char *cert_path = StringValueCStr(cert);
    const char *key_path = StringValueCStr(key);
    const char *ca_path = NIL_P(ca) ? NULL : StringValueCStr(ca);
    if (DATA_PTR(self))
        rb_raise(rb_eRuntimeError, "already initialized");
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        raise_ssl(NULL, "TLS context", "(new)");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"serval", 6);
    check_readable(ctx, "certificate", cert_path);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1)
        raise_ssl(ctx, "certificate", cert_path);
    check_readable(ctx, "key", key_path);
    if (SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1)
        raise_ssl(ctx, "key", key_path);
    if (SSL_CTX_check_private_key(ctx) != 1)
        raise_ssl(ctx, "key does not match certificate", key_path);
    if (ca_path) {
        check_readable(ctx, "ca", ca_path);
        if (SSL_CTX_load_verify_locations(ctx, ca_path, NULL) != 1)
            raise_ssl(ctx, "ca", ca_path);
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca_path);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
    }
    SSL_CTX_set_verify(ctx, RTEST(verify) ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_NONE,
                       NULL);
    ERR_clear_error();
    DATA_PTR(self) = ctx;
    return self;
}

void *sv_tls_ctx_get(VALUE obj)
{
    SSL_CTX *ctx = rb_check_typeddata(obj, &ctx_type);
    if (!ctx)
        rb_raise(rb_eArgError, "TLS context is not initialized");
    SSL_CTX_up_ref(ctx); /* the listener's reference, dropped by sv_tls_ctx_free */
    return ctx;
}

void sv_init_tls(VALUE mNative)
{
    VALUE k = rb_define_class_under(mNative, "TLSContext", rb_cObject);
    rb_define_alloc_func(k, ctx_alloc);
    rb_define_method(k, "initialize", ctx_initialize, 4);
    rb_define_const(k, "LIBRARY_VERSION", rb_str_new_cstr(OpenSSL_version(OPENSSL_VERSION)));
}

#else /* no OpenSSL: no TLSContext class; Binder reports TLS as unavailable */

int sv_tls_conn_init(sv_conn *c, void *ctx) { return -1; }
int sv_tls_handshaking(const sv_conn *c) { return 0; }
void sv_tls_ctx_free(void *ctx) {}
void *sv_tls_ctx_get(VALUE obj)
{
    if (!NIL_P(obj)) /* core.c passes a TLSContext, which cannot exist here */
        rb_raise(rb_eNotImpError, "serval was built without OpenSSL");
    return NULL;
}
void sv_init_tls(VALUE mNative) {}

#endif

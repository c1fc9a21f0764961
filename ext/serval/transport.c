/*
 * The plain TCP transport (transport.h): read(2), send(2) and sendfile(2)
 * on the socket. Every connection starts with it (sv_conn_new); one
 * accepted on an ssl:// listener then gets TLS's (tls.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <unistd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include "transport.h"
#include "buffer.h"

#define SV_SENDFILE_MAX ((size_t)1 << 30)   /* bytes per sendfile call */

static ssize_t plain_read(sv_conn *c, void *p, size_t n)
{
    return read(c->fd, p, n);
}

static ssize_t plain_write(sv_conn *c, const void *p, size_t n)
{
    return send(c->fd, p, n, MSG_NOSIGNAL);
}

/* errno after a failed write: 0 would block, -1 error, 1 try again. */
static int write_failed(void)
{
    if (errno == EINTR)
        return 1;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
}

static int plain_flush(sv_conn *c)
{
    while (c->out.off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        int r = n < 0 ? write_failed() : -1;
        if (r <= 0)
            return r;
    }
    c->out.len = c->out.off = 0;
    if (c->file_rem > 0 && c->out.cap > SV_OUT_MIN)
        sv_buf_free(&c->out); /* the rest comes from the file: give the memory back now */
    while (c->file_rem > 0) {
        size_t want = c->file_rem > SV_SENDFILE_MAX ? SV_SENDFILE_MAX : (size_t)c->file_rem;
        ssize_t n = sendfile(c->fd, c->file_fd, &c->file_off, want);
        if (n > 0) {
            c->file_rem -= (uint64_t)n;
            continue;
        }
        int r = n < 0 ? write_failed() : -1; /* 0: the file shrank under us */
        if (r <= 0)
            return r;
    }
    return 1;
}

static uint32_t plain_events(sv_conn *c, uint32_t events)
{
    return events;
}

static void plain_shutdown(sv_conn *c)
{
    shutdown(c->fd, SHUT_WR);
}

static void plain_close(sv_conn *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

const sv_transport sv_plain_transport = {
    plain_read, plain_write, plain_flush, plain_events, plain_shutdown, plain_close,
};

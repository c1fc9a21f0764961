/*
 * Connection lifecycle steps shared by the event loop and the Ruby threads.
 * Every function here runs without the GVL and touches no Ruby object; the
 * caller owns the connection (see the ownership rule in serval.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include "serval.h"
#include "tls.h"

sv_conn *sv_conn_new(sv_core *core, int fd, sv_listener *l)
{
    sv_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->kind = SV_KIND_CONN;
    c->fd = fd;
    c->core = core;
    c->listener = l;
    c->body_fd = -1;
    c->file_fd = -1;
    atomic_store(&c->owner, SV_OWN_LOOP);
    c->state = SV_ST_HEAD;
    return c;
}

static void close_if_open(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

void sv_conn_free(sv_conn *c)
{
    if (c->tls)
        sv_tls_conn_free(c);
    close_if_open(&c->fd);
    close_if_open(&c->body_fd);
    close_if_open(&c->file_fd);
    sv_buf_free(&c->in);
    sv_buf_free(&c->body);
    sv_buf_free(&c->out);
    free(c->req);
    free(c);
}

/* Forget the request that was just answered; keep pipelined bytes. */
void sv_conn_reset_request(sv_conn *c)
{
    close_if_open(&c->body_fd);
    close_if_open(&c->file_fd);
    sv_buf_free(&c->body);
    sv_buf_consume_front(&c->in, c->consumed);
    sv_buf_shrink(&c->in, SV_READ_MIN);
    c->out.len = c->out.off = 0;
    sv_buf_shrink(&c->out, SV_OUT_MIN);
    c->consumed = 0;
    c->has_request = 0;
    c->body_in_place = 0;
    c->body_total = 0;
    c->mode = SV_MODE_NONE;
    c->expected = -1;
    c->sent_body = 0;
    c->head_only = 0;
    c->close_after = 0;
    c->head_written = 0;
    c->since = sv_now();
    c->file_rem = 0;
    c->file_off = 0;
}

int sv_conn_flush(sv_conn *c)
{
    if (c->tls)
        return sv_tls_flush(c);
    while (c->out.off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out.off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1;
        }
    }
    c->out.len = c->out.off = 0;
    while (c->file_rem > 0) {
        size_t want = c->file_rem > (1u << 30) ? (1u << 30) : (size_t)c->file_rem;
        ssize_t n = sendfile(c->fd, c->file_fd, &c->file_off, want);
        if (n > 0) {
            c->file_rem -= (uint64_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1; /* error, or the file shrank under us */
        }
    }
    close_if_open(&c->file_fd);
    return 1;
}

void sv_loop_arm(sv_conn *c, uint32_t events)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = (c->tls ? sv_tls_events(c, events) : events) | EPOLLONESHOT;
    ev.data.ptr = c;
    epoll_ctl(c->core->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Ruby side: the connection is closed and goes to the loop to be freed. */
void sv_conn_give_to_loop_dead(sv_conn *c)
{
    sv_core *core = c->core;
    if (c->tls)
        sv_tls_close_notify(c);
    close_if_open(&c->fd);
    pthread_mutex_lock(&core->mu);
    atomic_store(&c->owner, SV_OWN_DEAD);
    c->next = core->dead;
    core->dead = c;
    pthread_mutex_unlock(&core->mu);
    sv_core_wake(core); /* free it now: it holds a max_connections slot */
}

/* Ruby side: publish the connection to the loop in a given state. The store and
 * the re-arm happen under the core mutex so the loop's timeout scan never sees
 * a loop-owned connection that is not armed yet. */
static void hand_to_loop(sv_conn *c, int state, double timeout, uint32_t events)
{
    sv_core *core = c->core;
    c->state = state;
    c->deadline = sv_now() + timeout;
    pthread_mutex_lock(&core->mu);
    if (core->stopping) {
        pthread_mutex_unlock(&core->mu);
        sv_conn_give_to_loop_dead(c);
        return;
    }
    atomic_store(&c->owner, SV_OWN_LOOP);
    if (events) {
        sv_loop_arm(c, events);
    } else {
        c->next = core->returned;
        core->returned = c;
    }
    pthread_mutex_unlock(&core->mu);
    if (!events)
        sv_core_wake(core);
}

/* Ruby side, without the GVL: the application finished its response. */
void sv_conn_response_done(sv_conn *c)
{
    sv_options *o = &c->core->opt;
    int r = sv_conn_flush(c);
    if (r < 0) {
        sv_conn_give_to_loop_dead(c);
        return;
    }
    if (r == 0) {
        hand_to_loop(c, SV_ST_WRITE, o->write_timeout, EPOLLOUT);
        return;
    }
    if (!c->keep_alive || c->close_after) {
        if (c->in.len > c->consumed) {
            /* unread pipelined input: lingering close so the peer gets our bytes */
            if (c->tls)
                sv_tls_close_notify(c);
            shutdown(c->fd, SHUT_WR);
            c->in.len = 0;
            hand_to_loop(c, SV_ST_LINGER, SV_LINGER_SECONDS, EPOLLIN);
        } else {
            sv_conn_give_to_loop_dead(c);
        }
        return;
    }
    sv_conn_reset_request(c);
    if (c->in.len > 0)
        hand_to_loop(c, SV_ST_HEAD, o->read_timeout, 0); /* pipelined: loop parses */
    else
        hand_to_loop(c, SV_ST_HEAD, o->persistent_timeout, EPOLLIN);
}

/*
 * The event-loop thread: accept, read, parse, read bodies, answer framing
 * errors, finish slow writes, enforce timeouts. A plain pthread that never
 * touches a Ruby object and never holds the GVL.
 */
#define _GNU_SOURCE 1 /* as ruby/config.h (hooks.h includes ruby.h for its types) */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <sys/socket.h>
#include "serval.h"
#include "tls.h"
#include "transport.h"
#include "loop.h"
#include "conn.h"
#include "errlog.h"
#include "hooks.h"

#define SV_EV_END (EPOLLRDHUP | EPOLLHUP | EPOLLERR)

/* The loop's own answers always carry a phrase. */
static const char *status_reason(int status)
{
    const char *phrase = sv_reason_phrase(status);
    return *phrase ? phrase : "Error";
}

/* ---- connection table -------------------------------------------------- */

static int table_add(sv_core *core, sv_conn *c)
{
    if (core->nconns == core->conns_cap) {
        size_t cap = core->conns_cap ? core->conns_cap * 2 : 64;
        sv_conn **p = realloc(core->conns, cap * sizeof(*p));
        if (!p)
            return -1;
        core->conns = p;
        core->conns_cap = cap;
    }
    c->slot = (uint32_t)core->nconns;
    core->conns[core->nconns++] = c;
    atomic_fetch_add(&core->open, 1);
    return 0;
}

static void set_partial(sv_conn *c, int on)
{
    sv_core *core = c->core;
    if (c->partial == on)
        return;
    c->partial = on;
    if (on) {
        atomic_fetch_add(&core->partial, 1);
    } else if (atomic_fetch_sub(&core->partial, 1) == 1) {
        pthread_mutex_lock(&core->mu);
        if (core->draining)
            sv_wake_all(core); /* waiting threads may stop now */
        pthread_mutex_unlock(&core->mu);
    }
}

/* Loop only: close and free a connection the loop owns (or a dead one).
 * It leaves the table at once; its memory is freed after the current round
 * of events (bury), since a later event of the same epoll batch may still
 * name it (an edge-triggered connection can have an event and a place on
 * the return list in one round): such an event finds it dead. */
static void conn_destroy(sv_conn *c)
{
    sv_core *core = c->core;
    set_partial(c, 0);
    uint32_t slot = c->slot;
    if (slot < core->nconns && core->conns[slot] == c) {
        sv_conn *last = core->conns[--core->nconns];
        core->conns[slot] = last;
        last->slot = slot;
    }
    atomic_fetch_sub(&core->open, 1);
    atomic_store(&c->owner, SV_OWN_DEAD);
    c->next = core->graveyard;
    core->graveyard = c;
}

static void bury(sv_core *core)
{
    while (core->graveyard) {
        sv_conn *c = core->graveyard;
        core->graveyard = c->next;
        sv_conn_free(c);
    }
}

/* ---- listeners ----------------------------------------------------------- */

static void listeners_register(sv_core *core, int on)
{
    if (core->accepting == on)
        return;
    for (int i = 0; i < core->nlisteners; i++) {
        sv_listener *l = &core->listeners[i];
        struct epoll_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN | EPOLLEXCLUSIVE;
        ev.data.ptr = l;
        epoll_ctl(core->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, l->fd, &ev);
    }
    core->accepting = on;
}

/* REMOTE_ADDR's text of an address (a socket's peer, or a PROXY header's
 * source): an IPv4-mapped IPv6 address as IPv4. */
static void remote_text(sv_conn *c, int family, const void *addr)
{
    if (family == AF_INET6) {
        struct in6_addr a6;
        memcpy(&a6, addr, sizeof(a6));
        if (IN6_IS_ADDR_V4MAPPED(&a6))
            inet_ntop(AF_INET, &a6.s6_addr[12], c->remote, sizeof(c->remote));
        else
            inet_ntop(AF_INET6, &a6, c->remote, sizeof(c->remote));
    } else {
        inet_ntop(AF_INET, addr, c->remote, sizeof(c->remote));
    }
}

static void format_remote(sv_conn *c, const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        remote_text(c, AF_INET, &((const struct sockaddr_in *)ss)->sin_addr);
    else if (ss->ss_family == AF_INET6)
        remote_text(c, AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr);
    else
        snprintf(c->remote, sizeof(c->remote), "127.0.0.1"); /* unix socket peer */
}

/* The Ruby threads that will take the next request queued: those waiting in
 * Core#next (asleep, or waiting on the epoll: sv_polls_wait), and a thread
 * running this round from Core#next between requests (thread polls), which
 * takes the queue's head right after it. Caller holds core->mu (and, for
 * gvl_round, is the round's thread). */
static int takers_locked(sv_core *core)
{
    return core->waiting + core->gvl_round;
}

/* Balance mode: how many Ruby threads are free: the takers, minus the
 * requests already queued for them, minus the connections accepted whose
 * first request is still arriving (counted in partial from accept on).
 * Caller holds core->mu. */
static int free_threads_locked(sv_core *core)
{
    return takers_locked(core) - (int)core->queued - (int)atomic_load(&core->partial);
}

static int free_threads(sv_core *core)
{
    pthread_mutex_lock(&core->mu);
    int n = free_threads_locked(core);
    pthread_mutex_unlock(&core->mu);
    return n;
}

/* Balance mode: listeners stay in epoll only while a Ruby thread is free and
 * no hold is on; the flag tells the next waiter in Core#next to wake the
 * loop (core.c). After each round, by whoever ran it (the loop thread's
 * housekeeping, or a request thread's poll: sv_loop_poll), so that a parked
 * loop's listeners follow the threads as closely as a running loop's. */
static void balance_listeners(sv_core *core)
{
    if (core->accepting < 0)
        return; /* drained: never again */
    pthread_mutex_lock(&core->mu);
    if (core->draining || core->stopping) {
        pthread_mutex_unlock(&core->mu);
        return; /* housekeeping takes the listeners away */
    }
    int idle = free_threads_locked(core) > 0 && !atomic_load(&core->balance_hold);
    core->balance_paused = !idle;
    pthread_mutex_unlock(&core->mu);
    if (!idle)
        listeners_register(core, 0);
    else if ((size_t)atomic_load(&core->open) < core->opt.max_connections)
        listeners_register(core, 1);
}

/* A connection waits in the listener's accept queue. */
static int listener_pending(const sv_listener *l)
{
    struct pollfd p = {l->fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

static void do_accept(sv_core *core, sv_listener *l)
{
    /* balance: one connection per free thread, none while held (the hold
     * may be newer than the listeners' registration: balance_listeners) */
    int batch = !core->opt.balance ? SV_ACCEPT_BATCH : atomic_load(&core->balance_hold) ? 0 : free_threads(core);
    for (int i = 0; i < batch; i++) {
        if ((size_t)atomic_load(&core->open) >= core->opt.max_connections) {
            listeners_register(core, 0); /* resumed by evict_slowest or the timeout scan */
            /* room is made only for a client that is really waiting: the
             * listener's event says so before this batch accepted one; after
             * that, ask the accept queue itself */
            if (i == 0 || listener_pending(l))
                core->evict_wanted = 1;
            return;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                listeners_register(core, 0);
            return;
        }
        if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        sv_conn *c = sv_conn_new(core, fd, l);
        if (!c || table_add(core, c) != 0) {
            free(c);
            close(fd);
            continue;
        }
        format_remote(c, &ss);
        if (core->opt.remote_value[0]) /* set_remote_address "ADDR" */
            memcpy(c->remote, core->opt.remote_value, sizeof(c->remote));
        c->proxy = core->opt.proxy_versions != 0;
        if (l->tls_ctx && sv_tls_conn_init(c, l->tls_ctx) != 0) { /* plain until then (sv_conn_new) */
            conn_destroy(c);
            continue;
        }
        c->since = sv_now();
        c->deadline = c->since + core->opt.first_data_timeout;
        atomic_fetch_add(&core->accepted, 1);
        if (core->opt.balance)
            set_partial(c, 1); /* a drain waits for its first request (conn_expired) */
        /* Plain TCP is registered once, edge-triggered: no epoll_ctl per
         * request (sv_conn_arm). TLS keeps EPOLLONESHOT: OpenSSL may hold
         * decrypted input no socket event announces (tls.c tls_events). */
        c->et = c->io == &sv_plain_transport;
        struct epoll_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.events = c->et ? SV_ET_EVENTS : EPOLLIN | EPOLLONESHOT;
        ev.data.ptr = c;
        if (epoll_ctl(core->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
            conn_destroy(c);
    }
}

/* ---- slow clients ------------------------------------------------------- */

/* A body read extends the deadline by read_timeout (the longest silence),
 * but never past what min_body_rate allows: after a read_timeout of grace
 * from the start of the request, the body must average min_body_rate bytes
 * a second, so a byte every few seconds cannot hold a connection for long
 * (mod_reqtimeout's MinRate). The head already has a whole-head deadline:
 * read_timeout from its first byte, not extended by later bytes. */
static double body_deadline(sv_conn *c)
{
    const sv_options *o = &c->core->opt;
    double idle = sv_now() + o->read_timeout;
    if (o->min_body_rate <= 0)
        return idle;
    double paced = c->since + o->read_timeout + (double)c->body_total / o->min_body_rate;
    return paced < idle ? paced : idle;
}

/* max_connections was reached with a connection waiting to be accepted:
 * close the loop-owned connection, waiting for a request or reading one,
 * with the fewest bytes a second since it began waiting (an idle keep-alive
 * connection or a trickling client goes before a client that is sending).
 * One per round: the listener is registered again, and each accept that
 * finds the table full asks for one more. Connections younger than
 * SV_EVICT_MIN_AGE and those the app or the writer hold are never picked.
 * Runs after an epoll batch, so no event of the batch names the freed
 * connection. Returns 1 when one was closed. */
static int evict_slowest(sv_core *core, double now)
{
    sv_conn *victim = NULL;
    double slowest = 0;
    pthread_mutex_lock(&core->mu);
    for (size_t i = 0; i < core->nconns; i++) {
        sv_conn *c = core->conns[i];
        if (atomic_load(&c->owner) != SV_OWN_LOOP || (c->state != SV_ST_HEAD && c->state != SV_ST_BODY))
            continue;
        double age = now - c->since;
        if (age < SV_EVICT_MIN_AGE)
            continue;
        double rate = ((double)c->in.len + (double)c->body_total + 1.0) / age;
        if (!victim || rate < slowest) {
            victim = c;
            slowest = rate;
        }
    }
    pthread_mutex_unlock(&core->mu);
    if (!victim)
        return 0;
    atomic_fetch_add(&core->evicted, 1);
    conn_destroy(victim);
    return 1;
}

/* ---- answering and closing --------------------------------------------- */

/* r: what sv_conn_flush returned; the next step is decided in conn.c, the
 * same for a response the loop finishes and one a Ruby thread finishes. */
static void wrote(sv_conn *c, int r)
{
    uint32_t events = 0;
    switch (sv_conn_after_flush(c, r, &events, 0)) {
    case SV_NEXT_CLOSE: conn_destroy(c); break;
    case SV_NEXT_PARSE: sv_loop_process_input(c); break;
    case SV_NEXT_WAIT: sv_conn_arm(c, events); break;
    }
}

static void write_some(sv_conn *c)
{
    wrote(c, sv_conn_flush(c));
}

static void http_date(char *buf, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* Answer a request the application never sees, then close. */
static void error_response(sv_conn *c, int status, const char *msg)
{
    sv_core *core = c->core;
    char head[512], date[64];
    if (!msg)
        msg = status_reason(status);
    http_date(date, sizeof(date));
    int blen = (int)strlen(msg) + 1;
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                     "content-length: %d\r\n%sconnection: close\r\ndate: %s\r\n\r\n%s\n",
                     status, status_reason(status), blen,
                     status == 503 ? "retry-after: " SV_REFUSED_RETRY_AFTER "\r\n" : "", date, msg);
    set_partial(c, 0);
    atomic_fetch_add(&core->errors, 1);
    c->out.len = c->out.off = 0;
    c->file_rem = 0;
    if (n < 0 || sv_buf_append(&c->out, head, (size_t)n, (size_t)n + SV_OUT_MIN) != 0) {
        conn_destroy(c);
        return;
    }
    c->keep_alive = 0;
    c->close_after = 1;
    int r = sv_conn_flush(c);
    if (r >= 0) /* an answer that reached the socket (or is on its way): log it */
        sv_errlog_push(&core->errlog, status, status_reason(status), msg, c->remote);
    wrote(c, r);
}

/* ---- requests ----------------------------------------------------------- */

/* Admission (hooks.h queued; load shedding, shed_core.c): a request the hook
 * refuses is answered 503 here, before any Ruby thread sees it; one that
 * joins carries its place for the taken hook. Returns 1 when the request was
 * answered. */
static int shed(sv_conn *c)
{
    sv_core *core = c->core;
    double now = sv_now();
    pthread_mutex_lock(&core->mu);
    long ahead = (long)core->queued - (long)takers_locked(core);
    c->q_ahead = ahead < 0 ? -1 : ahead;
    int admit = sv_hooks.queued(core, c, now);
    pthread_mutex_unlock(&core->mu);
    if (admit)
        return 0;
    atomic_fetch_add(&core->shed_total, 1);
    error_response(c, 503, "queue wait over max_queue_time");
    return 1;
}

/* Now, for the timestamps of a round's events: the round's start while one
 * runs (events arrive by then; a round lasts microseconds), else the clock.
 * One clock read per round instead of two per request. */
static double sv_loop_now(sv_core *core)
{
    double at = atomic_load_explicit(&core->round_at, memory_order_relaxed);
    return at > 0 ? at : sv_now();
}

/* The request joins the ready queue. Its connection stops counting as partial
 * in the same critical section, after it is queued: a draining core's waiting
 * threads leave once nothing is partial and the queue is empty, so the two
 * must never both look empty while a request is on its way in. */
static void dispatch(sv_conn *c)
{
    sv_core *core = c->core;
    if (core->admission && shed(c))
        return;
    int was_partial = c->partial;
    c->partial = 0;
    c->state = SV_ST_APP;
    c->has_request = 1;
    c->queued_at = sv_loop_now(core);
    atomic_fetch_add(&core->requests, 1);
    pthread_mutex_lock(&core->mu);
    atomic_store(&c->owner, SV_OWN_RUBY);
    c->next = NULL;
    if (core->q_tail)
        core->q_tail->next = c;
    else
        core->q_head = c;
    core->q_tail = c;
    core->queued++;
    int none_partial = was_partial && atomic_fetch_sub(&core->partial, 1) == 1;
    if (none_partial && core->draining)
        sv_wake_all(core); /* one takes the request, the others may leave */
    else if (!atomic_load(&core->duty))
        sv_wake_dispatched(core); /* one sleeping thread, if any (conn.c) */
    /* thread polls (request.c): the running threads take it; one sleeping is
     * woken when they block, or by the parked loop */
    pthread_mutex_unlock(&core->mu);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Add decoded body bytes: memory up to body_spill, then an unlinked temp file.
 * Returns 0, or the status to answer (413, 500). */
static int body_sink(sv_conn *c, const char *p, size_t n)
{
    sv_options *o = &c->core->opt;
    if (c->body_total + n > o->max_body)
        return 413;
    c->body_total += n;
    if (c->body_fd < 0 && c->body.len + n <= o->body_spill)
        return sv_buf_append(&c->body, p, n, o->body_spill) == 0 ? 0 : 500;
    if (c->body_fd < 0) {
        c->body_fd = sv_tmpfile(c->core);
        if (c->body_fd < 0 || write_all(c->body_fd, c->body.data, c->body.len) != 0)
            return 500;
        sv_buf_free(&c->body);
    }
    return write_all(c->body_fd, p, n) == 0 ? 0 : 500;
}

static void send_continue(sv_conn *c)
{
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (c->req->minor_version >= 1)
        (void)!c->io->write(c, msg, sizeof(msg) - 1);
}

/* Chunked body: decode what is buffered after the head. */
static void chunked_step(sv_conn *c)
{
    size_t head = c->req->head_len;
    size_t out = 0;
    const char *msg = NULL;
    ssize_t used = sv_chunked_decode(&c->chunked, c->in.data + head, c->in.len - head, &out, &msg);
    if (used < 0) {
        error_response(c, (int)-used, msg);
        return;
    }
    int st = body_sink(c, c->in.data + head, out);
    if (st) {
        error_response(c, st, st == 413 ? "request body too large" : "cannot buffer request body");
        return;
    }
    memmove(c->in.data + head, c->in.data + head + used, c->in.len - head - (size_t)used);
    c->in.len -= (size_t)used;
    if (c->chunked.done) {
        c->consumed = head;
        dispatch(c);
    } else {
        c->deadline = body_deadline(c);
        sv_conn_arm(c, EPOLLIN);
    }
}

static void head_complete(sv_conn *c)
{
    sv_request *r = c->req;
    sv_options *o = &c->core->opt;
    if (r->method_len == 7 && memcmp(r->method, "CONNECT", 7) == 0) {
        error_response(c, 501, "CONNECT is not supported");
        return;
    }
    if (r->content_length > 0 && (uint64_t)r->content_length > o->max_body) {
        error_response(c, 413, "request body too large");
        return;
    }
    c->nreq++;
    size_t have = c->in.len - r->head_len;
    if (r->chunked) {
        sv_chunked_init(&c->chunked, o->max_chunk_ext, o->lim.max_head);
        c->state = SV_ST_BODY;
        if (r->expect_continue && have == 0)
            send_continue(c);
        chunked_step(c);
        return;
    }
    if (r->content_length <= 0) {
        c->consumed = r->head_len;
        dispatch(c);
        return;
    }
    uint64_t len = (uint64_t)r->content_length;
    if (have >= len) {
        c->body_in_place = 1;
        c->consumed = r->head_len + (size_t)len;
        dispatch(c);
        return;
    }
    c->state = SV_ST_BODY;
    int st = body_sink(c, c->in.data + r->head_len, have);
    if (st) {
        error_response(c, st, "cannot buffer request body");
        return;
    }
    c->in.len = r->head_len;
    if (r->expect_continue && have == 0)
        send_continue(c);
    c->deadline = sv_now() + o->read_timeout;
    sv_conn_arm(c, EPOLLIN);
}

/* set_remote_address proxy_protocol: a connection's first bytes are a PROXY
 * header (parser.c sv_parse_proxy), taken off the front of the buffer; the
 * source address it carries becomes c->remote. Without a valid one the
 * connection is answered 400 and closed before any request is read. The
 * header must be complete within first_data_timeout of the accept (the
 * deadline do_accept set, which read_head leaves alone until then); then
 * the first request has a first_data_timeout of its own, as the proxy may
 * send the header before its client sent anything.
 * Returns 0 when the header is done and c->in holds what came after it,
 * 1 when the connection waits for more input or is closed. */
static int proxy_header(sv_conn *c)
{
    sv_options *o = &c->core->opt;
    sv_proxy p;
    const char *msg = NULL;
    int r = sv_parse_proxy(&p, o->proxy_versions, c->in.data, c->in.len, &msg);
    if (r < 0) {
        error_response(c, 400, msg);
        return 1;
    }
    if (r == 0) {
        sv_conn_arm(c, EPOLLIN);
        return 1;
    }
    if (!p.keep) /* v1 UNKNOWN, v2 LOCAL and the like keep the socket's address */
        remote_text(c, p.family, p.addr);
    c->proxy = 0;
    sv_buf_consume_front(&c->in, (size_t)r);
    double now = sv_loop_now(c->core);
    if (c->in.len > 0) {
        c->deadline = now + o->read_timeout; /* the request's head began */
        return 0;
    }
    c->deadline = now + o->first_data_timeout;
    set_partial(c, o->balance); /* as a connection just accepted (do_accept) */
    sv_conn_arm(c, EPOLLIN);
    return 1;
}

void sv_loop_process_input(sv_conn *c)
{
    sv_core *core = c->core;
    if (c->state == SV_ST_BODY) {
        chunked_step(c);
        return;
    }
    if (c->in.len == 0) {
        /* draining in balance mode an idle connection stays partial until
         * its moment ends (drain_idle) */
        set_partial(c, atomic_load(&core->draining) && core->opt.balance);
        sv_conn_arm(c, EPOLLIN);
        return;
    }
    set_partial(c, 1);
    if (c->proxy && proxy_header(c) != 0)
        return;
    if (!c->req && !(c->req = sv_pool_get(&core->req_pool))) {
        conn_destroy(c);
        return;
    }
    const char *msg = NULL;
    int r = sv_parse_head(c->req, &core->opt.lim, c->in.data, c->in.len, &msg);
    if (r < 0) {
        error_response(c, -r, msg);
    } else if (r == 0) {
        sv_conn_arm(c, EPOLLIN);
    } else {
        head_complete(c);
    }
}

/* ---- reading ------------------------------------------------------------ */

static int read_into(sv_conn *c, char *p, size_t n)
{
    for (;;) {
        ssize_t got = c->io->read(c, p, n);
        /* A short read emptied the socket, so more input brings an edge;
         * unless the peer's FIN came with the last edge (its EOF is left). */
        c->rd_more = got == (ssize_t)n || c->rdhup;
        if (got > 0)
            return (int)got;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            sv_conn_arm(c, EPOLLIN);
            return 0;
        }
        conn_destroy(c); /* EOF or error: an incomplete request is dropped */
        return -1;
    }
}

static void read_head(sv_conn *c)
{
    sv_options *o = &c->core->opt;
    size_t limit = o->lim.max_head + SV_READ_MIN;
    if (sv_buf_reserve(&c->in, SV_READ_MIN / 4, limit) != 0) {
        error_response(c, 431, "header section too large");
        return;
    }
    int n = read_into(c, c->in.data + c->in.len, c->in.cap - c->in.len);
    if (n <= 0)
        return;
    if (c->in.len == 0 && !c->proxy) /* a PROXY header keeps the accept's deadline (proxy_header) */
        c->deadline = sv_loop_now(c->core) + o->read_timeout;
    c->in.len += (size_t)n;
    sv_loop_process_input(c);
}

/* c->req points into c->in.data; once the buffer has moved, parse the head
 * again in its new place (same bytes, same result, no stale pointers). */
static int reparse_head(sv_conn *c)
{
    size_t head = c->req->head_len;
    int r = sv_parse_head(c->req, &c->core->opt.lim, c->in.data, head, NULL);
    if (r != (int)head) {
        error_response(c, 500, "cannot re-parse request head");
        return -1;
    }
    return 0;
}

static void read_body(sv_conn *c)
{
    size_t head = c->req->head_len;
    size_t old_cap = c->in.cap;
    if (sv_buf_reserve(&c->in, SV_BODY_WINDOW / 4, head + SV_BODY_WINDOW) != 0) {
        if (c->in.cap <= c->in.len) {
            error_response(c, 400, "chunk framing too large");
            return;
        }
    }
    if (c->in.cap != old_cap && reparse_head(c) != 0)
        return;
    size_t room = c->in.cap - c->in.len;
    if (!c->req->chunked) {
        uint64_t left = (uint64_t)c->req->content_length - c->body_total;
        if (room > left)
            room = (size_t)left;
    }
    if (c->req->chunked) {
        int n = read_into(c, c->in.data + c->in.len, room);
        if (n <= 0)
            return;
        c->in.len += (size_t)n;
        chunked_step(c);
        return;
    }
    /* Content-Length: keep reading while the socket has data (bounded), one
     * epoll round trip per burst instead of one per window. */
    for (int k = 0; k < SV_BODY_READS_PER_EVENT; k++) {
        uint64_t left = (uint64_t)c->req->content_length - c->body_total;
        size_t want = room > left ? (size_t)left : room;
        int n = read_into(c, c->in.data + c->in.len, want); /* 0: would block, re-armed */
        if (n <= 0)
            return;
        int st = body_sink(c, c->in.data + head, (size_t)n);
        if (st) {
            error_response(c, st, "cannot buffer request body");
            return;
        }
        if (c->body_total == (uint64_t)c->req->content_length) {
            c->consumed = head;
            dispatch(c);
            return;
        }
        c->deadline = body_deadline(c);
    }
    sv_conn_arm(c, EPOLLIN);
}

/* After the transport's shutdown: discard raw input until EOF or the deadline. */
static void linger_read(sv_conn *c)
{
    char scratch[4096];
    for (;;) {
        ssize_t n = read(c->fd, scratch, sizeof(scratch));
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            sv_conn_arm(c, EPOLLIN);
            return;
        }
        conn_destroy(c);
        return;
    }
}

/* An event for a connection a Ruby thread owns (input or a close while the
 * app runs, on an edge-triggered connection; on a one-shot one only from
 * the thread's re-arm just before it hands the connection back, conn.c
 * hand_to_loop): noted, under the mutex the hand-over takes, so that either
 * the thread sees it and returns the connection through the return list
 * (handle_wake runs the event then) or the loop already owns it here. */
static int conn_owned(sv_conn *c, uint32_t events)
{
    if (atomic_load(&c->owner) == SV_OWN_LOOP)
        return 1;
    sv_core *core = c->core;
    pthread_mutex_lock(&core->mu);
    int owner = atomic_load(&c->owner);
    if (owner == SV_OWN_RUBY)
        c->missed |= events | EPOLLIN; /* never 0: the mark that something came */
    pthread_mutex_unlock(&core->mu);
    return owner == SV_OWN_LOOP;
}

/* Thread polls: a request thread polling with the GVL (core->gvl_round)
 * leaves a TLS handshake's CPU to the loop thread, which does it without
 * the GVL: the connection is armed again (one-shot, level-triggered: its
 * event comes back) and the duty ends, so that the loop thread, not a
 * request thread, waits on the epoll next (request.c). After the handshake
 * the connection's reads are a request thread's work again. */
void sv_loop_unpark_locked(sv_core *core)
{
    /* a thread waiting on the epoll gives it back itself if its wait brings nothing */
    if (!atomic_load(&core->duty) || atomic_load(&core->poll_waiting))
        return;
    atomic_store(&core->duty, 0);
    pthread_cond_signal(&core->park_cv); /* the parked loop thread waits on the epoll again */
}

static int leave_to_loop_thread(sv_conn *c)
{
    sv_core *core = c->core;
    if (!core->gvl_round || c->state != SV_ST_HEAD || !sv_tls_handshaking(c))
        return 0;
    sv_conn_arm(c, EPOLLIN);
    pthread_mutex_lock(&core->mu);
    sv_loop_unpark_locked(core);
    pthread_mutex_unlock(&core->mu);
    return 1;
}

static void conn_event(sv_conn *c, uint32_t events)
{
    if (!conn_owned(c, events))
        return;
    if (leave_to_loop_thread(c))
        return;
    if (c->et && (events & SV_EV_END))
        c->rdhup = 1; /* the peer sends no more: its EOF must be read, edge or not */
    if (c->state == SV_ST_WRITE && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)))
        c->rd_more = 1; /* not read now: the edge is spent, the response's end must look */
    switch (c->state) {
    case SV_ST_HEAD: read_head(c); break;
    case SV_ST_BODY: read_body(c); break;
    case SV_ST_WRITE: write_some(c); break;
    case SV_ST_LINGER: linger_read(c); break;
    default: break;
    }
}

/* ---- wake-ups, timeouts, draining -------------------------------------- */

/* The returned connections become the loop's here (hand_to_loop leaves
 * them Ruby's, so that an event before this notes c->missed instead of
 * handling a connection that is on the list). */
static void take_lists(sv_core *core, sv_conn **returned, sv_conn **dead)
{
    pthread_mutex_lock(&core->mu);
    *returned = core->returned;
    *dead = core->dead;
    core->returned = core->dead = NULL;
    for (sv_conn *c = *returned; c; c = c->next)
        atomic_store(&c->owner, SV_OWN_LOOP);
    pthread_mutex_unlock(&core->mu);
}

static void handle_wake(sv_core *core)
{
    uint64_t v;
    (void)!read(core->wakefd, &v, sizeof(v));
    sv_conn *ret, *dead;
    take_lists(core, &ret, &dead);
    while (dead) {
        sv_conn *n = dead->next;
        conn_destroy(dead);
        dead = n;
    }
    while (ret) {
        sv_conn *n = ret->next;
        uint32_t missed = ret->missed; /* returned by hand_to_loop: no thread touches it now */
        ret->missed = 0;
        int parse = ret->state == SV_ST_HEAD && ret->in.len > 0; /* a pipelined head is buffered */
        if (core->draining) {
            conn_destroy(ret);
        } else if (missed && !parse) {
            conn_event(ret, missed); /* the events that came while a thread owned it */
        } else {
            if (missed)
                ret->rd_more = 1; /* input came too: read once the buffered requests are done */
            if (ret->et && (missed & SV_EV_END))
                ret->rdhup = 1;
            sv_loop_process_input(ret);
        }
        ret = n;
    }
}

static int conn_expired(sv_conn *c, double now, int draining)
{
    if (atomic_load(&c->owner) != SV_OWN_LOOP)
        return 0;
    if (draining && c->state == SV_ST_HEAD && c->in.len == 0) {
        /* balance (cluster worker): a keep-alive connection whose last
         * response just went out gets the same moment, so an active client's
         * next request is answered (with connection: close) instead of
         * meeting the close (bench/NOTES.md "Worker recycling") */
        if (c->nreq > 0 && c->core->opt.balance)
            return now > c->since + SV_DRAIN_FRESH_SECONDS;
        if (c->nreq > 0 || !c->core->opt.balance)
            return 1;
        /* balance (cluster worker): a connection accepted just before the
         * drain gets a moment for its first request, which is on its way */
        double accepted = c->deadline - c->core->opt.first_data_timeout;
        return now > accepted + SV_DRAIN_FRESH_SECONDS;
    }
    return now > c->deadline;
}

static void scan_timeouts(sv_core *core, double now)
{
    size_t cap = core->nconns, n = 0;
    sv_conn **hit = cap ? malloc(cap * sizeof(*hit)) : NULL;
    pthread_mutex_lock(&core->mu);
    int draining = core->draining || core->stopping;
    for (size_t i = 0; hit && i < core->nconns; i++)
        if (conn_expired(core->conns[i], now, draining))
            hit[n++] = core->conns[i];
    pthread_mutex_unlock(&core->mu);
    for (size_t i = 0; i < n; i++) {
        sv_conn *c = hit[i];
        if (c->state == SV_ST_HEAD && c->in.len > 0 && !c->proxy) /* part of a PROXY header: no request began */
            error_response(c, 408, "request timeout");
        else if (c->state == SV_ST_BODY)
            error_response(c, 408, "request timeout");
        else
            conn_destroy(c);
    }
    free(hit);
    /* Keep-alive connections idle since before the last scan give their
     * buffers back (conn.c sv_conn_release_idle); the table is the loop's,
     * and an owner other than the loop is skipped. */
    for (size_t i = 0; i < core->nconns; i++) {
        sv_conn *c = core->conns[i];
        if (atomic_load(&c->owner) == SV_OWN_LOOP && (c->in.data || c->out.data || c->req) &&
            c->state == SV_ST_HEAD && now - c->since >= SV_IDLE_RELEASE_MS / 1000.0)
            sv_conn_release_idle(c); /* owned by the loop: no other thread touches it now */
    }
    /* Below max_connections: accept again. At it: listen anyway, so that a
     * connection waiting in the backlog makes do_accept ask evict_slowest for
     * room (a full table with nobody waiting costs nothing). */
    if (!draining && core->accepting == 0 &&
        ((size_t)atomic_load(&core->open) < core->opt.max_connections || !core->balance_paused))
        listeners_register(core, 1);
}

static int loop_should_exit(sv_core *core, double now)
{
    pthread_mutex_lock(&core->mu);
    int stopping = core->stopping;
    double deadline = core->stop_deadline;
    pthread_mutex_unlock(&core->mu);
    if (!stopping)
        return 0;
    if (now >= deadline)
        return 1;
    for (size_t i = 0; i < core->nconns; i++) {
        sv_conn *c = core->conns[i];
        if (atomic_load(&c->owner) == SV_OWN_LOOP && c->state == SV_ST_WRITE)
            return 0; /* still finishing a response */
    }
    return 1;
}

/* One batch of epoll events, by whoever holds core->poll_mu. */
/* Returns when the round began. */
static double handle_events(sv_core *core, struct epoll_event *events, int n)
{
    double began = sv_now();
    atomic_store_explicit(&core->round_at, began, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        int kind = *(int *)events[i].data.ptr;
        if (kind == SV_KIND_LISTENER) {
            if (core->accepting == 1)
                do_accept(core, events[i].data.ptr);
        } else if (kind == SV_KIND_WAKE) {
            handle_wake(core);
        } else {
            conn_event(events[i].data.ptr, events[i].events);
        }
    }
    atomic_store_explicit(&core->round_at, 0, memory_order_relaxed);
    return began;
}

int sv_loop_poll(sv_core *core, int timeout_ms)
{
    struct epoll_event events[SV_EVENTS];
    int n = epoll_wait(core->epfd, events, SV_EVENTS, timeout_ms);
    double now = n > 0 ? handle_events(core, events, n) : sv_now();
    if (core->opt.balance)
        balance_listeners(core);
    bury(core);
    atomic_store(&core->last_poll, now);
    return n;
}

/* A connection the kernel announced to another process's loop (listeners
 * are registered EPOLLEXCLUSIVE: one waiter is woken per connection) stays
 * queued when that process took its listeners away before accepting it (a
 * worker's drain, the balancer's hold): no event for it comes here. So each
 * scan, a listener this loop watches that has a connection queued is
 * accepted from as its event would have (one poll(2) per listener per
 * SV_SCAN_INTERVAL_MS). */
static void take_stranded(sv_core *core)
{
    for (int i = 0; i < core->nlisteners; i++)
        if (listener_pending(&core->listeners[i]))
            do_accept(core, &core->listeners[i]);
}

/* A drain begins. In balance mode an idle keep-alive connection gets a
 * moment for a next request already on its way (conn_expired): it counts as
 * partial until then, so the request threads stay to answer it. Without
 * this a request arriving in that moment was queued after every thread had
 * left, and its connection stayed open unanswered (in a mold, for good). */
static void drain_idle(sv_core *core)
{
    if (!core->opt.balance)
        return; /* the scan right after closes idle connections */
    for (size_t i = 0; i < core->nconns; i++) {
        sv_conn *c = core->conns[i];
        if (atomic_load(&c->owner) == SV_OWN_LOOP && c->state == SV_ST_HEAD && c->in.len == 0)
            set_partial(c, 1);
    }
}

/* Draining, eviction, timeouts, balance: the loop thread's own work after
 * each round and each park. */
static void housekeeping(sv_core *core)
{
    pthread_mutex_lock(&core->mu);
    int draining = core->draining || core->stopping;
    pthread_mutex_unlock(&core->mu);
    if (draining && core->accepting >= 0) {
        listeners_register(core, 0);
        core->accepting = -1; /* never again */
        drain_idle(core);
        pthread_mutex_lock(&core->mu);
        core->accept_closed = 1;
        pthread_cond_broadcast(&core->cv);
        sv_wake_all(core); /* waiting threads may leave now (core.c nothing_more) */
        pthread_mutex_unlock(&core->mu);
    }
    double now = sv_now();
    if (core->evict_wanted && !draining) {
        core->evict_wanted = 0;
        if (evict_slowest(core, now) > 0)
            listeners_register(core, 1); /* the waiting connections are taken next round */
    }
    if (now >= core->next_scan || draining) {
        scan_timeouts(core, now);
        sv_out_trim(core, now);
        if (!draining && core->accepting == 1)
            take_stranded(core);
        core->next_scan = now + SV_SCAN_INTERVAL_MS / 1000.0;
    }
    if (core->opt.balance)
        balance_listeners(core);
    bury(core); /* no event of this round names them any more */
}

/* Thread polls (request.c): after a round, request threads that took a
 * request within SV_PARK_MS will be back in Core#next soon and poll there.
 * A thread alone in a long request is not waited for. */
static int threads_will_poll(sv_core *core)
{
    if (!core->polls_on || atomic_load(&core->running) <= 0)
        return 0;
    double now = sv_now();
    if (now - atomic_load(&core->last_take) > SV_PARK_MS / 1000.0)
        return 0;
    pthread_mutex_lock(&core->mu);
    int go = !core->stopping && !core->draining;
    if (go) {
        atomic_store(&core->last_poll, now);
        atomic_store(&core->duty, 1);
    }
    pthread_mutex_unlock(&core->mu);
    return go;
}

/* Parked (poll_mu released): until a request thread going to sleep ends
 * the duty (core.c wait_nogvl), the timeout scan is due (the loop runs
 * housekeeping and parks again), or no thread has polled for SV_PARK_MS; a
 * request queued that long with nobody taking one gets a sleeping thread.
 * Ending the duty, the loop takes the epoll back and wakes threads for what
 * is queued (dispatch woke none). */
static void park(sv_core *core)
{
    pthread_mutex_lock(&core->mu);
    while (atomic_load(&core->duty) && !core->stopping && !core->draining) {
        double now = sv_now(), until = atomic_load(&core->last_poll) + SV_PARK_MS / 1000.0;
        if (now >= until) {
            atomic_store(&core->duty, 0);
            break;
        }
        if (now >= core->next_scan) { /* read by this thread only (housekeeping writes it) */
            pthread_mutex_unlock(&core->mu);
            return; /* still parked: housekeeping, then park again */
        }
        if (core->q_head && now - atomic_load(&core->last_take) > SV_PARK_MS / 1000.0)
            sv_wake_dispatched(core);
        double wake = until < core->next_scan ? until : core->next_scan;
        struct timespec ts;
        ts.tv_sec = (time_t)wake;
        ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&core->park_cv, &core->mu, &ts);
    }
    atomic_store(&core->duty, 0);
    for (size_t i = 0; i < core->queued; i++)
        sv_wake_dispatched(core); /* stops at the first with no sleeping thread left */
    pthread_mutex_unlock(&core->mu);
}

static void *loop_main(void *arg)
{
    sv_core *core = arg;
    struct epoll_event events[SV_EVENTS];
    pthread_mutex_lock(&core->poll_mu);
    listeners_register(core, 1);
    core->next_scan = sv_now() + SV_SCAN_INTERVAL_MS / 1000.0;
    for (;;) {
        if (!atomic_load(&core->duty)) {
            int n = epoll_wait(core->epfd, events, SV_EVENTS, SV_SCAN_INTERVAL_MS);
            handle_events(core, events, n);
        }
        housekeeping(core);
        if (loop_should_exit(core, sv_now()))
            break;
        if (atomic_load(&core->duty) || threads_will_poll(core)) {
            pthread_mutex_unlock(&core->poll_mu);
            park(core);
            pthread_mutex_lock(&core->poll_mu);
        }
    }
    /* close what the loop owns; Ruby-owned connections stay until their Request ends */
    handle_wake(core);
    for (size_t i = core->nconns; i > 0; i--) {
        sv_conn *c = core->conns[i - 1];
        if (atomic_load(&c->owner) != SV_OWN_RUBY)
            conn_destroy(c);
    }
    bury(core);
    pthread_mutex_unlock(&core->poll_mu);
    return NULL;
}

/* ---- lifecycle (called from Ruby threads) ------------------------------- */

int sv_core_init(sv_core *core)
{
    sv_errlog_init(&core->errlog);
    core->epfd = epoll_create1(EPOLL_CLOEXEC);
    core->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (core->epfd < 0 || core->wakefd < 0)
        return -1;
    core->wake_kind = SV_KIND_WAKE;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = &core->wake_kind;
    if (epoll_ctl(core->epfd, EPOLL_CTL_ADD, core->wakefd, &ev) != 0)
        return -1;
    pthread_mutex_init(&core->mu, NULL);
    pthread_mutex_init(&core->poll_mu, NULL);
    sv_pool_init(&core->buf_pool, SV_POOL_BLOCK);
    sv_pool_init(&core->req_pool, sizeof(sv_request));
    core->pools_ready = 1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&core->cv, &ca);
    pthread_cond_init(&core->park_cv, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

int sv_core_start(sv_core *core)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals go to Ruby's threads */
    int rc = pthread_create(&core->thread, NULL, loop_main, core);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -1;
    pthread_setname_np(core->thread, "serval-io");
    core->started = 1;
    return 0;
}

void sv_core_stop_and_join(sv_core *core, double grace)
{
    pthread_mutex_lock(&core->mu);
    if (!core->stopping) {
        core->stopping = 1;
        core->stop_deadline = sv_now() + grace;
    } else if (sv_now() + grace < core->stop_deadline) {
        core->stop_deadline = sv_now() + grace;
    }
    sv_wake_all(core);
    pthread_cond_signal(&core->park_cv); /* a parked loop looks at once */
    pthread_mutex_unlock(&core->mu);
    if (!core->started || core->joined)
        return;
    sv_core_wake(core);
    pthread_join(core->thread, NULL);
    core->joined = 1;
}

void sv_core_destroy(sv_core *core)
{
    /* every connection, dead or alive, is in the table until the loop frees it */
    for (size_t i = 0; i < core->nconns; i++)
        sv_conn_free(core->conns[i]);
    free(core->conns);
    core->conns = NULL;
    core->nconns = 0;
    core->dead = core->returned = core->q_head = core->q_tail = NULL;
    if (core->epfd >= 0)
        close(core->epfd);
    if (core->wakefd >= 0)
        close(core->wakefd);
    core->epfd = core->wakefd = -1;
    sv_errlog_destroy(&core->errlog);
    if (core->pools_ready) {
        sv_pool_destroy(&core->buf_pool);
        sv_pool_destroy(&core->req_pool);
        core->pools_ready = 0;
    }
}

void sv_core_ref(sv_core *core)
{
    atomic_fetch_add(&core->refs, 1);
}

void sv_core_unref(sv_core *core)
{
    if (atomic_fetch_sub(&core->refs, 1) != 1)
        return;
    for (int i = 0; i < core->nlisteners; i++)
        if (core->listeners[i].tls_ctx)
            sv_tls_ctx_free(core->listeners[i].tls_ctx);
    sv_core_destroy(core);
    pthread_mutex_destroy(&core->mu);
    pthread_cond_destroy(&core->cv);
    free(core->admission);
    free(core);
}

/*
 * Connections: the memory a connection reads and writes through, the
 * wake-ups that hand its requests to Ruby threads, and its lifecycle steps
 * shared by the event loop and the Ruby threads. Sections:
 *
 *   - buffers: growable byte buffers with an upper bound, the pools of free
 *     blocks they come from, the process-wide output budget, the clock;
 *   - waking threads: the Ruby threads asleep in Core#next, one per queued
 *     request, and the loop thread (core->mu held, but sv_core_wake);
 *   - a connection's steps: made, armed, flushed, handed back, freed;
 *   - the plain TCP transport (transport.h).
 *
 * Nothing here touches a Ruby object or needs the GVL. A connection's steps
 * run without it, and their caller owns the connection (see the ownership
 * rule in serval.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include "serval.h"
#include "transport.h"
#include "conn.h"

/* ==== buffers ============================================================
 * Growable byte buffers with an explicit upper bound. An output buffer also
 * counts its capacity in the core's out_bytes (sv_buf.acct), the figure the
 * process-wide output_budget bounds. */

#define SV_TRIM_MIN ((size_t)16 << 20)  /* output memory freed before malloc_trim is worth it */
#define SV_TRIM_INTERVAL 1.0             /* seconds between two malloc_trim calls at most */

double sv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void set_cap(sv_buf *b, size_t cap)
{
    if (b->acct) {
        if (cap > b->cap)
            atomic_fetch_add(b->acct, cap - b->cap);
        else
            atomic_fetch_sub(b->acct, b->cap - cap);
    }
    b->cap = cap;
}

/* Take `delta` bytes of the budget, or refuse without taking any. */
static int charge(sv_buf *b, size_t delta, size_t budget)
{
    size_t cur = atomic_load(b->acct);
    do {
        if (cur > budget || delta > budget - cur)
            return -1;
    } while (!atomic_compare_exchange_weak(b->acct, &cur, cur + delta));
    return 0;
}

void sv_pool_init(sv_pool *p, size_t size)
{
    pthread_mutex_init(&p->mu, NULL);
    p->size = size;
    p->n = 0;
}

void sv_pool_destroy(sv_pool *p)
{
    while (p->n > 0)
        free(p->items[--p->n]);
    pthread_mutex_destroy(&p->mu);
}

void *sv_pool_get(sv_pool *p)
{
    void *blk = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->n > 0)
        blk = p->items[--p->n];
    pthread_mutex_unlock(&p->mu);
    return blk ? blk : malloc(p->size);
}

void sv_pool_put(sv_pool *p, void *blk)
{
    if (!blk)
        return;
    pthread_mutex_lock(&p->mu);
    int kept = p->n < SV_POOL_MAX;
    if (kept)
        p->items[p->n++] = blk;
    pthread_mutex_unlock(&p->mu);
    if (!kept)
        free(blk);
}

static int grow_to(sv_buf *b, size_t cap, size_t budget)
{
    size_t delta = cap - b->cap;
    int charged = b->acct && cap > SV_OUT_MIN && budget != (size_t)-1;
    if (charged && charge(b, delta, budget) != 0)
        return -1;
    char *p = !b->data && b->pool && cap == SV_POOL_BLOCK ? sv_pool_get(b->pool) : realloc(b->data, cap);
    if (!p) {
        if (charged)
            atomic_fetch_sub(b->acct, delta);
        return -1;
    }
    b->data = p;
    if (charged)
        b->cap = cap; /* counted by charge() */
    else
        set_cap(b, cap);
    return 0;
}

/* Make room for `extra` more bytes without exceeding `limit` bytes in all
 * and, past SV_OUT_MIN, the budget shared through b->acct: the buffer doubles,
 * or, when doubling does not fit the budget, grows to just what is needed.
 * Returns 0 on success, -1 when a limit would be exceeded or malloc failed. */
int sv_buf_reserve_budget(sv_buf *b, size_t extra, size_t limit, size_t budget)
{
    size_t need = b->len + extra;
    if (need < b->len || need > limit)
        return -1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : SV_READ_MIN;
    while (cap < need)
        cap = cap > limit / 2 ? limit : cap * 2;
    if (cap < need)
        cap = need;
    if (grow_to(b, cap, budget) == 0)
        return 0;
    return cap > need ? grow_to(b, need, budget) : -1;
}

int sv_buf_reserve(sv_buf *b, size_t extra, size_t limit)
{
    return sv_buf_reserve_budget(b, extra, limit, (size_t)-1);
}

int sv_buf_append(sv_buf *b, const void *p, size_t n, size_t limit)
{
    if (n == 0)
        return 0; /* an empty buffer may have no memory: no memcpy to NULL */
    if (sv_buf_reserve(b, n, limit) != 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void sv_buf_consume_front(sv_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void sv_buf_free(sv_buf *b)
{
    if (b->pool && b->cap == SV_POOL_BLOCK)
        sv_pool_put(b->pool, b->data);
    else
        free(b->data);
    b->data = NULL;
    set_cap(b, 0);
    b->len = b->off = 0;
}

/* Between requests of a keep-alive connection: an empty buffer of one pool
 * block stays (the next request, a few microseconds away under load, needs
 * it again; the loop's scan frees it once the connection has been idle
 * SV_IDLE_RELEASE_MS); any other buffer is shrunk as by sv_buf_shrink. */
void sv_buf_keep(sv_buf *b, size_t keep)
{
    if (b->len == 0 && b->data && b->cap == SV_POOL_BLOCK && b->pool)
        return;
    sv_buf_shrink(b, keep);
}

/* Give memory back after a request or response: an empty buffer is freed
 * whatever its size (a keep-alive connection waiting for its next request
 * then holds neither its read nor its output buffer; the next request
 * allocates them again), a larger one shrinks to `keep`. */
void sv_buf_shrink(sv_buf *b, size_t keep)
{
    if (b->len == 0) {
        if (b->data)
            sv_buf_free(b);
        return;
    }
    if (b->cap <= keep || b->len > keep)
        return;
    char *p = realloc(b->data, keep);
    if (p) {
        b->data = p;
        set_cap(b, keep);
    }
}

/* glibc keeps freed memory in its arenas (and raises its mmap threshold
 * after a large free, so the next large buffers come from the arenas too):
 * after the output buffers shrank by SV_TRIM_MIN from their high-water mark,
 * hand the free pages back, at most once per SV_TRIM_INTERVAL. */
void sv_out_trim(sv_core *core, double now)
{
    size_t cur = atomic_load(&core->out_bytes);
    if (cur > core->trim_peak)
        core->trim_peak = cur;
    if (core->trim_peak - cur < SV_TRIM_MIN || now < core->next_trim)
        return;
    core->trim_peak = cur;
    core->next_trim = now + SV_TRIM_INTERVAL;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* ==== waking threads =====================================================
 * Waking Ruby threads for queued requests, and the loop thread.
 *
 * Each Ruby thread asleep in Core#next waits on its own condition variable
 * (sv_waiter, on the waiting thread's stack), listed most recent first. A
 * request that joins the ready queue wakes the thread at the head of that
 * list, so a wake-up reaches exactly one thread that is asleep and not woken
 * yet (never one already on its way, as a signal on one shared condition
 * variable could), and the thread whose memory is warm is the one reused;
 * `waking` counts the threads woken and not yet back at the queue. A thread
 * woken for a request another thread took first (Core#next's fast path)
 * lists itself again and sleeps on.
 *
 * Waking a thread only when no running thread would take the request soon
 * was measured and dropped: it halved the futex calls but woke the loop
 * more often and cost more CPU per hello request (bench/NOTES.md "Hot
 * path"). Everything here runs with core->mu held, but sv_core_wake, which
 * wakes the loop thread (its eventfd) and takes no lock. */

void sv_waiter_push(sv_core *core, sv_waiter *w)
{
    w->prev = NULL;
    w->next = core->idle;
    if (core->idle)
        core->idle->prev = w;
    core->idle = w;
    w->listed = 1;
}

void sv_waiter_remove(sv_core *core, sv_waiter *w)
{
    if (!w->listed)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        core->idle = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->listed = 0;
}

void sv_wake_all(sv_core *core)
{
    for (sv_waiter *w = core->idle; w; w = w->next)
        pthread_cond_signal(&w->cv); /* each re-checks why it waits; none is marked woken */
    pthread_cond_broadcast(&core->cv);
}

void sv_wake_dispatched(sv_core *core)
{
    sv_waiter *w = core->idle;
    if (!w)
        return; /* every thread is busy or already woken: one of them takes it */
    sv_waiter_remove(core, w);
    w->woken = 1;
    core->waking++;
    pthread_cond_signal(&w->cv);
}

/* The loop thread's epoll wait returns (its eventfd becomes readable). */
void sv_core_wake(sv_core *core)
{
    uint64_t one = 1;
    (void)!write(core->wakefd, &one, sizeof(one));
}

/* ==== a connection's steps ===============================================
 * Made on accept, armed on the loop's epoll, flushed, handed between the
 * loop and a Ruby thread, freed. */

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
    c->out.acct = &core->out_bytes;
    c->in.pool = c->out.pool = &core->buf_pool;
    c->io = &sv_plain_transport; /* TLS's instead on an ssl:// listener (loop.c do_accept) */
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

/* The response's file is sent (or abandoned): close it; a spill's bytes
 * leave the process's count. */
static void file_done(sv_conn *c)
{
    close_if_open(&c->file_fd);
    if (c->spill_bytes > 0)
        atomic_fetch_sub(&c->core->spill_used, c->spill_bytes);
    c->spill_bytes = 0;
    c->file_spill = 0;
    c->file_rem = 0;
    c->file_off = 0;
}

int sv_tmpfile(sv_core *core)
{
    int fd = open(core->opt.tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    char path[1100];
    snprintf(path, sizeof(path), "%s/serval-XXXXXX", core->opt.tmpdir);
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0)
        unlink(path);
    return fd;
}

/* Reserve up to n bytes of max_spill: how many were granted. */
static size_t spill_reserve(sv_core *core, size_t n)
{
    uint64_t cur = atomic_load(&core->spill_used), take;
    do {
        uint64_t room = core->opt.max_spill > cur ? core->opt.max_spill - cur : 0;
        take = n < room ? n : room;
        if (take == 0)
            return 0;
    } while (!atomic_compare_exchange_weak(&core->spill_used, &cur, cur + take));
    return (size_t)take;
}

size_t sv_conn_spill(sv_conn *c, const char *p, size_t n)
{
    sv_core *core = c->core;
    if (c->spill_failed || (c->file_fd >= 0 && !c->file_spill))
        return 0; /* a to_path file is still being sent: its bytes come first */
    size_t take = spill_reserve(core, n);
    if (take > 0 && c->file_fd < 0) {
        c->file_fd = sv_tmpfile(core);
        if (c->file_fd >= 0) {
            c->file_spill = 1;
            c->file_off = 0;
            c->file_rem = 0;
            atomic_fetch_add(&core->spills, 1);
        }
    }
    size_t done = 0;
    while (c->file_fd >= 0 && done < take) {
        ssize_t w = write(c->file_fd, p + done, take - done); /* the end of the file: sendfile and
                                                                 pread never move its offset */
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; /* ENOSPC, EDQUOT, EFBIG, EIO */
        done += (size_t)w;
    }
    if (done < take)
        atomic_fetch_sub(&core->spill_used, take - done);
    if (done < n)
        c->spill_failed = 1;
    c->spill_bytes += done;
    c->file_rem += done;
    if (c->file_spill && c->spill_bytes == 0)
        file_done(c); /* refused at its first byte: no empty file in the way */
    return done;
}

/* Out of epoll before the close: a copy of the descriptor (a fork of the
 * app's) would otherwise keep the registration, and its events, alive. */
static void unregister(sv_conn *c)
{
    if (c->fd >= 0)
        epoll_ctl(c->core->epfd, EPOLL_CTL_DEL, c->fd, NULL);
}

void sv_conn_free(sv_conn *c)
{
    unregister(c);
    c->io->close(c);
    close_if_open(&c->body_fd);
    file_done(c);
    sv_buf_free(&c->in);
    sv_buf_free(&c->body);
    sv_buf_free(&c->out);
    sv_pool_put(&c->core->req_pool, c->req);
    free(c);
}

/* Forget the request that was just answered; keep pipelined bytes. */
static void reset_request(sv_conn *c, double now)
{
    close_if_open(&c->body_fd);
    file_done(c);
    c->spill_failed = 0;
    sv_buf_free(&c->body);
    sv_buf_consume_front(&c->in, c->consumed);
    c->out.len = c->out.off = 0;
    /* With few connections open the buffers and the parsed head stay for
     * the next request (the loop's scan gives them back after
     * SV_IDLE_RELEASE_MS idle: sv_conn_release_idle); with many, memory
     * matters more than the pool round trip, and they go back now. */
    int keep = atomic_load(&c->core->open) <= SV_KEEP_OPEN;
    if (keep) {
        sv_buf_keep(&c->in, SV_READ_MIN);
        sv_buf_keep(&c->out, SV_OUT_MIN);
    } else {
        sv_buf_shrink(&c->in, SV_READ_MIN);
        sv_buf_shrink(&c->out, SV_OUT_MIN);
    }
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
    c->head_partial = 0;
    c->since = now > 0 ? now : sv_now();
    if (!keep && c->in.len == 0) { /* the parsed head (header slots) goes too; parse takes one again */
        sv_pool_put(&c->core->req_pool, c->req);
        c->req = NULL;
    }
}

/* The loop (poll_mu held), for a connection it owns that waits for its next
 * request with nothing buffered: its buffers and parsed head go back to the
 * pools, so an idle keep-alive connection costs a few KB. */
void sv_conn_release_idle(sv_conn *c)
{
    if (c->in.len > 0 || c->out.len > 0 || c->state != SV_ST_HEAD)
        return;
    if (c->in.data)
        sv_buf_free(&c->in);
    if (c->out.data)
        sv_buf_free(&c->out);
    sv_pool_put(&c->core->req_pool, c->req);
    c->req = NULL;
}

int sv_conn_flush(sv_conn *c)
{
    int r = c->io->flush(c);
    if (r == 1)
        file_done(c);
    return r;
}

/* The next step: its state, its deadline, the events to wait for. */
static sv_next wait_for(sv_conn *c, int state, double deadline, uint32_t want, uint32_t *events)
{
    c->state = state;
    c->deadline = deadline;
    *events = want;
    return SV_NEXT_WAIT;
}

sv_next sv_conn_after_flush(sv_conn *c, int r, uint32_t *events, double now)
{
    sv_core *core = c->core;
    const sv_options *o = &core->opt;
    if (r < 0)
        return SV_NEXT_CLOSE;
    if (r == 0) /* the socket is full: the loop writes the rest when it drains */
        return wait_for(c, SV_ST_WRITE, sv_now() + o->write_timeout, EPOLLOUT, events);
    if (!c->keep_alive || c->close_after || atomic_load(&core->draining) || atomic_load(&core->stopping)) {
        if (!c->close_after && c->in.len <= c->consumed) {
            /* The FIN goes out now even if a fork (a plugin's child, an app's
             * system()) still holds a copy of the descriptor: close alone
             * would leave the client waiting for the end of the response. */
            c->io->shutdown(c);
            return SV_NEXT_CLOSE;
        }
        /* After an error answer, or with unread pipelined input: lingering
         * close, so the peer reads our bytes instead of a reset. */
        c->io->shutdown(c);
        c->in.len = 0;
        return wait_for(c, SV_ST_LINGER, sv_now() + SV_LINGER_SECONDS, EPOLLIN, events);
    }
    reset_request(c, now); /* sets c->since: the next request's deadline counts from it */
    if (c->in.len > 0) { /* pipelined: the next head is already here */
        c->state = SV_ST_HEAD;
        c->deadline = c->since + o->read_timeout;
        return SV_NEXT_PARSE;
    }
    return wait_for(c, SV_ST_HEAD, c->since + o->persistent_timeout, EPOLLIN, events);
}

/* The owner waits for `events`, through the connection's transport. Called
 * by the loop and by Ruby threads (hand_to_loop): epoll_ctl is thread-safe. */
void sv_conn_arm(sv_conn *c, uint32_t events)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    if (c->et) {
        /* Registered for both directions: the next edge comes by itself
         * (EPOLLOUT after a write that would block, EPOLLIN with new input).
         * Input already waiting has no edge left: renewing the registration
         * reports it once more; so does an end of input already seen
         * (c->rdhup), whose EOF is still to read. */
        if (!((events & EPOLLIN) && (c->rd_more || c->rdhup)))
            return;
        c->rd_more = 0;
        ev.events = SV_ET_EVENTS;
        ev.data.ptr = c;
        epoll_ctl(c->core->epfd, EPOLL_CTL_MOD, c->fd, &ev);
        return;
    }
    ev.events = c->io->events(c, events) | EPOLLONESHOT;
    ev.data.ptr = c;
    epoll_ctl(c->core->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Ruby side: the connection is closed and goes to the loop to be freed. */
void sv_conn_give_to_loop_dead(sv_conn *c)
{
    sv_core *core = c->core;
    unregister(c);
    c->io->close(c);
    pthread_mutex_lock(&core->mu);
    atomic_store(&c->owner, SV_OWN_DEAD);
    c->next = core->dead;
    core->dead = c;
    pthread_mutex_unlock(&core->mu);
    sv_core_wake(core); /* free it now: it holds a max_connections slot */
}

/* Ruby side: publish the connection to the loop, its state and deadline set
 * (sv_conn_after_flush): armed for `events`, or with none on the return
 * list, for the loop to parse a pipelined request. The registration is
 * re-armed while the thread still owns the connection, outside the core
 * mutex (a system call there made the loop, woken by it, wait for the
 * mutex): an event in between finds the connection Ruby's and is noted in
 * c->missed (loop.c conn_event), and the connection then goes to the return
 * list for the loop to handle that event. An edge-triggered connection is
 * not re-armed (sv_conn_arm renews it only for input no edge will announce);
 * its events while Ruby owns it are noted the same way. The owner store
 * happens under the mutex, so the loop's timeout scan never sees a
 * loop-owned connection that is not armed yet, and the connection is not
 * touched after it; one put on the return list stays Ruby's until the loop
 * takes the list. */
static void hand_to_loop(sv_conn *c, uint32_t events)
{
    sv_core *core = c->core;
    if (events && !atomic_load(&core->stopping))
        sv_conn_arm(c, events);
    pthread_mutex_lock(&core->mu);
    if (core->stopping) {
        pthread_mutex_unlock(&core->mu);
        sv_conn_give_to_loop_dead(c);
        return;
    }
    int to_list = !events || c->missed;
    if (to_list) { /* stays Ruby's until the loop takes the list (loop.c take_lists) */
        c->next = core->returned;
        core->returned = c;
    } else {
        atomic_store(&c->owner, SV_OWN_LOOP);
    }
    pthread_mutex_unlock(&core->mu);
    if (to_list)
        sv_core_wake(core);
}

/* Ruby side, without the GVL: the application finished its response. */
void sv_conn_response_done(sv_conn *c, double now)
{
    uint32_t events = 0;
    switch (sv_conn_after_flush(c, sv_conn_flush(c), &events, now)) {
    case SV_NEXT_CLOSE: sv_conn_give_to_loop_dead(c); break;
    case SV_NEXT_PARSE: hand_to_loop(c, 0); break;
    case SV_NEXT_WAIT: hand_to_loop(c, events); break;
    }
}

/* ==== the plain TCP transport (transport.h) ==============================
 * read(2), send(2) and sendfile(2) on the socket. Every connection starts
 * with it (sv_conn_new); one accepted on an ssl:// listener then gets TLS's
 * (tls.c). */

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

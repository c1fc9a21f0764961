/* Growable byte buffers with an explicit upper bound. An output buffer also
 * counts its capacity in the core's out_bytes (sv_buf.acct), the figure the
 * process-wide output_budget bounds. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "serval.h"
#include "buffer.h"

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

/* Growable byte buffers with an explicit upper bound. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "serval.h"

double sv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Make room for `extra` more bytes without exceeding `limit` bytes in all.
 * Returns 0 on success, -1 when the limit would be exceeded or malloc failed. */
int sv_buf_reserve(sv_buf *b, size_t extra, size_t limit)
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
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int sv_buf_append(sv_buf *b, const void *p, size_t n, size_t limit)
{
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
    free(b->data);
    b->data = NULL;
    b->len = b->cap = b->off = 0;
}

/* Give memory back after a large response or request. */
void sv_buf_shrink(sv_buf *b, size_t keep)
{
    if (b->cap <= keep || b->len > keep)
        return;
    if (b->len == 0) {
        sv_buf_free(b);
        return;
    }
    char *p = realloc(b->data, keep);
    if (p) {
        b->data = p;
        b->cap = keep;
    }
}

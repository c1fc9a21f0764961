/* buffer.c: buffers, the pools of free blocks, the clock */
#ifndef SERVAL_BUFFER_H
#define SERVAL_BUFFER_H

#include "serval.h"

void sv_pool_init(sv_pool *p, size_t size);
void sv_pool_destroy(sv_pool *p);
void *sv_pool_get(sv_pool *p);           /* a block of p->size bytes (malloc when none is kept), or NULL */
void sv_pool_put(sv_pool *p, void *blk); /* keep it, or free it when SV_POOL_MAX are kept */
int sv_buf_reserve(sv_buf *b, size_t extra, size_t limit);
void sv_buf_keep(sv_buf *b, size_t keep);    /* sv_buf_shrink, but an empty pool block stays */
/* Also within `budget` bytes for all buffers sharing b->acct (to SV_OUT_MIN a buffer grows freely). */
int sv_buf_reserve_budget(sv_buf *b, size_t extra, size_t limit, size_t budget);
int sv_buf_append(sv_buf *b, const void *p, size_t n, size_t limit);
void sv_buf_consume_front(sv_buf *b, size_t n);
void sv_buf_free(sv_buf *b);
void sv_buf_shrink(sv_buf *b, size_t keep);
/* Loop only: give freed output memory back to the system (malloc_trim), rate-limited. */
void sv_out_trim(sv_core *core, double now);

/* The monotonic clock in seconds */
double sv_now(void);

#endif

/* Frozen Strings the env shares between requests (runs with the GVL).
 *
 * A keep-alive client sends the same Host on every request of a connection,
 * and comes from the same address: REMOTE_ADDR, SERVER_NAME, SERVER_PORT and
 * HTTP_HOST repeat request after request. sv_strcache_get returns a frozen
 * String of the given bytes, from a direct-mapped table of SV_STRCACHE
 * entries when the same bytes were asked for before, so those values cost no
 * allocation (and no garbage) on the common path. A miss, or bytes longer than
 * SV_STRCACHE_LEN, makes a new frozen String (a miss also replaces the
 * entry): hostile or varied values cost what a fresh String did, and the
 * table never holds more than SV_STRCACHE Strings of at most SV_STRCACHE_LEN
 * bytes. Frozen, so a value shared between requests cannot be changed by one
 * of them (Rack::MockRequest hands apps frozen values for these keys too). */
#include <stdint.h>
#include <string.h>
#include <ruby.h>
#include "serval_ruby.h"

#define SV_STRCACHE 256      /* entries, a power of two */
#define SV_STRCACHE_LEN 64   /* longest value kept */

static VALUE entries[SV_STRCACHE];
static VALUE empty;

static void cache_mark(void *p)
{
    for (int i = 0; i < SV_STRCACHE; i++)
        if (entries[i])
            rb_gc_mark(entries[i]);
}

/* Not write-barrier protected: the GC marks it on every collection, so
 * entries stored straight into the table are always seen. */
static const rb_data_type_t cache_type = {
    "Serval::Native::StringCache",
    {cache_mark, NULL, NULL},
    NULL, NULL, 0,
};

static uint32_t bytes_hash(const char *p, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h ^ (h >> 15);
}

static VALUE frozen_new(const char *p, size_t n)
{
    VALUE s = rb_str_new(p, (long)n);
    rb_obj_freeze(s);
    return s;
}

VALUE sv_strcache_get(const char *p, size_t n)
{
    if (n == 0)
        return empty;
    if (n > SV_STRCACHE_LEN)
        return frozen_new(p, n);
    VALUE *slot = &entries[bytes_hash(p, n) & (SV_STRCACHE - 1)];
    VALUE s = *slot;
    if (s && (size_t)RSTRING_LEN(s) == n && memcmp(RSTRING_PTR(s), p, n) == 0)
        return s;
    s = frozen_new(p, n);
    *slot = s;
    return s;
}

void sv_init_strcache(void)
{
    VALUE holder = TypedData_Wrap_Struct(0, &cache_type, entries);
    rb_gc_register_mark_object(holder);
    empty = frozen_new("", 0);
    rb_gc_register_mark_object(empty);
}

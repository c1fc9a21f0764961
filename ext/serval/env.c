/*
 * The Rack env of a request, built from its parsed head (runs with the GVL).
 * Sections:
 *
 *   - the string cache: frozen Strings for the header names and values that
 *     recur (sv_strcache_get), shared between requests;
 *   - building the env (sv_build_env): the keys, the prepared bases, the
 *     values of one request.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <ruby.h>
#include <ruby/encoding.h>
#include <ruby/re.h>
#include "serval_ruby.h"
#include "env.h"

/* ==== the string cache ===================================================
 * Frozen Strings the env shares between requests.
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

#define SV_STRCACHE 256      /* entries, a power of two */
#define SV_STRCACHE_LEN 64   /* longest value kept */

static VALUE entries[SV_STRCACHE];
static VALUE empty;

/* The last value of each kind the env took (strcache_memo): a client's
 * next request usually brings the same bytes, found without a hash. */
enum { M_NAME, M_PORT, M_REMOTE, M_HOST, SV_MEMOS };
static VALUE memos[SV_MEMOS];

static void cache_mark(void *p)
{
    for (int i = 0; i < SV_STRCACHE; i++)
        if (entries[i])
            rb_gc_mark(entries[i]);
    for (int i = 0; i < SV_MEMOS; i++)
        if (memos[i])
            rb_gc_mark(memos[i]);
}

/* Not write-barrier protected: the GC marks it on every collection, so
 * entries stored straight into the table are always seen. */
static const rb_data_type_t cache_type = {
    "Serval::Native::StringCache",
    {cache_mark, NULL, NULL},
    NULL, NULL, 0,
};

/* Eight bytes a step (the values are short: hosts, addresses, ports). */
static uint32_t bytes_hash(const char *p, size_t n)
{
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 29;
    }
    w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)(unsigned char)p[i] << (8 * i);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    return (uint32_t)(h ^ (h >> 32));
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

/* sv_strcache_get, the last value of kind m first (GVL held). */
static VALUE strcache_memo(int m, const char *p, size_t n)
{
    if (n > SV_STRCACHE_LEN) /* never cached: a new String each time, as sv_strcache_get */
        return sv_strcache_get(p, n);
    VALUE s = memos[m];
    if (s && (size_t)RSTRING_LEN(s) == n && memcmp(RSTRING_PTR(s), p, n) == 0)
        return s;
    s = sv_strcache_get(p, n);
    memos[m] = s;
    return s;
}

void sv_init_strcache(void)
{
    VALUE holder = TypedData_Wrap_Struct(0, &cache_type, entries);
    rb_gc_register_mark_object(holder);
    empty = frozen_new("", 0);
    rb_gc_register_mark_object(empty);
}

/* ==== building the env ===================================================
 * From a parsed request head, a copy of the app's template (or of a
 * prepared base) with the request's values. */

#define SV_KEY_STACK 256

/* The env keys every request sets (sv_build_env). */
enum { E_METHOD, E_PATH, E_QUERY, E_URI, E_PROTO, E_REMOTE, E_NAME, E_PORT, E_HOST, E_HIJACK, E_FINISHED, E_AFTER, E_SLOTS };
static VALUE slot_keys[E_SLOTS];

/* Prepared bases (sv_build_env): a copy of the template with the values a
 * client repeats request after request already in place, which the next
 * request from the same client copies instead of the template. The values
 * are the shared frozen Strings the plain build stores (interned
 * REQUEST_METHOD, the string cache's SERVER_NAME, SERVER_PORT, HTTP_HOST,
 * REMOTE_ADDR), compared by identity: a base is used only for exactly the
 * objects the plain build would put in, so both give the same env. A
 * direct-mapped table of SV_BASES entries; an entry's base is made the
 * second time its values come (a client seen once costs no copy). Touched
 * with the GVL held; marked through a typed object that is not
 * write-barrier protected (entries are stored into it directly). */
#define SV_BASES 32 /* a power of two */
#define SV_PER_REQUEST 6       /* the slots a base leaves to each request (per_request) */
#define SV_BASE_FIELDS 32      /* a request with more fields than this gets no base */
#define SV_BASE_SETS (SV_PER_REQUEST + SV_BASE_FIELDS)
typedef struct {
    VALUE tmpl;   /* the frozen template (kept alive: its address names it) */
    VALUE method, proto, remote, name, port, host;
    int tls;
    int nfields;
    VALUE fields[SV_BASE_FIELDS]; /* the keys of the request's fields, in order */
    VALUE base;   /* Qnil: values seen once, no base yet; Qfalse: the template does not fit; else the Hash */
    /* where each request's values go in the base's copy: its nsets entries
     * (counted in the table's order) at pos[], ascending, take value src[]
     * (a per_request slot, then the fields in order) */
    int nsets;
    unsigned short pos[SV_BASE_SETS];
    unsigned char src[SV_BASE_SETS];
} env_base;
static env_base bases[SV_BASES];
static int use_bases = 1; /* Serval::Native.env_fill: :prepared (1) or :plain (0) */
static unsigned long base_copies; /* envs made from a base (Serval::Native.env_base_copies, for the tests) */

static void bases_mark(void *p)
{
    for (int i = 0; i < SV_BASES; i++) {
        const env_base *e = &bases[i];
        if (!e->tmpl)
            continue;
        rb_gc_mark(e->tmpl);
        rb_gc_mark(e->method);
        rb_gc_mark(e->remote);
        rb_gc_mark(e->name);
        rb_gc_mark(e->port);
        rb_gc_mark(e->host);
        for (int i = 0; i < e->nfields; i++)
            rb_gc_mark(e->fields[i]);
        rb_gc_mark(e->base);
    }
}

static const rb_data_type_t bases_type = {
    "Serval::Native::EnvBases",
    {bases_mark, NULL, NULL},
    NULL, NULL, 0,
};

/* REQUEST_METHOD: an interned String; the common methods without a lookup
 * in Ruby's table of interned strings (method_str). */
static const char *common_methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", NULL};
#define SV_METHODS 8
static VALUE method_keys[SV_METHODS];

static VALUE v_80, v_443, k_ctype, k_clen, k_cookie, k_xrs, k_xqs, k_upgrade, k_protocol, v_http10, v_http11, k_scheme, k_https,
    v_https, v_on, re_list;

/* Frequent header names map straight to their env key. */
static const char *common_headers[] = {
    "host", "user-agent", "accept", "accept-encoding", "accept-language", "connection",
    "cache-control", "referer", "origin", "authorization", "if-none-match",
    "if-modified-since", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host",
    "x-request-id", "x-request-start", "x-queue-start", "x-real-ip", "upgrade",
    "sec-fetch-mode", "sec-fetch-site", "sec-fetch-dest", "pragma", "te",
    "content-type", "content-length", /* no HTTP_ prefix (sv_init_env) */ NULL,
};
#define SV_COMMON_MAX 32
static VALUE common_keys[SV_COMMON_MAX];
static size_t common_lens[SV_COMMON_MAX];
static unsigned char lower_of[256]; /* ASCII letters to lower case, every other byte as it is */
/* The common names by length (a name is compared only with those of its
 * length), -1 ends each list. */
#define SV_NAME_LEN_MAX 24
static signed char by_len[SV_NAME_LEN_MAX + 1][8];

static VALUE fstr(const char *s)
{
    VALUE v = rb_enc_interned_str(s, (long)strlen(s), rb_utf8_encoding());
    rb_gc_register_mark_object(v);
    return v;
}

static VALUE header_key_build(const char *name, size_t len)
{
    char stack[SV_KEY_STACK];
    char *buf = len + 5 <= sizeof(stack) ? stack : xmalloc(len + 5);
    memcpy(buf, "HTTP_", 5);
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (ch >= 'a' && ch <= 'z')
            ch = (char)(ch - 'a' + 'A');
        else if (ch == '-')
            ch = '_';
        buf[5 + i] = ch;
    }
    VALUE key = rb_enc_interned_str(buf, (long)(len + 5), rb_utf8_encoding());
    if (buf != stack)
        xfree(buf);
    return key;
}

void sv_init_env(void)
{
    static const char *slot_names[E_SLOTS] = {
        [E_METHOD] = "REQUEST_METHOD", [E_PATH] = "PATH_INFO", [E_QUERY] = "QUERY_STRING",
        [E_URI] = "REQUEST_URI", [E_PROTO] = "SERVER_PROTOCOL", [E_REMOTE] = "REMOTE_ADDR",
        [E_NAME] = "SERVER_NAME", [E_PORT] = "SERVER_PORT", [E_HOST] = "HTTP_HOST", [E_HIJACK] = "rack.hijack",
        [E_FINISHED] = "rack.response_finished", [E_AFTER] = "rack.after_reply",
    };
    for (int i = 0; i < E_SLOTS; i++)
        slot_keys[i] = fstr(slot_names[i]);
    for (int i = 0; common_methods[i]; i++)
        method_keys[i] = fstr(common_methods[i]);
    v_80 = sv_strcache_get("80", 2);
    v_443 = sv_strcache_get("443", 3);
    rb_gc_register_mark_object(v_80);
    rb_gc_register_mark_object(v_443);
    k_ctype = fstr("CONTENT_TYPE");
    k_clen = fstr("CONTENT_LENGTH");
    k_cookie = fstr("HTTP_COOKIE");
    k_xrs = fstr("HTTP_X_REQUEST_START");
    k_xqs = fstr("HTTP_X_QUEUE_START");
    k_upgrade = fstr("HTTP_UPGRADE");
    k_protocol = fstr("rack.protocol");
    v_http10 = fstr("HTTP/1.0");
    v_http11 = fstr("HTTP/1.1");
    k_scheme = fstr("rack.url_scheme");
    k_https = fstr("HTTPS");
    v_https = fstr("https");
    v_on = fstr("on");
    re_list = rb_reg_new_str(rb_str_new_cstr("\\s*,\\s*"), 0);
    rb_obj_freeze(re_list);
    rb_gc_register_mark_object(re_list);
    for (int c = 0; c < 256; c++)
        lower_of[c] = (unsigned char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    memset(by_len, -1, sizeof(by_len));
    for (int i = 0; common_headers[i] && i < SV_COMMON_MAX; i++) {
        common_lens[i] = strlen(common_headers[i]);
        if (strcmp(common_headers[i], "content-type") == 0)
            common_keys[i] = k_ctype;
        else if (strcmp(common_headers[i], "content-length") == 0)
            common_keys[i] = k_clen;
        else
            common_keys[i] = header_key_build(common_headers[i], common_lens[i]);
        rb_gc_register_mark_object(common_keys[i]);
        signed char *l = by_len[common_lens[i]];
        while (*l >= 0)
            l++;
        if (l < by_len[common_lens[i]] + 7) /* room for the list's end */
            *l = (signed char)i;
    }
    VALUE holder = TypedData_Wrap_Struct(0, &bases_type, bases);
    rb_gc_register_mark_object(holder);
}

/* Whether name (a field name: tchars, parser.c) is lower (a common name:
 * a-z and '-') in any case. Eight bytes a step: OR 0x20 lowers a letter and
 * keeps '-'; of the tchars only a letter's two cases give a letter, and
 * only '-' gives '-' (CR, the other byte that does, is no tchar). */
static int name_is(const char *name, size_t len, const char *lower, size_t llen)
{
    if (len != llen)
        return 0;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t a, b;
        memcpy(&a, name + i, 8);
        memcpy(&b, lower + i, 8);
        if ((a | 0x2020202020202020ull) != b)
            return 0;
    }
    for (; i < len; i++)
        if (lower_of[(unsigned char)name[i]] != (unsigned char)lower[i])
            return 0;
    return 1;
}

static VALUE header_key(const char *name, size_t len)
{
    if (len <= SV_NAME_LEN_MAX)
        for (const signed char *i = by_len[len]; *i >= 0; i++)
            if (name_is(name, len, common_headers[*i], common_lens[*i]))
                return common_keys[*i];
    return header_key_build(name, len);
}

static VALUE bin(const char *p, size_t n)
{
    return rb_str_new(p ? p : "", (long)n);
}


/* REQUEST_METHOD's value */
static VALUE method_str(const char *m, size_t n)
{
    int i = -1; /* common_methods' index, by length first */
    if (n == 3)
        i = memcmp(m, "GET", 3) == 0 ? 0 : memcmp(m, "PUT", 3) == 0 ? 3 : -1;
    else if (n == 4)
        i = memcmp(m, "POST", 4) == 0 ? 1 : memcmp(m, "HEAD", 4) == 0 ? 2 : -1;
    else if (n == 6)
        i = memcmp(m, "DELETE", 6) == 0 ? 4 : -1;
    else if (n == 5)
        i = memcmp(m, "PATCH", 5) == 0 ? 5 : -1;
    else if (n == 7)
        i = memcmp(m, "OPTIONS", 7) == 0 ? 6 : -1;
    return i >= 0 ? method_keys[i] : rb_enc_interned_str(m, (long)n, rb_utf8_encoding());
}

/* SERVER_NAME and SERVER_PORT from the Host (or absolute-form authority),
 * else the listener's. */
static void server_name(sv_conn *c, VALUE *name, VALUE *port)
{
    const sv_request *r = c->req;
    const char *h = r->host;
    size_t n = r->host_len;
    if (!h || n == 0) {
        char digits[16];
        int len = snprintf(digits, sizeof(digits), "%d", c->listener->port);
        *name = sv_strcache_get(c->listener->name, strlen(c->listener->name));
        *port = sv_strcache_get(digits, (size_t)len);
        return;
    }
    size_t colon = n;
    if (h[0] == '[') {
        const char *close = memchr(h, ']', n);
        if (close && (size_t)(close - h) + 1 < n && close[1] == ':')
            colon = (size_t)(close - h) + 1;
    } else {
        const char *p = memchr(h, ':', n);
        if (p)
            colon = (size_t)(p - h);
    }
    *name = strcache_memo(M_NAME, h, colon);
    if (colon + 1 < n)
        *port = strcache_memo(M_PORT, h + colon + 1, n - colon - 1);
    else
        *port = c->tls ? v_443 : v_80;
}

/* REMOTE_ADDR: the connection's address (the socket's peer, a PROXY
 * header's source, or set_remote_address's value), or with
 * set_remote_address header: the first element of that field's first line
 * (up to a comma or whitespace: "client, proxy1" gives "client"), as Puma
 * does; the connection's address when the field is absent or that element
 * empty. */
static VALUE remote_addr(const sv_conn *c, const sv_request *r)
{
    const sv_options *o = &c->core->opt;
    for (size_t i = 0; o->remote_header_len && i < r->num_headers; i++) {
        const sv_header *h = &r->headers[i];
        if (h->name_len != o->remote_header_len || strncasecmp(h->name, o->remote_header, h->name_len) != 0)
            continue;
        size_t n = 0;
        while (n < h->value_len && h->value[n] != ',' && h->value[n] != ' ' && h->value[n] != '\t')
            n++;
        if (n > 0)
            return sv_strcache_get(h->value, n);
        break;
    }
    return strcache_memo(M_REMOTE, c->remote, strlen(c->remote));
}

/* The pairs a request adds to its env's copy on the plain path, put in by
 * rb_hash_bulk_insert: one call for all of them instead of one rb_hash_aset
 * each (each pair still costs its key's hash; the call's fixed cost is one
 * re-index of the copy). Hash#[]='s outcome (rb_hash_bulk_insert's
 * contract): a key the copy holds keeps its place and takes the new value,
 * a new key is added at the end, in the pairs' order. Held on the stack (the
 * GC sees the VALUEs there); a request with more than SV_PAIRS pairs puts
 * them in in more than one call. */
#define SV_PAIRS 48
typedef struct {
    VALUE env;
    long n;                  /* VALUEs in kv: two per pair */
    VALUE kv[2 * SV_PAIRS];
} env_pairs;

static void pairs_flush(env_pairs *p)
{
    if (p->n > 0)
        rb_hash_bulk_insert(p->n, p->kv, p->env);
    p->n = 0;
}

static void pairs_put(env_pairs *p, VALUE key, VALUE val)
{
    if (p->n == 2 * SV_PAIRS)
        pairs_flush(p);
    p->kv[p->n++] = key;
    p->kv[p->n++] = val;
}

/* A request's header fields as env pairs, in order (on the stack: the GC
 * sees the VALUEs there). */
typedef struct {
    long n;                         /* pairs */
    VALUE key[SV_HEADERS_CAP + 1];  /* + Content-Length's own */
    VALUE val[SV_HEADERS_CAP + 1];
} env_fields;

static void fields_put(env_fields *f, VALUE key, VALUE val)
{
    f->key[f->n] = key;
    f->val[f->n++] = val;
}

/* Header fields into the env's pairs, in order: each key once, a repeated
 * field appended to the String the first one put in (joined by ", ", Cookie
 * by "; ", Content-Type: the first one kept). Repeats are found by the
 * key's address (the keys are interned Strings: one name, one object) in an
 * open-addressing table on the stack, twice the fields' number of slots. A
 * field's value replaces a template's value under the same key. */
typedef struct {
    VALUE key;
    VALUE val; /* the String put in, or Qnil: nothing to append to */
} seen_field;

static size_t seen_slot(VALUE key, size_t mask)
{
    uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 40) & mask;
}

static void add_headers(env_fields *fields, const sv_request *r, const sv_header *host, int *upstream)
{
    size_t n = r->num_headers - (host ? 1 : 0);
    if (n == 0)
        return;
    size_t size = 16;
    while (size < 2 * n)
        size <<= 1;
    seen_field stack[64], *seen = size <= 64 ? stack : xmalloc(size * sizeof(seen_field));
    memset(seen, 0, size * sizeof(seen_field));
    for (size_t i = 0; i < r->num_headers && fields->n <= SV_HEADERS_CAP; i++) {
        const sv_header *h = &r->headers[i];
        if (h == host) /* in its slot already */
            continue;
        /* A name with '_' would alias a '-' name in the env (HTTP_X_FOO): dropped. */
        if (memchr(h->name, '_', h->name_len))
            continue;
        VALUE key = header_key(h->name, h->name_len);
        size_t j = seen_slot(key, size - 1);
        while (seen[j].key && seen[j].key != key)
            j = (j + 1) & (size - 1);
        if (seen[j].key) { /* a repeat */
            VALUE prev = seen[j].val;
            if (!NIL_P(prev)) {
                rb_str_cat(prev, key == k_cookie ? "; " : ", ", 2);
                rb_str_cat(prev, h->value, (long)h->value_len);
            }
            continue;
        }
        seen[j].key = key;
        if (key == k_clen) {
            /* the parser accepts "5, 5", "005" or repeated identical fields; the
             * app gets the one decimal value it validated */
            seen[j].val = Qnil;
            if (r->content_length >= 0)
                fields_put(fields, k_clen, rb_sprintf("%lld", (long long)r->content_length));
            continue;
        }
        if (key == k_xrs || key == k_xqs)
            *upstream = 1;
        VALUE val = bin(h->value, h->value_len);
        seen[j].val = key == k_ctype ? Qnil : val;
        fields_put(fields, key, val);
    }
    if (seen != stack)
        xfree(seen);
}

/* The per-request values, made before the env. */
typedef struct {
    VALUE val[E_SLOTS];
    int has_host, tls;
} env_vals;

/* The slots a base leaves to each request: new objects every time. A base
 * holds QUERY_STRING's empty value; every request sets its own. */
static const int per_request[SV_PER_REQUEST] = {E_PATH, E_QUERY, E_URI, E_HIJACK, E_FINISHED, E_AFTER};

static int is_per_request(int slot)
{
    for (int k = 0; k < SV_PER_REQUEST; k++)
        if (per_request[k] == slot)
            return 1;
    return 0;
}

static int slot_index(VALUE key)
{
    for (int i = 0; i < E_SLOTS; i++)
        if (key == slot_keys[i])
            return i;
    return -1;
}

/* The env's order, on both paths: the per-request slots, the request's
 * fields, then the template's entries (with the repeating slots' and TLS's
 * values put in), then any slot or TLS key the template lacks. What a
 * request sets is so at the front of a base's copy: filling it walks past
 * nothing else (env_from_bases). */
typedef struct {
    env_pairs *pairs;
    const env_vals *v;
    const env_fields *f;
    unsigned placed; /* bit i: slot i put in; bits E_SLOTS, E_SLOTS + 1: the TLS keys */
} env_rest;

static int rest_entry(VALUE key, VALUE val, VALUE arg)
{
    env_rest *x = (env_rest *)arg;
    int i = slot_index(key);
    if (i >= 0 && is_per_request(i))
        return ST_CONTINUE; /* put in first */
    for (long k = 0; k < x->f->n; k++)
        if (key == x->f->key[k])
            return ST_CONTINUE; /* a field's value replaces the template's */
    if (i >= 0) {
        if (i != E_HOST || x->v->has_host)
            val = x->v->val[i];
        x->placed |= 1u << i;
    } else if (x->v->tls && key == k_scheme) {
        val = v_https;
        x->placed |= 1u << E_SLOTS;
    } else if (x->v->tls && key == k_https) {
        val = v_on;
        x->placed |= 1u << (E_SLOTS + 1);
    }
    pairs_put(x->pairs, key, val);
    return ST_CONTINUE;
}

/* A new env in that order with v's values and f's fields. */
static VALUE env_plain(VALUE tmpl, const env_vals *v, const env_fields *f)
{
    env_pairs pairs;
    VALUE env = rb_hash_new();
    pairs.env = env;
    pairs.n = 0;
    for (int k = 0; k < SV_PER_REQUEST; k++)
        pairs_put(&pairs, slot_keys[per_request[k]], v->val[per_request[k]]);
    for (long i = 0; i < f->n; i++)
        pairs_put(&pairs, f->key[i], f->val[i]);
    env_rest x = {&pairs, v, f, 0};
    rb_hash_foreach(tmpl, rest_entry, (VALUE)&x);
    for (int i = 0; i < E_SLOTS; i++)
        if (!is_per_request(i) && !(x.placed & (1u << i)) && (i != E_HOST || v->has_host))
            pairs_put(&pairs, slot_keys[i], v->val[i]);
    if (v->tls && !(x.placed & (1u << E_SLOTS)))
        pairs_put(&pairs, k_scheme, v_https);
    if (v->tls && !(x.placed & (1u << (E_SLOTS + 1))))
        pairs_put(&pairs, k_https, v_on);
    pairs_flush(&pairs);
    RB_GC_GUARD(tmpl);
    return env;
}

/* The key base e sets as its j-th value (e->src[j]). */
static VALUE set_key(const env_base *e, int j)
{
    int s = e->src[j];
    return s < SV_PER_REQUEST ? slot_keys[per_request[s]] : e->fields[s - SV_PER_REQUEST];
}

/* Where the values go in a base's copy (env_base's pos and src): each
 * per-request slot and each field key, found among the base's entries in
 * the table's order. */
typedef struct {
    env_base *e;
    long pos; /* entries seen */
} sets_map;

static int map_entry(VALUE key, VALUE val, VALUE arg)
{
    (void)val;
    sets_map *m = (sets_map *)arg;
    env_base *e = m->e;
    long pos = m->pos++;
    int s = -1;
    for (int k = 0; k < SV_PER_REQUEST && s < 0; k++)
        if (key == slot_keys[per_request[k]])
            s = k;
    for (int k = 0; k < e->nfields && s < 0; k++)
        if (key == e->fields[k])
            s = SV_PER_REQUEST + k;
    if (s < 0)
        return ST_CONTINUE;
    if (pos > 0xFFFF || e->nsets == SV_BASE_SETS) {
        e->nsets = -1;
        return ST_STOP;
    }
    e->pos[e->nsets] = (unsigned short)pos;
    e->src[e->nsets++] = (unsigned char)s;
    return ST_CONTINUE;
}

/* A base for v's repeating values and f's field keys: env_plain's env with
 * the template's values in the per-request slots (every copy sets its own:
 * a base holds no request's objects but the repeating values and the first
 * request's field Strings, which every copy replaces), or Qfalse when the
 * places cannot be mapped. */
static VALUE base_build(VALUE tmpl, const env_vals *v, const env_fields *f, env_base *e)
{
    env_vals b = *v;
    for (int k = 0; k < SV_PER_REQUEST; k++)
        if (per_request[k] != E_QUERY)
            b.val[per_request[k]] = rb_hash_lookup2(tmpl, slot_keys[per_request[k]], Qnil);
    VALUE base = env_plain(tmpl, &b, f);
    e->nsets = 0;
    sets_map m = {e, 0};
    rb_hash_foreach(base, map_entry, (VALUE)&m);
    if (e->nsets != SV_PER_REQUEST + e->nfields)
        return Qfalse;
    return base;
}

/* Setting a copy's values where the base's map says, through the copy's
 * table (RHASH_TBL and st_foreach_with_replace, Ruby's public C API): no
 * key is hashed, as a copy keeps every entry's stored hash, and the values
 * are the copy's first entries (env_plain's order): the walk stops after
 * them. Each entry set is checked to hold the key the map expects. RHASH_TBL leaves the copy
 * without write-barrier protection, so the values need no barrier: the GC
 * scans such an object whole (and the app gets a protected copy of it,
 * env_from_bases). */
typedef struct {
    const env_base *e;
    const VALUE *vals;
    long pos;  /* entries seen */
    int next;  /* the next of e's sets */
    int ok;
} sets_fill;

static int fill_entry(st_data_t key, st_data_t val, st_data_t arg, int error)
{
    (void)val;
    sets_fill *f = (sets_fill *)arg;
    if (error) {
        f->ok = 0;
        return ST_STOP;
    }
    if (f->pos++ != f->e->pos[f->next])
        return ST_CONTINUE;
    if ((VALUE)key != set_key(f->e, f->next)) {
        f->ok = 0;
        return ST_STOP;
    }
    return ST_REPLACE;
}

static int fill_set(st_data_t *key, st_data_t *val, st_data_t arg, int existing)
{
    (void)key;
    (void)existing;
    sets_fill *f = (sets_fill *)arg;
    *val = (st_data_t)f->vals[f->e->src[f->next]];
    return ++f->next == f->e->nsets ? ST_STOP : ST_CONTINUE;
}

static int base_fill(VALUE env, const env_base *e, const VALUE *vals)
{
#if defined(HAVE_RB_HASH_TBL) && defined(HAVE_RB_ST_FOREACH_WITH_REPLACE)
    sets_fill f = {e, vals, 0, 0, 1};
    st_foreach_with_replace(RHASH_TBL(env), fill_entry, fill_set, (st_data_t)&f);
    return f.ok && f.next == e->nsets;
#else
    (void)env;
    (void)e;
    (void)vals;
    return 0; /* the plain way */
#endif
}

static VALUE env_from_bases(VALUE tmpl, const env_vals *v, VALUE empty_query, const env_fields *f)
{
    const VALUE *x = v->val;
    if (f->n > SV_BASE_FIELDS)
        return Qundef;
    uint64_t h = (uint64_t)tmpl ^ ((uint64_t)x[E_METHOD] << 1) ^ ((uint64_t)x[E_REMOTE] << 2) ^
                 ((uint64_t)x[E_NAME] << 3) ^ ((uint64_t)x[E_PORT] << 4) ^ ((uint64_t)x[E_HOST] << 5) ^
                 ((uint64_t)x[E_PROTO] << 6) ^ (uint64_t)v->tls;
    for (long i = 0; i < f->n; i++)
        h = (h ^ (uint64_t)f->key[i]) * 0x9E3779B97F4A7C15ull;
    h *= 0x9E3779B97F4A7C15ull;
    env_base *e = &bases[(h >> 40) & (SV_BASES - 1)];
    int same = e->tmpl == tmpl && e->method == x[E_METHOD] && e->proto == x[E_PROTO] && e->remote == x[E_REMOTE] &&
               e->name == x[E_NAME] && e->port == x[E_PORT] && e->host == x[E_HOST] && e->tls == v->tls &&
               e->nfields == f->n;
    for (long i = 0; same && i < f->n; i++)
        same = e->fields[i] == f->key[i];
    if (!same) {
        /* first sight of these values here: noted, built the plain way */
        e->tmpl = tmpl;
        e->method = x[E_METHOD];
        e->proto = x[E_PROTO];
        e->remote = x[E_REMOTE];
        e->name = x[E_NAME];
        e->port = x[E_PORT];
        e->host = x[E_HOST];
        e->tls = v->tls;
        e->nfields = (int)f->n;
        memcpy(e->fields, f->key, (size_t)f->n * sizeof(VALUE));
        e->base = Qnil;
        return Qundef;
    }
    if (NIL_P(e->base)) {
        env_vals b = *v;
        b.val[E_QUERY] = empty_query;
        e->base = base_build(tmpl, &b, f, e);
    }
    VALUE base = e->base;
    if (base == Qfalse)
        return Qundef;
    VALUE vals[SV_BASE_SETS];
    for (int k = 0; k < SV_PER_REQUEST; k++)
        vals[k] = x[per_request[k]];
    for (long i = 0; i < f->n; i++)
        vals[SV_PER_REQUEST + i] = f->val[i];
    /* The base itself takes the request's values in place, gives its copy
     * (a fresh Hash, write-barrier protected: the table copied with its
     * stored hashes, nothing rehashed) and gets nil back in those places at
     * once: between requests a base holds none of a request's objects. (A
     * base is old and, through RHASH_TBL, unprotected: the GC scans it
     * whole at every minor GC, and values it kept would survive into the
     * old generation and force major GCs, bench/NOTES.md "Session 26". An
     * unprotected env that an old object points to, as Rails keeps the
     * request in thread-local state, would do the same; hence the copy.)
     * Nothing in between runs Ruby code or releases the GVL. */
    static const VALUE blank[SV_BASE_SETS] = {[0 ... SV_BASE_SETS - 1] = Qnil};
    int ok = base_fill(base, e, vals);
    VALUE env = ok ? rb_hash_dup(base) : Qundef;
    if (!base_fill(base, e, blank) || !ok) {
        e->base = Qfalse; /* cannot happen (nothing else touches a base's table): the plain way from now on */
        return Qundef;
    }
    RB_GC_GUARD(base);
    base_copies++;
    return env;
}

/* Builds the env of c's request from the template: the CGI keys, the
 * HTTP_* headers, rack.hijack (hijack: the Request itself), and new
 * rack.response_finished / rack.after_reply Arrays (returned in *finished,
 * *after). *upstream is set when an X-Request-Start or X-Queue-Start header
 * is present (timing reads it). The env's order: env_plain. */
VALUE sv_build_env(sv_conn *c, VALUE tmpl, VALUE hijack, VALUE *finished, VALUE *after, int *upstream)
{
    const sv_request *r = c->req;
    env_vals v;
    VALUE empty_query = sv_strcache_get("", 0);
    v.val[E_METHOD] = method_str(r->method, r->method_len);
    v.val[E_PATH] = bin(r->path, r->path_len);
    v.val[E_QUERY] = r->query_len ? bin(r->query, r->query_len) : empty_query;
    v.val[E_URI] = bin(r->target, r->target_len);
    v.val[E_PROTO] = r->minor_version ? v_http11 : v_http10;
    v.val[E_REMOTE] = remote_addr(c, r);
    server_name(c, &v.val[E_NAME], &v.val[E_PORT]);
    /* Host: in every HTTP/1.1 request (the parser demands it), so a slot;
     * an HTTP/1.0 request without one has no HTTP_HOST */
    const sv_header *host = r->host_field >= 0 ? &r->headers[r->host_field] : NULL;
    v.has_host = host != NULL;
    v.val[E_HOST] = host ? strcache_memo(M_HOST, host->value, host->value_len) : Qnil;
    v.val[E_HIJACK] = hijack;
    v.val[E_FINISHED] = *finished = rb_ary_new();
    v.val[E_AFTER] = *after = rb_ary_new();
    v.tls = c->tls ? 1 : 0;
    env_fields fields;
    fields.n = 0;
    *upstream = 0;
    add_headers(&fields, r, host, upstream);
    VALUE env = Qundef;
    /* a base only for a frozen template (one that cannot change under it) */
    if (use_bases && host && RB_OBJ_FROZEN(tmpl))
        env = env_from_bases(tmpl, &v, empty_query, &fields);
    if (env == Qundef)
        env = env_plain(tmpl, &v, &fields);
    if (!host) /* HTTP/1.0 without a Host: no HTTP_HOST */
        rb_hash_delete(env, slot_keys[E_HOST]);
    if (r->upgrade) { /* rack.protocol: the Upgrade field's tokens */
        VALUE up = rb_hash_lookup2(env, k_upgrade, Qnil);
        if (RB_TYPE_P(up, T_STRING))
            rb_hash_aset(env, k_protocol, rb_funcall(up, rb_intern("split"), 1, re_list));
    }
    return env;
}

/* Serval::Native.env_fill: :prepared (a client's repeating values come
 * from a prepared base, the default) or :plain (every slot set on the
 * template's copy); env_fill= picks one (the tests build every env both
 * ways and compare). */
static VALUE env_fill_get(VALUE mod)
{
    (void)mod;
    return ID2SYM(rb_intern(use_bases ? "prepared" : "plain"));
}

static VALUE env_fill_set(VALUE mod, VALUE mode)
{
    (void)mod;
    use_bases = SYM2ID(rb_to_symbol(mode)) == rb_intern("prepared");
    return env_fill_get(mod);
}

static VALUE env_base_copies(VALUE mod)
{
    (void)mod;
    return ULONG2NUM(base_copies);
}

void sv_define_env_fill(VALUE mNative)
{
    rb_define_module_function(mNative, "env_base_copies", env_base_copies, 0);
    rb_define_module_function(mNative, "env_fill", env_fill_get, 0);
    rb_define_module_function(mNative, "env_fill=", env_fill_set, 1);
}

/* Building the Rack env from a parsed request head (runs with the GVL). */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <ruby.h>
#include <ruby/encoding.h>
#include <ruby/re.h>
#include <ruby/st.h>
#include "serval_ruby.h"
#include "strcache.h"

#define SV_KEY_STACK 256

/* The env keys every request sets (sv_build_env). */
enum { E_METHOD, E_PATH, E_QUERY, E_URI, E_PROTO, E_REMOTE, E_NAME, E_PORT, E_HOST, E_HIJACK, E_FINISHED, E_AFTER, E_SLOTS };
static VALUE slot_keys[E_SLOTS];

/* The env fill (fill_entries, below): whether st.c's entry layout checked
 * out at load, and whether the direct fill is in use. */
static int layout_ok, direct_fill;
static int entry_layout_ok(void);

/* Which slot a key is, by its address (the slot keys are pinned: rb_gc_mark
 * through rb_gc_register_mark_object): open addressing, SV_SLOT_TABLE
 * entries for E_SLOTS keys, so a template key that is no slot usually
 * costs one probe. */
#define SV_SLOT_TABLE 64
static struct {
    VALUE key;
    int slot;
} slot_table[SV_SLOT_TABLE];

static unsigned slot_hash(VALUE key)
{
    return (unsigned)((key >> 3) ^ (key >> 9)) & (SV_SLOT_TABLE - 1);
}

static void slot_table_add(VALUE key, int slot)
{
    unsigned i = slot_hash(key);
    while (slot_table[i].key)
        i = (i + 1) & (SV_SLOT_TABLE - 1);
    slot_table[i].key = key;
    slot_table[i].slot = slot;
}

static int slot_of(VALUE key)
{
    for (unsigned i = slot_hash(key); slot_table[i].key; i = (i + 1) & (SV_SLOT_TABLE - 1))
        if (slot_table[i].key == key)
            return slot_table[i].slot;
    return -1;
}

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
    "sec-fetch-mode", "sec-fetch-site", "sec-fetch-dest", "pragma", "te", NULL,
};
#define SV_COMMON_MAX 32
static VALUE common_keys[SV_COMMON_MAX];
static size_t common_lens[SV_COMMON_MAX];

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
    for (int i = 0; i < E_SLOTS; i++) {
        slot_keys[i] = fstr(slot_names[i]);
        slot_table_add(slot_keys[i], i);
    }
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
    for (int i = 0; common_headers[i] && i < SV_COMMON_MAX; i++) {
        common_lens[i] = strlen(common_headers[i]);
        common_keys[i] = header_key_build(common_headers[i], common_lens[i]);
        rb_gc_register_mark_object(common_keys[i]);
    }
    layout_ok = entry_layout_ok();
    direct_fill = layout_ok;
}

static int name_is(const char *name, size_t len, const char *lower, size_t llen)
{
    if (len != llen)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if (ch != lower[i])
            return 0;
    }
    return 1;
}

static VALUE header_key(const char *name, size_t len)
{
    for (int i = 0; common_headers[i]; i++)
        if (name_is(name, len, common_headers[i], common_lens[i]))
            return common_keys[i];
    if (name_is(name, len, "content-type", 12))
        return k_ctype;
    if (name_is(name, len, "content-length", 14))
        return k_clen;
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

/* st_update callback for one header field: a new key takes the String made
 * for it (allocated before the call: nothing here may run the GC); an
 * existing one is left alone and reported, the caller appends to it. */
typedef struct {
    VALUE fresh;
    VALUE prev;
} header_put;

static int header_update(st_data_t *key, st_data_t *value, st_data_t arg, int existing)
{
    header_put *put = (header_put *)arg;
    if (existing)
        put->prev = (VALUE)*value;
    else
        *value = (st_data_t)put->fresh;
    return ST_CONTINUE;
}

static void add_header(VALUE env, st_table *tbl, const sv_request *r, const sv_header *h, int *upstream)
{
    /* A name with '_' would alias a '-' name in the env (HTTP_X_FOO): dropped. */
    if (memchr(h->name, '_', h->name_len))
        return;
    VALUE key = header_key(h->name, h->name_len);
    if (key == k_clen) {
        /* the parser accepts "5, 5", "005" or repeated identical fields; the
         * app gets the one decimal value it validated */
        if (r->content_length >= 0)
            rb_hash_aset(env, k_clen, rb_sprintf("%lld", (long long)r->content_length));
        return;
    }
    if (key == k_xrs || key == k_xqs)
        *upstream = 1;
    /* One hash of the key per field (a lookup and then an aset would hash it
     * twice); the key is an interned String, as Hash#[]= would store it. */
    header_put put = {bin(h->value, h->value_len), Qundef};
    st_update(tbl, (st_data_t)key, header_update, (st_data_t)&put);
    if (put.prev == Qundef)
        return;
    if (key == k_ctype || !RB_TYPE_P(put.prev, T_STRING))
        return;
    rb_str_cat(put.prev, key == k_cookie ? "; " : ", ", 2);
    rb_str_cat(put.prev, h->value, (long)h->value_len);
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
    *name = sv_strcache_get(h, colon);
    if (colon + 1 < n)
        *port = sv_strcache_get(h + colon + 1, n - colon - 1);
    else
        *port = c->tls ? v_443 : v_80;
}

/* The keys every request sets. The template (lib/serval/request_handler.rb)
 * holds each of them (value nil) first, so its copy already has them in
 * place: one pass over the copy's first entries puts the values in
 * (st_foreach_with_replace), stopping once every slot is filled, instead of
 * one hash lookup and update per key. A key the template lacks is added by
 * rb_hash_aset afterwards, so the result never depends on it. */

typedef struct {
    VALUE val[E_SLOTS];
    unsigned filled;           /* bit i: val[i] is in the table */
    int pending;               /* the slot the replace callback fills */
} env_fill;

static int fill_check(st_data_t key, st_data_t value, st_data_t arg, int error)
{
    env_fill *f = (env_fill *)arg;
    if (error)
        return ST_STOP;
    if (f->filled == (1u << E_SLOTS) - 1)
        return ST_STOP; /* every slot is in: the template's other keys keep their values */
    int i = slot_of((VALUE)key);
    if (i < 0 || (f->filled & (1u << i)))
        return ST_CONTINUE;
    f->pending = i;
    return ST_REPLACE;
}

static int fill_replace(st_data_t *key, st_data_t *value, st_data_t arg, int existing)
{
    env_fill *f = (env_fill *)arg;
    *value = (st_data_t)f->val[f->pending];
    f->filled |= 1u << f->pending;
    return ST_CONTINUE;
}

/* The same pass without st_foreach_with_replace's generic machinery (a
 * callback pair per entry, rebuild checks): straight over the copy's entry
 * array. st.c keeps the entry type private; its layout (hash, key, record,
 * unchanged since Ruby 2.4) is checked once at load (entry_layout_ok) on a
 * table of known keys and values, and the generic pass is used when the
 * check fails. A deleted entry keeps its key with the reserved hash value. */
typedef struct {
    st_data_t hash, key, record;
} entry_view;

static int entry_live(const entry_view *e)
{
    return e->hash != (st_data_t)~(st_data_t)0;
}

static int entry_layout_ok(void)
{
    enum { N = 20 };
    VALUE h = rb_hash_new(), keys[N], vals[N];
    for (int i = 0; i < N; i++) {
        keys[i] = rb_obj_freeze(rb_sprintf("serval-layout-%d", i));
        vals[i] = INT2FIX(i * 3 + 1);
        rb_hash_aset(h, keys[i], vals[i]);
    }
    st_table *tbl = RHASH_TBL(h);
    const entry_view *e = (const entry_view *)tbl->entries;
    int ok = tbl->entries_start == 0 && tbl->entries_bound == N && tbl->num_entries == N;
    for (int i = 0; ok && i < N; i++) {
        VALUE k = (VALUE)e[i].key;
        ok = entry_live(&e[i]) && (k == keys[i] || rb_str_equal(k, keys[i]) == Qtrue) &&
             (VALUE)e[i].record == vals[i];
    }
    RB_GC_GUARD(h);
    return ok;
}

/* Where the last template's copy held each slot key (the copies of one
 * template share its layout): each store is then checked against the key it
 * expects instead of looking the entry's key up. Touched with the GVL held. */
#define SV_NO_POS ((st_index_t)-1)
static struct {
    VALUE tmpl;                /* compared by value only, never dereferenced */
    st_index_t bound;
    st_index_t at[E_SLOTS];    /* entry index, or SV_NO_POS: not in the template */
} pos;

static int fill_known(st_table *tbl, env_fill *f, VALUE tmpl)
{
    if (pos.tmpl != tmpl || pos.bound != tbl->entries_bound)
        return 0;
    entry_view *e = (entry_view *)tbl->entries;
    for (int i = 0; i < E_SLOTS; i++) {
        st_index_t j = pos.at[i];
        if (j != SV_NO_POS && (e[j].key != (st_data_t)slot_keys[i] || !entry_live(&e[j])))
            return 0; /* another template at this address, or changed: scan */
    }
    for (int i = 0; i < E_SLOTS; i++)
        if (pos.at[i] != SV_NO_POS) {
            e[pos.at[i]].record = (st_data_t)f->val[i];
            f->filled |= 1u << i;
        }
    return 1;
}

static void fill_entries(st_table *tbl, env_fill *f, VALUE tmpl)
{
    if (fill_known(tbl, f, tmpl))
        return;
    entry_view *e = (entry_view *)tbl->entries;
    for (int i = 0; i < E_SLOTS; i++)
        pos.at[i] = SV_NO_POS;
    for (st_index_t j = tbl->entries_start; j < tbl->entries_bound && f->filled != (1u << E_SLOTS) - 1; j++) {
        if (!entry_live(&e[j]))
            continue; /* deleted */
        int i = slot_of((VALUE)e[j].key);
        if (i < 0 || (f->filled & (1u << i)))
            continue;
        e[j].record = (st_data_t)f->val[i];
        f->filled |= 1u << i;
        pos.at[i] = j;
    }
    pos.tmpl = tmpl;
    pos.bound = tbl->entries_bound;
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
    return sv_strcache_get(c->remote, strlen(c->remote));
}

/* Builds the env of c's request from the frozen template: the CGI keys,
 * the HTTP_* headers, rack.hijack (hijack: the Request itself), and new
 * rack.response_finished / rack.after_reply Arrays (returned in *finished,
 * *after). *upstream is set when an X-Request-Start or X-Queue-Start header
 * is present (timing reads it). */
VALUE sv_build_env(sv_conn *c, VALUE tmpl, VALUE hijack, VALUE *finished, VALUE *after, int *upstream)
{
    const sv_request *r = c->req;
    env_fill f;
    f.filled = 0;
    f.pending = 0;
    /* every value is made before the table is touched: the fill below must
     * not allocate (a GC in the middle of an st iteration) */
    f.val[E_METHOD] = method_str(r->method, r->method_len);
    f.val[E_PATH] = bin(r->path, r->path_len);
    f.val[E_QUERY] = r->query_len ? bin(r->query, r->query_len) : sv_strcache_get("", 0);
    f.val[E_URI] = bin(r->target, r->target_len);
    f.val[E_PROTO] = r->minor_version ? v_http11 : v_http10;
    f.val[E_REMOTE] = remote_addr(c, r);
    server_name(c, &f.val[E_NAME], &f.val[E_PORT]);
    /* Host: in every HTTP/1.1 request (the parser demands it), so a slot;
     * an HTTP/1.0 request without one has the key taken out below */
    const sv_header *host = r->host_field >= 0 ? &r->headers[r->host_field] : NULL;
    f.val[E_HOST] = host ? sv_strcache_get(host->value, host->value_len) : Qnil;
    f.val[E_HIJACK] = hijack;
    f.val[E_FINISHED] = *finished = rb_ary_new();
    f.val[E_AFTER] = *after = rb_ary_new();
    VALUE env = rb_hash_dup(tmpl);
    /* RHASH_TBL makes env write-barrier unprotected, so the GC rescans it
     * and values stored straight into its table are safe */
    st_table *tbl = RHASH_TBL(env);
    if (direct_fill)
        fill_entries(tbl, &f, tmpl);
    else
        st_foreach_with_replace(tbl, fill_check, fill_replace, (st_data_t)&f);
    for (int i = 0; i < E_SLOTS; i++)
        if (!(f.filled & (1u << i)) && !(i == E_HOST && !host))
            rb_hash_aset(env, slot_keys[i], f.val[i]);
    if (!host && (f.filled & (1u << E_HOST)))
        rb_hash_delete(env, slot_keys[E_HOST]);
    if (c->tls) {
        rb_hash_aset(env, k_scheme, v_https);
        rb_hash_aset(env, k_https, v_on);
    }
    *upstream = 0;
    for (size_t i = 0; i < r->num_headers; i++)
        if (&r->headers[i] != host) /* in its slot already */
            add_header(env, tbl, r, &r->headers[i], upstream);
    if (r->upgrade) { /* rack.protocol: the Upgrade field's tokens */
        VALUE up = rb_hash_lookup2(env, k_upgrade, Qnil);
        if (RB_TYPE_P(up, T_STRING))
            rb_hash_aset(env, k_protocol, rb_funcall(up, rb_intern("split"), 1, re_list));
    }
    return env;
}

/* Serval::Native.env_fill: :direct (the entry array) or :generic
 * (st_foreach_with_replace); env_fill= picks one (tests run both), :direct
 * only where the layout check passed. */
static VALUE env_fill_get(VALUE mod)
{
    (void)mod;
    return ID2SYM(rb_intern(direct_fill ? "direct" : "generic"));
}

static VALUE env_fill_set(VALUE mod, VALUE mode)
{
    (void)mod;
    direct_fill = layout_ok && SYM2ID(rb_to_symbol(mode)) == rb_intern("direct");
    return env_fill_get(mod);
}

void sv_define_env_fill(VALUE mNative)
{
    rb_define_module_function(mNative, "env_fill", env_fill_get, 0);
    rb_define_module_function(mNative, "env_fill=", env_fill_set, 1);
}

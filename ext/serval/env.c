/* Building the Rack env from a parsed request head (runs with the GVL). */
#include <string.h>
#include <ruby.h>
#include <ruby/encoding.h>
#include "serval_ruby.h"

#define SV_KEY_STACK 256

static VALUE k_method, k_path, k_query, k_uri, k_proto, k_name, k_port, k_remote,
    k_ctype, k_clen, k_cookie, v_http10, v_http11, v_empty, v_port80, k_scheme, k_https, v_https, v_on, v_port443;

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
    k_method = fstr("REQUEST_METHOD");
    k_path = fstr("PATH_INFO");
    k_query = fstr("QUERY_STRING");
    k_uri = fstr("REQUEST_URI");
    k_proto = fstr("SERVER_PROTOCOL");
    k_name = fstr("SERVER_NAME");
    k_port = fstr("SERVER_PORT");
    k_remote = fstr("REMOTE_ADDR");
    k_ctype = fstr("CONTENT_TYPE");
    k_clen = fstr("CONTENT_LENGTH");
    k_cookie = fstr("HTTP_COOKIE");
    v_http10 = fstr("HTTP/1.0");
    v_http11 = fstr("HTTP/1.1");
    v_empty = fstr("");
    v_port80 = fstr("80");
    k_scheme = fstr("rack.url_scheme");
    k_https = fstr("HTTPS");
    v_https = fstr("https");
    v_on = fstr("on");
    v_port443 = fstr("443");
    for (int i = 0; common_headers[i] && i < SV_COMMON_MAX; i++) {
        common_lens[i] = strlen(common_headers[i]);
        common_keys[i] = header_key_build(common_headers[i], common_lens[i]);
        rb_gc_register_mark_object(common_keys[i]);
    }
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

static void add_header(VALUE env, const sv_request *r, const sv_header *h)
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
    VALUE prev = rb_hash_lookup2(env, key, Qundef);
    if (prev == Qundef) {
        rb_hash_aset(env, key, bin(h->value, h->value_len));
        return;
    }
    if (key == k_ctype)
        return;
    rb_str_cat(prev, key == k_cookie ? "; " : ", ", 2);
    rb_str_cat(prev, h->value, (long)h->value_len);
}

static void add_server_name(VALUE env, sv_conn *c)
{
    const sv_request *r = c->req;
    const char *h = r->host;
    size_t n = r->host_len;
    if (!h || n == 0) {
        rb_hash_aset(env, k_name, rb_str_new_cstr(c->listener->name));
        rb_hash_aset(env, k_port, rb_sprintf("%d", c->listener->port));
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
    rb_hash_aset(env, k_name, bin(h, colon));
    if (colon + 1 < n)
        rb_hash_aset(env, k_port, bin(h + colon + 1, n - colon - 1));
    else
        rb_hash_aset(env, k_port, c->tls ? v_port443 : v_port80);
}

VALUE sv_build_env(sv_conn *c, VALUE tmpl)
{
    const sv_request *r = c->req;
    VALUE env = rb_hash_dup(tmpl);
    rb_hash_aset(env, k_method, rb_enc_interned_str(r->method, (long)r->method_len, rb_utf8_encoding()));
    rb_hash_aset(env, k_path, bin(r->path, r->path_len));
    rb_hash_aset(env, k_query, bin(r->query, r->query_len));
    rb_hash_aset(env, k_uri, bin(r->target, r->target_len));
    rb_hash_aset(env, k_proto, r->minor_version ? v_http11 : v_http10);
    rb_hash_aset(env, k_remote, rb_str_new_cstr(c->remote));
    add_server_name(env, c);
    if (c->tls) {
        rb_hash_aset(env, k_scheme, v_https);
        rb_hash_aset(env, k_https, v_on);
    }
    for (size_t i = 0; i < r->num_headers; i++)
        add_header(env, r, &r->headers[i]);
    return env;
}

/* Serialising a Rack response head into the connection's output buffer. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <ruby.h>
#include "serval_ruby.h"
#include "head.h"
#include "conn.h"

#define SV_HEAD_LIMIT ((size_t)1 << 30)

typedef struct {
    sv_conn *c;
    int code;
    int has_cl, has_te, has_date, conn_close, hijack;
    int64_t app_cl;
} head_ctx;

/* A header name in a message: at most 64 bytes of it. */
#define NAME_ARG(p, n) (int)((n) > 64 ? 64 : (n)), (p)

static void out(sv_conn *c, const char *p, size_t n)
{
    if (sv_buf_append(&c->out, p, n, SV_HEAD_LIMIT) != 0)
        rb_raise(rb_eNoMemError, "response head too large");
}

static int ieq(const char *a, long alen, const char *lower)
{
    size_t n = strlen(lower);
    if ((size_t)alen != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = a[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if (ch != lower[i])
            return 0;
    }
    return 1;
}

static void check_name(const char *p, long n)
{
    if (n == 0)
        rb_raise(sv_eBadResponse, "empty response header name");
    for (long i = 0; i < n; i++)
        if (!sv_is_tchar((unsigned char)p[i]))
            rb_raise(sv_eBadResponse, "invalid response header name %+" PRIsVALUE " (not an HTTP token)",
                     rb_str_new(p, n > 64 ? 64 : n));
}

/* CR, NUL and the other controls (a lone LF has split the value into lines
 * already): Puma drops such a line silently, Serval answers 500, since a
 * CR in a value built from request data is how responses are split. */
static void check_value(const char *name, long nlen, const char *p, long n)
{
    for (long i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            rb_raise(sv_eBadResponse, "response header %.*s: control character 0x%02x in the value (%s)",
                     NAME_ARG(name, nlen), ch, ch == '\r' ? "CR: response splitting" : "not allowed in HTTP");
    }
}

static void emit_line(head_ctx *x, const char *name, long nlen, const char *val, long vlen)
{
    check_value(name, nlen, val, vlen);
    sv_buf *b = &x->c->out;
    size_t n = (size_t)nlen + 2 + (size_t)vlen + 2;
    if (sv_buf_reserve(b, n, SV_HEAD_LIMIT) != 0)
        rb_raise(rb_eNoMemError, "response head too large");
    char *p = b->data + b->len;
    memcpy(p, name, (size_t)nlen);
    p += nlen;
    *p++ = ':';
    *p++ = ' ';
    memcpy(p, val, (size_t)vlen);
    p += vlen;
    *p++ = '\r';
    *p++ = '\n';
    b->len += n;
}

#define SV_PHRASE_MAX 48 /* longer than any phrase sv_reason_phrase knows (31) */

/* "HTTP/1.1 200 OK\r\n" (no snprintf: Ruby's, which ruby.h puts in its
 * place, costs more than the rest of the status line). */
static void status_line(sv_conn *c, int code)
{
    const char *phrase = sv_reason_phrase(code);
    size_t plen = strlen(phrase);
    char line[16 + SV_PHRASE_MAX];
    if (plen > SV_PHRASE_MAX)
        plen = SV_PHRASE_MAX;
    memcpy(line, "HTTP/1.1 ", 9);
    line[9] = (char)('0' + code / 100);
    line[10] = (char)('0' + code / 10 % 10);
    line[11] = (char)('0' + code % 10);
    line[12] = ' ';
    memcpy(line + 13, phrase, plen);
    memcpy(line + 13 + plen, "\r\n", 2);
    out(c, line, 15 + plen); /* one append */
}

/* A String value may carry several lines (Rack 2 style), one header line
 * each; trailing newlines end the value (as Ruby's split, which Puma uses,
 * drops trailing empty fields). */
static void emit_string(head_ctx *x, const char *name, long nlen, VALUE v)
{
    const char *p = RSTRING_PTR(v);
    long n = RSTRING_LEN(v);
    while (n > 0 && p[n - 1] == '\n')
        n--;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)n);
        long len = nl ? (long)(nl - p) : n;
        emit_line(x, name, nlen, p, len);
        if (!nl)
            break;
        n -= len + 1;
        p = nl + 1;
    }
}

/* Does a Connection value list the token "close"? */
static int has_close_token(const char *p, long n)
{
    long i = 0;
    while (i < n) {
        while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == ','))
            i++;
        long start = i;
        while (i < n && p[i] != ',' && p[i] != ' ' && p[i] != '\t')
            i++;
        if (ieq(p + start, i - start, "close"))
            return 1;
    }
    return 0;
}

/* The rare path of a response that Rack does not allow but Puma writes: a
 * header value (or an Array value's element) that is not a String, a name
 * that is a Symbol. Serval::ResponseLeniency.note warns once per header name
 * in development (lib/serval/response_leniency.rb). */
static void note_lenient(VALUE name, VALUE value)
{
    static ID id_serval, id_leniency, id_note;
    if (!id_note) {
        id_serval = rb_intern("Serval");
        id_leniency = rb_intern("ResponseLeniency");
        id_note = rb_intern("note");
    }
    VALUE serval = rb_const_get(rb_cObject, id_serval);
    if (rb_const_defined_at(serval, id_leniency))
        rb_funcall(rb_const_get_at(serval, id_leniency), id_note, 2, name, value);
}

/* to_s, as Puma writes such a value: nil is an empty value. */
static VALUE lenient_value(VALUE key, VALUE v)
{
    note_lenient(key, v);
    return NIL_P(v) ? rb_str_new(NULL, 0) : rb_obj_as_string(v);
}

static int64_t parse_length(VALUE key, VALUE v)
{
    if (RB_TYPE_P(v, T_ARRAY) && RARRAY_LEN(v) == 1)
        v = RARRAY_AREF(v, 0);
    if (!RB_TYPE_P(v, T_STRING) && !RB_TYPE_P(v, T_ARRAY))
        v = lenient_value(key, v); /* an Integer length: its digits */
    if (!RB_TYPE_P(v, T_STRING) || RSTRING_LEN(v) == 0 || RSTRING_LEN(v) > 18)
        rb_raise(sv_eBadResponse, "invalid content-length response header %" PRIsVALUE,
                 rb_str_substr(rb_inspect(v), 0, 64));
    int64_t n = 0;
    for (long i = 0; i < RSTRING_LEN(v); i++) {
        char ch = RSTRING_PTR(v)[i];
        if (ch < '0' || ch > '9')
            rb_raise(sv_eBadResponse, "invalid content-length response header %" PRIsVALUE,
                     rb_str_substr(rb_inspect(v), 0, 64));
        n = n * 10 + (ch - '0');
    }
    RB_GC_GUARD(v);
    return n;
}

static int header_i(VALUE key, VALUE val, VALUE arg)
{
    head_ctx *x = (head_ctx *)arg;
    if (!RB_TYPE_P(key, T_STRING)) {
        if (!RB_SYMBOL_P(key))
            rb_raise(sv_eBadResponse, "response header names must be Strings, not %" PRIsVALUE, rb_obj_class(key));
        note_lenient(key, val); /* a Symbol name: Puma writes it as its String */
        key = rb_sym2str(key);
    }
    const char *name = RSTRING_PTR(key);
    long nlen = RSTRING_LEN(key);
    if (nlen >= 5 && memcmp(name, "rack.", 5) == 0) {
        if (nlen == 11 && memcmp(name, "rack.hijack", 11) == 0)
            x->hijack = 1;
        return ST_CONTINUE;
    }
    check_name(name, nlen);
    /* the four names the server acts on, told apart by length first */
    if (nlen == 14 && ieq(name, nlen, "content-length")) {
        if (NIL_P(val)) {
            note_lenient(key, val); /* no length given: as if the header were absent (Puma too) */
            return ST_CONTINUE;
        }
        int64_t len = parse_length(key, val);
        if (x->has_cl) { /* "content-length" and "Content-Length" both */
            if (len != x->app_cl)
                rb_raise(sv_eBadResponse, "two content-length response headers that differ (%lld and %lld)",
                         (long long)x->app_cl, (long long)len);
            return ST_CONTINUE; /* the same length: written once */
        }
        x->has_cl = 1;
        x->app_cl = len;
        if (x->code == 204)
            return ST_CONTINUE; /* never on a 204 (RFC 9110 8.6) */
        if (!RB_TYPE_P(val, T_STRING) && !(RB_TYPE_P(val, T_ARRAY) && RB_TYPE_P(RARRAY_AREF(val, 0), T_STRING))) {
            char line[40];
            int n = snprintf(line, sizeof(line), "%lld", (long long)len);
            emit_line(x, name, nlen, line, n);
            return ST_CONTINUE;
        }
    } else if (nlen == 17 && ieq(name, nlen, "transfer-encoding")) {
        if (x->code == 204)
            return ST_CONTINUE; /* never on a 204 (RFC 9112 6.1) */
        x->has_te = 1;
    } else if (nlen == 4 && ieq(name, nlen, "date")) {
        x->has_date = 1;
    } else if (nlen == 10 && ieq(name, nlen, "connection")) {
        VALUE s = RB_TYPE_P(val, T_ARRAY) ? rb_ary_join(val, rb_str_new_cstr(",")) : val;
        if (RB_TYPE_P(s, T_STRING) && has_close_token(RSTRING_PTR(s), RSTRING_LEN(s)))
            x->conn_close = 1;
        return ST_CONTINUE; /* the server writes its own connection header */
    }
    if (RB_TYPE_P(val, T_STRING)) {
        emit_string(x, name, nlen, val);
    } else if (RB_TYPE_P(val, T_ARRAY)) {
        for (long i = 0; i < RARRAY_LEN(val); i++) {
            VALUE e = RARRAY_AREF(val, i);
            if (!RB_TYPE_P(e, T_STRING))
                e = lenient_value(key, e); /* nil in an Array: an empty line, as Puma */
            emit_string(x, name, nlen, e);
            RB_GC_GUARD(e);
        }
    } else {
        VALUE s = lenient_value(key, val);
        emit_string(x, name, nlen, s);
        RB_GC_GUARD(s);
    }
    RB_GC_GUARD(key);
    return ST_CONTINUE;
}

/* The status as Puma reads it (to_i): an Integer, a String ("200"), any
 * object with to_int or to_i; then only a three-digit final status (or 101
 * with a partial hijack, checked by the caller). */
static int status_code(VALUE status)
{
    VALUE v = status;
    if (!FIXNUM_P(v)) {
        static ID id_to_i;
        if (!id_to_i)
            id_to_i = rb_intern("to_i");
        if (RB_TYPE_P(v, T_STRING))
            v = rb_str_to_inum(v, 10, 0); /* String#to_i: "200", " 200", "200 OK" */
        else if (NIL_P(v = rb_check_to_int(status)) && rb_respond_to(status, id_to_i))
            v = rb_funcall(status, id_to_i, 0);
    }
    long code = FIXNUM_P(v) ? FIX2LONG(v) : -1;
    if (code < 100 || code > 999)
        rb_raise(sv_eBadResponse, "invalid status %" PRIsVALUE, rb_str_substr(rb_inspect(status), 0, 64));
    return (int)code;
}

/* A head that raised midway (sv_write_head) is taken back out of c->out. */
void sv_head_rollback(sv_conn *c)
{
    if (c->head_partial) {
        c->out.len = c->head_mark;
        c->head_partial = 0;
    }
}

/* "date: ...\r\n\r\n" (the head's end included), formatted once a second;
 * only touched with the GVL held. */
static const char *date_line(size_t *len)
{
    static char buf[64];
    static size_t blen;
    static time_t cached;
    time_t now = time(NULL);
    if (now != cached) {
        struct tm tm;
        gmtime_r(&now, &tm);
        /* the head's end too: the date line is the head's last (one append) */
        blen = strftime(buf, sizeof(buf), "date: %a, %d %b %Y %H:%M:%S GMT\r\n\r\n", &tm);
        cached = now;
    }
    *len = blen;
    return buf;
}

VALUE sv_eBadResponse;

void sv_init_head(void)
{
    sv_eBadResponse = rb_path2class("Serval::BadResponse");
    rb_gc_register_mark_object(sv_eBadResponse);
}

/* Balance mode: a keep-alive connection to end, to move its client to a
 * sibling worker, if Core#balance_move granted one (balance.c sets the
 * switch, the head obeys it); takes it. */
static int take_move(sv_core *core)
{
    int n = atomic_load(&core->balance_moves);
    while (n > 0) {
        if (atomic_compare_exchange_weak(&core->balance_moves, &n, n - 1)) {
            atomic_fetch_add(&core->moved, 1);
            return 1;
        }
    }
    return 0;
}

/* Returns 1 when a body follows, 0 when none does. `length` is the body
 * size when the server knows it (an Array body, a file), else nil. Flags:
 * SV_HEAD_RAW for partial hijack (no framing headers, the application
 * writes the rest); SV_HEAD_NO_HIJACK: a rack.hijack header (a partial
 * hijack) is not for this caller: -1, nothing written. */
int sv_write_head(sv_conn *c, VALUE status, VALUE headers, VALUE length, int flags)
{
    int raw = (flags & SV_HEAD_RAW) != 0;
    int code = status_code(status);
    /* A 1xx is interim: as the final status the client would wait for the
     * real one forever. Only 101 with a partial hijack (the app takes over). */
    if (code < 200 && !(raw && code == 101))
        rb_raise(sv_eBadResponse, "status %d is informational, not a final response", code);
    sv_core *core = c->core;
    const sv_request *r = c->req;
    head_ctx x = {c, code, 0, 0, 0, 0, 0, -1};
    sv_head_rollback(c);
    /* Nothing of a bad head is sent: if anything below raises (a bad header,
     * a head too large), the partial head stays marked, and the next
     * write_head (the error answer) or finish takes it back out
     * (sv_head_rollback). No rb_protect per request. */
    c->head_mark = c->out.len;
    c->head_partial = 1;
    char line[64];
    int n;
    status_line(c, code);
    if (!NIL_P(headers)) {
        if (!RB_TYPE_P(headers, T_HASH))
            headers = rb_convert_type(headers, T_HASH, "Hash", "to_hash");
        rb_hash_foreach(headers, header_i, (VALUE)&x);
        if (x.hijack && (flags & SV_HEAD_NO_HIJACK)) {
            sv_head_rollback(c);
            return -1;
        }
    }
    int bodyless = code < 200 || code == 204 || code == 304;
    /* draining is atomic (serval.h); queued and waiting belong to the
     * scheduler and are read under its lock, only where they are used */
    int draining = atomic_load(&core->draining);
    int busy = 0;
    if (core->opt.balance_close) {
        pthread_mutex_lock(&core->mu);
        busy = core->queued > (size_t)core->waiting;
        pthread_mutex_unlock(&core->mu);
    }
    int keep = r->keep_alive && !draining && c->nreq < core->opt.max_keepalive_requests && !x.conn_close;
    if (keep && core->opt.balance_close && busy)
        keep = 0; /* no thread free here: the client reconnects, maybe to an idle sibling */
    c->head_only = r->method_len == 4 && memcmp(r->method, "HEAD", 4) == 0;
    c->expected = -1;
    if (bodyless) {
        c->mode = SV_MODE_NONE;
    } else if (raw || x.has_te) {
        c->mode = SV_MODE_RAW;
        keep = 0;
    } else if (x.has_cl) {
        c->mode = SV_MODE_LENGTH;
        c->expected = x.app_cl;
    } else if (!NIL_P(length)) {
        c->mode = SV_MODE_LENGTH;
        c->expected = NUM2LL(length);
        n = snprintf(line, sizeof(line), "content-length: %lld\r\n", (long long)c->expected);
        out(c, line, (size_t)n);
    } else if (c->head_only) {
        c->mode = SV_MODE_NONE;
    } else if (r->minor_version >= 1) {
        c->mode = SV_MODE_CHUNKED;
        out(c, "transfer-encoding: chunked\r\n", 28);
    } else {
        c->mode = SV_MODE_RAW;
        keep = 0;
    }
    if (keep && core->opt.balance && take_move(core))
        keep = 0; /* a sibling worker has GVL headroom: this client reconnects there */
    if (r->minor_version >= 1 && !keep)
        out(c, "connection: close\r\n", 19);
    else if (r->minor_version == 0 && keep)
        out(c, "connection: keep-alive\r\n", 24);
    if (!x.has_date) {
        size_t dl;
        const char *d = date_line(&dl);
        out(c, d, dl); /* with the head's closing CRLF */
    } else {
        out(c, "\r\n", 2);
    }
    c->head_partial = 0;
    c->keep_alive = keep;
    c->head_written = 1;
    c->sent_body = 0;
    if (c->head_only)
        c->mode = SV_MODE_NONE;
    return !bodyless && !c->head_only;
}

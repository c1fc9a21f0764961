/*
 * A request on its Ruby thread: Serval::Native::Request, owned by one Ruby
 * thread until #finish, the response head it writes, and thread polls, by
 * which request threads run the event loop's rounds between requests.
 * Sections:
 *
 *   - the response head (sv_write_head): a Rack response's status and
 *     headers serialised into the connection's output buffer;
 *   - the Request object: its blocking writes without the GVL, and its
 *     methods;
 *   - thread polls (sv_polls_*, called by Core#next in core.c): a request
 *     thread runs a round of the loop while the loop thread parks.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <ruby.h>
#include <ruby/thread.h>
#include "serval_ruby.h"
#include "transport.h"
#include "request.h"
#include "conn.h"
#include "env.h"
#include "loop.h"
#include "hooks.h"
#include "errlog.h"
#include "parser.h"

/* ==== the response head ==================================================
 * Serialising a Rack response head into the connection's output buffer. */

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

/* ==== the Request object =================================================
 * Serval::Native::Request - one request, owned by one Ruby thread until
 * #finish. */

static VALUE sv_cRequest, sv_eConnectionError, sv_eWriteTimeout;

#define SV_FINISH_INLINE 16384   /* finish with the GVL held when this little is pending */

typedef struct {
    VALUE core_obj;
    sv_core *core;
    sv_conn *conn;      /* NULL once finished, hijacked or aborted */
    sv_tm *tm_cur;      /* the running timing: &conn->tm (unsampled), tm_obj's record or tm_own; NULL once ended */
    sv_tm *tm_own;      /* an unsampled timing that outlived its connection (detach_timing), or NULL */
    VALUE tm_obj;       /* env["serval.timing"] of a sampled request, or Qnil */
    VALUE env;          /* the env #env built (for #call), or Qnil */
    VALUE finished;     /* its rack.response_finished Array, or Qnil */
    VALUE after;        /* its rack.after_reply Array, or Qnil */
    VALUE hijack_io;    /* the socket of a full hijack (#call), or Qnil */
    int upstream;       /* the env has an X-Request-Start / X-Queue-Start header: 1, 0, or -1 (not known) */
    int counted;        /* in core->running (thread polls, below) until it ends */
    int writing;        /* a write runs without the GVL (flush_blocking): #expire leaves it alone */
} sv_req;

/* The request ended (finished, aborted, hijacked or collected). */
static void ended(sv_req *r)
{
    if (r->counted) {
        r->counted = 0;
        sv_polls_done(r->core);
    }
}

/* Ruby 3.3+: the struct is allocated inside the Request's own slot (no
 * calloc and no free per request); Ruby frees it (or the malloc'd one when
 * it did not fit a slot), req_free only ends the request. Embedding needs
 * the free to run during the GC's sweep (RUBY_TYPED_FREE_IMMEDIATELY):
 * req_free never gives up the GVL, and core->mu, which it may take for an
 * abandoned connection, is never held by code that allocates Ruby objects. */
/* (SV_EMBED, SV_TYPED_EMBEDDABLE: serval_ruby.h) */

static void req_mark(void *p)
{
    sv_req *r = p;
    rb_gc_mark(r->core_obj);
    rb_gc_mark(r->tm_obj);
    rb_gc_mark(r->env);
    rb_gc_mark(r->finished);
    rb_gc_mark(r->after);
    rb_gc_mark(r->hijack_io);
}

static void req_free(void *p)
{
    sv_req *r = p;
    xfree(r->tm_own);
    if (r->conn) /* abandoned without finish: close it */
        sv_conn_give_to_loop_dead(r->conn);
    if (r->core) {
        ended(r);
        sv_core_unref(r->core);
    }
#if !SV_EMBED
    xfree(r);
#endif
}

/* Write-barrier protected (every VALUE field is stored with RB_OBJ_WRITE):
 * an unprotected type takes the GC's slow allocation path, per request. */
static const rb_data_type_t req_type = {
    "Serval::Native::Request",
    {req_mark, req_free, NULL},
    NULL, NULL, RUBY_TYPED_WB_PROTECTED | RUBY_TYPED_FREE_IMMEDIATELY | SV_TYPED_EMBEDDABLE,
};

VALUE sv_request_new(VALUE core_obj, sv_core *core, sv_conn *conn)
{
    sv_req *r;
    VALUE obj = TypedData_Make_Struct(sv_cRequest, sv_req, &req_type, r);
    RB_OBJ_WRITE(obj, &r->core_obj, core_obj);
    r->core = core;
    sv_core_ref(core);
    r->conn = conn;
    r->tm_obj = r->env = r->finished = r->after = r->hijack_io = Qnil;
    r->upstream = -1;
    r->counted = core->polls_on; /* Core#next counted it when it took it (sv_polls_took) */
    return obj;
}

static sv_req *get(VALUE self)
{
    sv_req *r;
    TypedData_Get_Struct(self, sv_req, &req_type, r);
    return r;
}

static sv_conn *conn_of(VALUE self)
{
    sv_req *r = get(self);
    if (!r->conn)
        rb_raise(sv_eConnectionError, "request already finished");
    return r->conn;
}

/* ---- blocking writes without the GVL ------------------------------------ */

typedef struct {
    sv_conn *c;
    size_t until;        /* stop once pending bytes <= until */
    int result;          /* 1 done, -1 error, -2 timeout, 0 interrupted */
} flush_args;

/* Response bytes not sent yet: the output buffer, then the file (a spill or to_path). */
static size_t pending(sv_conn *c)
{
    return c->out.len - c->out.off + (size_t)c->file_rem;
}

static void *flush_nogvl(void *p)
{
    flush_args *a = p;
    sv_conn *c = a->c;
    for (;;) {
        int r = sv_conn_flush(c);
        if (r < 0) {
            a->result = -1;
            return NULL;
        }
        if (r == 1 || pending(c) <= a->until) {
            a->result = 1;
            return NULL;
        }
        /* the transport says which way the socket must turn (TLS may need it readable) */
        struct pollfd pfd = {c->fd, c->io->events(c, EPOLLOUT) & EPOLLIN ? POLLIN : POLLOUT, 0};
        int ms = (int)(c->core->opt.write_timeout * 1000);
        int pr = poll(&pfd, 1, ms);
        if (pr == 0) {
            a->result = -2;
            return NULL;
        }
        if (pr < 0 && errno == EINTR) {
            a->result = 0;
            return NULL;
        }
    }
}

static void flush_blocking(VALUE self, sv_conn *c, size_t until)
{
    flush_args a = {c, until, 0};
    sv_req *r = get(self);
    while (a.result == 0) {
        r->writing = 1;
        rb_thread_call_without_gvl(flush_nogvl, &a, RUBY_UBF_IO, NULL);
        r->writing = 0;
        if (a.result == 0)
            rb_thread_check_ints();
    }
    if (a.result == -2)
        rb_raise(sv_eWriteTimeout, "client did not read the response within write_timeout");
    if (a.result == -1)
        rb_raise(sv_eConnectionError, "client closed the connection");
}

/* How many of `want` more bytes the output buffer takes now: it grows up to
 * output_buffer, within the process's output_budget; 0 when full. Sent
 * bytes at its front are reclaimed when at least as many were sent as are
 * left (so a slow client never makes us move a big buffer for a few bytes). */
static size_t out_room(sv_conn *c, size_t want)
{
    sv_options *o = &c->core->opt;
    sv_buf *b = &c->out;
    size_t used = b->len - b->off;
    if (used >= o->output_buffer)
        return 0;
    if (want > o->output_buffer - used)
        want = o->output_buffer - used;
    if (b->off > 0 && b->len + want > b->cap && b->off >= used) {
        memmove(b->data, b->data + b->off, used);
        b->len = used;
        b->off = 0;
    }
    size_t grow = b->len >= o->output_buffer ? 0 : o->output_buffer - b->len;
    if (grow > want)
        grow = want;
    if (grow > 0 && b->len + grow > b->cap)
        (void)sv_buf_reserve_budget(b, grow, o->output_buffer, o->output_budget);
    return b->cap - b->len < want ? b->cap - b->len : want;
}

/* Append body bytes: to the output buffer while it has room (see out_room);
 * when it is full, to the socket if the client keeps up (a non-blocking
 * send that frees an eighth of output_buffer or more); else to the
 * response's spill, an unlinked temp file the loop sends from once the
 * response is done, so the thread is free whatever the body's size. When
 * the spill is refused (max_spill reached, no disk), the thread waits for
 * the client instead (without the GVL, up to write_timeout): memory never
 * grows past the limits. Once spilled, every later byte goes to the file,
 * after the buffer: the order on the wire is the order of the writes. */
static void append_body(VALUE self, sv_conn *c, const char *p, size_t n)
{
    sv_core *core = c->core;
    while (n > 0) {
        size_t take = 0;
        if (c->file_fd < 0 && (take = out_room(c, n)) > 0) {
            memcpy(c->out.data + c->out.len, p, take);
            c->out.len += take;
        } else if (c->file_fd < 0 && !c->spill_failed) {
            size_t before = pending(c);
            if (sv_conn_flush(c) < 0)
                rb_raise(sv_eConnectionError, "client closed the connection");
            if (pending(c) == 0 || before - pending(c) >= core->opt.output_buffer / 8)
                continue;
            take = sv_conn_spill(c, p, n);
        } else {
            take = sv_conn_spill(c, p, n);
        }
        if (take == 0 && pending(c) == 0 && c->file_fd < 0)
            rb_raise(rb_eNoMemError, "cannot buffer response");
        if (take == 0) {
            /* nothing fits: wait until the client took half the buffer, or
             * everything when a file is in the way */
            atomic_fetch_add(&core->spill_waits, 1);
            flush_blocking(self, c, c->file_fd >= 0 ? 0 : (c->out.len - c->out.off) / 2);
            continue;
        }
        p += take;
        n -= take;
    }
}

/* Send what is buffered now: one non-blocking attempt with the GVL held (the
 * usual case: the socket has room); if the client is behind, wait for it
 * without the GVL, bounded by write_timeout. Streamed bodies call this after
 * every chunk so each one reaches the socket when the app yields it. */
static void flush_now(VALUE self, sv_conn *c)
{
    if (pending(c) == 0)
        return;
    int r = sv_conn_flush(c);
    if (r < 0)
        rb_raise(sv_eConnectionError, "client closed the connection");
    if (pending(c) > 0)
        flush_blocking(self, c, 0);
}

/* ---- methods ------------------------------------------------------------ */

static VALUE req_hijack(VALUE self);

/* env(template): the request's env (ext/serval/env.c). env["rack.hijack"]
 * is this Request (#call); its callback Arrays are kept for #callbacks. */
static VALUE req_env(VALUE self, VALUE tmpl)
{
    Check_Type(tmpl, T_HASH);
    sv_req *r = get(self);
    sv_conn *c = conn_of(self);
    VALUE finished, after;
    int upstream;
    VALUE env = sv_build_env(c, tmpl, self, &finished, &after, &upstream);
    RB_OBJ_WRITE(self, &r->env, env);
    RB_OBJ_WRITE(self, &r->finished, finished);
    RB_OBJ_WRITE(self, &r->after, after);
    r->upstream = upstream;
    return env;
}

/* call: env["rack.hijack"].call, a full hijack: the socket leaves the core
 * and becomes the app's IO, also in env["rack.hijack_io"]. Again: the same IO. */
static VALUE req_call(VALUE self)
{
    sv_req *r = get(self);
    if (NIL_P(r->hijack_io)) {
        VALUE fd = req_hijack(self);
        VALUE hijack = rb_path2class("Serval::Hijack");
        RB_OBJ_WRITE(self, &r->hijack_io, rb_funcall(hijack, rb_intern("socket_for"), 1, fd));
    }
    if (!NIL_P(r->env))
        rb_hash_aset(r->env, rb_str_new_cstr("rack.hijack_io"), r->hijack_io);
    return r->hijack_io;
}

static VALUE req_hijacked_p(VALUE self)
{
    return NIL_P(get(self)->hijack_io) ? Qfalse : Qtrue;
}

/* callbacks: [rack.response_finished, rack.after_reply] as #env made them,
 * or nil when both are empty (the usual case: nothing to run). */
static VALUE req_callbacks(VALUE self)
{
    sv_req *r = get(self);
    long n = (NIL_P(r->finished) ? 0 : RARRAY_LEN(r->finished)) + (NIL_P(r->after) ? 0 : RARRAY_LEN(r->after));
    if (n == 0)
        return Qnil;
    return rb_assoc_new(NIL_P(r->finished) ? rb_ary_new() : r->finished, NIL_P(r->after) ? rb_ary_new() : r->after);
}

static VALUE req_body(VALUE self)
{
    sv_conn *c = conn_of(self);
    const sv_request *r = c->req;
    if (c->body_in_place)
        return rb_str_new(c->in.data + r->head_len, (long)r->content_length);
    if (c->body_fd >= 0) {
        int fd = c->body_fd;
        c->body_fd = -1;
        lseek(fd, 0, SEEK_SET);
        return INT2NUM(fd);
    }
    if (r->chunked || c->body.len > 0)
        return rb_str_new(c->body.data ? c->body.data : "", (long)c->body.len);
    return Qnil;
}

static VALUE req_write_head(int argc, VALUE *argv, VALUE self)
{
    VALUE status, headers, length, raw;
    rb_scan_args(argc, argv, "31", &status, &headers, &length, &raw);
    return sv_write_head(conn_of(self), status, headers, length, RTEST(raw) ? SV_HEAD_RAW : 0) ? Qtrue : Qfalse;
}

/* Body bytes of the current response, framed as write_head decided. */
static void write_body(VALUE self, sv_conn *c, VALUE str)
{
    size_t n = (size_t)RSTRING_LEN(str);
    if (n == 0 || c->mode == SV_MODE_NONE)
        return;
    if (c->mode == SV_MODE_LENGTH) {
        uint64_t room = c->expected > c->sent_body ? (uint64_t)(c->expected - c->sent_body) : 0;
        if (n > room) {
            n = (size_t)room; /* more than content-length: never sent, connection closed */
            c->keep_alive = 0;
        }
    }
    if (c->mode == SV_MODE_CHUNKED) {
        char hex[24];
        int hl = snprintf(hex, sizeof(hex), "%zx\r\n", n);
        append_body(self, c, hex, (size_t)hl);
        append_body(self, c, RSTRING_PTR(str), n);
        append_body(self, c, "\r\n", 2);
    } else {
        append_body(self, c, RSTRING_PTR(str), n);
    }
    c->sent_body += (int64_t)n;
    RB_GC_GUARD(str);
}

static VALUE req_write(VALUE self, VALUE str)
{
    sv_conn *c = conn_of(self);
    StringValue(str);
    write_body(self, c, str);
    return Qnil;
}

/* respond(status, headers, body): the whole response of a plain Array body
 * of Strings in one call (the head with its content-length, then the
 * chunks), :array (a plain Array has no close to call); true with nothing
 * written after a full hijack (the app has the socket). For any other body,
 * or a rack.hijack response header, false with nothing written:
 * ResponseWriter#write takes those. */
static VALUE sym_array;
static VALUE req_respond(VALUE self, VALUE status, VALUE headers, VALUE body)
{
    if (!NIL_P(get(self)->hijack_io))
        return Qtrue; /* the app took the socket (rack.hijack): nothing to write */
    sv_conn *c = conn_of(self);
    if (rb_obj_class(body) != rb_cArray)
        return Qfalse;
    uint64_t length = 0;
    for (long i = 0; i < RARRAY_LEN(body); i++) {
        VALUE s = RARRAY_AREF(body, i);
        if (!RB_TYPE_P(s, T_STRING))
            return Qfalse;
        length += (uint64_t)RSTRING_LEN(s);
    }
    int more = sv_write_head(c, status, headers, ULL2NUM(length), SV_HEAD_NO_HIJACK);
    if (more < 0)
        return Qfalse;
    for (long i = 0; more && i < RARRAY_LEN(body); i++) {
        VALUE s = RARRAY_AREF(body, i);
        if (RB_TYPE_P(s, T_STRING)) /* still: a write may have let another thread run */
            write_body(self, conn_of(self), s);
    }
    return sym_array;
}

static VALUE req_flush(VALUE self)
{
    flush_now(self, conn_of(self));
    return Qnil;
}

/* write + one non-blocking send, never a wait: a chunk of a generated body
 * of known length reaches a client that keeps up when it is made (a slow
 * producer's first bytes are not held back until the buffer fills); when
 * the client is behind, the bytes stay in the buffer or the spill for the
 * loop (append_body) and the thread goes on. Once spilled, the file is the
 * loop's to send. */
static VALUE req_write_nowait(VALUE self, VALUE str)
{
    req_write(self, str);
    sv_conn *c = conn_of(self);
    if (c->file_fd < 0 && pending(c) > 0 && sv_conn_flush(c) < 0)
        rb_raise(sv_eConnectionError, "client closed the connection");
    return Qnil;
}

/* write + flush: one chunk of a streamed body. */
static VALUE req_stream_write(VALUE self, VALUE str)
{
    req_write(self, str);
    flush_now(self, conn_of(self));
    return Qnil;
}

static VALUE req_sendfile(VALUE self, VALUE fd, VALUE offset, VALUE length)
{
    sv_conn *c = conn_of(self);
    if (c->mode != SV_MODE_LENGTH)
        return Qfalse;
    uint64_t len = NUM2ULL(length);
    if (c->file_fd >= 0)
        flush_blocking(self, c, 0); /* a file before this one (a spill): sent first, then closed */
    int dup = fcntl(NUM2INT(fd), F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        rb_sys_fail("dup");
    c->file_fd = dup;
    c->file_off = (off_t)NUM2LL(offset);
    c->file_rem = len;
    c->sent_body += (int64_t)len;
    return Qtrue;
}

static void *done_nogvl(void *p)
{
    sv_conn_response_done(p, 0);
    return NULL;
}

/* The request's timing ends, if it began (once); the sampled request's
 * Timing, or nil. An unsampled record lives in the connection, which the
 * next request reuses: tm_cur lets go of it here. */
static VALUE timing_end(sv_req *r, double *ended)
{
    if (r->tm_cur) {
        sv_hooks.end(r->tm_cur); /* set: tm_cur is only set by begin */
        if (ended)
            *ended = (double)r->tm_cur->end_ns / 1e9;
        r->tm_cur = NULL;
    }
    return r->tm_obj;
}

/* The connection leaves the request before #finish (abort, hijack): a
 * running unsampled timing moves out of it, to end at #finish as before. */
static void detach_timing(sv_req *r)
{
    if (r->conn && r->tm_cur == &r->conn->tm) {
        r->tm_own = ALLOC(sv_tm);
        *r->tm_own = r->conn->tm;
        r->tm_cur = r->tm_own;
    }
}

/* finish: the request's timing ends (when it began: before the client can
 * see the response, so stats never lag it), then what is left of the
 * response goes out and the connection goes back to the loop (a no-op
 * after a hijack or an abort). Returns the sampled request's Timing, or nil. */
static VALUE req_finish(VALUE self)
{
    sv_req *r = get(self);
    double end_at = 0; /* the timing's end: the clock for the connection's keep-alive wait, read once */
    VALUE timing = timing_end(r, &end_at);
    sv_conn *c = r->conn;
    if (!c)
        return timing;
    sv_head_rollback(c); /* a head that raised midway is not sent */
    if (c->mode == SV_MODE_CHUNKED)
        append_body(self, c, "0\r\n\r\n", 5);
    else if (c->mode == SV_MODE_LENGTH && c->sent_body != c->expected)
        c->keep_alive = 0; /* body shorter than declared: the client sees the close */
    r->conn = NULL;
    ended(r);
    if (pending(c) <= SV_FINISH_INLINE)
        sv_conn_response_done(c, end_at);
    else
        rb_thread_call_without_gvl(done_nogvl, c, RUBY_UBF_IO, NULL);
    return timing;
}

static VALUE req_abort(VALUE self)
{
    sv_req *r = get(self);
    if (r->conn) {
        detach_timing(r);
        sv_conn_give_to_loop_dead(r->conn);
        r->conn = NULL;
    }
    ended(r);
    return Qnil;
}

/* expire(status, message) -> true when the client was answered `status`
 * (with connection: close) and the connection left the request; false when
 * nothing could be sent: the request ended, was hijacked, its head is out
 * or a write of it runs without the GVL. Called by the request-timeout
 * watchdog (lib/serval/request_timeout.rb) from its own thread while the
 * request's thread still runs the app: every Request method runs with the
 * GVL and finds no connection afterwards (ConnectionError, or a no-op in
 * #finish and #abort), so the app's late response goes nowhere. */
static VALUE req_expire(VALUE self, VALUE status, VALUE message)
{
    sv_req *r = get(self);
    sv_conn *c = r->conn;
    if (!c || r->writing || c->head_written)
        return Qfalse;
    int code = NUM2INT(status);
    const char *msg = StringValueCStr(message);
    const char *phrase = sv_reason_phrase(code);
    char head[512];
    int blen = (int)strlen(msg) + 1;
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                     "content-length: %d\r\nconnection: close\r\n\r\n%s\n",
                     code, *phrase ? phrase : "Error", blen, msg);
    if (n < 0 || n >= (int)sizeof(head))
        rb_raise(rb_eArgError, "message too long");
    c->out.len = c->out.off = 0;
    c->file_rem = 0;
    if (sv_buf_append(&c->out, head, (size_t)n, (size_t)n + SV_OUT_MIN) != 0)
        return Qfalse;
    c->keep_alive = 0;
    c->close_after = 1;
    sv_errlog_push(&c->core->errlog, code, *phrase ? phrase : "Error", msg, c->remote);
    detach_timing(r);
    r->conn = NULL;
    ended(r);
    sv_conn_response_done(c, sv_now());
    return Qtrue;
}

static VALUE req_hijack(VALUE self)
{
    sv_req *r = get(self);
    sv_conn *c = conn_of(self);
    if (c->tls)
        rb_raise(sv_eConnectionError, "hijack is not supported on TLS connections");
    if (pending(c) > 0)
        flush_blocking(self, c, 0);
    epoll_ctl(c->core->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    int fd = c->fd;
    c->fd = -1;
    detach_timing(r);
    r->conn = NULL;
    ended(r);
    sv_conn_give_to_loop_dead(c);
    return INT2NUM(fd);
}

static int hint_i(VALUE key, VALUE val, VALUE arg)
{
    VALUE lines = (VALUE)arg;
    VALUE k = rb_obj_as_string(key);
    VALUE list = RB_TYPE_P(val, T_ARRAY) ? val : rb_str_split(rb_obj_as_string(val), "\n");
    for (long i = 0; i < RARRAY_LEN(list); i++) {
        VALUE v = rb_obj_as_string(RARRAY_AREF(list, i));
        if (memchr(RSTRING_PTR(v), '\r', (size_t)RSTRING_LEN(v)) || memchr(RSTRING_PTR(v), '\n', (size_t)RSTRING_LEN(v)) ||
            memchr(RSTRING_PTR(k), '\r', (size_t)RSTRING_LEN(k)) || memchr(RSTRING_PTR(k), '\n', (size_t)RSTRING_LEN(k)) ||
            memchr(RSTRING_PTR(k), ':', (size_t)RSTRING_LEN(k)))
            rb_raise(sv_eBadResponse, "invalid early hints header");
        rb_str_append(lines, k);
        rb_str_cat(lines, ": ", 2);
        rb_str_append(lines, v);
        rb_str_cat(lines, "\r\n", 2);
    }
    return ST_CONTINUE;
}

static VALUE req_early_hints(VALUE self, VALUE headers)
{
    sv_conn *c = conn_of(self);
    if (c->req->minor_version < 1 || c->out.len > 0)
        return Qfalse; /* no 1xx to HTTP/1.0 clients, nor after the final head */
    VALUE s = rb_str_new_cstr("HTTP/1.1 103 Early Hints\r\n");
    rb_hash_foreach(rb_convert_type(headers, T_HASH, "Hash", "to_hash"), hint_i, (VALUE)s);
    rb_str_cat(s, "\r\n", 2);
    append_body(self, c, RSTRING_PTR(s), (size_t)RSTRING_LEN(s));
    flush_blocking(self, c, 0);
    c->out.len = c->out.off = 0;
    return Qtrue;
}

/* The request's timing begins (hooks.h begin: timing.c when attached; no
 * timing when nothing is). every: one in every requests is sampled into a
 * Timing object, which goes into the env under serval.timing. */
static VALUE timing_begin(VALUE self, sv_req *r, VALUE env, VALUE every)
{
    unsigned long n = NUM2ULONG(every);
    if (!sv_hooks.begin)
        return Qnil;
    sv_tm *plain;
    if (r->conn) {
        plain = &r->conn->tm;
    } else { /* no connection left (a test's late call): a record of its own */
        if (!r->tm_own)
            r->tm_own = ALLOC(sv_tm);
        plain = r->tm_own;
    }
    VALUE obj = Qnil;
    r->tm_cur = sv_hooks.begin(plain, env, r->conn ? r->conn->queued_at : 0.0, n, r->upstream != 0, &obj);
    if (!NIL_P(obj))
        RB_OBJ_WRITE(self, &r->tm_obj, obj);
    return r->tm_obj;
}

static VALUE req_timing_begin(VALUE self, VALUE env, VALUE every)
{
    return timing_begin(self, get(self), env, every);
}

/* The handler's first call (lib/serval/request_handler.rb): the env, and
 * with timing on (every: one in every requests is sampled; nil: off) the
 * request's timing started, in one call. */
static VALUE req_start(VALUE self, VALUE tmpl, VALUE every)
{
    VALUE env = req_env(self, tmpl);
    if (!NIL_P(every))
        timing_begin(self, get(self), env, every);
    return env;
}

static VALUE req_timing_end(VALUE self)
{
    return timing_end(get(self), NULL);
}

double sv_request_queued_at(VALUE self)
{
    sv_req *r = get(self);
    return r->conn ? r->conn->queued_at : 0.0;
}

static VALUE req_queued_at(VALUE self)
{
    return DBL2NUM(conn_of(self)->queued_at);
}

static VALUE req_head_written_p(VALUE self)
{
    sv_req *r = get(self);
    return !r->conn || r->conn->head_written ? Qtrue : Qfalse;
}

void sv_init_request(VALUE mNative)
{
    sv_eConnectionError = rb_path2class("Serval::ConnectionError");
    sv_eWriteTimeout = rb_path2class("Serval::WriteTimeout");
    rb_gc_register_mark_object(sv_eConnectionError);
    rb_gc_register_mark_object(sv_eWriteTimeout);
    sv_cRequest = rb_define_class_under(mNative, "Request", rb_cObject);
    rb_undef_alloc_func(sv_cRequest);
    sym_array = ID2SYM(rb_intern("array"));
    rb_define_method(sv_cRequest, "env", req_env, 1);
    rb_define_method(sv_cRequest, "start", req_start, 2);
    rb_define_method(sv_cRequest, "body", req_body, 0);
    rb_define_method(sv_cRequest, "write_head", req_write_head, -1);
    rb_define_method(sv_cRequest, "write", req_write, 1);
    rb_define_method(sv_cRequest, "respond", req_respond, 3);
    rb_define_method(sv_cRequest, "flush", req_flush, 0);
    rb_define_method(sv_cRequest, "stream_write", req_stream_write, 1);
    rb_define_method(sv_cRequest, "write_nowait", req_write_nowait, 1);
    rb_define_method(sv_cRequest, "sendfile", req_sendfile, 3);
    rb_define_method(sv_cRequest, "finish", req_finish, 0);
    rb_define_method(sv_cRequest, "abort", req_abort, 0);
    rb_define_method(sv_cRequest, "expire", req_expire, 2);
    rb_define_method(sv_cRequest, "hijack", req_hijack, 0);
    rb_define_method(sv_cRequest, "call", req_call, 0);
    rb_define_method(sv_cRequest, "hijacked?", req_hijacked_p, 0);
    rb_define_method(sv_cRequest, "callbacks", req_callbacks, 0);
    rb_define_method(sv_cRequest, "early_hints", req_early_hints, 1);
    rb_define_method(sv_cRequest, "queued_at", req_queued_at, 0);
    rb_define_method(sv_cRequest, "head_written?", req_head_written_p, 0);
    rb_define_method(sv_cRequest, "timing_begin", req_timing_begin, 2);
    rb_define_method(sv_cRequest, "timing_end", req_timing_end, 0);
}

/* ==== thread polls =======================================================
 * Thread polls: request threads run the event loop's rounds themselves
 * between requests, so that a request arriving while Ruby runs wakes no
 * thread (docs/DESIGN.md "Thread polls", bench/NOTES.md).
 *
 * Without it every burst of arrivals wakes the loop thread, which preempts
 * the thread that holds the GVL, reads, queues and wakes a sleeping request
 * thread, which preempts again only to wait for the GVL: 0.4 context
 * switches per hello request. With it:
 *
 *   - after a round that queued work for running threads, the loop thread
 *     parks (loop.c park) instead of waiting on the epoll: core->duty;
 *   - a request thread in Core#next whose queue is empty, or whose last poll
 *     is SV_POLL_EVERY_MS old, takes poll_mu (trylock), runs one round
 *     without waiting (sv_loop_poll) and takes the first request queued;
 *   - a queued request wakes no sleeping thread (loop.c dispatch): one
 *     thread takes them in turn while it can run. A second thread is woken
 *     when the running one gives the GVL away inside a request (Ruby's
 *     thread event hook, SUSPENDED: a database call, or a fairness switch
 *     away from a long computation), or by the parked loop when no request
 *     was taken for SV_PARK_MS;
 *   - a thread that holds a request and waits for the GVL goes first: one
 *     that took it while asleep (woken before the duty began), or one whose
 *     young request (under SV_YOUNG_MS) a fairness switch interrupted (the
 *     thread had held the GVL for a slice of back-to-back requests). The
 *     thread that has the GVL goes to sleep at its next Core#next
 *     (sv_polls_yield) instead of taking the queue for a whole slice;
 *   - a thread that goes to sleep with nothing to do ends the duty (core.c
 *     wait_nogvl): the loop waits on the epoll again, so that arrivals are
 *     read while the remaining threads compute. A parked loop that sees no
 *     poll for SV_PARK_MS does the same and wakes threads for what waits.
 *
 * It needs the thread event hook (Ruby 3.3 here: the same test as gvl.c); on
 * Ruby 3.1 and 3.2 the loop thread reads every request and wakes a thread for
 * it. On 3.3 it is the one dispatch path of every mode:
 *
 *   - cluster balancing (loop.c): a thread running a round from Core#next
 *     counts as a free thread (it takes a request right after); the
 *     listeners follow the free threads and the hold after every round,
 *     whoever ran it (balance_listeners), and an accept obeys a hold at once;
 *   - load shedding (loop.c shed): the same takers, the waiting threads and
 *     the one polling, decide whether a request waits behind others;
 *   - TLS: a round run with the GVL leaves a connection still in its
 *     handshake to the loop thread (loop.c leave_to_loop_thread: armed
 *     again, and the duty ends), so that the handshake's CPU is spent
 *     without the GVL; an open session's reads are a request thread's work;
 *   - threads :auto and the I/O lane measure requests as before: a request's
 *     queue time runs until a thread starts it, whether it waited for a
 *     woken thread and the GVL or for the running thread. */

/* The core whose request this thread holds (for the hook), when it took
 * it, and whether a fairness switch took the GVL from it mid-request. */
static __thread sv_core *held_core;
static __thread double held_since;
static __thread int held_preempted;

#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
/* SUSPENDED: a thread that holds a request gave the GVL away. A blocking
 * call in the application: while requests wait, a sleeping thread is woken
 * to take one; with none queued the loop thread takes its epoll back, to
 * read what arrives while this one waits. A fairness switch (fairness.c): the GVL goes to a thread
 * already waiting; noted, so that when that thread reaches Core#next it
 * leaves the queue to this one if its request is young (sv_polls_yield).
 * RESUMED: that thread has the GVL again. Runs on the thread itself. */
static void polls_hook(rb_event_flag_t ev, const rb_internal_thread_event_data_t *d, void *data)
{
    (void)d;
    (void)data;
    sv_core *core = held_core;
    if (!core)
        return;
    if (ev == RUBY_INTERNAL_THREAD_EVENT_RESUMED) {
        if (held_preempted) {
            held_preempted = 0;
            atomic_fetch_sub(&core->preempted, 1);
        }
        return;
    }
    if (sv_gvl_yielding) {
        if (!held_preempted) {
            held_preempted = 1;
            atomic_store(&core->preempted_since, held_since);
            atomic_fetch_add(&core->preempted, 1);
        }
        if (sv_now() - held_since < SV_YOUNG_MS / 1000.0)
            return;
        /* a long computation: the requests that wait get their own thread
         * to share the GVL with it, as without thread polls */
    }
    if (!atomic_load(&core->duty))
        return;
    pthread_mutex_lock(&core->mu);
    if (core->q_head) {
        if (core->waking < (int)core->queued)
            sv_wake_dispatched(core);
    } else {
        /* nothing queued: while this thread waits, the loop thread reads
         * what arrives (no thread would poll before this one is back) */
        sv_loop_unpark_locked(core);
    }
    pthread_mutex_unlock(&core->mu);
}
#endif

void sv_polls_start(sv_core *core)
{
    core->polls_on = 0;
#ifdef HAVE_RB_INTERNAL_THREAD_SPECIFIC_GET
    if (!core->opt.thread_polls)
        return;
    static int hooked;
    if (!hooked) {
        hooked = 1;
        rb_internal_thread_add_event_hook(polls_hook,
                                          RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_RESUMED, NULL);
    }
    core->polls_on = 1;
#endif
}

void sv_polls_took(sv_core *core, double now)
{
    atomic_fetch_add(&core->running, 1);
    if (now <= 0)
        now = sv_now();
    atomic_store(&core->last_take, now);
    held_since = now;
    held_core = core;
}

/* This thread no longer holds a request of held_core. */
static void release_held(void)
{
    if (held_core && held_preempted)
        atomic_fetch_sub(&held_core->preempted, 1);
    held_preempted = 0;
    held_core = NULL;
}

void sv_polls_done(sv_core *core)
{
    atomic_fetch_sub(&core->running, 1);
    if (held_core == core)
        release_held(); /* on another thread (a hijacked socket's), Core#next clears it */
}

/* With the GVL: without it a thread that waits for the GVL would overtake
 * this one; the round is short and never waits (timeout 0). */
int sv_polls_poll(sv_core *core, int queue_empty, double *now)
{
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    if (!queue_empty) {
        *now = sv_now();
        if (*now - atomic_load(&core->last_poll) <= SV_POLL_EVERY_MS / 1000.0)
            return 0;
    }
    if (pthread_mutex_trylock(&core->poll_mu) != 0)
        return 0; /* the loop thread has the epoll, or another thread polls */
    int ran = atomic_load(&core->duty);
    if (ran) {
        core->gvl_round = 1; /* this thread is a taker; TLS handshakes go to the loop thread (loop.c) */
        sv_loop_poll(core, 0);
        core->gvl_round = 0;
        *now = atomic_load(&core->last_poll); /* the round's start */
        atomic_fetch_add(&core->polled_rounds, 1);
    }
    pthread_mutex_unlock(&core->poll_mu);
    return ran;
}

/* Nothing is queued and this thread has nothing to do: rather than give the
 * epoll back to the loop thread and sleep (the loop thread would wake for
 * the next arrival, dispatch it and wake this thread: three context
 * switches), it waits on the epoll itself, so the arrival wakes the thread
 * that takes it. At most SV_PARK_MS: after that the loop thread takes the
 * epoll back as before (wait_nogvl), and last_poll keeps the parked loop
 * from doing so while this one waits. */
int sv_polls_wait(sv_core *core)
{
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    if (pthread_mutex_trylock(&core->poll_mu) != 0)
        return 0; /* the loop thread has the epoll, or another thread polls */
    int ran = atomic_load(&core->duty);
    if (ran) {
        atomic_store(&core->poll_waiting, 1);
        atomic_store(&core->last_poll, sv_now());
        sv_loop_poll(core, SV_PARK_MS);
        atomic_store(&core->poll_waiting, 0);
        atomic_fetch_add(&core->polled_rounds, 1);
        atomic_fetch_add(&core->polled_waits, 1);
    }
    pthread_mutex_unlock(&core->poll_mu);
    return ran;
}

int sv_polls_yield(sv_core *core)
{
    release_held(); /* this thread's request has ended */
    if (!core->polls_on || !atomic_load(&core->duty))
        return 0;
    return atomic_load(&core->unstarted) > 0 ||
           (atomic_load(&core->preempted) > 0 &&
            sv_now() - atomic_load(&core->preempted_since) < SV_YOUNG_MS / 1000.0);
}

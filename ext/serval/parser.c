/*
 * Serval's strict HTTP/1.1 request parser (RFC 9112 / RFC 9110).
 *
 * Written from the RFC grammar. No Ruby API, no allocation, no mutable
 * globals: every function works on the caller's buffer with explicit lengths.
 *
 * Strictness choices (deliberate, documented here once):
 *   - Lines end in CRLF only. A bare LF or a bare CR anywhere in the head
 *     (or in chunk framing) is rejected with 400; RFC 9112 2.2 allows a
 *     recipient to accept a bare LF, we do not, because lenient line-ending
 *     handling is a classic request-smuggling vector.
 *   - obs-fold is rejected (400), as RFC 9112 5.2 permits.
 *   - Whitespace between a field name and the colon is rejected (400).
 *   - Transfer-Encoding: only "chunked" is implemented; any other coding -> 501.
 *   - Framing fields take no lists: an empty Transfer-Encoding element
 *     (",chunked") and any repeated or comma-listed Content-Length ("5, 5",
 *     two "5" fields) -> 400, as nginx and Puma do, although RFC 9110 lets a
 *     recipient accept identical values: a lenient proxy in front could frame
 *     them differently.
 *   - Request-targets: any byte except controls, SP and DEL is accepted
 *     (browsers and Node send '|', '{', '^', raw UTF-8), since none of them
 *     can change framing; a fragment ("#...") is stripped.
 *   - HTTP/1.x with x > 1 is served as HTTP/1.1 (RFC 9110 2.5); other major
 *     versions -> 505.
 *   - Bytes that cannot start a request line (a TLS ClientHello on a plain
 *     port) -> 400 at once, not after the read timeout.
 */
#include "parser.h"

#include <arpa/inet.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

/* ---- named limits and constants ---------------------------------------- */

#define SV_CL_DIGITS_MAX 18        /* Content-Length digits; more -> 400 (int64 overflow guard) */
#define SV_PORT_DIGITS_MAX 5       /* digits of a port in Host / authority */
#define SV_VERSION_LEN 8           /* strlen("HTTP/1.1") */
#define SV_CRLF_LEN 2

/* ---- character classes ------------------------------------------------- */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int hex_val(unsigned char c)
{
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t'; }

/* tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." /
 *         "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA          (RFC 9110 5.6.2)
 * A table: every byte of a method and a field name is looked up (test/c
 * checks it against the grammar above for all 256 bytes). */
const unsigned char sv_tchar_table[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1,
    ['+'] = 1, ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

#define TCHAR(c) (sv_tchar_table[(unsigned char)(c)])

/* field-vchar / obs-text / SP / HTAB (RFC 9110 5.5) */
static int is_value_char(unsigned char c)
{
    return (c >= 0x21 && c != 0x7f) || c == ' ' || c == '\t';
}

/* ---- eight bytes a step ------------------------------------------------
 * Scans that look at every byte of a head (line ends, value and target
 * bytes) test a word of 8 bytes at once and look at single bytes only in a
 * word that may hold one they stop at. For a word w, below(w, n) has the top
 * bit of a byte set when that byte is < n (n <= 128; bytes >= 0x80 never),
 * and for the lowest such byte exactly; equal(w, c) likewise for bytes == c
 * (Hacker's Delight's zero-byte test: a borrow only runs towards higher
 * bytes, which come later in memory on a little-endian machine, so a set bit
 * can be wrong only above a right one). Big-endian machines take the plain
 * byte loops. */
#define SV_ONES 0x0101010101010101ull
#define SV_HIGHS 0x8080808080808080ull
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SV_SWAR 1
#else
#define SV_SWAR 0
#endif

static inline uint64_t load8(const char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

static inline uint64_t below(uint64_t w, unsigned n) { return (w - SV_ONES * n) & ~w & SV_HIGHS; }
static inline uint64_t equal(uint64_t w, unsigned char c) { return below(w ^ (SV_ONES * c), 1); }

/* Bytes we accept in a request-target: anything but controls, SP and DEL.
 * RFC 3986 forbids '|', '{', '^', '"' and raw non-ASCII unencoded, but
 * browsers and Node send them and nginx and Puma serve them; they cannot
 * change framing, which only SP, CR and LF could. */
static int is_target_char(unsigned char c)
{
    return c > 0x20 && c != 0x7f;
}

/* Whether every byte of p[0..n) is a field value byte (is_value_char). */
static int all_value_chars(const char *p, size_t n)
{
    size_t i = 0;
#if SV_SWAR
    for (; i + 8 <= n; i += 8) {
        uint64_t w = load8(p + i);
        if ((below(w, 0x20) | equal(w, 0x7f)) == 0)
            continue; /* no control byte: every byte is one (tabs are the only controls allowed) */
        for (size_t k = i; k < i + 8; k++)
            if (!is_value_char((unsigned char)p[k])) return 0;
    }
#endif
    for (; i < n; i++)
        if (!is_value_char((unsigned char)p[i])) return 0;
    return 1;
}

/* Whether every byte of p[0..n) is a request-target byte (is_target_char). */
static int all_target_chars(const char *p, size_t n)
{
    size_t i = 0;
#if SV_SWAR
    for (; i + 8 <= n; i += 8) {
        uint64_t w = load8(p + i);
        if ((below(w, 0x21) | equal(w, 0x7f)) != 0) return 0;
    }
#endif
    for (; i < n; i++)
        if (!is_target_char((unsigned char)p[i])) return 0;
    return 1;
}

/* unreserved / sub-delims (RFC 3986), the bytes of a reg-name besides
 * pct-encoded: "-" / "." / "_" / "~" / "!" / "$" / "&" / "'" / "(" / ")" /
 * "*" / "+" / "," / ";" / "=" / DIGIT / ALPHA. A table: every byte of every
 * Host goes through it (test/c checks it against this grammar). */
const unsigned char sv_regname_table[256] = {
    ['-'] = 1, ['.'] = 1, ['_'] = 1, ['~'] = 1, ['!'] = 1, ['$'] = 1, ['&'] = 1, ['\''] = 1,
    ['('] = 1, [')'] = 1, ['*'] = 1, ['+'] = 1, [','] = 1, [';'] = 1, ['='] = 1,
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

static int is_regname_char(unsigned char c) { return sv_regname_table[c]; }

static int lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

/* case-insensitive equality of p[0..n) with the NUL-terminated lowercase lit */
static int ieq(const char *p, size_t n, const char *lit)
{
    size_t ln = strlen(lit);
    if (n != ln) return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)p[i]) != (unsigned char)lit[i]) return 0;
    return 1;
}

static int all_tchar(const char *p, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!TCHAR(p[i])) return 0;
    return 1;
}

/* ---- list iteration (#rule, RFC 9110 5.6.1) ------------------------------ */

/* Yield the next comma-separated element of v[0..n) starting at *pos, with
 * OWS trimmed (possibly empty). Returns 0 when the list is exhausted. */
static int next_elem(const char *v, size_t n, size_t *pos, const char **e, size_t *elen)
{
    size_t i = *pos;
    if (i > n) return 0;
    size_t start = i;
    while (i < n && v[i] != ',') i++;
    size_t end = i;
    while (start < end && is_ws((unsigned char)v[start])) start++;
    while (end > start && is_ws((unsigned char)v[end - 1])) end--;
    *e = v + start;
    *elen = end - start;
    *pos = i + 1; /* past the comma, or n + 1 at the end */
    return 1;
}

/* ---- host validation --------------------------------------------------- */

/* IP-literal contents: we accept IPv6address (HEXDIG, ':', '.' for an
 * embedded IPv4), which must contain at least one ':'. IPvFuture -> invalid. */
static int valid_ip_literal(const char *p, size_t n)
{
    int colon = 0;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == ':') colon = 1;
        else if (!is_hex(c) && c != '.') return 0;
    }
    return colon;
}

/* uri-host [ ":" port ]; need_port demands a non-empty port (authority-form). */
static int valid_host(const char *p, size_t n, int need_port)
{
    size_t i = 0;
    if (n == 0) return 0;
    if (p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (close == NULL) return 0;
        size_t inner = (size_t)(close - p) - 1;
        if (!valid_ip_literal(p + 1, inner)) return 0;
        i = inner + 2;
    } else {
        while (i < n && p[i] != ':') {
            unsigned char c = (unsigned char)p[i];
            if (is_regname_char(c)) {
                i++;
            } else if (c == '%' && i + 2 < n && is_hex((unsigned char)p[i + 1]) &&
                       is_hex((unsigned char)p[i + 2])) {
                i += 3;
            } else {
                return 0;
            }
        }
        if (i == 0) return 0; /* empty reg-name */
    }
    if (i == n) return !need_port;
    if (p[i] != ':') return 0;
    i++;
    size_t digits = n - i;
    if (digits > SV_PORT_DIGITS_MAX) return 0;
    if (need_port && digits == 0) return 0;
    for (; i < n; i++)
        if (!is_digit((unsigned char)p[i])) return 0;
    return 1;
}

/* ---- parse context ----------------------------------------------------- */

typedef struct {
    const char *buf;
    size_t len;
    const sv_limits *lim;
    size_t max_headers;
    const char **errmsg;
    /* header-derived state, decided once the head is complete */
    int host_fields;
    int host_empty;
    int abs_host;          /* the absolute-form target supplied the host */
    int cl_seen;
    int te_seen;
    int te_chunked_count;
    int te_last_chunked;
    int te_other;
    int conn_close;
    int conn_keep_alive;
    int expect_bad;
} sv_ctx;

static int fail(sv_ctx *x, int status, const char *msg)
{
    if (x->errmsg != NULL) *x->errmsg = msg;
    return -status;
}

/* Find the end of the line that starts at pos.
 * Returns 1 when complete (*eol = index of its CR),
 *         0 when incomplete (*eol = end of the content seen so far, not
 *           counting a CR that is the last buffered byte),
 *        -1 on a bare CR or bare LF (*eol = index of the offending byte). */
static int find_eol(const sv_ctx *x, size_t pos, size_t *eol)
{
    /* the first CR or LF: a LF first is a bare one */
    const char *b = x->buf;
    size_t i = pos, len = x->len;
#if SV_SWAR
    for (; i + 8 <= len; i += 8) {
        uint64_t w = load8(b + i);
        uint64_t hit = equal(w, '\r') | equal(w, '\n');
        if (hit) {
            i += (size_t)__builtin_ctzll(hit) >> 3;
            goto found;
        }
    }
#endif
    for (; i < len; i++)
        if (b[i] == '\r' || b[i] == '\n')
            goto found;
    *eol = len;
    return 0;
found:
    *eol = i;
    if (b[i] == '\n') return -1;
    if (i + 1 == len) return 0;
    return b[i + 1] == '\n' ? 1 : -1;
}

static int bare_eol(sv_ctx *x, size_t at)
{
    return fail(x, SV_ERR_BAD_REQUEST, x->buf[at] == '\n' ? "bare LF" : "bare CR");
}

/* The head is incomplete: all buffered bytes belong to it and at least one
 * more byte is needed, so len >= max_head proves the head is too large. */
static int incomplete(sv_ctx *x)
{
    if (x->len >= x->lim->max_head) return fail(x, SV_ERR_HEADERS_TOO_LARGE, "header section too large");
    return 0;
}

/* ---- request line ------------------------------------------------------ */

static int parse_version(sv_ctx *x, sv_request *r, const char *v, size_t n)
{
    if (n != SV_VERSION_LEN || memcmp(v, "HTTP/", 5) != 0 || !is_digit((unsigned char)v[5]) ||
        v[6] != '.' || !is_digit((unsigned char)v[7]))
        return fail(x, SV_ERR_BAD_REQUEST, "bad request line");
    if (v[5] != '1')
        return fail(x, SV_ERR_VERSION, "unsupported HTTP version");
    r->minor_version = v[7] == '0' ? 0 : 1; /* 1.2..1.9: served as 1.1 (RFC 9110 2.5) */
    return 0;
}

/* Split p[0..n) (a path with optional query) into path and query. */
static void split_query(sv_request *r, const char *p, size_t n)
{
    const char *q = memchr(p, '?', n);
    if (q == NULL) {
        r->path = p;
        r->path_len = n;
        return;
    }
    r->path = p;
    r->path_len = (size_t)(q - p);
    r->query = q + 1;
    r->query_len = n - r->path_len - 1;
}

static int parse_absolute_form(sv_ctx *x, sv_request *r, const char *t, size_t n)
{
    size_t skip;
    if (n >= 7 && ieq(t, 7, "http://")) skip = 7;
    else if (n >= 8 && ieq(t, 8, "https://")) skip = 8;
    else return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");

    size_t a = skip;
    while (a < n && t[a] != '/' && t[a] != '?') a++;
    if (!valid_host(t + skip, a - skip, 0)) return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");
    r->host = t + skip;
    r->host_len = a - skip;
    x->abs_host = 1;

    if (a < n && t[a] == '/') {
        split_query(r, t + a, n - a);
    } else {
        /* empty path: "/" -- point at the last '/' of "://" so that every
         * pointer stays inside the caller's buffer */
        r->path = t + skip - 1;
        r->path_len = 1;
        if (a < n) { /* t[a] == '?' */
            r->query = t + a + 1;
            r->query_len = n - a - 1;
        }
    }
    return 0;
}

static int parse_target(sv_ctx *x, sv_request *r)
{
    const char *t = r->target;
    size_t n = r->target_len;
    if (!all_target_chars(t, n)) return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");
    const char *hash = memchr(t, '#', n); /* a fragment is the client's own: dropped */
    if (hash != NULL) {
        n = (size_t)(hash - t);
        r->target_len = n;
        if (n == 0) return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");
    }

    int is_connect = r->method_len == 7 && memcmp(r->method, "CONNECT", 7) == 0;
    int is_options = r->method_len == 7 && memcmp(r->method, "OPTIONS", 7) == 0;

    if (is_connect) { /* authority-form only; the caller answers 501 */
        if (!valid_host(t, n, 1)) return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");
        return 0;
    }
    if (t[0] == '/') {
        split_query(r, t, n);
        return 0;
    }
    if (n == 1 && t[0] == '*') {
        if (!is_options) return fail(x, SV_ERR_BAD_REQUEST, "invalid request target");
        r->path = t;
        r->path_len = 1;
        return 0;
    }
    return parse_absolute_form(x, r, t, n);
}

/* line = buf[start..eol), complete and within the length limit */
static int parse_request_line(sv_ctx *x, sv_request *r, size_t start, size_t eol)
{
    const char *line = x->buf + start;
    size_t n = eol - start;
    size_t i = 0;

    while (i < n && line[i] != ' ') {
        if (!TCHAR(line[i])) return fail(x, SV_ERR_BAD_REQUEST, "invalid method");
        i++;
    }
    if (i == n) return fail(x, SV_ERR_BAD_REQUEST, "bad request line");
    if (i == 0 || i > SV_METHOD_MAX) return fail(x, SV_ERR_BAD_REQUEST, "invalid method");
    r->method = line;
    r->method_len = i;

    size_t ts = ++i;
    while (i < n && line[i] != ' ') i++;
    if (i == n) return fail(x, SV_ERR_BAD_REQUEST, "bad request line");
    if (i == ts) return fail(x, SV_ERR_BAD_REQUEST, "bad request line"); /* empty target / double SP */
    r->target = line + ts;
    r->target_len = i - ts;

    size_t vs = i + 1;
    int rc = parse_version(x, r, line + vs, n - vs);
    if (rc < 0) return rc;
    return parse_target(x, r);
}

/* ---- header fields ----------------------------------------------------- */

static int on_content_length(sv_ctx *x, sv_request *r, const char *v, size_t n)
{
    size_t pos = 0;
    const char *e;
    size_t elen;
    if (x->cl_seen) return fail(x, SV_ERR_BAD_REQUEST, "repeated Content-Length");
    /* one value, no list: "5, 5" is refused like two fields */
    if (!next_elem(v, n, &pos, &e, &elen) || pos <= n || elen == 0 || elen > SV_CL_DIGITS_MAX)
        return fail(x, SV_ERR_BAD_REQUEST, "invalid Content-Length");
    int64_t val = 0;
    for (size_t i = 0; i < elen; i++) {
        if (!is_digit((unsigned char)e[i])) return fail(x, SV_ERR_BAD_REQUEST, "invalid Content-Length");
        val = val * 10 + (e[i] - '0');
    }
    x->cl_seen = 1;
    r->content_length = val;
    return 0;
}

static int on_transfer_encoding(sv_ctx *x, const char *v, size_t n)
{
    size_t pos = 0;
    const char *e;
    size_t elen;
    int any = 0;
    while (next_elem(v, n, &pos, &e, &elen)) {
        if (elen == 0) return fail(x, SV_ERR_BAD_REQUEST, "empty Transfer-Encoding element");
        size_t k = 0;
        while (k < elen && TCHAR(e[k])) k++;
        if (k == 0) return fail(x, SV_ERR_BAD_REQUEST, "invalid Transfer-Encoding");
        int chunked = ieq(e, k, "chunked");
        if (k < elen) { /* only transfer-parameters may follow: OWS ";" ... */
            size_t j = k;
            while (j < elen && is_ws((unsigned char)e[j])) j++;
            if (j == elen || e[j] != ';' || chunked)
                return fail(x, SV_ERR_BAD_REQUEST, "invalid Transfer-Encoding");
        }
        if (chunked) x->te_chunked_count++;
        else x->te_other = 1;
        x->te_last_chunked = chunked;
        any = 1;
    }
    if (!any) return fail(x, SV_ERR_BAD_REQUEST, "invalid Transfer-Encoding");
    x->te_seen = 1;
    return 0;
}

static int on_connection(sv_ctx *x, const char *v, size_t n)
{
    size_t pos = 0;
    const char *e;
    size_t elen;
    while (next_elem(v, n, &pos, &e, &elen)) {
        if (elen == 0) continue;
        if (!all_tchar(e, elen)) return fail(x, SV_ERR_BAD_REQUEST, "invalid Connection");
        if (ieq(e, elen, "close")) x->conn_close = 1;
        else if (ieq(e, elen, "keep-alive")) x->conn_keep_alive = 1;
    }
    return 0;
}

static int on_host(sv_ctx *x, const char *v, size_t n)
{
    if (++x->host_fields > 1) return fail(x, SV_ERR_BAD_REQUEST, "duplicate Host");
    if (n == 0) {
        x->host_empty = 1;
        return 0;
    }
    if (!valid_host(v, n, 0)) return fail(x, SV_ERR_BAD_REQUEST, "invalid Host");
    return 0;
}

static int on_field(sv_ctx *x, sv_request *r, const sv_header *h)
{
    const char *nm = h->name;
    size_t nl = h->name_len;
    if (ieq(nm, nl, "host")) {
        r->host_field = (int)(h - r->headers);
        return on_host(x, h->value, h->value_len);
    }
    if (ieq(nm, nl, "content-length")) return on_content_length(x, r, h->value, h->value_len);
    if (ieq(nm, nl, "transfer-encoding")) return on_transfer_encoding(x, h->value, h->value_len);
    if (ieq(nm, nl, "connection")) return on_connection(x, h->value, h->value_len);
    if (ieq(nm, nl, "expect")) {
        if (ieq(h->value, h->value_len, "100-continue")) r->expect_continue = 1;
        else x->expect_bad = 1;
        return 0;
    }
    if (ieq(nm, nl, "upgrade")) r->upgrade = 1;
    return 0;
}

/* Syntax of one field line buf[start..eol) (non-empty). */
static int parse_field_line(sv_ctx *x, sv_header *h, size_t start, size_t eol)
{
    const char *line = x->buf + start;
    size_t n = eol - start;
    size_t i = 0;

    if (is_ws((unsigned char)line[0])) return fail(x, SV_ERR_BAD_REQUEST, "obs-fold not allowed");
    while (i < n && TCHAR(line[i])) /* ':' is no tchar */
        i++;
    if (i < n && line[i] != ':')
        return fail(x, SV_ERR_BAD_REQUEST, is_ws((unsigned char)line[i]) ? "whitespace before colon" : "invalid header name");
    if (i == 0 || i == n) return fail(x, SV_ERR_BAD_REQUEST, "invalid header name");
    h->name = line;
    h->name_len = i;

    size_t vs = i + 1;
    size_t ve = n;
    if (!all_value_chars(line + vs, n - vs))
        return fail(x, SV_ERR_BAD_REQUEST, "invalid character in header value");
    while (vs < ve && is_ws((unsigned char)line[vs])) vs++;
    while (ve > vs && is_ws((unsigned char)line[ve - 1])) ve--;
    h->value = line + vs;
    h->value_len = ve - vs;
    return 0;
}

/* ---- completion -------------------------------------------------------- */

static int finish_framing(sv_ctx *x, sv_request *r)
{
    if (!x->te_seen) return 0;
    if (r->minor_version == 0) return fail(x, SV_ERR_BAD_REQUEST, "Transfer-Encoding in HTTP/1.0");
    if (x->cl_seen) return fail(x, SV_ERR_BAD_REQUEST, "Content-Length with Transfer-Encoding");
    if (x->te_chunked_count > 1) return fail(x, SV_ERR_BAD_REQUEST, "chunked applied more than once");
    if (x->te_chunked_count == 1 && !x->te_last_chunked)
        return fail(x, SV_ERR_BAD_REQUEST, "chunked is not the final coding");
    if (x->te_other) return fail(x, SV_ERR_NOT_IMPLEMENTED, "unsupported transfer coding");
    r->chunked = 1;
    return 0;
}

static int finish(sv_ctx *x, sv_request *r, size_t head_len)
{
    if (head_len > x->lim->max_head || head_len > (size_t)INT_MAX) /* result must fit the int return */
        return fail(x, SV_ERR_HEADERS_TOO_LARGE, "header section too large");
    if (r->minor_version == 1 && x->host_fields == 0) return fail(x, SV_ERR_BAD_REQUEST, "missing Host");
    if (x->host_empty && !x->abs_host) return fail(x, SV_ERR_BAD_REQUEST, "invalid Host");
    int rc = finish_framing(x, r);
    if (rc < 0) return rc;
    if (x->expect_bad) return fail(x, SV_ERR_EXPECTATION, "unsupported expectation");

    if (!x->abs_host && r->host_field >= 0) {
        r->host = r->headers[r->host_field].value;
        r->host_len = r->headers[r->host_field].value_len;
    }
    if (r->minor_version == 1) r->keep_alive = !x->conn_close;
    else r->keep_alive = x->conn_keep_alive && !x->conn_close;
    r->head_len = head_len;
    return (int)head_len;
}

static void reset_request(sv_request *r)
{
    r->method = r->target = r->path = r->query = r->host = NULL;
    r->method_len = r->target_len = r->path_len = r->query_len = r->host_len = 0;
    r->minor_version = 0;
    r->content_length = -1;
    r->chunked = r->keep_alive = r->expect_continue = r->upgrade = 0;
    r->head_len = 0;
    r->num_headers = 0;
    r->host_field = -1;
}

/* Skip up to SV_LEADING_CRLF_MAX empty lines. Returns 1 with *pos set to the
 * start of the request line, else the result to return (0 or -status). */
static int skip_leading_crlf(sv_ctx *x, size_t *pos)
{
    size_t p = 0;
    int lines = 0;
    while (p < x->len && (x->buf[p] == '\r' || x->buf[p] == '\n')) {
        if (x->buf[p] == '\n') return fail(x, SV_ERR_BAD_REQUEST, "bare LF");
        if (p + 1 == x->len) return incomplete(x);
        if (x->buf[p + 1] != '\n') return fail(x, SV_ERR_BAD_REQUEST, "bare CR");
        if (++lines > SV_LEADING_CRLF_MAX) return fail(x, SV_ERR_BAD_REQUEST, "bad request line");
        p += SV_CRLF_LEN;
    }
    *pos = p;
    return 1;
}

/* An incomplete request line buf[pos..end): its bytes so far must be able to
 * start "METHOD SP", else answer 400 now instead of waiting for a line end
 * that garbage (a TLS ClientHello on a plain port) never sends. */
static int method_prefix(sv_ctx *x, size_t pos, size_t end)
{
    size_t i = pos;
    while (i < end && x->buf[i] != ' ') {
        if (!TCHAR(x->buf[i]) || i - pos >= SV_METHOD_MAX)
            return fail(x, SV_ERR_BAD_REQUEST, "invalid method");
        i++;
    }
    if (i < end && i == pos) return fail(x, SV_ERR_BAD_REQUEST, "bad request line");
    return 0;
}

int sv_parse_head(sv_request *r, const sv_limits *lim, const char *buf, size_t len, const char **errmsg)
{
    sv_ctx x;
    memset(&x, 0, sizeof x);
    x.buf = buf;
    x.len = len;
    x.lim = lim;
    x.errmsg = errmsg;
    x.max_headers = lim->max_headers < SV_HEADERS_CAP ? lim->max_headers : SV_HEADERS_CAP;
    if (errmsg != NULL) *errmsg = NULL;
    reset_request(r);

    size_t pos = 0, eol = 0;
    int rc = skip_leading_crlf(&x, &pos);
    if (rc <= 0) return rc;

    /* request line */
    rc = find_eol(&x, pos, &eol);
    if (eol - pos > lim->max_request_line) return fail(&x, SV_ERR_URI_TOO_LONG, "request line too long");
    if (rc < 0) return bare_eol(&x, eol);
    if (rc == 0) {
        rc = method_prefix(&x, pos, eol);
        return rc < 0 ? rc : incomplete(&x);
    }
    if (eol + SV_CRLF_LEN > lim->max_head) return fail(&x, SV_ERR_HEADERS_TOO_LARGE, "header section too large");
    rc = parse_request_line(&x, r, pos, eol);
    if (rc < 0) return rc;
    pos = eol + SV_CRLF_LEN;

    /* field lines until the empty line */
    for (;;) {
        rc = find_eol(&x, pos, &eol);
        if (rc < 0) return bare_eol(&x, eol);
        if (rc == 0) return incomplete(&x);
        if (eol + SV_CRLF_LEN > lim->max_head) return fail(&x, SV_ERR_HEADERS_TOO_LARGE, "header section too large");
        if (eol == pos) return finish(&x, r, eol + SV_CRLF_LEN);
        if (r->num_headers >= x.max_headers) return fail(&x, SV_ERR_HEADERS_TOO_LARGE, "too many header fields");
        sv_header *h = &r->headers[r->num_headers];
        rc = parse_field_line(&x, h, pos, eol);
        if (rc < 0) return rc;
        r->num_headers++;
        rc = on_field(&x, r, h);
        if (rc < 0) return rc;
        pos = eol + SV_CRLF_LEN;
    }
}

/* ======================================================================== */
/* chunked transfer coding (RFC 9112 7.1)                                   */
/* ======================================================================== */

enum {
    CS_SIZE = 0,      /* chunk-size hex digits */
    CS_EXT_WS_SEMI,   /* BWS; only more WS or ';' may follow */
    CS_EXT_WS_SEMI_EQ,/* BWS after an ext name; WS, ';' or '=' */
    CS_EXT_NAME_START,/* after ';': BWS then a token */
    CS_EXT_NAME,      /* in an ext name */
    CS_EXT_VAL_START, /* after '=': BWS then token or quoted-string */
    CS_EXT_VAL_TOKEN, /* in a token value */
    CS_EXT_QSTR,      /* in a quoted-string value */
    CS_EXT_QESC,      /* after a backslash in a quoted-string */
    CS_EXT_AFTER_VAL, /* right after a value */
    CS_SIZE_LF,       /* CR of the chunk line seen */
    CS_DATA,          /* chunk data */
    CS_DATA_CR,       /* expecting CR after data */
    CS_DATA_LF,       /* expecting LF after data */
    CS_TRL_START,     /* start of a trailer line (or the final CRLF) */
    CS_TRL_NAME,      /* in a trailer field name */
    CS_TRL_VALUE,     /* in a trailer field value */
    CS_TRL_LF,        /* CR of a trailer line seen */
    CS_FINAL_LF,      /* CR of the final empty line seen */
    CS_DONE,
    CS_ERROR
};

void sv_chunked_init(sv_chunked *c, size_t max_ext, size_t max_trailer)
{
    memset(c, 0, sizeof *c);
    c->state = CS_SIZE;
    c->max_ext = max_ext;
    c->max_trailer = max_trailer;
}

/* Enter the sticky error state; the status is kept in `remaining`. */
static int chunk_fail(sv_chunked *c, const char **errmsg, int status, const char *msg)
{
    c->state = CS_ERROR;
    c->remaining = (uint64_t)status;
    if (errmsg != NULL) *errmsg = msg;
    return -status;
}

static int is_qdtext(unsigned char c)
{
    return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) || (c >= 0x5d && c <= 0x7e) || c >= 0x80;
}

/* chunk-ext bytes: one byte in an extension state. Returns 0 or -status. */
static int chunk_ext_byte(sv_chunked *c, unsigned char ch, const char **errmsg)
{
    if (++c->ext_len > c->max_ext) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "chunk extension too long");
    switch (c->state) {
    case CS_EXT_WS_SEMI:
        if (is_ws(ch)) return 0;
        if (ch == ';') { c->state = CS_EXT_NAME_START; return 0; }
        break;
    case CS_EXT_WS_SEMI_EQ:
        if (is_ws(ch)) return 0;
        if (ch == ';') { c->state = CS_EXT_NAME_START; return 0; }
        if (ch == '=') { c->state = CS_EXT_VAL_START; return 0; }
        break;
    case CS_EXT_NAME_START:
        if (is_ws(ch)) return 0;
        if (TCHAR(ch)) { c->state = CS_EXT_NAME; return 0; }
        break;
    case CS_EXT_NAME:
        if (TCHAR(ch)) return 0;
        if (is_ws(ch)) { c->state = CS_EXT_WS_SEMI_EQ; return 0; }
        if (ch == ';') { c->state = CS_EXT_NAME_START; return 0; }
        if (ch == '=') { c->state = CS_EXT_VAL_START; return 0; }
        break;
    case CS_EXT_VAL_START:
        if (is_ws(ch)) return 0;
        if (ch == '"') { c->state = CS_EXT_QSTR; return 0; }
        if (TCHAR(ch)) { c->state = CS_EXT_VAL_TOKEN; return 0; }
        break;
    case CS_EXT_VAL_TOKEN:
        if (TCHAR(ch)) return 0;
        if (is_ws(ch)) { c->state = CS_EXT_WS_SEMI; return 0; }
        if (ch == ';') { c->state = CS_EXT_NAME_START; return 0; }
        break;
    case CS_EXT_QSTR:
        if (ch == '"') { c->state = CS_EXT_AFTER_VAL; return 0; }
        if (ch == '\\') { c->state = CS_EXT_QESC; return 0; }
        if (is_qdtext(ch)) return 0;
        break;
    case CS_EXT_QESC:
        if (is_value_char(ch)) { c->state = CS_EXT_QSTR; return 0; }
        break;
    case CS_EXT_AFTER_VAL:
        if (is_ws(ch)) { c->state = CS_EXT_WS_SEMI; return 0; }
        if (ch == ';') { c->state = CS_EXT_NAME_START; return 0; }
        break;
    default:
        break;
    }
    return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk extension");
}

/* States in which a CR legitimately ends the chunk line. */
static int ext_may_end(int state)
{
    return state == CS_SIZE || state == CS_EXT_NAME || state == CS_EXT_VAL_TOKEN || state == CS_EXT_AFTER_VAL;
}

static int chunk_size_byte(sv_chunked *c, unsigned char ch, const char **errmsg)
{
    if (is_hex(ch)) {
        if (++c->digits > SV_CHUNK_SIZE_DIGITS) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk size");
        c->remaining = (c->remaining << 4) | (uint64_t)hex_val(ch);
        return 0;
    }
    if (c->digits == 0) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk size");
    if (ch == ';' || is_ws(ch)) {
        c->state = CS_EXT_WS_SEMI;
        return chunk_ext_byte(c, ch, errmsg);
    }
    return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk size");
}

static int chunk_trailer_byte(sv_chunked *c, unsigned char ch, const char **errmsg)
{
    if (c->state == CS_TRL_START && ch == '\r') { /* the final CRLF is not counted */
        c->state = CS_FINAL_LF;
        return 0;
    }
    if (c->state != CS_FINAL_LF && ++c->trailer_len > c->max_trailer)
        return chunk_fail(c, errmsg, SV_ERR_HEADERS_TOO_LARGE, "trailer section too large");
    switch (c->state) {
    case CS_TRL_START:
        if (is_ws(ch)) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "obs-fold not allowed");
        if (TCHAR(ch)) { c->state = CS_TRL_NAME; return 0; }
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, ch == '\n' ? "bare LF" : "invalid header name");
    case CS_TRL_NAME:
        if (TCHAR(ch)) return 0;
        if (ch == ':') { c->state = CS_TRL_VALUE; return 0; }
        if (is_ws(ch)) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "whitespace before colon");
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid header name");
    case CS_TRL_VALUE:
        if (ch == '\r') { c->state = CS_TRL_LF; return 0; }
        if (is_value_char(ch)) return 0;
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, ch == '\n' ? "bare LF" : "invalid character in header value");
    case CS_TRL_LF:
        if (ch == '\n') { c->state = CS_TRL_START; return 0; }
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "bare CR");
    case CS_FINAL_LF:
        if (ch == '\n') { c->state = CS_DONE; c->done = 1; return 0; }
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "bare CR");
    default:
        return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunked state");
    }
}

/* One framing byte (everything except chunk data). Returns 0 or -status. */
static int chunk_frame_byte(sv_chunked *c, unsigned char ch, const char **errmsg)
{
    switch (c->state) {
    case CS_SIZE:
    case CS_EXT_WS_SEMI: case CS_EXT_WS_SEMI_EQ: case CS_EXT_NAME_START: case CS_EXT_NAME:
    case CS_EXT_VAL_START: case CS_EXT_VAL_TOKEN: case CS_EXT_QSTR: case CS_EXT_QESC:
    case CS_EXT_AFTER_VAL:
        if (ch == '\r') {
            if (c->state == CS_SIZE && c->digits == 0)
                return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk size");
            if (!ext_may_end(c->state)) return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "invalid chunk extension");
            c->state = CS_SIZE_LF;
            return 0;
        }
        if (c->state == CS_SIZE) return chunk_size_byte(c, ch, errmsg);
        return chunk_ext_byte(c, ch, errmsg);
    case CS_SIZE_LF:
        if (ch != '\n') return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "bare CR");
        c->state = c->remaining == 0 ? CS_TRL_START : CS_DATA;
        return 0;
    case CS_DATA_CR:
        if (ch != '\r') return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "missing CRLF after chunk data");
        c->state = CS_DATA_LF;
        return 0;
    case CS_DATA_LF:
        if (ch != '\n') return chunk_fail(c, errmsg, SV_ERR_BAD_REQUEST, "missing CRLF after chunk data");
        c->state = CS_SIZE;
        c->remaining = 0;
        c->digits = 0;
        c->ext_len = 0;
        return 0;
    default:
        return chunk_trailer_byte(c, ch, errmsg);
    }
}

ssize_t sv_chunked_decode(sv_chunked *c, char *buf, size_t len, size_t *out_len, const char **errmsg)
{
    size_t r = 0, w = 0;
    *out_len = 0;
    if (c->state == CS_ERROR) {
        if (errmsg != NULL) *errmsg = "chunked decoder already failed";
        return -(ssize_t)c->remaining;
    }
    while (r < len && c->state != CS_DONE) {
        if (c->state == CS_DATA) {
            size_t n = len - r;
            if ((uint64_t)n > c->remaining) n = (size_t)c->remaining;
            if (w != r) memmove(buf + w, buf + r, n);
            w += n;
            r += n;
            c->remaining -= n;
            if (c->remaining == 0) c->state = CS_DATA_CR;
            continue;
        }
        int rc = chunk_frame_byte(c, (unsigned char)buf[r], errmsg);
        if (rc < 0) return rc;
        r++;
    }
    *out_len = w;
    return (ssize_t)r;
}

/* ---- PROXY protocol ----------------------------------------------------- */

/* The v2 signature: \r\n\r\n\0\r\nQUIT\n. */
static const char proxy_sig[12] = {'\r', '\n', '\r', '\n', '\0', '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};
#define SV_PROXY_V2_FIXED 16        /* signature, version/command, family/protocol, length */
#define SV_PROXY_ADDR_TEXT_MAX 45   /* longest textual IPv6 address (INET6_ADDRSTRLEN - 1) */

static int proxy_fail(const char **errmsg, const char *msg)
{
    if (errmsg) *errmsg = msg;
    return -SV_ERR_BAD_REQUEST;
}

/* buf[0..len) and lit agree on their common length. */
static int agrees(const char *buf, size_t len, const char *lit, size_t lit_len)
{
    return memcmp(buf, lit, len < lit_len ? len : lit_len) == 0;
}

static int v1_addr(int family, const char *s, size_t n, unsigned char *out)
{
    char tmp[SV_PROXY_ADDR_TEXT_MAX + 1];
    if (n == 0 || n > SV_PROXY_ADDR_TEXT_MAX) return 0;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    return inet_pton(family, tmp, out) == 1;
}

/* 0..65535 in decimal, no leading zero (but "0"). */
static int v1_port(const char *s, size_t n, unsigned *out)
{
    if (n == 0 || n > SV_PORT_DIGITS_MAX || (n > 1 && s[0] == '0')) return 0;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit((unsigned char)s[i])) return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > 65535) return 0;
    *out = v;
    return 1;
}

/* "PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n" or "PROXY UNKNOWN ...\r\n", one
 * space between fields, at most SV_PROXY_V1_MAX bytes; buf starts with (a
 * prefix of) "PROXY ". */
static int proxy_v1(sv_proxy *p, const char *buf, size_t len, const char **errmsg)
{
    static const char *const protos[] = {"TCP4", "TCP6", "UNKNOWN"};
    p->version = 1;
    if (len < 6) return 0;
    size_t end = len < SV_PROXY_V1_MAX ? len : SV_PROXY_V1_MAX, eol = 0;
    int found = 0;
    for (size_t i = 6; i < end && !found; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\r') {
            if (i + 1 >= len) break; /* its LF is still to come */
            if (buf[i + 1] != '\n') return proxy_fail(errmsg, "bare CR in PROXY v1 header");
            eol = i;
            found = 1;
        } else if (c < 0x20 || c > 0x7e) {
            return proxy_fail(errmsg, "invalid byte in PROXY v1 header");
        }
    }
    if (found ? eol + SV_CRLF_LEN > SV_PROXY_V1_MAX : len >= SV_PROXY_V1_MAX)
        return proxy_fail(errmsg, "PROXY v1 header too long");
    const char *l = buf + 6;
    size_t n = (found ? eol : len) - 6, pl = 0;
    while (pl < n && l[pl] != ' ' && l[pl] != '\r') pl++;
    int open = pl == n && !found; /* the protocol's name may go on */
    int which = -1;
    for (int k = 0; k < 3 && which < 0; k++) {
        size_t kl = strlen(protos[k]);
        if ((open ? pl <= kl : pl == kl) && memcmp(l, protos[k], pl) == 0) which = k;
    }
    if (which < 0) return proxy_fail(errmsg, "unknown protocol in PROXY v1 header");
    if (!found) return 0;
    if (which == 2) { /* UNKNOWN: the rest of the line is ignored */
        p->keep = 1;
        return (int)(eol + SV_CRLF_LEN);
    }
    const char *f[4];
    size_t fl[4], pos = pl;
    for (int k = 0; k < 4; k++) {
        if (pos >= n || l[pos] != ' ') return proxy_fail(errmsg, "PROXY v1 header needs four fields");
        size_t s = ++pos;
        while (pos < n && l[pos] != ' ') pos++;
        f[k] = l + s;
        fl[k] = pos - s;
    }
    if (pos != n) return proxy_fail(errmsg, "PROXY v1 header has extra fields");
    int family = which == 0 ? AF_INET : AF_INET6;
    unsigned char dst[16];
    unsigned dport;
    if (!v1_addr(family, f[0], fl[0], p->addr) || !v1_addr(family, f[1], fl[1], dst))
        return proxy_fail(errmsg, "invalid address in PROXY v1 header");
    if (!v1_port(f[2], fl[2], &p->port) || !v1_port(f[3], fl[3], &dport))
        return proxy_fail(errmsg, "invalid port in PROXY v1 header");
    p->family = family;
    return (int)(eol + SV_CRLF_LEN);
}

/* The binary header: signature, version 2 and a command, one of the seven
 * family/protocol bytes the spec defines, a length, then the addresses and
 * TLVs (ignored); buf starts with (a prefix of) the signature. */
static int proxy_v2(sv_proxy *p, const char *buf, size_t len, const char **errmsg)
{
    const unsigned char *b = (const unsigned char *)buf;
    p->version = 2;
    if (len > 12 && ((b[12] >> 4) != 2 || (b[12] & 0xF) > 1))
        return proxy_fail(errmsg, "unsupported PROXY v2 version or command");
    if (len > 13) {
        unsigned fam = b[13];
        if (!(fam == 0x00 || ((fam >> 4) >= 1 && (fam >> 4) <= 3 && (fam & 0xF) >= 1 && (fam & 0xF) <= 2)))
            return proxy_fail(errmsg, "unknown PROXY v2 address family or protocol");
    }
    if (len < SV_PROXY_V2_FIXED) return 0;
    int local = (b[12] & 0xF) == 0;
    unsigned af = b[13] >> 4;
    size_t body = (size_t)b[14] << 8 | b[15], total = SV_PROXY_V2_FIXED + body;
    if (total > SV_PROXY_V2_MAX) return proxy_fail(errmsg, "PROXY v2 header too long");
    size_t need = af == 1 ? 12 : af == 2 ? 36 : af == 3 ? 216 : 0;
    if (!local && body < need) return proxy_fail(errmsg, "PROXY v2 addresses truncated");
    if (len < total) return 0;
    if (local || af == 0 || af == 3) { /* LOCAL, UNSPEC, or a UNIX socket: keep the socket's address */
        p->keep = 1;
    } else if (af == 1) {
        p->family = AF_INET;
        memcpy(p->addr, b + 16, 4);
        p->port = (unsigned)b[24] << 8 | b[25];
    } else {
        p->family = AF_INET6;
        memcpy(p->addr, b + 16, 16);
        p->port = (unsigned)b[48] << 8 | b[49];
    }
    return (int)total;
}

int sv_parse_proxy(sv_proxy *p, int versions, const char *buf, size_t len, const char **errmsg)
{
    memset(p, 0, sizeof(*p));
    if (len == 0) return 0;
    if ((versions & SV_PROXY_V1) && agrees(buf, len, "PROXY ", 6)) return proxy_v1(p, buf, len, errmsg);
    if ((versions & SV_PROXY_V2) && agrees(buf, len, proxy_sig, sizeof(proxy_sig)))
        return proxy_v2(p, buf, len, errmsg);
    return proxy_fail(errmsg, "no PROXY protocol header");
}

/* HTTP status reason phrases (RFC 9110 section 15), one table for the
 * responses the app sends (request.c sv_write_head) and the ones the loop
 * answers itself (loop.c). */
const char *sv_reason_phrase(int code)
{
    switch (code) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 103: return "Early Hints";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
    }
}

/*
 * Unit tests for ext/serval/parser.c (standalone, no Ruby).
 * Build: gcc -std=gnu11 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *          -Iext/serval ext/serval/parser.c test/c/test_parser.c -o tmp/test_parser
 */
#include "parser.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int passed, failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

static const sv_limits default_limits = {8192, 16384, 100};

static sv_request req; /* large (headers array); keep it off the stack */

static int parse_lim(const char *s, const sv_limits *lim)
{
    const char *msg = NULL;
    int rc = sv_parse_head(&req, lim, s, strlen(s), &msg);
    if (rc < 0 && msg == NULL) {
        fprintf(stderr, "error %d without errmsg for: %s\n", rc, s);
        failed++;
    }
    return rc;
}

static int parse(const char *s) { return parse_lim(s, &default_limits); }

static int eq(const char *p, size_t n, const char *lit)
{
    return p != NULL && n == strlen(lit) && memcmp(p, lit, n) == 0;
}

/* expect status code rc for request s (and report which input failed) */
#define EXPECT(s, rc)                                                            \
    do {                                                                         \
        int got_ = parse(s);                                                     \
        if (got_ != (rc)) fprintf(stderr, "  input %s -> %d, want %d\n", #s, got_, (rc)); \
        CHECK(got_ == (rc));                                                     \
    } while (0)

#define EXPECT_OK(s) EXPECT(s, (int)strlen(s))

/* Every strict prefix of a valid head must give 0, the whole gives its length. */
static void check_prefixes(const char *s)
{
    size_t n = strlen(s);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        char *copy = malloc(i ? i : 1); /* exact-size copy so ASan catches over-reads */
        memcpy(copy, s, i);
        const char *msg = NULL;
        int rc = sv_parse_head(&req, &default_limits, copy, i, &msg);
        if (rc != 0) {
            fprintf(stderr, "  prefix %zu of %s -> %d (%s)\n", i, s, rc, msg ? msg : "");
            ok = 0;
        }
        free(copy);
    }
    CHECK(ok);
    CHECK(parse(s) == (int)n);
}

static void test_basic(void)
{
    const char *s = "GET /index.html?a=1&b=2 HTTP/1.1\r\nHost: example.com\r\nUser-Agent:  x y \t\r\n\r\n";
    CHECK(parse(s) == (int)strlen(s));
    CHECK(req.head_len == strlen(s));
    CHECK(eq(req.method, req.method_len, "GET"));
    CHECK(eq(req.target, req.target_len, "/index.html?a=1&b=2"));
    CHECK(eq(req.path, req.path_len, "/index.html"));
    CHECK(eq(req.query, req.query_len, "a=1&b=2"));
    CHECK(eq(req.host, req.host_len, "example.com"));
    CHECK(req.minor_version == 1);
    CHECK(req.content_length == -1);
    CHECK(req.chunked == 0);
    CHECK(req.keep_alive == 1);
    CHECK(req.expect_continue == 0);
    CHECK(req.upgrade == 0);
    CHECK(req.num_headers == 2);
    CHECK(eq(req.headers[0].name, req.headers[0].name_len, "Host"));
    CHECK(eq(req.headers[1].name, req.headers[1].name_len, "User-Agent"));
    CHECK(eq(req.headers[1].value, req.headers[1].value_len, "x y"));

    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-Sp:   \r\n\r\n");
    CHECK(req.headers[1].value_len == 0 && req.headers[2].value_len == 0);
    CHECK(req.query == NULL && req.query_len == 0);

    /* empty query is present, not absent */
    EXPECT_OK("GET /p? HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(eq(req.path, req.path_len, "/p") && req.query != NULL && req.query_len == 0);
    /* only the first '?' splits */
    EXPECT_OK("GET /p?a?b HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(eq(req.query, req.query_len, "a?b"));
    /* obs-text allowed in values */
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n");
    /* token method other than the usual ones */
    EXPECT_OK("PURGE /x HTTP/1.1\r\nHost: a\r\n\r\n");
    EXPECT_OK("M-SEARCH /x HTTP/1.1\r\nHost: a\r\n\r\n");
}

static void test_prefixes(void)
{
    check_prefixes("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    check_prefixes("\r\n\r\nPOST /upload?x=1 HTTP/1.1\r\nHost: example.com:8080\r\nContent-Length: 5\r\n"
                   "Transfer-Encoding-X: no\r\nConnection: close\r\nExpect: 100-continue\r\n\r\n");
    check_prefixes("GET http://example.com/a?b HTTP/1.1\r\nHost: other\r\n\r\n");
    check_prefixes("GET / HTTP/1.0\r\n\r\n");
    check_prefixes("POST / HTTP/1.1\r\nHost: [::1]:80\r\nTransfer-Encoding: chunked\r\n\r\n");
}

static void test_request_line(void)
{
    EXPECT("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", -400);       /* double SP */
    EXPECT("GET /  HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1 \r\nHost: a\r\n\r\n", -400);       /* trailing SP */
    EXPECT("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", -400);       /* tab */
    EXPECT(" GET / HTTP/1.1\r\nHost: a\r\n\r\n", -400);       /* leading SP */
    EXPECT("GET /\r\nHost: a\r\n\r\n", -400);                 /* HTTP/0.9 style */
    EXPECT("GET\r\n\r\n", -400);
    EXPECT("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", -400);        /* non-tchar in method */
    EXPECT("GET HTTP/1.1\r\nHost: a\r\n\r\n", -400);          /* missing target */
    /* method length */
    EXPECT_OK("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF / HTTP/1.1\r\nHost: a\r\n\r\n"); /* 32 */
    EXPECT("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG / HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    const char *msg = NULL;
    const char *s = "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG / HTTP/1.1\r\nHost: a\r\n\r\n";
    sv_parse_head(&req, &default_limits, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "invalid method") == 0);
}

static void test_version(void)
{
    EXPECT_OK("GET / HTTP/1.0\r\n\r\n");
    CHECK(req.minor_version == 0 && req.host == NULL && req.keep_alive == 0);
    EXPECT("GET / HTTP/2.0\r\nHost: a\r\n\r\n", -505);
    /* a higher 1.x minor is served as 1.1 (RFC 9110 2.5) */
    EXPECT_OK("GET / HTTP/1.2\r\nHost: a\r\n\r\n");
    CHECK(req.minor_version == 1 && req.keep_alive == 1);
    EXPECT("GET / HTTP/1.9\r\n\r\n", -400); /* as 1.1: Host is required */
    EXPECT("GET / HTTP/0.9\r\nHost: a\r\n\r\n", -505);
    EXPECT("GET / HTTP/3.1\r\nHost: a\r\n\r\n", -505);
    EXPECT("GET / HTTP/1.1x\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / http/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/11\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.10\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/a.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTPS/1.1\r\nHost: a\r\n\r\n", -400);
    /* bytes that cannot start a request line: 400 before any line end */
    EXPECT("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", -400);   /* a TLS ClientHello */
    EXPECT("GE\x01", -400);
    EXPECT(" GET / HTTP/1.1", -400);
    EXPECT("GET", 0);                                  /* could still be a request */
    EXPECT("GET /partial", 0);
    EXPECT("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG", -400); /* 33 method bytes: too long already */
    EXPECT("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF", 0);     /* 32: may still be a method */
    /* 505 is reported as soon as the request line is complete */
    EXPECT("GET / HTTP/2.0\r\n", -505);
}

static void test_targets(void)
{
    /* absolute-form */
    EXPECT_OK("GET http://example.com:8080/a/b?c=d HTTP/1.1\r\nHost: other\r\n\r\n");
    CHECK(eq(req.host, req.host_len, "example.com:8080"));
    CHECK(eq(req.path, req.path_len, "/a/b"));
    CHECK(eq(req.query, req.query_len, "c=d"));
    EXPECT_OK("GET HTTPS://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n");
    CHECK(eq(req.host, req.host_len, "example.com") && eq(req.path, req.path_len, "/") && req.query == NULL);
    EXPECT_OK("GET http://example.com?q HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(eq(req.path, req.path_len, "/") && eq(req.query, req.query_len, "q"));
    EXPECT_OK("GET http://[::1]:80/ HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(eq(req.host, req.host_len, "[::1]:80"));
    EXPECT_OK("GET http://example.com/ HTTP/1.1\r\nHost:\r\n\r\n"); /* empty Host ok with absolute-form */
    CHECK(eq(req.host, req.host_len, "example.com"));
    EXPECT_OK("GET http://example.com/ HTTP/1.0\r\n\r\n");
    EXPECT("GET http://example.com/ HTTP/1.1\r\n\r\n", -400);      /* 1.1 still needs Host */
    EXPECT("GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n", -400);     /* empty authority */
    EXPECT("GET http://u@h/ HTTP/1.1\r\nHost: a\r\n\r\n", -400);   /* userinfo */
    EXPECT("GET ftp://h/ HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET example.com/ HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    /* asterisk-form */
    EXPECT_OK("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(eq(req.path, req.path_len, "*"));
    EXPECT("GET * HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("OPTIONS *x HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    /* authority-form */
    EXPECT_OK("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
    CHECK(eq(req.method, req.method_len, "CONNECT"));
    EXPECT("CONNECT example.com HTTP/1.1\r\nHost: a\r\n\r\n", -400);   /* port required */
    EXPECT("CONNECT /x HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET example.com:443 HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    /* characters */
    EXPECT_OK("GET /a%20b;c=d/e!$&'()*+,:@-._~[] HTTP/1.1\r\nHost: a\r\n\r\n");
    /* what browsers and Node send unencoded is accepted: it cannot change framing */
    const char *lenient[] = {"\"", "<", ">", "\\", "^", "`", "{", "|", "}", "\x80", "\xc3\xa9", "\xff"};
    for (size_t i = 0; i < sizeof lenient / sizeof lenient[0]; i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "GET /a%sb?q=%s HTTP/1.1\r\nHost: a\r\n\r\n", lenient[i], lenient[i]);
        int rc = parse(buf);
        if (rc != (int)strlen(buf)) fprintf(stderr, "  target byte 0x%02x -> %d\n", (unsigned char)lenient[i][0], rc);
        CHECK(rc == (int)strlen(buf));
        CHECK(req.path_len == 2 + strlen(lenient[i]) + 1);
    }
    const char *bad[] = {"\x7f", "\x01", "\t", "\x1f"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "GET /a%sb HTTP/1.1\r\nHost: a\r\n\r\n", bad[i]);
        int rc = parse(buf);
        if (rc != -400) fprintf(stderr, "  target byte 0x%02x -> %d\n", (unsigned char)bad[i][0], rc);
        CHECK(rc == -400);
    }
    /* a fragment is stripped from the target, the path and the query */
    EXPECT_OK("GET /a/b?x=1#frag HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(eq(req.target, req.target_len, "/a/b?x=1") && eq(req.path, req.path_len, "/a/b"));
    CHECK(eq(req.query, req.query_len, "x=1"));
    EXPECT_OK("GET /p#x?y HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(eq(req.path, req.path_len, "/p") && req.query == NULL);
    EXPECT("GET #frag HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET /a\0b HTTP/1.1\r\n", 0); /* strlen stops at NUL: just incomplete */
    char nul[] = "GET /a\0b HTTP/1.1\r\nHost: a\r\n\r\n";
    CHECK(sv_parse_head(&req, &default_limits, nul, sizeof nul - 1, NULL) == -400);
}

static void test_leading_crlf(void)
{
    EXPECT_OK("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
    EXPECT_OK("\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"); /* 8 */
    CHECK(req.head_len == 16 + 27 && eq(req.method, req.method_len, "GET"));
    EXPECT("\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", -400); /* 9 */
    EXPECT("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", -400);
    EXPECT("\r", 0);
    EXPECT("\r\n", 0);
    EXPECT("\rX", -400);
}

static void test_line_endings(void)
{
    EXPECT("GET / HTTP/1.1\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\n\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX: a\nb\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\rHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\n\r\r", -400);
    /* a bare LF in a complete line is reported even though the head is incomplete */
    EXPECT("GET / HTTP/1.1\r\nX: y\nZ", -400);
}

static void test_fields(void)
{
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", -400);       /* obs-fold */
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\n Host: a\r\n\r\n", -400);                 /* fold right after request line */
    EXPECT("GET / HTTP/1.1\r\nHost : a\r\n\r\n", -400);                 /* SP before colon */
    EXPECT("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\n: novalue\r\n\r\n", -400);     /* empty name */
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX(y): z\r\n\r\n", -400);       /* non-token name */
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX\x80: z\r\n\r\n", -400);
    /* control chars in values */
    for (int c = 0; c < 0x20; c++) {
        if (c == '\t' || c == '\r' || c == '\n') continue;
        char buf[64];
        int n = snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nHost: a\r\nX: a%cb\r\n\r\n", c ? c : '@');
        if (c == 0) buf[29] = '\0';
        CHECK(sv_parse_head(&req, &default_limits, buf, (size_t)n, NULL) == -400);
    }
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", -400);
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nX: \ta\tb\t \r\n\r\n");
    CHECK(eq(req.headers[1].value, req.headers[1].value_len, "a\tb"));
    const char *msg = NULL;
    const char *s = "GET / HTTP/1.1\r\nHost : a\r\n\r\n";
    sv_parse_head(&req, &default_limits, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "whitespace before colon") == 0);
    s = "GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n";
    sv_parse_head(&req, &default_limits, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "obs-fold not allowed") == 0);
}

static void test_host(void)
{
    EXPECT("GET / HTTP/1.1\r\n\r\n", -400);
    const char *msg = NULL;
    sv_parse_head(&req, &default_limits, "GET / HTTP/1.1\r\n\r\n", 18, &msg);
    CHECK(msg != NULL && strcmp(msg, "missing Host") == 0);
    EXPECT_OK("GET / HTTP/1.0\r\n\r\n");
    EXPECT_OK("GET / HTTP/1.0\r\nHost: a.b\r\n\r\n");
    CHECK(eq(req.host, req.host_len, "a.b"));
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost:\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.0\r\nHost: \r\n\r\n", -400);
    EXPECT_OK("GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n");
    EXPECT_OK("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    EXPECT_OK("GET / HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n");
    EXPECT_OK("GET / HTTP/1.1\r\nHost: [::ffff:1.2.3.4]\r\n\r\n");
    EXPECT_OK("GET / HTTP/1.1\r\nHOST: ex%41mple\r\n\r\n");
    EXPECT("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a:123456\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: :80\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: [zz]\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: []\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", -400);
    EXPECT("GET / HTTP/1.1\r\nHost: a%4\r\n\r\n", -400);
}

static void test_content_length(void)
{
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\n\r\n");
    CHECK(req.content_length == 42 && req.chunked == 0);
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    CHECK(req.content_length == 0);
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999999999999\r\n\r\n"); /* 18 digits */
    CHECK(req.content_length == 999999999999999999LL);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000000000000000\r\n\r\n", -400); /* 19 */
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5.0\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: ,\r\n\r\n", -400);
    /* duplicates and lists are refused even when equal (as nginx and Puma do) */
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5 ,5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: ,5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n", -400);
    const char *msg = NULL;
    const char *s = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    sv_parse_head(&req, &default_limits, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "repeated Content-Length") == 0);
}

static void test_transfer_encoding(void)
{
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(req.chunked == 1 && req.content_length == -1);
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n");
    CHECK(req.chunked == 1);
    const char *msg = NULL;
    const char *s = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
    CHECK(sv_parse_head(&req, &default_limits, s, strlen(s), &msg) == -400);
    CHECK(msg != NULL && strcmp(msg, "Content-Length with Transfer-Encoding") == 0);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: x-foo\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip;q=1, chunked\r\n\r\n", -501);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", -400);
    s = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n";
    sv_parse_head(&req, &default_limits, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "chunked is not the final coding") == 0);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked\r\n\r\n", -400); /* empty element */
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, , chunked\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , ,\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;x=1\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chun ked\r\n\r\n", -400);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", -400);
}

static void test_connection(void)
{
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(req.keep_alive == 1);
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    CHECK(req.keep_alive == 0);
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, CLOSE\r\n\r\n");
    CHECK(req.keep_alive == 0);
    EXPECT_OK("GET / HTTP/1.0\r\n\r\n");
    CHECK(req.keep_alive == 0);
    EXPECT_OK("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    CHECK(req.keep_alive == 1);
    EXPECT_OK("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n");
    CHECK(req.keep_alive == 0);
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n");
    CHECK(req.keep_alive == 1);
    EXPECT("GET / HTTP/1.1\r\nHost: a\r\nConnection: clo se\r\n\r\n", -400);
    /* Upgrade */
    EXPECT_OK("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    CHECK(req.upgrade == 1);
}

static void test_expect(void)
{
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n");
    CHECK(req.expect_continue == 1);
    EXPECT_OK("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n");
    CHECK(req.expect_continue == 1);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", -417);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nExpect:\r\n\r\n", -417);
    EXPECT("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, foo\r\n\r\n", -417);
    /* framing errors take precedence over 417 */
    EXPECT("POST / HTTP/1.1\r\nExpect: foo\r\n\r\n", -400);
}

static void test_limits(void)
{
    sv_limits lim = {20, 100, 3};
    /* request line exactly 20 bytes: ok */
    const char *s = "GET /12345 HTTP/1.1\r\nHost: a\r\n\r\n"; /* "GET /12345 HTTP/1.1" = 19 */
    CHECK(parse_lim(s, &lim) == (int)strlen(s));
    s = "GET /123456 HTTP/1.1\r\nHost: a\r\n\r\n"; /* 20 */
    CHECK(parse_lim(s, &lim) == (int)strlen(s));
    s = "GET /1234567 HTTP/1.1\r\nHost: a\r\n\r\n"; /* 21 */
    CHECK(parse_lim(s, &lim) == -414);
    /* partial request line already too long -> 414 without CRLF */
    CHECK(parse_lim("GET /1234567890123456789", &lim) == -414);
    CHECK(parse_lim("GET /123456 HTTP/1.1", &lim) == 0);  /* 20 bytes, maybe complete */
    CHECK(parse_lim("GET /123456 HTTP/1.1\r", &lim) == 0); /* CR does not count */
    CHECK(parse_lim("GET /1234567 HTTP/1.1\r", &lim) == -414);
    /* header count */
    s = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n";
    CHECK(parse_lim(s, &lim) == (int)strlen(s));
    CHECK(parse_lim("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", &lim) == -431);
    CHECK(parse_lim("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n", &lim) == -431); /* early */
    const char *msg = NULL;
    s = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
    sv_parse_head(&req, &lim, s, strlen(s), &msg);
    CHECK(msg != NULL && strcmp(msg, "too many header fields") == 0);
    /* head size: exactly max_head ok, one more 431 */
    char buf[256];
    sv_limits lim2 = {100, 60, 10};
    /* "GET / HTTP/1.1\r\nHost: a\r\nX: " = 28 bytes, + value + "\r\n\r\n" (4) */
    memset(buf, 0, sizeof buf);
    strcpy(buf, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
    memset(buf + 28, 'v', 28);
    strcpy(buf + 56, "\r\n\r\n");
    CHECK(strlen(buf) == 60);
    CHECK(parse_lim(buf, &lim2) == 60);
    CHECK(parse_lim("GET / HTTP/1.1\r\nHost: a\r\nX: vvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n\r\n", &lim2) == -431);
    sv_parse_head(&req, &lim2, "GET / HTTP/1.1\r\nHost: a\r\nX: vvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n\r\n", 61, &msg);
    CHECK(msg != NULL && strcmp(msg, "header section too large") == 0);
    /* incomplete head that already reached max_head -> 431 */
    for (size_t i = 0; i < 60; i++) CHECK(sv_parse_head(&req, &lim2, buf, i, NULL) == 0);
    memset(buf + 28, 'v', 32); /* 60 bytes, no end of head: can only grow past max_head */
    CHECK(sv_parse_head(&req, &lim2, buf, 59, NULL) == 0);
    CHECK(sv_parse_head(&req, &lim2, buf, 60, NULL) == -431);
    CHECK(sv_parse_head(&req, &lim2, buf, 61, NULL) == -431);
    /* leading CRLFs count toward the head */
    sv_limits lim3 = {100, 29, 10};
    CHECK(parse_lim("GET / HTTP/1.1\r\nHost: a\r\n\r\n", &lim3) == 27);
    CHECK(parse_lim("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", &lim3) == 29);
    CHECK(parse_lim("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", &lim3) == -431);
    /* max_headers above the cap is clamped */
    sv_limits lim4 = {100, 100000, 100000};
    static char big[SV_HEADERS_CAP * 8 + 64];
    size_t n = (size_t)sprintf(big, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 1; i < SV_HEADERS_CAP; i++) n += (size_t)sprintf(big + n, "X: %d\r\n", i % 10);
    strcpy(big + n, "\r\n");
    CHECK(sv_parse_head(&req, &lim4, big, n + 2, NULL) == (int)(n + 2));
    CHECK(req.num_headers == SV_HEADERS_CAP);
    n = (size_t)sprintf(big, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < SV_HEADERS_CAP; i++) n += (size_t)sprintf(big + n, "X: %d\r\n", i % 10);
    strcpy(big + n, "\r\n");
    CHECK(sv_parse_head(&req, &lim4, big, n + 2, NULL) == -431);
}

static void test_pipelining(void)
{
    const char *a = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
    const char *b = "GET /b HTTP/1.1\r\nHost: b\r\n\r\n";
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s", a, b);
    int rc = sv_parse_head(&req, &default_limits, buf, strlen(buf), NULL);
    CHECK(rc == (int)strlen(a));
    CHECK(eq(req.path, req.path_len, "/a"));
    rc = sv_parse_head(&req, &default_limits, buf + rc, strlen(buf) - (size_t)rc, NULL);
    CHECK(rc == (int)strlen(b));
    CHECK(eq(req.path, req.path_len, "/b") && eq(req.host, req.host_len, "b"));
    /* garbage after a complete head is not looked at */
    snprintf(buf, sizeof buf, "%s\n\x01garbage", a);
    CHECK(sv_parse_head(&req, &default_limits, buf, strlen(buf), NULL) == (int)strlen(a));
}

static void test_errmsg_null(void)
{
    /* errmsg may be NULL */
    CHECK(sv_parse_head(&req, &default_limits, "BAD\n", 4, NULL) == -400);
    const char *msg = "x";
    CHECK(sv_parse_head(&req, &default_limits, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 27, &msg) == 27);
    CHECK(msg == NULL);
}

/* ---- chunked ----------------------------------------------------------- */

typedef struct {
    ssize_t status;      /* total consumed (>= 0) or the negative error */
    char out[4096];
    size_t out_len;
    int done;
} chunk_result;

/* Feed input in pieces (split[] gives piece sizes cyclically; 0 = all at once).
 * Like a real caller: unconsumed bytes stay and more are appended. */
static chunk_result run_chunked(const char *in, size_t len, size_t piece, size_t max_ext, size_t max_trailer)
{
    chunk_result res;
    memset(&res, 0, sizeof res);
    sv_chunked c;
    sv_chunked_init(&c, max_ext, max_trailer);
    size_t fed = 0;
    size_t total = 0;
    while (fed < len && !c.done) {
        size_t n = piece ? piece : len;
        if (n > len - fed) n = len - fed;
        char *tmp = malloc(n);
        memcpy(tmp, in + fed, n);
        size_t out = 0;
        const char *msg = NULL;
        ssize_t rc = sv_chunked_decode(&c, tmp, n, &out, &msg);
        if (rc < 0) {
            CHECK(msg != NULL);
            res.status = rc;
            free(tmp);
            return res;
        }
        CHECK((size_t)rc <= n && out <= (size_t)rc);
        CHECK(res.out_len + out <= sizeof res.out);
        memcpy(res.out + res.out_len, tmp, out);
        res.out_len += out;
        total += (size_t)rc;
        if (!c.done) CHECK((size_t)rc == n); /* everything consumed until done */
        fed += n;
        free(tmp);
        if (c.done) {
            fed -= n - (size_t)rc;
        }
    }
    res.status = (ssize_t)total;
    res.done = c.done;
    return res;
}

/* decode at once, byte by byte and with several split sizes; all must agree */
static chunk_result chunked_all_splits(const char *in, size_t len, size_t max_ext, size_t max_trailer)
{
    chunk_result whole = run_chunked(in, len, 0, max_ext, max_trailer);
    size_t pieces[] = {1, 2, 3, 5, 7, 13};
    int same = 1;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        chunk_result r = run_chunked(in, len, pieces[i], max_ext, max_trailer);
        if (r.status != whole.status || r.done != whole.done ||
            (whole.status >= 0 && (r.out_len != whole.out_len || memcmp(r.out, whole.out, r.out_len) != 0))) {
            fprintf(stderr, "  split %zu differs for %s\n", pieces[i], in);
            same = 0;
        }
    }
    CHECK(same);
    return whole;
}

#define CHUNK_OK(s, body)                                                        \
    do {                                                                         \
        chunk_result r_ = chunked_all_splits(s, sizeof(s) - 1, 64, 256);          \
        int ok_ = r_.status == (ssize_t)(sizeof(s) - 1) && r_.done &&            \
                  r_.out_len == strlen(body) && memcmp(r_.out, body, r_.out_len) == 0; \
        if (!ok_) fprintf(stderr, "  chunked %s -> %zd\n", #s, r_.status);       \
        CHECK(ok_);                                                              \
    } while (0)

#define CHUNK_ERR(s, code)                                                       \
    do {                                                                         \
        chunk_result r_ = chunked_all_splits(s, sizeof(s) - 1, 64, 256);          \
        if (r_.status != -(code)) fprintf(stderr, "  chunked %s -> %zd\n", #s, r_.status); \
        CHECK(r_.status == -(code));                                             \
    } while (0)

static void test_chunked(void)
{
    CHUNK_OK("0\r\n\r\n", "");
    CHUNK_OK("5\r\nhello\r\n0\r\n\r\n", "hello");
    CHUNK_OK("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world");
    CHUNK_OK("a\r\n0123456789\r\nA\r\nabcdefghij\r\n0\r\n\r\n", "0123456789abcdefghij");
    CHUNK_OK("0000000000000005\r\nhello\r\n0\r\n\r\n", "hello"); /* 16 digits */
    CHUNK_OK("5;ext\r\nhello\r\n0\r\n\r\n", "hello");
    CHUNK_OK("5 ; a=b ; c = \"d \\\" e\"\r\nhello\r\n0;x\r\n\r\n", "hello");
    CHUNK_OK("5;a=b;c\r\nhello\r\n0\r\n\r\n", "hello");
    CHUNK_OK("5\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: \r\n\r\n", "hello");
    CHUNK_OK("3\r\n\r\n\r\r\n0\r\n\r\n", "\r\n\r"); /* data is opaque */

    CHUNK_ERR("\r\n", 400);                       /* empty size */
    CHUNK_ERR("x\r\n", 400);
    CHUNK_ERR("0x5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("-5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("+5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR(" 5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5 \r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5\t\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("00000000000000005\r\nhello\r\n0\r\n\r\n", 400); /* 17 digits */
    CHUNK_ERR("ffffffffffffffffff\r\n", 400);
    CHUNK_ERR("5\nhello\r\n0\r\n\r\n", 400);      /* bare LF */
    CHUNK_ERR("5\rhello\r\n0\r\n\r\n", 400);      /* bare CR */
    CHUNK_ERR("5\r\nhelloX\r\n0\r\n\r\n", 400);   /* data longer than size */
    CHUNK_ERR("5\r\nhello\n0\r\n\r\n", 400);
    CHUNK_ERR("5\r\nhello\rX0\r\n\r\n", 400);
    CHUNK_ERR("5;\r\nhello\r\n0\r\n\r\n", 400);   /* empty ext name */
    CHUNK_ERR("5;a=\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a \r\nhello\r\n0\r\n\r\n", 400); /* trailing BWS */
    CHUNK_ERR("5;a=\"x\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a\x01\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a=b\x7f\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a=\"x\x01\"\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a=(b)\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a=\"b\"c\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5 x\r\nhello\r\n0\r\n\r\n", 400);       /* only ';' may follow BWS */
    CHUNK_ERR("5;a x\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;\"a\"\r\nhello\r\n0\r\n\r\n", 400);   /* name must be a token */
    CHUNK_ERR("5;a=\"b\"\x01\r\nhello\r\n0\r\n\r\n", 400);
    CHUNK_ERR("5;a=\"\\\x01\"\r\nhello\r\n0\r\n\r\n", 400); /* bad quoted-pair */
    CHUNK_OK("5\t;\ta\t=\t\"\\\\\"\t;b\r\nhello\r\n0\r\n\r\n", "hello");
    /* extension length limit (64 in these tests; counts bytes after the size) */
    CHUNK_OK("5;aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nhello\r\n0\r\n\r\n", "hello");
    CHUNK_ERR("5;aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nhello\r\n0\r\n\r\n", 400);
    /* trailers */
    CHUNK_ERR("0\r\n X: 1\r\n\r\n", 400);         /* obs-fold */
    CHUNK_ERR("0\r\nX : 1\r\n\r\n", 400);
    CHUNK_ERR("0\r\nX: a\x01\r\n\r\n", 400);
    CHUNK_ERR("0\r\nX: a\n\r\n", 400);
    CHUNK_ERR("0\r\nNoColon\r\n\r\n", 400);
    CHUNK_ERR("0\r\n\n", 400);
    CHUNK_ERR("0\r\n\rX", 400);
    CHUNK_ERR("0\r\nX: 1\rY\r\n\r\n", 400);
    CHUNK_ERR("0\r\nX\x80: 1\r\n\r\n", 400);
    {
        /* trailer byte limit: 10 bytes of trailer fields allowed */
        const char ok[] = "0\r\nAbc: 12\r\n\r\n"; /* "Abc: 12\r\n" = 9 */
        const char big[] = "0\r\nAbcd: 12\r\n\r\n"; /* 10 */
        const char bigger[] = "0\r\nAbcde: 12\r\n\r\n"; /* 11 */
        chunk_result r = chunked_all_splits(ok, sizeof ok - 1, 64, 10);
        CHECK(r.status == (ssize_t)(sizeof ok - 1) && r.done);
        r = chunked_all_splits(big, sizeof big - 1, 64, 10);
        CHECK(r.status == (ssize_t)(sizeof big - 1) && r.done);
        r = chunked_all_splits(bigger, sizeof bigger - 1, 64, 10);
        CHECK(r.status == -431);
        r = chunked_all_splits("0\r\n\r\n", 5, 64, 0); /* no trailers allowed, none sent */
        CHECK(r.status == 5 && r.done);
        r = chunked_all_splits("0\r\nX:\r\n\r\n", 9, 64, 0);
        CHECK(r.status == -431);
    }
}

static void test_chunked_incremental(void)
{
    /* leftover after done stays untouched; return value points at it */
    char buf[] = "5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
    sv_chunked c;
    sv_chunked_init(&c, 16, 16);
    size_t out = 0;
    ssize_t rc = sv_chunked_decode(&c, buf, sizeof buf - 1, &out, NULL);
    CHECK(rc == 15 && c.done == 1 && out == 5 && memcmp(buf, "hello", 5) == 0);
    CHECK(memcmp(buf + 15, "GET / HTTP/1.1\r\n", 16) == 0);
    /* calling again after done consumes nothing */
    rc = sv_chunked_decode(&c, buf + 15, 16, &out, NULL);
    CHECK(rc == 0 && out == 0);

    /* incomplete: everything consumed, no data yet */
    sv_chunked_init(&c, 16, 16);
    char p1[] = "5\r\nhe";
    rc = sv_chunked_decode(&c, p1, 5, &out, NULL);
    CHECK(rc == 5 && out == 2 && memcmp(p1, "he", 2) == 0 && !c.done);
    char p2[] = "llo\r\n0\r\n";
    rc = sv_chunked_decode(&c, p2, 8, &out, NULL);
    CHECK(rc == 8 && out == 3 && memcmp(p2, "llo", 3) == 0 && !c.done);
    char p3[] = "\r\n";
    rc = sv_chunked_decode(&c, p3, 2, &out, NULL);
    CHECK(rc == 2 && out == 0 && c.done);
    /* empty input */
    sv_chunked_init(&c, 16, 16);
    rc = sv_chunked_decode(&c, p3, 0, &out, NULL);
    CHECK(rc == 0 && out == 0);
    /* sticky error */
    char bad[] = "zz";
    const char *msg = NULL;
    CHECK(sv_chunked_decode(&c, bad, 2, &out, &msg) == -400 && msg != NULL);
    CHECK(sv_chunked_decode(&c, p3, 2, &out, &msg) == -400);
    /* large chunk size across calls */
    sv_chunked_init(&c, 16, 16);
    char big[] = "FFFFFFFFFFFFFFFF\r\nabc";
    rc = sv_chunked_decode(&c, big, sizeof big - 1, &out, NULL);
    CHECK(rc == (ssize_t)(sizeof big - 1) && out == 3 && c.remaining == 0xFFFFFFFFFFFFFFFFULL - 3);

    /* random splits of a long body */
    char in[2048];
    char expect[1024];
    size_t n = 0, en = 0;
    unsigned seed = 12345;
    for (int k = 0; k < 20; k++) {
        size_t sz = (size_t)(k * 7 % 41) + 1;
        n += (size_t)sprintf(in + n, "%zx;k=%d\r\n", sz, k);
        for (size_t j = 0; j < sz; j++) {
            seed = seed * 1103515245u + 12345u;
            char ch = (char)(seed >> 16);
            in[n++] = ch;
            expect[en++] = ch;
        }
        in[n++] = '\r';
        in[n++] = '\n';
    }
    n += (size_t)sprintf(in + n, "0\r\nT: v\r\n\r\n");
    int all_ok = 1;
    for (int trial = 0; trial < 200; trial++) {
        sv_chunked_init(&c, 16, 64);
        char work[2048];
        char got[1024];
        size_t gn = 0, fed = 0;
        ssize_t consumed = 0;
        while (fed < n && !c.done) {
            seed = seed * 1103515245u + 12345u;
            size_t piece = (seed >> 16) % 9;
            if (piece > n - fed) piece = n - fed;
            memcpy(work, in + fed, piece);
            rc = sv_chunked_decode(&c, work, piece, &out, NULL);
            if (rc < 0 || (size_t)rc != piece || out > (size_t)rc) {
                all_ok = 0;
                break;
            }
            memcpy(got + gn, work, out);
            gn += out;
            fed += piece;
            consumed += rc;
        }
        if (!c.done || gn != en || memcmp(got, expect, en) != 0 || (size_t)consumed != n) all_ok = 0;
    }
    CHECK(all_ok);
}

/* The tchar table against RFC 9110 5.6.2's grammar, for every byte. */
static void test_tchar_table(void)
{
    const char *specials = "!#$%&'*+-.^_`|~";
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        int want = alnum || (c != 0 && strchr(specials, c) != NULL);
        if (!!sv_is_tchar((unsigned char)c) != want) {
            fprintf(stderr, "tchar table wrong for byte %d\n", c);
            failed++;
        } else {
            passed++;
        }
    }
}

/* The reg-name table against RFC 3986's unreserved / sub-delims, every byte. */
static void test_regname_table(void)
{
    const char *specials = "-._~!$&'()*+,;=";
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        int want = alnum || (c != 0 && strchr(specials, c) != NULL);
        if (!!sv_regname_table[c] != want) {
            fprintf(stderr, "reg-name table wrong for byte %d\n", c);
            failed++;
        } else {
            passed++;
        }
    }
}

/* ---- PROXY protocol ---------------------------------------------------- */

#define ALL_PROXY (SV_PROXY_V1 | SV_PROXY_V2)

static int proxy(const char *buf, size_t len, int versions, sv_proxy *p)
{
    const char *msg = NULL;
    int rc = sv_parse_proxy(p, versions, buf, len, &msg);
    if (rc < 0 && msg == NULL) {
        fprintf(stderr, "proxy error %d without errmsg\n", rc);
        failed++;
    }
    return rc;
}

/* every strict prefix of a complete header is incomplete (0), the whole is
 * its length, and bytes after it change nothing */
static int proxy_ok(const char *buf, size_t len, int versions, sv_proxy *p)
{
    sv_proxy q;
    for (size_t i = 0; i < len; i++)
        if (proxy(buf, i, versions, &q) != 0) {
            fprintf(stderr, "  PROXY prefix of %zu bytes not incomplete\n", i);
            failed++;
            return -1;
        }
    char more[SV_PROXY_V2_MAX + 32];
    memcpy(more, buf, len);
    memcpy(more + len, "GET / HTTP/1.1\r\n", 16);
    int rc = proxy(buf, len, versions, p);
    CHECK(proxy(more, len + 16, versions, &q) == rc);
    return rc;
}

#define PROXY_V1_OK(s) proxy_ok(s, strlen(s), ALL_PROXY, &p)
#define PROXY_BAD(s) CHECK(proxy(s, strlen(s), ALL_PROXY, &p) == -400)

static size_t v2_header(unsigned char *b, int cmd, int fam, size_t body)
{
    static const unsigned char sig[12] = {'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};
    memcpy(b, sig, 12);
    b[12] = (unsigned char)(0x20 | cmd);
    b[13] = (unsigned char)fam;
    b[14] = (unsigned char)(body >> 8);
    b[15] = (unsigned char)(body & 0xff);
    memset(b + 16, 0, body);
    return 16 + body;
}

static void test_proxy_v1(void)
{
    sv_proxy p;
    const char *tcp4 = "PROXY TCP4 203.0.113.7 10.0.0.1 51234 8080\r\n";
    CHECK(PROXY_V1_OK(tcp4) == (int)strlen(tcp4));
    CHECK(p.version == 1 && !p.keep && p.family == AF_INET && p.port == 51234);
    CHECK(memcmp(p.addr, "\xcb\x00\x71\x07", 4) == 0);
    const char *tcp6 = "PROXY TCP6 2001:db8::7 2001:db8::1 0 65535\r\n";
    CHECK(PROXY_V1_OK(tcp6) == (int)strlen(tcp6));
    CHECK(p.family == AF_INET6 && p.port == 0 && p.addr[0] == 0x20 && p.addr[1] == 0x01 && p.addr[15] == 7);
    CHECK(PROXY_V1_OK("PROXY UNKNOWN\r\n") == 15 && p.keep);
    CHECK(PROXY_V1_OK("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n") > 0 && p.keep);
    /* v1 only, v2 only */
    CHECK(proxy(tcp4, strlen(tcp4), SV_PROXY_V1, &p) == (int)strlen(tcp4));
    CHECK(proxy(tcp4, strlen(tcp4), SV_PROXY_V2, &p) == -400);
    /* not a PROXY header: rejected at the first byte that cannot start one */
    PROXY_BAD("GET / HTTP/1.1\r\n");
    PROXY_BAD("G");
    PROXY_BAD("PO");
    PROXY_BAD("proxy TCP4 1.2.3.4 1.2.3.4 1 2\r\n");
    PROXY_BAD("PROXY TCP5");
    PROXY_BAD("PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n");
    PROXY_BAD("PROXY UNKNOWNX\r\n");
    CHECK(proxy("PROXY TCP", 9, ALL_PROXY, &p) == 0);
    CHECK(proxy("PROXY UNKN", 10, ALL_PROXY, &p) == 0);
    /* malformed lines */
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 1 2\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 1 2\rX");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 1\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 1 2 3\r\n");
    PROXY_BAD("PROXY TCP4  1.2.3.4 1.2.3.5 1 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 1 2 \r\n");
    PROXY_BAD("PROXY TCP4\r\n");
    PROXY_BAD("PROXY TCP4 2001:db8::1 1.2.3.5 1 2\r\n");
    PROXY_BAD("PROXY TCP6 1.2.3.4 2001:db8::1 1 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.256 1.2.3.5 1 2\r\n");
    PROXY_BAD("PROXY TCP4 01.2.3.4 1.2.3.5 1 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 65536 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 080 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4 1.2.3.5 -1 2\r\n");
    PROXY_BAD("PROXY TCP4 1.2.3.4\t1.2.3.5 1 2\r\n");
    PROXY_BAD("PROXY UNKNOWN \x01\r\n");
    /* the length limit: 107 bytes with the CRLF */
    char line[256];
    memcpy(line, "PROXY UNKNOWN ", 14);
    memset(line + 14, 'x', SV_PROXY_V1_MAX - 16);
    memcpy(line + SV_PROXY_V1_MAX - 2, "\r\n", 3);
    CHECK(strlen(line) == SV_PROXY_V1_MAX);
    CHECK(PROXY_V1_OK(line) == SV_PROXY_V1_MAX);
    memset(line + 14, 'x', SV_PROXY_V1_MAX - 15);
    memcpy(line + SV_PROXY_V1_MAX - 1, "\r\n", 3);
    PROXY_BAD(line);                                   /* 108 bytes */
    CHECK(proxy(line, SV_PROXY_V1_MAX - 1, ALL_PROXY, &p) == 0);
    CHECK(proxy(line, SV_PROXY_V1_MAX, ALL_PROXY, &p) == -400); /* no CRLF can end it in time */
    CHECK(sv_parse_proxy(&p, ALL_PROXY, "X", 1, NULL) == -400);   /* errmsg may be NULL */
    CHECK(sv_parse_proxy(&p, ALL_PROXY, "", 0, NULL) == 0);
}

static void test_proxy_v2(void)
{
    sv_proxy p;
    unsigned char b[SV_PROXY_V2_MAX + 64];
    /* PROXY TCP4 */
    size_t n = v2_header(b, 1, 0x11, 12);
    memcpy(b + 16, "\xc6\x33\x64\x09", 4);
    memcpy(b + 24, "\x1f\x90", 2);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 28);
    CHECK(p.version == 2 && !p.keep && p.family == AF_INET && p.port == 8080 && b[16] == p.addr[0] && p.addr[3] == 9);
    /* TLVs after the addresses are skipped */
    n = v2_header(b, 1, 0x11, 12 + 7);
    memcpy(b + 16, "\x0a\x00\x00\x05", 4);
    memcpy(b + 28, "\x04\x00\x04test", 7);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == (int)n && p.addr[3] == 5);
    /* PROXY TCP6 */
    n = v2_header(b, 1, 0x21, 36);
    b[16] = 0x20;
    b[17] = 0x01;
    b[31] = 0x42;
    b[48] = 0x01;
    b[49] = 0x02;
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 52);
    CHECK(p.family == AF_INET6 && p.addr[0] == 0x20 && p.addr[15] == 0x42 && p.port == 258);
    /* LOCAL, UNSPEC and UNIX keep the socket's address */
    n = v2_header(b, 0, 0x00, 0);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 16 && p.keep);
    n = v2_header(b, 0, 0x11, 12);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 28 && p.keep);
    n = v2_header(b, 1, 0x00, 0);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 16 && p.keep);
    n = v2_header(b, 1, 0x31, 216);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == 232 && p.keep);
    /* v2 only, v1 only */
    CHECK(proxy((char *)b, n, SV_PROXY_V2, &p) == 232);
    CHECK(proxy((char *)b, n, SV_PROXY_V1, &p) == -400);
    /* malformed: each rejected as soon as its byte arrives */
    n = v2_header(b, 1, 0x11, 12);
    b[12] = 0x11; /* version 1 */
    CHECK(proxy((char *)b, 13, ALL_PROXY, &p) == -400);
    b[12] = 0x22; /* command 2 */
    CHECK(proxy((char *)b, 13, ALL_PROXY, &p) == -400);
    b[12] = 0x21;
    const int bad_fams[] = {0x01, 0x10, 0x13, 0x40, 0x41, 0xff};
    for (size_t i = 0; i < sizeof(bad_fams) / sizeof(bad_fams[0]); i++) {
        b[13] = (unsigned char)bad_fams[i];
        CHECK(proxy((char *)b, 14, ALL_PROXY, &p) == -400);
    }
    b[11] = 'X'; /* a broken signature */
    CHECK(proxy((char *)b, 12, ALL_PROXY, &p) == -400);
    /* addresses shorter than the family needs */
    n = v2_header(b, 1, 0x11, 11);
    CHECK(proxy((char *)b, 16, ALL_PROXY, &p) == -400);
    n = v2_header(b, 1, 0x21, 35);
    CHECK(proxy((char *)b, 16, ALL_PROXY, &p) == -400);
    /* the length limit, known from the fixed 16 bytes */
    n = v2_header(b, 1, 0x11, SV_PROXY_V2_MAX - 16);
    CHECK(proxy_ok((char *)b, n, ALL_PROXY, &p) == SV_PROXY_V2_MAX);
    v2_header(b, 1, 0x11, 0);
    b[14] = (unsigned char)((SV_PROXY_V2_MAX - 15) >> 8);
    b[15] = (unsigned char)((SV_PROXY_V2_MAX - 15) & 0xff);
    CHECK(proxy((char *)b, 16, ALL_PROXY, &p) == -400);
    b[14] = b[15] = 0xff;
    CHECK(proxy((char *)b, 16, ALL_PROXY, &p) == -400);
}

/* Every byte at every offset of a field name, a field value and a target, for
 * values of 1-24 bytes (the scans test 8 bytes a step, then single bytes):
 * the outcome is the grammar's, byte by byte. */
static int parse_exact(const char *s, size_t n, const char **msg)
{
    char *copy = malloc(n); /* exact size: ASan catches a scan past the end */
    memcpy(copy, s, n);
    int rc = sv_parse_head(&req, &default_limits, copy, n, msg);
    free(copy);
    return rc;
}

/* Parses before + v[0..len) + after and checks the outcome: accepted whole
 * (want NULL) or 400 with message want. Returns 0 and says which on a miss. */
static int byte_case(const char *what, const char *before, const char *v, size_t len, const char *after,
                     const char *want, int b, size_t k)
{
    char head[128];
    size_t n = (size_t)snprintf(head, sizeof head, "%s", before);
    memcpy(head + n, v, len);
    n += len;
    n += (size_t)snprintf(head + n, sizeof head - n, "%s", after);
    const char *msg = NULL;
    int rc = parse_exact(head, n, &msg);
    int good = want ? rc == -SV_ERR_BAD_REQUEST && msg && strcmp(msg, want) == 0 : rc == (int)n;
    if (!good)
        fprintf(stderr, "  %s byte 0x%02x at %zu of %zu -> %d (%s)\n", what, b, k, len, rc, msg ? msg : "");
    return good;
}

static void test_every_byte_everywhere(void)
{
    int ok = 1;
    for (int b = 0; b < 256; b++) {
        int value_ok = (b >= 0x21 && b != 0x7f) || b == ' ' || b == '\t';
        int target_ok = b > 0x20 && b != 0x7f;
        int ws = b == ' ' || b == '\t';
        const char *line_end = b == '\r' ? "bare CR" : b == '\n' ? "bare LF" : NULL;
        for (size_t len = 1; len <= 24; len++) {
            for (size_t k = 0; k < len; k++) {
                char v[32];
                memset(v, 'a', len);
                v[k] = (char)b;
                const char *want = line_end ? line_end : value_ok ? NULL : "invalid character in header value";
                ok &= byte_case("value", "GET /t HTTP/1.1\r\nHost: h\r\nX: ", v, len, "\r\n\r\n", want, b, k);
                want = line_end                ? line_end
                       : ws && k == 0          ? "obs-fold not allowed"
                       : ws                    ? "whitespace before colon"
                       : b == ':' && k == 0    ? "invalid header name"
                       : b == ':' || sv_tchar_table[b] ? NULL
                                               : "invalid header name";
                ok &= byte_case("name", "GET /t HTTP/1.1\r\nHost: h\r\n", v, len, ": v\r\n\r\n", want, b, k);
                /* a target: '/' then the bytes (' ' ends it early: a bad request line) */
                want = line_end ? line_end : b == ' ' ? "bad request line" : target_ok ? NULL : "invalid request target";
                ok &= byte_case("target", "GET /", v, len, " HTTP/1.1\r\nHost: h\r\n\r\n", want, b, k);
            }
        }
    }
    CHECK(ok);
}

int main(void)
{
    test_tchar_table();
    test_regname_table();
    test_basic();
    test_prefixes();
    test_request_line();
    test_version();
    test_targets();
    test_leading_crlf();
    test_line_endings();
    test_fields();
    test_host();
    test_content_length();
    test_transfer_encoding();
    test_connection();
    test_expect();
    test_limits();
    test_pipelining();
    test_errmsg_null();
    test_chunked();
    test_chunked_incremental();
    test_proxy_v1();
    test_proxy_v2();
    test_every_byte_everywhere();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/*
 * Serval's HTTP/1.1 request parser: strict per RFC 9112, no Ruby, no allocation.
 *
 * The parser works on a contiguous buffer that holds the bytes received so far.
 * sv_parse_head() is re-run from the start of the buffer every time more bytes
 * arrive until it returns a complete head (requests usually arrive in one read,
 * so re-parsing costs little and keeps the parser stateless and easy to fuzz).
 * All pointers in sv_request point into that buffer.
 *
 * The chunked body decoder is incremental: it keeps its state in sv_chunked
 * and decodes in place.
 */
#ifndef SERVAL_PARSER_H
#define SERVAL_PARSER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SV_HEADERS_CAP 256        /* hard upper bound for max_headers */
#define SV_METHOD_MAX 32          /* longer method token -> 400 */
#define SV_CHUNK_SIZE_DIGITS 16   /* more hex digits than this -> 400 */
#define SV_LEADING_CRLF_MAX 8     /* empty lines tolerated before a request line */

/* Status codes the parser produces (returned negated by sv_parse_head). */
#define SV_ERR_BAD_REQUEST 400
#define SV_ERR_URI_TOO_LONG 414
#define SV_ERR_EXPECTATION 417
#define SV_ERR_HEADERS_TOO_LARGE 431
#define SV_ERR_NOT_IMPLEMENTED 501
#define SV_ERR_VERSION 505

typedef struct {
    size_t max_request_line; /* bytes of "METHOD SP target SP version"; over -> 414 */
    size_t max_head;         /* bytes of the whole head incl. final CRLF; over -> 431 */
    size_t max_headers;      /* number of header fields (<= SV_HEADERS_CAP); over -> 431 */
} sv_limits;

typedef struct {
    const char *name;
    size_t name_len;
    const char *value;       /* leading and trailing OWS removed */
    size_t value_len;
} sv_header;

typedef struct {
    const char *method;
    size_t method_len;
    const char *target;      /* raw request-target as sent */
    size_t target_len;
    const char *path;        /* origin-form path; for absolute-form the path part ("/" if empty); "*" for asterisk-form */
    size_t path_len;
    const char *query;       /* after '?', without the '?'; NULL/0 when absent */
    size_t query_len;
    const char *host;        /* authority from absolute-form if present, else the Host field value; NULL if neither */
    size_t host_len;
    int minor_version;       /* 0 or 1 */
    int64_t content_length;  /* -1 when no Content-Length */
    int chunked;             /* 1 when Transfer-Encoding ends in chunked */
    int keep_alive;          /* HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "Connection: keep-alive" */
    int expect_continue;     /* "Expect: 100-continue" */
    int upgrade;             /* an Upgrade header field is present */
    int host_field;          /* index in headers of the Host field, -1 when there is none */
    size_t head_len;         /* bytes consumed, including the blank line (and any skipped leading CRLFs) */
    size_t num_headers;
    sv_header headers[SV_HEADERS_CAP]; /* every field except none: Host, Content-Length etc. are listed too */
} sv_request;

/*
 * Parse a request head from buf[0..len).
 * Returns  > 0: the head is complete; the value equals r->head_len.
 *          = 0: incomplete, call again with more bytes (the caller enforces
 *               the size limits on what it buffers; the parser also returns
 *               -414/-431 as soon as a limit is provably exceeded, even when
 *               the head is still incomplete).
 *          < 0: the negated status code to answer with (400, 414, 417, 431, 501, 505).
 * On error *errmsg (if errmsg != NULL) points to a static, human-readable
 * reason such as "Content-Length and Transfer-Encoding together".
 */
int sv_parse_head(sv_request *r, const sv_limits *lim, const char *buf, size_t len, const char **errmsg);

typedef struct {
    int state;               /* private */
    uint64_t remaining;      /* private: bytes left in the current chunk */
    size_t digits;           /* private */
    size_t ext_len;          /* private */
    size_t trailer_len;      /* private */
    size_t max_ext;          /* limit: bytes of chunk extensions per chunk line (over -> 400) */
    size_t max_trailer;      /* limit: bytes of trailer section (over -> 431) */
    int done;                /* set to 1 once the last chunk and trailers are consumed */
} sv_chunked;

void sv_chunked_init(sv_chunked *c, size_t max_ext, size_t max_trailer);

/*
 * Decode chunked framing in place. Reads buf[0..len), moves the decoded body
 * bytes to the front of buf and stores their count in *out_len. Returns the
 * number of input bytes consumed (>= 0); once c->done is set, bytes after the
 * returned count belong to the next request and are left untouched.
 * Returns the negated status code (400 or 431) on a framing error, with
 * *errmsg set as for sv_parse_head.
 */
ssize_t sv_chunked_decode(sv_chunked *c, char *buf, size_t len, size_t *out_len, const char **errmsg);

/*
 * PROXY protocol (HAProxy's proxy-protocol.txt), the header a proxy sends
 * before anything else on a connection when `set_remote_address
 * proxy_protocol:` is configured. Version 1 is one text line, version 2 a
 * binary block; the limits below are the only ones (core.c exports them as
 * Native::Core::REMOTE_LIMITS, the tests and the docs read them there).
 */
#define SV_PROXY_V1 1                 /* `versions` bits of sv_parse_proxy */
#define SV_PROXY_V2 2
#define SV_PROXY_V1_MAX 107           /* the spec's longest v1 line, CRLF included */
#define SV_PROXY_V2_MAX 4096          /* a v2 header (16 bytes + addresses + TLVs) longer than this -> 400 */

typedef struct {
    int version;             /* 1 or 2 */
    int keep;                /* 1: no address to use, keep the socket's (v1 UNKNOWN, v2 LOCAL, v2 UNSPEC or UNIX) */
    int family;              /* AF_INET or AF_INET6 when !keep */
    unsigned char addr[16];  /* the source address, network order (4 bytes for AF_INET) */
    unsigned port;           /* the source port */
} sv_proxy;

/*
 * Parse a PROXY header at the front of buf[0..len), of a version in
 * `versions` (SV_PROXY_V1 | SV_PROXY_V2). Stateless, like sv_parse_head:
 * call again from the start with more bytes.
 * Returns  > 0: the header's length (the connection's data follows it);
 *          = 0: incomplete, and every byte so far can still begin a valid
 *               header (at most SV_PROXY_V1_MAX / SV_PROXY_V2_MAX bytes are
 *               ever asked for);
 *          < 0: -400, with *errmsg (if errmsg != NULL) a static reason.
 */
int sv_parse_proxy(sv_proxy *p, int versions, const char *buf, size_t len, const char **errmsg);

/* tchar (RFC 9110 5.6.2): the bytes of a token (method, field name); a
 * table lookup, inline (every byte of every field name goes through it). */
extern const unsigned char sv_tchar_table[256];
extern const unsigned char sv_regname_table[256]; /* reg-name bytes of a Host (RFC 3986), for test/c */
static inline int sv_is_tchar(unsigned char c) { return sv_tchar_table[c]; }

/* The reason phrase for a status code, "" when there is no standard one. */
const char *sv_reason_phrase(int code);

#endif

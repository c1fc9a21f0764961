/*
 * libFuzzer target for ext/serval/parser.c.
 *
 *   clang-14 -g -O1 -fsanitize=fuzzer,address,undefined -Iext/serval \
 *       ext/serval/parser.c fuzz/fuzz_parser.c -o tmp/fuzz_parser
 *
 * Built with -DSV_FUZZ_STANDALONE (any compiler, no libFuzzer) it is a corpus
 * replayer: every file named on the command line is fed to the target once.
 *
 * Invariants checked (abort() on violation):
 *   - sv_parse_head returns head_len, 0, or a known negated status + errmsg;
 *   - a complete head lies inside the input, all pointers point into it, and
 *     the result does not depend on bytes after the head;
 *   - every strict prefix of a complete head is "incomplete" (0);
 *   - sv_chunked_decode gives the same result for any split of its input,
 *     with out_len <= consumed <= fed;
 *   - sv_parse_proxy returns a length within its version's limit, 0 or -400
 *     + errmsg; every strict prefix of a complete header is 0, bytes after it
 *     change nothing, and an incomplete input is shorter than the limit.
 */
#include "parser.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define FUZZ_MAX_REQUEST_LINE 128
#define FUZZ_MAX_HEAD 512
#define FUZZ_MAX_HEADERS 12
#define FUZZ_MAX_EXT 24
#define FUZZ_MAX_TRAILER 48
#define FUZZ_SPLIT_ROUNDS 3
#define FUZZ_MAX_PIECE 17

#define ENSURE(cond)                                                             \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                             \
        }                                                                        \
    } while (0)

static const sv_limits fuzz_limits = {FUZZ_MAX_REQUEST_LINE, FUZZ_MAX_HEAD, FUZZ_MAX_HEADERS};

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*; seeded from the input so runs are reproducible */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static uint64_t seed_of(const uint8_t *d, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 0x100000001b3ULL;
    return h ? h : 1;
}

static void check_ptr(const char *p, size_t n, const char *base, size_t len)
{
    if (p == NULL) {
        ENSURE(n == 0);
        return;
    }
    ENSURE(p >= base && p <= base + len);
    ENSURE(n <= (size_t)(base + len - p));
}

static int known_status(int rc)
{
    return rc == -400 || rc == -414 || rc == -417 || rc == -431 || rc == -501 || rc == -505;
}

static void check_request(const sv_request *r, const char *buf, size_t head_len)
{
    ENSURE(r->head_len == head_len);
    ENSURE(r->method != NULL && r->method_len > 0 && r->method_len <= SV_METHOD_MAX);
    ENSURE(r->target != NULL && r->target_len > 0);
    check_ptr(r->method, r->method_len, buf, head_len);
    check_ptr(r->target, r->target_len, buf, head_len);
    check_ptr(r->path, r->path_len, buf, head_len);
    check_ptr(r->query, r->query_len, buf, head_len);
    check_ptr(r->host, r->host_len, buf, head_len);
    ENSURE(r->minor_version == 0 || r->minor_version == 1);
    ENSURE(r->content_length >= -1);
    ENSURE(!(r->chunked && r->content_length >= 0));
    ENSURE(r->num_headers <= FUZZ_MAX_HEADERS);
    if (r->minor_version == 1) ENSURE(r->host != NULL);
    for (size_t i = 0; i < r->num_headers; i++) {
        ENSURE(r->headers[i].name_len > 0);
        check_ptr(r->headers[i].name, r->headers[i].name_len, buf, head_len);
        check_ptr(r->headers[i].value, r->headers[i].value_len, buf, head_len);
    }
}

typedef struct {
    ssize_t status; /* consumed total, or negative error */
    int done;
    size_t out_len;
} chunk_outcome;

/* Decode in[0..n) split into pieces (piece size 0 = at once); decoded bytes
 * are appended to out (capacity n: decoding never grows the data). */
static chunk_outcome decode_split(const uint8_t *in, size_t n, uint64_t *rng, int at_once, char *out)
{
    chunk_outcome res = {0, 0, 0};
    sv_chunked c;
    sv_chunked_init(&c, FUZZ_MAX_EXT, FUZZ_MAX_TRAILER);
    char *work = malloc(n ? n : 1);
    size_t fed = 0;
    ENSURE(work != NULL);
    while (fed < n && !c.done) {
        size_t piece = at_once ? n - fed : (size_t)(rng_next(rng) % FUZZ_MAX_PIECE);
        if (piece > n - fed) piece = n - fed;
        memcpy(work, in + fed, piece);
        size_t out_len = 12345;
        const char *msg = NULL;
        ssize_t rc = sv_chunked_decode(&c, work, piece, &out_len, &msg);
        if (rc < 0) {
            ENSURE(rc == -400 || rc == -431);
            ENSURE(msg != NULL);
            res.status = rc;
            break;
        }
        ENSURE((size_t)rc <= piece);
        ENSURE(out_len <= (size_t)rc);
        if (!c.done) ENSURE((size_t)rc == piece);
        else ENSURE(memcmp(work + rc, in + fed + rc, piece - (size_t)rc) == 0); /* leftover untouched */
        memcpy(out + res.out_len, work, out_len);
        res.out_len += out_len;
        res.status += rc;
        fed += (size_t)rc;
    }
    res.done = c.done;
    free(work);
    return res;
}

static void fuzz_chunked(const uint8_t *in, size_t n, uint64_t *rng)
{
    char *ref = malloc(n ? n : 1);
    char *got = malloc(n ? n : 1);
    ENSURE(ref != NULL && got != NULL);
    chunk_outcome whole = decode_split(in, n, rng, 1, ref);
    ENSURE(whole.out_len <= n);
    if (whole.status >= 0) ENSURE((size_t)whole.status <= n);
    for (int round = 0; round < FUZZ_SPLIT_ROUNDS; round++) {
        chunk_outcome part = decode_split(in, n, rng, 0, got);
        ENSURE(part.done == whole.done);
        ENSURE(part.status == whole.status);
        if (whole.status >= 0) {
            ENSURE(part.out_len == whole.out_len);
            ENSURE(memcmp(got, ref, whole.out_len) == 0);
        }
    }
    free(ref);
    free(got);
}

static sv_request fuzz_req; /* big; not on the stack */

static void fuzz_proxy(const char *buf, size_t size, uint64_t *rng)
{
    sv_proxy p, q;
    const char *msg = NULL;
    int rc = sv_parse_proxy(&p, SV_PROXY_V1 | SV_PROXY_V2, buf, size, &msg);
    if (rc < 0) {
        ENSURE(rc == -400 && msg != NULL);
        return;
    }
    if (rc == 0) {
        ENSURE(size < SV_PROXY_V2_MAX);
        return;
    }
    size_t n = (size_t)rc;
    ENSURE(n <= size && n <= (p.version == 1 ? SV_PROXY_V1_MAX : SV_PROXY_V2_MAX));
    ENSURE(p.keep || p.family == AF_INET || p.family == AF_INET6);
    ENSURE(p.port <= 65535);
    char *hdr = malloc(n);
    ENSURE(hdr != NULL);
    memcpy(hdr, buf, n);
    ENSURE(sv_parse_proxy(&q, SV_PROXY_V1 | SV_PROXY_V2, hdr, n, NULL) == rc);
    ENSURE(memcmp(&p, &q, sizeof(p)) == 0);
    size_t cuts[3] = {n - 1, n / 2, (size_t)(rng_next(rng) % n)};
    for (int i = 0; i < 3; i++) ENSURE(sv_parse_proxy(&q, SV_PROXY_V1 | SV_PROXY_V2, hdr, cuts[i], NULL) == 0);
    ENSURE(sv_parse_proxy(&q, p.version == 1 ? SV_PROXY_V2 : SV_PROXY_V1, hdr, n, NULL) == -400);
    free(hdr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* exact-size copy so that any over-read trips ASan */
    char *buf = malloc(size ? size : 1);
    ENSURE(buf != NULL);
    memcpy(buf, data, size);
    uint64_t rng = seed_of(data, size);

    const char *msg = NULL;
    int rc = sv_parse_head(&fuzz_req, &fuzz_limits, buf, size, &msg);
    if (rc < 0) {
        ENSURE(known_status(rc));
        ENSURE(msg != NULL);
    } else if (rc == 0) {
        ENSURE(size < FUZZ_MAX_HEAD); /* a full buffer would have been 431 */
    } else {
        size_t head_len = (size_t)rc;
        ENSURE(head_len <= size && head_len <= FUZZ_MAX_HEAD);
        check_request(&fuzz_req, buf, head_len);
        /* the bytes after the head do not matter */
        char *head = malloc(head_len);
        ENSURE(head != NULL);
        memcpy(head, buf, head_len);
        ENSURE(sv_parse_head(&fuzz_req, &fuzz_limits, head, head_len, NULL) == rc);
        check_request(&fuzz_req, head, head_len);
        /* every strict prefix is incomplete */
        size_t cuts[3] = {head_len - 1, head_len / 2, (size_t)(rng_next(&rng) % head_len)};
        for (int i = 0; i < 3; i++) ENSURE(sv_parse_head(&fuzz_req, &fuzz_limits, head, cuts[i], NULL) == 0);
        free(head);
        fuzz_chunked(data + head_len, size - head_len, &rng);
    }
    /* also drive the chunked decoder directly with raw body inputs */
    if (rc <= 0 && size > 0 && ((data[0] >= '0' && data[0] <= '9') || (data[0] >= 'a' && data[0] <= 'f') ||
                                (data[0] >= 'A' && data[0] <= 'F')))
        fuzz_chunked(data, size, &rng);
    /* a PROXY header (what a proxy_protocol connection starts with) */
    if (size > 0 && (data[0] == 'P' || data[0] == '\r'))
        fuzz_proxy(buf, size, &rng);
    free(buf);
    return 0;
}

#ifdef SV_FUZZ_STANDALONE
int main(int argc, char **argv)
{
    int files = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 1;
        }
        if (fseek(f, 0, SEEK_END) != 0) {
            fclose(f);
            continue;
        }
        long sz = ftell(f);
        rewind(f);
        if (sz < 0) {
            fclose(f);
            return 1;
        }
        uint8_t *d = malloc((size_t)sz ? (size_t)sz : 1);
        if (d == NULL || fread(d, 1, (size_t)sz, f) != (size_t)sz) {
            fprintf(stderr, "%s: read failed\n", argv[i]);
            fclose(f);
            free(d);
            return 1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(d, (size_t)sz);
        free(d);
        files++;
    }
    printf("replayed %d inputs\n", files);
    return 0;
}
#endif

/*
 * The native I/O core's data: its limits, the connection, the core. Each
 * module's functions are declared in its own header (conn.h, core.h,
 * loop.h, ...).
 *
 * Ownership rule: a connection is owned either by the event-loop thread
 * (SV_OWN_LOOP) or by exactly one Ruby worker thread (SV_OWN_RUBY). The owner
 * is the only one that touches it; ownership moves through the ready queue
 * (loop -> Ruby) and through an atomic store followed by an epoll re-arm or the
 * return list (Ruby -> loop). The loop thread never touches a Ruby object.
 * "The loop" is whoever holds core->poll_mu: the loop thread, or a request
 * thread running a round while the loop thread is parked (request.c); the
 * round is the same C code and touches no Ruby object either.
 */
#ifndef SERVAL_H
#define SERVAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include "parser.h"

#define SV_MAX_LISTENERS 16
#define SV_READ_MIN 4096             /* first read buffer size */
#define SV_BODY_WINDOW 262144        /* read window for bodies */
#define SV_BODY_READS_PER_EVENT 16   /* Content-Length body reads per readiness event */
#define SV_OUT_MIN 16384             /* output buffer a connection keeps between responses of a
                                      * pipeline; an empty one is freed when the request ends */
#define SV_LINGER_SECONDS 2.0        /* lingering close after an error response */
#define SV_SCAN_INTERVAL_MS 50       /* timeout scan granularity */
#define SV_IDLE_RELEASE_MS 50       /* a keep-alive connection idle this long gives its buffers back (loop.c scan) */
#define SV_KEEP_OPEN 256             /* connections open up to which one keeps its buffers between requests (conn.c) */
#define SV_POLL_EVERY_MS 0.1         /* thread polls: a request thread polls at least this often (request.c) */
#define SV_YOUNG_MS 1                /* thread polls: a preempted request this young goes before the queue */
#define SV_PARK_MS 2                 /* thread polls: the loop takes the epoll back after this long without a poll */
#define SV_ACCEPT_BATCH 64           /* accepts per listener event */
#define SV_EVICT_MIN_AGE 0.25        /* seconds: a connection this new is never evicted */
#define SV_EVENTS 128                /* epoll events per wait */
#define SV_REMOTE_MAX 64             /* REMOTE_ADDR text, NUL included (a set_remote_address value: 63 bytes) */
#define SV_REMOTE_HEADER_MAX 128     /* set_remote_address header: the field name, NUL included */
#define SV_DRAIN_ACK_SECONDS 1.0     /* Core#drain waits this long for the loop to stop accepting */
#define SV_DRAIN_FRESH_SECONDS 0.5   /* balance: a drain's grace for a new connection's first request */

enum { SV_KIND_LISTENER = 1, SV_KIND_CONN = 2, SV_KIND_WAKE = 3 };
enum { SV_OWN_LOOP = 0, SV_OWN_RUBY = 1, SV_OWN_DEAD = 2 };
enum {
    SV_ST_HEAD = 0,   /* waiting for / reading a request head */
    SV_ST_BODY,       /* reading a request body */
    SV_ST_APP,        /* in the ready queue or with a Ruby thread */
    SV_ST_WRITE,      /* loop finishes writing the response */
    SV_ST_LINGER      /* error answered; discard input until EOF or timeout */
};
enum { SV_MODE_NONE = 0, SV_MODE_LENGTH, SV_MODE_CHUNKED, SV_MODE_RAW };

/* Free blocks kept for reuse (conn.c): a connection's read and output
 * buffers start at SV_POOL_BLOCK bytes and its parsed head is one
 * sv_request; all are freed when a request ends with nothing behind it (an
 * idle keep-alive connection holds none), so each request would otherwise
 * malloc and free three blocks. At most SV_POOL_MAX per pool, LIFO (the
 * block reused is the one in cache). */
#define SV_POOL_BLOCK SV_READ_MIN
#define SV_POOL_MAX 64
typedef struct {
    pthread_mutex_t mu;
    size_t size;                 /* bytes of each block */
    int n;
    void *items[SV_POOL_MAX];
} sv_pool;

typedef struct {
    char *data;
    size_t len;
    size_t cap;
    size_t off;       /* output buffers: bytes already written */
    _Atomic size_t *acct;        /* output buffers: the core's count their capacity is part of */
    sv_pool *pool;               /* where a block of SV_POOL_BLOCK bytes goes when freed, or NULL */
} sv_buf;

typedef struct sv_listener {
    int kind;
    int fd;
    int port;
    char name[256];
    void *tls_ctx;               /* SSL_CTX* of an ssl:// listener (one reference), or NULL */
} sv_listener;

typedef struct sv_core sv_core;

/* A Ruby thread asleep in Core#next, on that thread's stack (conn.c). */
typedef struct sv_waiter {
    pthread_cond_t cv;
    struct sv_waiter *prev, *next;
    int listed;                  /* in core->idle */
    int woken;                   /* taken off core->idle by a wake-up, counted in core->waking */
} sv_waiter;
typedef struct sv_transport sv_transport;   /* transport.h: plain TCP or TLS */

/* One error response the loop answered itself (errlog.c). */
#define SV_ERRLOG_CAP 256
typedef struct {
    int status;
    const char *reason;          /* static: the status line's reason phrase */
    const char *detail;          /* static: what was wrong */
    char peer[SV_REMOTE_MAX];
} sv_err_event;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_err_event ev[SV_ERRLOG_CAP];
    unsigned head, len;
    unsigned long dropped;       /* records lost to a full ring since the last take */
    unsigned long total;         /* records offered, kept or not */
    int wake;
    int ready;
    int efd;                     /* eventfd: readable while records (or drops) wait, for a poller */
} sv_errlog;

/* One request's timing record (ext/serval/timing.c). */
typedef struct {
    /* what every request sets, first: two cache lines (sv_tm_begin writes
     * these and leaves the rest alone unless a flag says it is used) */
    uint64_t start_ns, end_ns;
    double queue;
    double upstream;             /* NaN when no header */
    int has_cpu, has_gc, has_gvl, has_pool, finished;
    uint64_t gvl0[5], gvl1[5];   /* run, idle, stall ns, idle periods, lock ns (SV_GVL_MARKS); valid when has_gvl */
    uint64_t cpu0, cpu1;         /* thread CPU ns; valid when has_cpu */
    uint64_t gc0, gc1;           /* GC.total_time ns; valid when has_gc */
    uint64_t pw0[4], pw1[4];     /* pool wait: wall, run, idle, stall ns; valid when has_pool */
} sv_tm;

typedef struct sv_conn {
    int kind;
    int fd;
    _Atomic int owner;
    int state;
    uint32_t missed;             /* events that came while a Ruby thread owned it, or-ed (under core->mu) */
    int et;                      /* registered once, edge-triggered (plain TCP); else EPOLLONESHOT, re-armed */
    int rd_more;                 /* edge-triggered: the socket may hold input no event will announce
                                  * (a read filled the buffer, or readiness came in a state that does not read) */
    int rdhup;                   /* edge-triggered: an event said the peer's input ended (EPOLLRDHUP, HUP, ERR):
                                  * a short read no longer means an empty socket, its EOF is still to read */
    sv_core *core;
    struct sv_conn *next;        /* ready queue / return list / dead list link */
    uint32_t slot;               /* index in core->conns */
    sv_listener *listener;
    char remote[SV_REMOTE_MAX];
    int proxy;                   /* a PROXY header must come first (opt.proxy_versions) and has not yet */
    const sv_transport *io;      /* read/write/flush/close of the socket (transport.h) */
    void *tls;                   /* TLS transport only (tls.c): SSL*, else NULL */
    uint32_t tls_want;           /* TLS: epoll event OpenSSL waits for, or 0 */
    int tls_state;               /* TLS: handshake, open, failed, closed (tls.c) */

    /* request side */
    sv_buf in;                   /* raw bytes; the head stays at the front while the request lives */
    sv_request *req;             /* parsed head (points into in.data) */
    size_t consumed;             /* bytes of in that belong to the current request */
    int has_request;
    int body_in_place;           /* body is in.data[head_len .. head_len+content_length) */
    sv_buf body;                 /* body in memory */
    int body_fd;                 /* body spilled to an unlinked temp file, or -1 */
    uint64_t body_total;
    sv_chunked chunked;
    int partial;                 /* counted in core->partial */
    unsigned nreq;               /* requests served on this connection */
    double deadline;             /* monotonic seconds */
    double since;                /* monotonic: when waiting for the current request began */
    double queued_at;
    long q_ahead;                /* requests ahead no idle thread would take, or -1 (hooks.h queued) */

    /* response side */
    sv_buf out;
    int file_fd;                 /* sendfile source (a to_path file or the spill) or -1 */
    off_t file_off;
    uint64_t file_rem;
    int file_spill;              /* file_fd is this response's spill: the rest of a generated body */
    int spill_failed;            /* the spill was refused for this response: its writer waits instead */
    uint64_t spill_bytes;        /* of the spill file, counted in core->spill_used */
    int mode;                    /* SV_MODE_* of the current response */
    int64_t expected;            /* SV_MODE_LENGTH: declared length */
    int64_t sent_body;           /* body bytes accepted so far */
    int keep_alive;              /* decided by write_head */
    int head_only;               /* HEAD request: body bytes are dropped */
    int close_after;             /* close once the output is written */
    int head_written;            /* write_head succeeded for the current request */
    int head_partial;            /* write_head raised midway: out holds a partial head from head_mark on */
    size_t head_mark;

    sv_tm tm;                    /* the timing of its current request when not sampled (request.c) */
} sv_conn;

typedef struct {
    sv_limits lim;
    uint64_t max_body;
    size_t body_spill;
    size_t max_chunk_ext;
    double first_data_timeout;
    double read_timeout;
    double persistent_timeout;
    double write_timeout;
    size_t max_connections;
    size_t output_buffer;
    size_t output_budget;        /* all connections' output buffers together (SV_OUT_MIN each free) */
    uint64_t max_spill;          /* all spill files together */
    unsigned max_keepalive_requests;
    double min_body_rate;        /* bytes/s a body must average after read_timeout; 0: off */
    int balance;                 /* cluster worker: accept only while a Ruby thread is free */
    int balance_close;           /* ... and end a keep-alive connection whose response starts while
                                  * no thread is free (gvl_balance) */
    double max_queue_time;       /* load shedding budget in seconds (shed.h); 0: off */
    int thread_polls;            /* asked for: request threads poll while the loop parks (request.c) */
    /* set_remote_address (docs/configuration.md): at most one of these three */
    int proxy_versions;          /* SV_PROXY_V1 | SV_PROXY_V2 (parser.h): each connection starts with a PROXY header */
    char remote_value[SV_REMOTE_MAX];         /* non-empty: REMOTE_ADDR of every request */
    char remote_header[SV_REMOTE_HEADER_MAX]; /* non-empty: REMOTE_ADDR from this field's first element (env.c) */
    size_t remote_header_len;
    char tmpdir[1024];
} sv_options;

struct sv_core {
    sv_options opt;
    int epfd;
    int wakefd;                  /* eventfd: Ruby threads wake the loop */
    int wake_kind;               /* epoll tag for wakefd (SV_KIND_WAKE) */
    pthread_t thread;
    int started;
    /* Thread polls (request.c): who runs a round of events is whoever holds
     * poll_mu. The loop thread holds it, except while it is parked (duty):
     * then request threads poll in Core#next between requests, so that an
     * arrival while they run wakes no thread. */
    pthread_mutex_t poll_mu;
    pthread_cond_t park_cv;      /* the parked loop thread waits here (with core->mu) */
    _Atomic int duty;            /* written under core->mu */
    _Atomic int poll_waiting;    /* a request thread waits on the epoll (sv_polls_wait) */
    int gvl_round;               /* poll_mu's holder runs a round from Core#next with the GVL (sv_polls_poll):
                                  * its thread takes a request right after (a free thread, a taker),
                                  * and a TLS handshake is left to the loop thread (loop.c) */
    _Atomic double last_poll;    /* monotonic: the last round a request thread ran */
    _Atomic double round_at;     /* monotonic: when the round of events in progress began, 0 between rounds (sv_loop_now) */
    _Atomic double last_take;    /* monotonic: the last request Core#next returned */
    _Atomic int running;         /* requests taken and not yet finished */
    _Atomic int unstarted;       /* of those, taken by a sleeping thread that waits for the GVL with it */
    _Atomic int preempted;       /* of those, the ones a fairness switch took the GVL from */
    _Atomic double preempted_since; /* when the last of those was taken */
    int polls_on;                /* thread polls in effect (sv_polls_start: asked for, and possible) */
    _Atomic unsigned long polled_rounds; /* rounds run by request threads */
    _Atomic unsigned long polled_waits;  /* of those, rounds a thread with nothing to do waited for (sv_polls_wait) */
    int joined;

    sv_listener listeners[SV_MAX_LISTENERS];
    int nlisteners;
    int accepting;               /* listeners registered with epoll (loop only) */
    int evict_wanted;            /* an accept found max_connections reached (loop only) */

    sv_conn **conns;             /* slot table, loop only */
    sv_conn *graveyard;          /* loop only: destroyed in this round of events, freed after it */
    size_t nconns;
    size_t conns_cap;
    double next_scan;

    pthread_mutex_t mu;          /* guards everything below; the _Atomic ones are written under it
                                  * and may be read without it */
    pthread_cond_t cv;
    sv_conn *q_head, *q_tail;    /* ready queue */
    size_t queued;
    int waiting;                 /* Ruby threads blocked in Core#next */
    sv_waiter *idle;             /* of those, the ones no wake-up was sent to, most recent first */
    int waking;                  /* woken for a request, not yet back at the queue */
    void *admission;             /* the admission hooks' state for this core (hooks.h; load shedding:
                                  * shed_core.c, with opt.max_queue_time > 0), malloc'd; NULL: none */
    _Atomic int balance_paused;  /* balance: listeners out of epoll until a thread waits */
    _Atomic int balance_hold;    /* balance: a sibling has GVL headroom, accept nothing (balance.c) */
    _Atomic int balance_moves;   /* balance: keep-alive connections to end after their response */
    _Atomic unsigned long moved; /* connections ended that way */
    sv_conn *returned;           /* conns handed back to the loop for parsing */
    sv_conn *dead;               /* conns closed by Ruby threads, to free */
    _Atomic int draining;
    int accept_closed;           /* the loop has taken the listeners out of epoll */
    _Atomic int stopping;
    double stop_deadline;

    _Atomic long partial;        /* loop-owned conns holding a partial request */
    _Atomic unsigned long accepted;
    _Atomic unsigned long evicted;   /* connections closed to make room at max_connections */
    _Atomic unsigned long requests;
    _Atomic unsigned long errors;
    _Atomic unsigned long shed_total; /* requests answered 503 by the admission hook (load shedding) */
    _Atomic long open;           /* open connections */
    _Atomic size_t out_bytes;    /* capacity of every output buffer (sv_buf.acct) */
    _Atomic uint64_t spill_used; /* bytes in open spill files */
    _Atomic unsigned long spills;       /* responses that spilled */
    _Atomic unsigned long spill_waits;  /* writers that waited: no memory or disk left for them */
    size_t trim_peak;            /* loop only: out_bytes high-water since the last malloc_trim */
    double next_trim;

    sv_errlog errlog;            /* error responses, for lib/serval/error_log.rb */
    sv_pool buf_pool;            /* SV_POOL_BLOCK-byte buffer blocks */
    sv_pool req_pool;            /* sv_request blocks */
    int pools_ready;             /* the two pools are initialised (sv_core_init) */
    _Atomic long refs;           /* the Core object + one per live Request (sv_core_unref frees it) */
    pid_t pid;                   /* the process that made it (core.c core_free) */
};

#endif

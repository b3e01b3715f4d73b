/*
 * The delaying loopback relay of bench/delayrelay.py (EpollRelays, run by
 * RelayProcess), in C: the same command line, the same control lines on stdin
 * (stats, reset, quit) and the same JSON figures on stdout, so RelayProcess can
 * start either. A benchmark that runs the system under test on the same cores as
 * the relay wants the relay to take as little CPU as it can: a real network's
 * latency costs the parties' machines nothing.
 *
 * What it does, as the Python version: each relay listens on a loopback port and
 * forwards every connection it accepts to its target; each chunk read from either
 * side is written to the other side `delay` seconds after it was read, in order,
 * and reading never waits for writing (latency, no bandwidth limit). Timeouts are
 * epoll_pwait2's, in nanoseconds. Only loopback addresses are accepted.
 *
 *     cc -O2 -o delayrelay bench/delayrelay.c
 *     ./delayrelay --delay-ms 0.5 --relay 15004=127.0.0.1:15000 [--relay ...] [--no-priority]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 16)
#define CONNECT_PATIENCE 60.0
#define CONNECT_RETRY 0.02

enum kind { LISTENER, CLIENT, TARGET, CONTROL };

struct dstats {
    long long arrived, bytes, chunks, waited;
    double hold_sum, hold_max;
};

struct rstats {
    long long connections;
    struct dstats to_target, from_target;
};

struct chunk {
    struct chunk *next;
    double arrived;
    size_t len; /* 0: the end of the stream */
    char data[];
};

struct handle {
    enum kind kind;
    int fd;
    uint32_t mask;
    void *owner;
};

struct link;

struct direction {
    struct handle *src, *dst; /* dst NULL while the target is being dialled */
    struct chunk *head, *tail;
    size_t sent;
    int counted, reading, blocked, done, has_scheduled;
    double scheduled;
    struct dstats *stats;
    struct link *link;
};

struct listener {
    struct handle h;
    struct sockaddr_in target;
    struct rstats stats;
    int port;
};

struct link {
    struct handle client, target;
    struct sockaddr_in target_addr;
    int connected, closed;
    double connected_at, give_up;
    struct direction up, down;
};

enum timer_kind { FIRE, DIAL, REWATCH };

struct timer {
    double due;
    unsigned long long seq;
    enum timer_kind kind;
    void *arg;
};

static double delay;
static int ep;
static int running = 1;
static struct listener *listeners;
static int n_listeners;
static struct dstats late;
static struct timer *heap;
static size_t heap_len, heap_cap;
static unsigned long long seq;
static char buf[CHUNK];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "delayrelay: %s\n", what);
    exit(1);
}

/* ------------------------------------------------------------------ timers */
static int earlier(const struct timer *a, const struct timer *b)
{
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void at(double due, enum timer_kind kind, void *arg)
{
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? 2 * heap_cap : 256;
        heap = realloc(heap, heap_cap * sizeof *heap);
        if (!heap)
            die("out of memory");
    }
    size_t i = heap_len++;
    struct timer t = {due, seq++, kind, arg};
    while (i > 0 && earlier(&t, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = t;
}

static struct timer pop(void)
{
    struct timer top = heap[0], last = heap[--heap_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_len)
            break;
        if (c + 1 < heap_len && earlier(&heap[c + 1], &heap[c]))
            c++;
        if (!earlier(&heap[c], &last))
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_len)
        heap[i] = last;
    return top;
}

/* ------------------------------------------------------------------ plumbing */
static void watch(struct handle *h, uint32_t mask)
{
    if (mask == h->mask)
        return;
    struct epoll_event ev = {.events = mask, .data.ptr = h};
    int op = mask == 0 ? EPOLL_CTL_DEL : h->mask == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (epoll_ctl(ep, op, h->fd, &ev) != 0)
        die("epoll_ctl failed");
    h->mask = mask;
}

static void forget(struct handle *h)
{
    if (h->fd < 0)
        return;
    watch(h, 0);
    close(h->fd);
    h->fd = -1;
}

static void drop_queue(struct direction *d)
{
    while (d->head) {
        struct chunk *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
}

static void abort_link(struct link *lk)
{
    if (lk->closed)
        return;
    lk->closed = 1;
    forget(&lk->client);
    forget(&lk->target);
    drop_queue(&lk->up);
    drop_queue(&lk->down);
}

static void update(struct link *lk)
{
    if (lk->closed)
        return;
    struct direction *up = &lk->up, *down = &lk->down;
    watch(&lk->client, (up->reading ? EPOLLIN : 0) | (down->blocked ? EPOLLOUT : 0));
    if (lk->target.fd >= 0 && lk->connected)
        watch(&lk->target, (down->reading ? EPOLLIN : 0) | (up->blocked ? EPOLLOUT : 0));
}

static void schedule(struct direction *d)
{
    double due = d->head->arrived + delay;
    if (d->has_scheduled && d->scheduled <= due)
        return; /* an earlier timer flushes this head (and reschedules) */
    d->has_scheduled = 1;
    d->scheduled = due;
    at(due, FIRE, d);
}

/* Write every chunk whose time has come, as far as dst takes it. */
static void flush(struct direction *d)
{
    struct link *lk = d->link;
    if (lk->closed || d->dst == NULL || d->blocked)
        return;
    double t = now();
    while (d->head && d->head->arrived + delay <= t) {
        struct chunk *c = d->head;
        if (c->len == 0) {
            d->head = c->next;
            if (!d->head)
                d->tail = NULL;
            free(c);
            d->done = 1;
            shutdown(d->dst->fd, SHUT_WR);
            if (lk->up.done && lk->down.done) {
                abort_link(lk); /* both ends finished: close */
                return;
            }
            continue;
        }
        if (!d->counted) {
            d->counted = 1;
            double hold = t - c->arrived;
            if (c->arrived < lk->connected_at) {
                d->stats->waited++; /* held up by the target, not by the delay */
            } else {
                d->stats->chunks++;
                d->stats->hold_sum += hold;
                if (hold > d->stats->hold_max)
                    d->stats->hold_max = hold;
            }
        }
        ssize_t n = send(d->dst->fd, c->data + d->sent, c->len - d->sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                abort_link(lk);
                return;
            }
            n = 0;
        }
        d->stats->bytes += n;
        d->sent += (size_t)n;
        if (d->sent < c->len) {
            d->blocked = 1;
            update(lk);
            return;
        }
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        free(c);
        d->sent = 0;
        d->counted = 0;
    }
    if (d->head)
        schedule(d);
}

static void read_side(struct direction *d)
{
    ssize_t n = recv(d->src->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        abort_link(d->link);
        return;
    }
    struct chunk *c = malloc(sizeof *c + (size_t)n);
    if (!c)
        die("out of memory");
    c->next = NULL;
    c->arrived = now();
    c->len = (size_t)n;
    memcpy(c->data, buf, (size_t)n);
    d->stats->arrived += n;
    int first = d->head == NULL;
    if (d->tail)
        d->tail->next = c;
    else
        d->head = c;
    d->tail = c;
    if (n == 0)
        d->reading = 0;
    if (first)
        schedule(d);
}

/* ------------------------------------------------------------------ connections */
static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void dial(struct link *lk);

static void dial_failed(struct link *lk)
{
    /* the target may not listen yet: a party dials its peers as it starts */
    forget(&lk->target);
    if (now() > lk->give_up)
        abort_link(lk);
    else
        at(now() + CONNECT_RETRY, DIAL, lk);
}

static void dial(struct link *lk)
{
    if (lk->closed)
        return;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        at(now() + CONNECT_RETRY, DIAL, lk);
        return;
    }
    nodelay(fd);
    lk->target.fd = fd;
    lk->target.mask = 0;
    if (connect(fd, (struct sockaddr *)&lk->target_addr, sizeof lk->target_addr) == 0
        || errno == EINPROGRESS) {
        watch(&lk->target, EPOLLOUT);
        return;
    }
    dial_failed(lk);
}

static void connected(struct link *lk)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(lk->target.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        dial_failed(lk);
        return;
    }
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    if (getpeername(lk->target.fd, (struct sockaddr *)&peer, &plen) != 0)
        return; /* still connecting */
    lk->connected = 1;
    lk->connected_at = now();
    lk->up.dst = &lk->target;
    lk->down.src = &lk->target;
    update(lk);
    flush(&lk->up);
}

static void init_direction(struct direction *d, struct link *lk, struct dstats *stats)
{
    memset(d, 0, sizeof *d);
    d->reading = 1;
    d->stats = stats;
    d->link = lk;
}

static void accept_on(struct listener *l)
{
    for (;;) {
        int fd = accept4(l->h.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            /* e.g. out of descriptors: pause this port a moment (the peer retries) */
            watch(&l->h, 0);
            at(now() + 0.05, REWATCH, l);
            return;
        }
        nodelay(fd);
        l->stats.connections++;
        /* links are never freed (a run makes a few thousand at most): a timer or an
         * event still queued for a closed one finds it closed */
        struct link *lk = calloc(1, sizeof *lk);
        if (!lk)
            die("out of memory");
        lk->client = (struct handle){CLIENT, fd, 0, lk};
        lk->target = (struct handle){TARGET, -1, 0, lk};
        lk->target_addr = l->target;
        lk->connected_at = 1e300;
        lk->give_up = now() + CONNECT_PATIENCE;
        init_direction(&lk->up, lk, &l->stats.to_target);
        init_direction(&lk->down, lk, &l->stats.from_target);
        lk->up.src = &lk->client;
        lk->down.dst = &lk->client;
        update(lk);
        dial(lk);
    }
}

/* One socket's event: flush what waits for it (writes: the direction it receives),
 * then read what it sent (reads: the direction it is the source of). */
static void side_event(struct link *lk, uint32_t ev, struct direction *writes,
                       struct direction *reads)
{
    if ((ev & EPOLLOUT) && writes->blocked) {
        writes->blocked = 0;
        flush(writes);
    }
    if (lk->closed)
        return;
    if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) && reads->reading)
        read_side(reads);
    update(lk);
}

/* ------------------------------------------------------------------ figures */
static void print_dstats(FILE *f, const struct dstats *s)
{
    fprintf(f,
            "{\"arrived\": %lld, \"bytes\": %lld, \"chunks\": %lld, \"hold_sum\": %.17g, "
            "\"hold_max\": %.17g, \"waited\": %lld}",
            s->arrived, s->bytes, s->chunks, s->hold_sum, s->hold_max, s->waited);
}

static void add(struct dstats *a, const struct dstats *b)
{
    a->arrived += b->arrived;
    a->bytes += b->bytes;
    a->chunks += b->chunks;
    a->waited += b->waited;
    a->hold_sum += b->hold_sum;
    if (b->hold_max > a->hold_max)
        a->hold_max = b->hold_max;
}

static void report(FILE *f)
{
    struct dstats total = {0};
    long long connections = 0;
    for (int i = 0; i < n_listeners; i++) {
        connections += listeners[i].stats.connections;
        add(&total, &listeners[i].stats.to_target);
        add(&total, &listeners[i].stats.from_target);
    }
    struct rusage use;
    getrusage(RUSAGE_SELF, &use);
    double cpu = (double)use.ru_utime.tv_sec + use.ru_utime.tv_usec * 1e-6
                 + (double)use.ru_stime.tv_sec + use.ru_stime.tv_usec * 1e-6;
    double mean = total.chunks ? total.hold_sum / (double)total.chunks : 0.0;
    double late_mean = late.chunks ? late.hold_sum / (double)late.chunks : 0.0;
    fprintf(f,
            "{\"connections\": %lld, \"bytes\": %lld, \"chunks\": %lld, \"waited\": %lld, "
            "\"hold_mean_ms\": %.17g, \"hold_max_ms\": %.17g, \"late_mean_ms\": %.17g, "
            "\"late_max_ms\": %.17g, \"cpu_seconds\": %.17g, \"implementation\": \"c\", "
            "\"relays\": {",
            connections, total.bytes, total.chunks, total.waited, mean * 1e3,
            total.hold_max * 1e3, late_mean * 1e3, late.hold_max * 1e3, cpu);
    for (int i = 0; i < n_listeners; i++) {
        const struct rstats *s = &listeners[i].stats;
        fprintf(f, "%s\"%d\": {\"connections\": %lld, \"to_target\": ", i ? ", " : "",
                listeners[i].port, s->connections);
        print_dstats(f, &s->to_target);
        fprintf(f, ", \"from_target\": ");
        print_dstats(f, &s->from_target);
        fprintf(f, "}");
    }
    fprintf(f, "}}\n");
    fflush(f);
}

static void reset(void)
{
    memset(&late, 0, sizeof late);
    for (int i = 0; i < n_listeners; i++)
        memset(&listeners[i].stats, 0, sizeof listeners[i].stats);
}

static char line[4096];
static size_t line_len;

static void command(void)
{
    char in[4096];
    ssize_t n = read(0, in, sizeof in);
    if (n < 0)
        return;
    if (n == 0) {
        running = 0;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (in[i] != '\n') {
            if (line_len < sizeof line - 1)
                line[line_len++] = in[i];
            continue;
        }
        line[line_len] = 0;
        char *w = line;
        while (*w == ' ' || *w == '\t' || *w == '\r')
            w++;
        char *e = w + strlen(w);
        while (e > w && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            *--e = 0;
        if (!strcmp(w, "stats") || !strcmp(w, "reset"))
            report(stdout);
        if (!strcmp(w, "reset"))
            reset();
        else if (!strcmp(w, "quit"))
            running = 0;
        line_len = 0;
    }
}

/* ------------------------------------------------------------------ set-up */
static int loopback(const char *host, struct in_addr *out)
{
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    if (inet_pton(AF_INET, host, out) != 1)
        return 0;
    return (ntohl(out->s_addr) >> 24) == 127;
}

static void add_relay(const char *spec)
{
    char text[300];
    if (strlen(spec) >= sizeof text)
        die("a --relay argument is too long");
    strcpy(text, spec);
    char *eq = strchr(text, '=');
    char *colon = strrchr(text, ':');
    if (!eq || !colon || colon < eq) {
        fprintf(stderr, "delayrelay: %s: expected PORT=HOST:PORT\n", spec);
        exit(2);
    }
    *eq = 0;
    *colon = 0;
    char *end;
    long port = strtol(text, &end, 10), tport = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535 || tport <= 0 || tport > 65535 || *end) {
        fprintf(stderr, "delayrelay: %s: expected PORT=HOST:PORT\n", spec);
        exit(2);
    }
    struct listener *l = &listeners[n_listeners++];
    memset(l, 0, sizeof *l);
    l->port = (int)port;
    l->target.sin_family = AF_INET;
    l->target.sin_port = htons((uint16_t)tport);
    if (!loopback(eq + 1, &l->target.sin_addr)) {
        fprintf(stderr, "delayrelay: the delay relay works on loopback only, not on %s\n",
                eq + 1);
        exit(2);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0) {
        fprintf(stderr, "delayrelay: relay port %ld: %s\n", port, strerror(errno));
        exit(1);
    }
    l->h = (struct handle){LISTENER, fd, 0, l};
}

static const char *raise_priority(char *out, size_t size)
{
    struct sched_param sp = {.sched_priority = 1};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) == 0)
        return "SCHED_FIFO 1";
    int steps[] = {-10, -5};
    for (int i = 0; i < 2; i++) {
        errno = 0;
        int got = nice(steps[i]);
        if (!(got == -1 && errno)) {
            snprintf(out, size, "nice %d", got);
            return out;
        }
    }
    snprintf(out, size, "none (nice %d)", nice(0));
    return out;
}

int main(int argc, char **argv)
{
    double delay_ms = -1;
    int priority = 1;
    listeners = calloc((size_t)argc, sizeof *listeners);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (!listeners || ep < 0)
        die("cannot start");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc) {
            char *end;
            delay_ms = strtod(argv[++i], &end);
            if (*end || delay_ms < 0)
                die("the delay must be a number, not negative");
        } else if (!strcmp(argv[i], "--relay") && i + 1 < argc) {
            add_relay(argv[++i]);
        } else if (!strcmp(argv[i], "--no-priority")) {
            priority = 0;
        } else {
            fprintf(stderr, "usage: %s --delay-ms MS --relay PORT=HOST:PORT ... "
                            "[--no-priority]\n", argv[0]);
            return 2;
        }
    }
    if (delay_ms < 0 || n_listeners == 0)
        die("--delay-ms and at least one --relay are required");
    delay = delay_ms / 1e3;
    for (int i = 0; i < n_listeners; i++)
        watch(&listeners[i].h, EPOLLIN);
    char pbuf[64];
    const char *got = priority ? raise_priority(pbuf, sizeof pbuf) : "not raised";
    struct handle control = {CONTROL, 0, 0, NULL};
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    watch(&control, EPOLLIN);
    printf("{\"ready\": true, \"priority\": \"%s\", \"implementation\": \"c\"}\n", got);
    fflush(stdout);

    struct epoll_event events[64];
    while (running) {
        double t = now();
        while (heap_len && heap[0].due <= t) {
            struct timer tm = pop();
            if (tm.kind == FIRE) {
                struct direction *d = tm.arg;
                if (d->has_scheduled && d->scheduled == tm.due && !d->link->closed) {
                    double lateness = now() - tm.due;
                    late.chunks++;
                    late.hold_sum += lateness;
                    if (lateness > late.hold_max)
                        late.hold_max = lateness;
                    d->has_scheduled = 0;
                    flush(d);
                }
            } else if (tm.kind == DIAL) {
                dial(tm.arg);
            } else {
                watch(&((struct listener *)tm.arg)->h, EPOLLIN);
            }
            t = now();
        }
        double wait = heap_len ? heap[0].due - t : 1.0;
        if (wait < 0)
            wait = 0;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        int n = epoll_pwait2(ep, events, 64, &ts, NULL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_pwait2 failed");
        }
        for (int i = 0; i < n; i++) {
            struct handle *h = events[i].data.ptr;
            uint32_t ev = events[i].events;
            if (h->kind == LISTENER) {
                accept_on(h->owner);
            } else if (h->kind == CONTROL) {
                command();
            } else {
                struct link *lk = h->owner;
                if (lk->closed || h->fd < 0)
                    continue;
                if (h->kind == CLIENT) {
                    side_event(lk, ev, &lk->down, &lk->up);
                } else if (!lk->connected) {
                    if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                        connected(lk);
                } else {
                    side_event(lk, ev, &lk->up, &lk->down);
                }
            }
        }
    }
    return 0;
}

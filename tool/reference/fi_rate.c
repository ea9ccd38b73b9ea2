/*
 * Raw libfabric message rate: one sender streams COUNT messages of SIZE
 * bytes to one receiver over an FI_EP_RDM endpoint of PROVIDER (default
 * shm, as msgr's `fabric+shm://...?ep=rdm`), two processes (fork), the
 * receiver's name passed over a pipe. What msgr's shm path is measured
 * against in the same run (scripts/bench-rate.sh, SHM=1).
 *
 * Sender: at most WINDOW sends in flight; a message no larger than the
 * provider's inject size goes by fi_inject (as msgr posts its small
 * pieces), else by fi_send, whose completions are reaped in batches of up
 * to 64. Receiver: RX receive buffers posted, each reposted as it
 * completes. Both busy-poll their CQ (FI_WAIT_NONE), as fi_pingpong does.
 * The clock runs on the receiver from its first message to its last; the
 * sender waits for a 1-byte "done" before it goes, so no message is lost
 * to an endpoint closing under it.
 *
 *   cc -O2 -o fi_rate tool/reference/fi_rate.c -lfabric
 *   fi_rate [-p PROVIDER] [-n COUNT] [-s SIZE] [-w WINDOW] [-r RX]
 *
 * Prints one JSON object: {"provider","size","count","window","inject",
 * "elapsed_s","msgs_per_s","mib_per_s"}. Exit status 0 on success; every
 * wait is bounded (60 s without progress fails).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/select.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CQ_BATCH 64
#define STALL_NS (60ull * 1000000000ull)

struct side {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void die(const char *what, long rc) {
    fprintf(stderr, "fi_rate: %s: %s (%ld)\n", what, rc < 0 ? fi_strerror((int)-rc) : "failed", rc);
    exit(1);
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        long rc_ = (long)(call);                                                             \
        if (rc_ != 0) die(#call, rc_);                                                       \
    } while (0)

static void open_side(struct side *s, const char *provider) {
    struct fi_info *hints = fi_allocinfo();
    if (!hints) die("fi_allocinfo", -FI_ENOMEM);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(provider);
    CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &s->info));
    fi_freeinfo(hints);
    CHECK(fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
    CHECK(fi_domain(s->fabric, s->info, &s->domain, NULL));
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE, .size = 1024};
    CHECK(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
    struct fi_av_attr av_attr = {.type = FI_AV_MAP};
    CHECK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
    CHECK(fi_endpoint(s->domain, s->info, &s->ep, NULL));
    CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
    CHECK(fi_enable(s->ep));
}

static void close_side(struct side *s) {
    fi_close(&s->ep->fid);
    fi_close(&s->av->fid);
    fi_close(&s->cq->fid);
    fi_close(&s->domain->fid);
    fi_close(&s->fabric->fid);
    fi_freeinfo(s->info);
}

/* Reads up to CQ_BATCH completions; returns how many (0 if none). */
static int reap(struct side *s, struct fi_cq_entry *entries, const char *who) {
    ssize_t n = fi_cq_read(s->cq, entries, CQ_BATCH);
    if (n > 0) return (int)n;
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        fi_cq_readerr(s->cq, &err, 0);
        fprintf(stderr, "fi_rate: %s completion error: %s\n", who, fi_strerror(err.err));
        exit(1);
    }
    die("fi_cq_read", n);
    return 0;
}

static void receiver(const char *provider, long count, size_t size, int rx, int to_sender, int from_sender,
                     int window) {
    struct side s;
    open_side(&s, provider);
    /* The sender's test, on this side's info of the same provider. */
    int inject = size <= s.info->tx_attr->inject_size;
    char name[256];
    size_t name_len = sizeof name;
    CHECK(fi_getname(&s.ep->fid, name, &name_len));
    char *bufs = calloc((size_t)rx, size);
    struct fi_context *ctx = calloc((size_t)rx, sizeof *ctx);
    if (!bufs || !ctx) die("calloc", -FI_ENOMEM);
    for (int i = 0; i < rx; i++) CHECK(fi_recv(s.ep, bufs + (size_t)i * size, size, NULL, FI_ADDR_UNSPEC, &ctx[i]));
    if (write(to_sender, &name_len, sizeof name_len) != sizeof name_len || write(to_sender, name, name_len) != (ssize_t)name_len)
        die("write name", -FI_EIO);
    struct fi_cq_entry entries[CQ_BATCH];
    long got = 0;
    uint64_t start = 0, last = now_ns();
    while (got < count) {
        int n = reap(&s, entries, "receive");
        if (n == 0) {
            if (now_ns() - last > STALL_NS) die("no message for 60 s", -FI_ETIMEDOUT);
            continue;
        }
        last = now_ns();
        if (got == 0) start = last;
        for (int i = 0; i < n; i++) {
            struct fi_context *c = entries[i].op_context;
            long slot = c - ctx;
            ssize_t rc;
            while ((rc = fi_recv(s.ep, bufs + (size_t)slot * size, size, NULL, FI_ADDR_UNSPEC, c)) == -FI_EAGAIN)
                fi_cq_read(s.cq, NULL, 0);
            if (rc) die("fi_recv", rc);
        }
        got += n;
    }
    uint64_t end = now_ns();
    char done = 1;
    if (write(to_sender, &done, 1) != 1) die("write done", -FI_EIO);
    /* The sender closes first: its endpoint goes while this one still
     * answers (shm). */
    if (read(from_sender, &done, 1) != 1) die("read closed", -FI_EIO);
    /* Messages of the first receive count from the clock's start: the
     * figure is over got - 1 intervals, as a rate between events is. */
    double secs = (double)(end - start) / 1e9;
    double rate = secs > 0 ? (double)(got - 1) / secs : 0;
    printf("{\"provider\":\"%s\",\"size\":%zu,\"count\":%ld,\"window\":%d,\"inject\":%s,"
           "\"elapsed_s\":%.6f,\"msgs_per_s\":%.1f,\"mib_per_s\":%.2f}\n",
           provider, size, got, window, inject ? "true" : "false", secs, rate, rate * (double)size / (1 << 20));
    close_side(&s);
    free(bufs);
    free(ctx);
}

static void sender(const char *provider, long count, size_t size, int window, int from_receiver, int to_receiver) {
    struct side s;
    open_side(&s, provider);
    size_t name_len;
    char name[256];
    if (read(from_receiver, &name_len, sizeof name_len) != sizeof name_len || name_len > sizeof name ||
        read(from_receiver, name, name_len) != (ssize_t)name_len)
        die("read name", -FI_EIO);
    fi_addr_t peer;
    if (fi_av_insert(s.av, name, 1, &peer, 0, NULL) != 1) die("fi_av_insert", -FI_EINVAL);
    int inject = size <= s.info->tx_attr->inject_size;
    /* One buffer per send in flight (a send's buffer is the provider's
     * until it completes). */
    char *bufs = calloc((size_t)window, size);
    struct fi_context *ctx = calloc((size_t)window, sizeof *ctx);
    int *free_slots = calloc((size_t)window, sizeof *free_slots);
    if (!bufs || !ctx || !free_slots) die("calloc", -FI_ENOMEM);
    int nfree = window;
    for (int i = 0; i < window; i++) free_slots[i] = i;
    struct fi_cq_entry entries[CQ_BATCH];
    uint64_t last = now_ns();
    for (long sent = 0; sent < count;) {
        ssize_t rc;
        if (inject) {
            memcpy(bufs, &sent, sizeof sent < size ? sizeof sent : size);
            rc = fi_inject(s.ep, bufs, size, peer);
        } else {
            if (nfree == 0) {
                int n = reap(&s, entries, "send");
                for (int i = 0; i < n; i++) free_slots[nfree++] = (int)((struct fi_context *)entries[i].op_context - ctx);
                if (n == 0 && now_ns() - last > STALL_NS) die("no send completion for 60 s", -FI_ETIMEDOUT);
                continue;
            }
            int slot = free_slots[nfree - 1];
            rc = fi_send(s.ep, bufs + (size_t)slot * size, size, NULL, peer, &ctx[slot]);
            if (rc == 0) nfree--;
        }
        if (rc == -FI_EAGAIN) {
            /* The receiver's queue is full: progress and try again. */
            int n = reap(&s, entries, "send");
            for (int i = 0; i < n; i++) free_slots[nfree++] = (int)((struct fi_context *)entries[i].op_context - ctx);
            if (now_ns() - last > STALL_NS) die("sends refused for 60 s", -FI_ETIMEDOUT);
            continue;
        }
        if (rc) die(inject ? "fi_inject" : "fi_send", rc);
        last = now_ns();
        sent++;
    }
    /* Progress until the receiver says it has them all. */
    char done;
    for (;;) {
        int n = reap(&s, entries, "send");
        for (int i = 0; i < n; i++) free_slots[nfree++] = (int)((struct fi_context *)entries[i].op_context - ctx);
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(from_receiver, &fds);
        struct timeval tv = {0, 0};
        if (select(from_receiver + 1, &fds, NULL, NULL, &tv) > 0) break;
        if (now_ns() - last > STALL_NS) die("receiver never finished", -FI_ETIMEDOUT);
    }
    if (read(from_receiver, &done, 1) != 1) die("read done", -FI_EIO);
    close_side(&s);
    if (write(to_receiver, &done, 1) != 1) die("write closed", -FI_EIO);
    free(bufs);
    free(ctx);
    free(free_slots);
}

int main(int argc, char **argv) {
    const char *provider = "shm";
    long count = 2000000;
    size_t size = 64;
    int window = 64, rx = 256, opt;
    while ((opt = getopt(argc, argv, "p:n:s:w:r:")) != -1) {
        switch (opt) {
        case 'p': provider = optarg; break;
        case 'n': count = atol(optarg); break;
        case 's': size = (size_t)atol(optarg); break;
        case 'w': window = atoi(optarg); break;
        case 'r': rx = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-p PROVIDER] [-n COUNT] [-s SIZE] [-w WINDOW] [-r RX]\n", argv[0]);
            return 2;
        }
    }
    if (count < 2 || size < 1 || window < 1 || rx < 1) {
        fprintf(stderr, "fi_rate: COUNT >= 2, SIZE, WINDOW and RX >= 1\n");
        return 2;
    }
    int to_sender[2], to_receiver[2];
    if (pipe(to_sender) || pipe(to_receiver)) die("pipe", -FI_EIO);
    pid_t pid = fork();
    if (pid < 0) die("fork", -FI_EIO);
    if (pid == 0) {
        sender(provider, count, size, window, to_sender[0], to_receiver[1]);
        _exit(0);
    }
    receiver(provider, count, size, rx, to_sender[1], to_receiver[0], window);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fi_rate: the sender failed\n");
        return 1;
    }
    return 0;
}

/*
 * ZeroMQ PUSH/PULL message rate: the reference msgr's 64 B stream is
 * measured against (scripts/bench-rate.sh, docs/BENCHMARKS.md). One
 * process, two threads, one TCP connection on 127.0.0.1: the PULL side
 * binds, the PUSH side connects and sends COUNT messages of SIZE bytes;
 * the clock runs from the first send to the last receive. libzmq batches
 * small messages itself, which is what makes it the reference for a
 * batched small-message path. With CONNECTIONS (default 1) the PUSH
 * thread opens that many PUSH sockets, each its own TCP connection into
 * the one PULL, and sends round robin over them: the many-connections
 * reference (issue 51 item 4). Prints one JSON object.
 *
 *   cc -O2 -o zmq_pushpull zmq_pushpull.c -lzmq -lpthread
 *   ./zmq_pushpull PORT COUNT SIZE [CONNECTIONS]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static void *ctx;
static char endpoint[64];
static long count;
static size_t size;
static long connections = 1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *pusher(void *arg)
{
    (void)arg;
    void **push = calloc((size_t)connections, sizeof *push);
    for (long c = 0; c < connections; c++) {
        push[c] = zmq_socket(ctx, ZMQ_PUSH);
        if (!push[c] || zmq_connect(push[c], endpoint) != 0) {
            fprintf(stderr, "push: %s\n", zmq_strerror(zmq_errno()));
            exit(1);
        }
    }
    char *buf = calloc(1, size ? size : 1);
    for (long i = 0; i < count; i++) {
        if (zmq_send(push[i % connections], buf, size, 0) < 0) {
            fprintf(stderr, "send: %s\n", zmq_strerror(zmq_errno()));
            exit(1);
        }
    }
    free(buf);
    for (long c = 0; c < connections; c++)
        zmq_close(push[c]);
    free(push);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s PORT COUNT SIZE [CONNECTIONS]\n", argv[0]);
        return 2;
    }
    if (argc == 5)
        connections = atol(argv[4]);
    if (connections < 1) {
        fprintf(stderr, "CONNECTIONS must be at least 1\n");
        return 2;
    }
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%s", argv[1]);
    count = atol(argv[2]);
    size = (size_t)atol(argv[3]);
    ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    if (!pull || zmq_bind(pull, endpoint) != 0) {
        fprintf(stderr, "pull: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char *buf = malloc(size + 1);
    pthread_t t;
    double start = now_s();
    pthread_create(&t, NULL, pusher, NULL);
    for (long i = 0; i < count; i++) {
        int n = zmq_recv(pull, buf, size + 1, 0);
        if (n != (int)size) {
            fprintf(stderr, "recv %d bytes, want %zu\n", n, size);
            return 1;
        }
    }
    double elapsed = now_s() - start;
    pthread_join(t, NULL);
    printf("{\"reference\":\"zmq push/pull\",\"messages\":%ld,\"size\":%zu,"
           "\"connections\":%ld,\"elapsed_s\":%.6f,\"msgs_per_s\":%.0f}\n",
           count, size, connections, elapsed, count / elapsed);
    free(buf);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    return 0;
}

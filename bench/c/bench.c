/*
 * The C library benchmark: feed a libblkhash hash for a fixed time through
 * the C API and print one line of JSON with the throughput, as the Rust
 * library's blkhash_bench example does, so that bench/run.py --lib can put
 * the two side by side.
 *
 *   cc -O2 bench.c -o c-bench $(pkg-config --cflags --libs blkhash)
 *   c-bench [-i data|zero|hole] [-d DIGEST] [-t THREADS] [-T SECONDS]
 *           [-b BLOCK_SIZE] [-r READ_SIZE] [-z HOLE_SIZE] [-q QUEUE_DEPTH]
 *
 * Without -q, data and zero go through blkhash_update() (the library copies
 * them); with -q N they go through blkhash_aio_update() (read in place, up
 * to N buffers in flight, completions collected with poll() on the
 * completion fd). hole is blkhash_zero() of HOLE_SIZE bytes at a time.
 * Sizes take a suffix k, m, g or t (powers of 1024). The time includes
 * blkhash_final().
 */

#define _GNU_SOURCE
#include <blkhash.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage_fail(const char *msg)
{
    fprintf(stderr,
            "c-bench: %s\nusage: c-bench [-i data|zero|hole] [-d DIGEST] [-t THREADS] "
            "[-T SECONDS] [-b BLOCK_SIZE] [-r READ_SIZE] [-z HOLE_SIZE] [-q QUEUE_DEPTH]\n",
            msg);
    exit(2);
}

static void fail(const char *what, int err)
{
    fprintf(stderr, "c-bench: %s: %s\n", what, strerror(err));
    exit(1);
}

static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    int shift = 0;
    if (errno || end == s)
        usage_fail("invalid size");
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: usage_fail("invalid size suffix");
    }
    if (*end && end[1])
        usage_fail("invalid size suffix");
    if (shift && n > (UINT64_MAX >> shift))
        usage_fail("size too large");
    return (uint64_t)n << shift;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Wait for completions and return the buffers they free to the stack. */
static void collect(struct blkhash *h, int fd, unsigned char **free_bufs, unsigned *nfree)
{
    struct blkhash_completion done[64];
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    uint64_t count;
    int n;

    if (poll(&pfd, 1, -1) < 0)
        fail("poll", errno);
    if (read(fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
        fail("read completion fd", errno);
    n = blkhash_aio_completions(h, done, 64);
    if (n < 0)
        fail("blkhash_aio_completions", -n);
    for (int i = 0; i < n; i++) {
        if (done[i].error)
            fail("async update", done[i].error);
        free_bufs[(*nfree)++] = done[i].user_data;
    }
}

int main(int argc, char **argv)
{
    const char *input = "data", *digest = "sha256";
    unsigned threads = 2, queue_depth = 0;
    double seconds = 2.0;
    uint64_t block_size = 64 * 1024, read_size = 1 << 20, hole_size = 16ULL << 30;
    int c;

    while ((c = getopt(argc, argv, "i:d:t:T:b:r:z:q:h")) != -1) {
        switch (c) {
        case 'i': input = optarg; break;
        case 'd': digest = optarg; break;
        case 't': threads = (unsigned)atoi(optarg); break;
        case 'T': seconds = atof(optarg); break;
        case 'b': block_size = parse_size(optarg); break;
        case 'r': read_size = parse_size(optarg); break;
        case 'z': hole_size = parse_size(optarg); break;
        case 'q': queue_depth = (unsigned)atoi(optarg); break;
        default: usage_fail("unknown option");
        }
    }
    if (strcmp(input, "data") && strcmp(input, "zero") && strcmp(input, "hole"))
        usage_fail("input must be data, zero or hole");
    if (read_size == 0 || hole_size == 0 || threads == 0 || threads > 128 ||
        block_size > UINT32_MAX || !(seconds >= 0))
        usage_fail("invalid value");

    struct blkhash_opts *opts = blkhash_opts_new(digest);
    if (!opts)
        fail("blkhash_opts_new", errno);
    int err = blkhash_opts_set_block_size(opts, (uint32_t)block_size);
    if (!err)
        err = blkhash_opts_set_threads(opts, (uint8_t)threads);
    if (!err)
        err = blkhash_opts_set_queue_depth(opts, queue_depth);
    if (err)
        fail("options", err);
    struct blkhash *h = blkhash_new_opts(opts);
    if (!h)
        fail(digest, errno);
    blkhash_opts_free(opts);

    /* Enough buffers to keep every worker busy with one more waiting. */
    unsigned nbufs = queue_depth ? queue_depth : 1;
    unsigned char **free_bufs = calloc(nbufs, sizeof(*free_bufs));
    if (!free_bufs)
        fail("calloc", errno);
    for (unsigned i = 0; i < nbufs; i++) {
        /* Zeros from calloc, as the Rust example's vec![0; n]: fresh pages
         * the kernel maps to its zero page, so both read the same memory. */
        free_bufs[i] = calloc(1, read_size);
        if (!free_bufs[i])
            fail("calloc", errno);
        /* Data: non-zero and not constant, the Rust example's pattern. */
        for (uint64_t j = 0; strcmp(input, "zero") && j < read_size; j++)
            free_bufs[i][j] = (uint8_t)((j * 31 + 7) % 251) | 1;
    }
    unsigned char **all = calloc(nbufs, sizeof(*all));
    if (!all)
        fail("calloc", errno);
    memcpy(all, free_bufs, nbufs * sizeof(*all));
    unsigned nfree = nbufs;
    int fd = queue_depth ? blkhash_aio_completion_fd(h) : -1;
    if (queue_depth && fd < 0)
        fail("blkhash_aio_completion_fd", -fd);

    uint64_t bytes = 0;
    double start = now();
    while (now() - start < seconds) {
        if (!strcmp(input, "hole")) {
            err = blkhash_zero(h, hole_size);
            if (err)
                fail("blkhash_zero", err);
            bytes += hole_size;
        } else if (!queue_depth) {
            err = blkhash_update(h, free_bufs[0], read_size);
            if (err)
                fail("blkhash_update", err);
            bytes += read_size;
        } else {
            while (nfree == 0)
                collect(h, fd, free_bufs, &nfree);
            unsigned char *buf = free_bufs[--nfree];
            err = blkhash_aio_update(h, buf, read_size, buf);
            if (err)
                fail("blkhash_aio_update", err);
            bytes += read_size;
        }
    }
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    unsigned md_len;
    err = blkhash_final(h, md, &md_len);
    if (err)
        fail("blkhash_final", err);
    double elapsed = now() - start;
    blkhash_free(h);
    for (unsigned i = 0; i < nbufs; i++)
        free(all[i]);
    free(all);
    free(free_bufs);

    char hex[2 * BLKHASH_MAX_MD_SIZE + 1] = "";
    for (unsigned i = 0; i < md_len; i++)
        sprintf(hex + 2 * i, "%02x", md[i]);
    double throughput = bytes / elapsed;
    printf("{\"input\": \"%s\", \"digest\": \"%s\", \"threads\": %u, \"queue-depth\": %u, "
           "\"block-size\": %" PRIu64 ", \"read-size\": %" PRIu64 ", \"hole-size\": %" PRIu64
           ", \"seconds\": %.3f, \"bytes\": %" PRIu64 ", \"throughput\": %.0f, \"gbs\": %.3f, "
           "\"checksum\": \"%s\"}\n",
           input, digest, threads, queue_depth, block_size, read_size, hole_size, elapsed,
           bytes, throughput, throughput / 1e9, hex);
    return 0;
}

/*
 * The async API driven by poll() on the completion fd, with many updates in
 * flight, mixed with blkhash_update() and blkhash_zero(); the result must
 * equal the simple API's for the same bytes.
 *
 *   aio [SIZE_MIB [QUEUE_DEPTH [THREADS [DIGEST]]]]
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <unistd.h>
#include <blkhash.h>

#include "check.h"

#define BS 65536

struct req {
    unsigned char *buf;
    size_t len;
    int busy;
    int completed;
};

/* Piece i of the input: its length (several not multiples of the block
 * size) and content (some whole zero blocks, a byte pattern otherwise). */
static size_t piece_len(unsigned i)
{
    static const size_t lens[] = {1 << 20, 256 << 10, 3 * BS + 100, 1000, 2 << 20, BS};
    return lens[i % 6];
}

static void fill_piece(unsigned i, unsigned char *buf, size_t len)
{
    if (i % 7 == 3) {
        memset(buf, 0, len);
        return;
    }
    for (size_t j = 0; j < len; j++)
        buf[j] = (unsigned char)((i * 131 + j * 7) % 253 + 1);
}

static struct blkhash *make(const char *digest, unsigned qd, unsigned threads)
{
    struct blkhash_opts *o = blkhash_opts_new(digest);
    struct blkhash *h;

    if (o == NULL)
        DIE("blkhash_opts_new: %s", strerror(errno));
    if (blkhash_opts_set_queue_depth(o, qd) || blkhash_opts_set_threads(o, threads))
        DIE("bad options");
    h = blkhash_new_opts(o);
    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    blkhash_opts_free(o);
    return h;
}

/* Every 5th piece goes through blkhash_update, every 11th is followed by a
 * run of zeros through blkhash_zero: the same sequence in both runs. */
static void expected(const char *digest, unsigned pieces, unsigned char *md, unsigned *len)
{
    struct blkhash *h = make(digest, 0, 2);
    unsigned char *buf = malloc(2 << 20);

    for (unsigned i = 0; i < pieces; i++) {
        size_t n = piece_len(i);
        fill_piece(i, buf, n);
        CHECK_ERR(blkhash_update(h, buf, n), 0);
        if (i % 11 == 0)
            CHECK_ERR(blkhash_zero(h, 5 * BS + 17), 0);
    }
    CHECK_ERR(blkhash_final(h, md, len), 0);
    blkhash_free(h);
    free(buf);
}

/* Wait for the fd, drain it, collect completions. Returns how many. */
static int reap(struct blkhash *h, int fd, struct req *reqs, unsigned qd,
                struct blkhash_completion *cs)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t counter;
    int n;

    if (poll(&p, 1, 10000) != 1)
        DIE("poll: timed out or failed (%s)", strerror(errno));
    CHECK((p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0);
    if (read(fd, &counter, sizeof(counter)) != sizeof(counter) && errno != EAGAIN)
        DIE("read completion fd: %s", strerror(errno));
    n = blkhash_aio_completions(h, cs, qd);
    if (n < 0)
        DIE("blkhash_aio_completions: %s", strerror(-n));
    for (int k = 0; k < n; k++) {
        struct req *r = cs[k].user_data;
        CHECK(cs[k].error == 0);
        CHECK(r >= reqs && r < reqs + qd);
        CHECK(r->busy);
        r->busy = 0;
        r->completed++;
        /* The hash must be done with the buffer: scribble over it. */
        memset(r->buf, 0xee, r->len);
    }
    return n;
}

int main(int argc, char **argv)
{
    unsigned mib = argc > 1 ? (unsigned)atoi(argv[1]) : 256;
    unsigned qd = argc > 2 ? (unsigned)atoi(argv[2]) : 32;
    unsigned threads = argc > 3 ? (unsigned)atoi(argv[3]) : 2;
    const char *digest = argc > 4 ? argv[4] : "sha256";
    unsigned pieces = 0;
    unsigned char want[BLKHASH_MAX_MD_SIZE], got[BLKHASH_MAX_MD_SIZE];
    unsigned want_len = 0, got_len = 0;
    struct req *reqs = calloc(qd, sizeof(*reqs));
    struct blkhash_completion *cs = calloc(qd, sizeof(*cs));
    unsigned char *extra = malloc(2 << 20);
    struct blkhash *h;
    uint64_t total = 0, started = 0, done = 0;
    int fd, flags, max_inflight = 0, inflight = 0;

    for (size_t sum = 0; sum < (size_t)mib << 20; pieces++)
        sum += piece_len(pieces);
    expected(digest, pieces, want, &want_len);

    for (unsigned k = 0; k < qd; k++)
        reqs[k].buf = malloc(2 << 20);
    h = make(digest, qd, threads);
    fd = blkhash_aio_completion_fd(h);
    CHECK(fd >= 0);
    flags = fcntl(fd, F_GETFL);
    CHECK(flags >= 0 && (flags & O_NONBLOCK));

    for (unsigned i = 0; i < pieces; i++) {
        size_t n = piece_len(i);
        struct req *r = NULL;

        if (i % 5 == 4) {
            /* A copying update between async ones keeps the order. */
            fill_piece(i, extra, n);
            CHECK_ERR(blkhash_update(h, extra, n), 0);
        } else {
            while (r == NULL) {
                for (unsigned k = 0; k < qd && r == NULL; k++)
                    if (!reqs[k].busy)
                        r = &reqs[k];
                if (r == NULL) {
                    /* Full: the queue depth is enforced. */
                    CHECK_ERR(blkhash_aio_update(h, extra, 1, NULL), EAGAIN);
                    int got_n = reap(h, fd, reqs, qd, cs);
                    done += got_n;
                    inflight -= got_n;
                }
            }
            r->len = n;
            fill_piece(i, r->buf, n);
            CHECK_ERR(blkhash_aio_update(h, r->buf, n, r), 0);
            r->busy = 1;
            started++;
            if (++inflight > max_inflight)
                max_inflight = inflight;
        }
        total += n;
        if (i % 11 == 0)
            CHECK_ERR(blkhash_zero(h, 5 * BS + 17), 0);
    }
    /* Collect the rest before finishing, as a careful caller would. */
    while (inflight > 0) {
        int got_n = reap(h, fd, reqs, qd, cs);
        done += got_n;
        inflight -= got_n;
    }
    CHECK(done == started);
    for (unsigned k = 0; k < qd; k++)
        CHECK(reqs[k].busy == 0);
    CHECK(max_inflight == (int)qd || qd > started);
    CHECK_ERR(blkhash_final(h, got, &got_len), 0);
    CHECK(got_len == want_len && memcmp(got, want, want_len) == 0);
    blkhash_free(h);

    /* Updates left in flight at final: they complete, and can be collected. */
    h = make(digest, 4, threads);
    fd = blkhash_aio_completion_fd(h);
    for (unsigned k = 0; k < 4 && k < qd; k++) {
        reqs[k].len = 1 << 20;
        fill_piece(k, reqs[k].buf, reqs[k].len);
        CHECK_ERR(blkhash_aio_update(h, reqs[k].buf, reqs[k].len, &reqs[k]), 0);
    }
    CHECK_ERR(blkhash_final(h, got, &got_len), 0);
    {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 0) == 1);
        CHECK(blkhash_aio_completions(h, cs, qd) == (int)(qd < 4 ? qd : 4));
    }
    blkhash_free(h);

    /* Freed with updates in flight: no buffer is read after free returns. */
    h = make(digest, 4, threads);
    for (unsigned k = 0; k < 4 && k < qd; k++)
        CHECK_ERR(blkhash_aio_update(h, reqs[k].buf, 1 << 20, &reqs[k]), 0);
    blkhash_free(h);

    /* Errors: NULL buffer fails the hash, and the error sticks. */
    h = make(digest, 4, threads);
    CHECK_ERR(blkhash_aio_update(h, NULL, 0, NULL), 0);
    CHECK_ERR(blkhash_aio_update(h, NULL, 10, NULL), EINVAL);
    CHECK_ERR(blkhash_aio_update(h, extra, 10, NULL), EINVAL);
    CHECK_ERR(blkhash_aio_completions(h, cs, qd), -EINVAL);
    CHECK_ERR(blkhash_update(h, extra, 10), EINVAL);
    CHECK_ERR(blkhash_final(h, got, &got_len), EINVAL);
    blkhash_free(h);

    for (unsigned k = 0; k < qd; k++)
        free(reqs[k].buf);
    free(reqs);
    free(cs);
    free(extra);
    printf("aio: %u pieces, %llu bytes, %llu async updates, at most %d in flight\n",
           pieces, (unsigned long long)total, (unsigned long long)started, max_inflight);
    return finish("aio");
}

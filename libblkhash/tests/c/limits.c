/*
 * The limits of the system and of the construction, as blkhash.3 states
 * them.
 *
 *   limits threads   run under a thread limit (RLIMIT_NPROC of 3 tasks):
 *                    blkhash_new and blkhash_new_opts fail with EAGAIN
 *                    and print nothing; a hash of one thread then fits
 *   limits length    a total length past 2^64 - 1 bytes is EINVAL, and
 *                    the hash stays failed
 */
#include <errno.h>
#include <stdint.h>
#include <time.h>
#include <blkhash.h>

#include "check.h"

static struct blkhash *new_with(const char *digest, uint32_t bs, uint8_t threads,
                                unsigned queue_depth)
{
    struct blkhash_opts *o = blkhash_opts_new(digest);
    struct blkhash *h;

    if (o == NULL)
        DIE("blkhash_opts_new: %s", strerror(errno));
    CHECK_ERR(blkhash_opts_set_block_size(o, bs), 0);
    CHECK_ERR(blkhash_opts_set_threads(o, threads), 0);
    CHECK_ERR(blkhash_opts_set_queue_depth(o, queue_depth), 0);
    h = blkhash_new_opts(o);
    blkhash_opts_free(o);
    return h;
}

static void check_threads(void)
{
    struct blkhash *h;
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    unsigned len = 0;
    int tries;

    /* The defaults want 4 threads; the limit leaves room for 2. */
    errno = 0;
    h = blkhash_new();
    CHECK(h == NULL);
    CHECK_ERR(errno, EAGAIN);
    blkhash_free(h);

    errno = 0;
    h = new_with("sha256", 65536, 8, 0);
    CHECK(h == NULL);
    CHECK_ERR(errno, EAGAIN);
    blkhash_free(h);

    /* The async API too. */
    errno = 0;
    h = new_with("blake3", 65536, 8, 16);
    CHECK(h == NULL);
    CHECK_ERR(errno, EAGAIN);
    blkhash_free(h);

    /* The threads that did start were stopped: one thread fits. A thread
     * leaves the count just after it is joined, hence a moment's grace. */
    for (tries = 0; tries < 100; tries++) {
        errno = 0;
        h = new_with("sha256", 65536, 1, 0);
        if (h != NULL || errno != EAGAIN)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    CHECK(h != NULL);
    if (h == NULL)
        return;
    CHECK_ERR(blkhash_update(h, "hello", 5), 0);
    CHECK_ERR(blkhash_final(h, md, &len), 0);
    CHECK(len == 32);
    blkhash_free(h);
}

static void check_length(void)
{
    /* The null digest and 64 MiB blocks: 2^64 bytes of zeros hash at once. */
    struct blkhash *h = new_with("null", 64 << 20, 1, 0);
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    unsigned len = 0;
    char byte = 1;

    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    CHECK_ERR(blkhash_update(h, &byte, 1), 0);
    CHECK_ERR(blkhash_zero(h, SIZE_MAX), EINVAL);
    /* Nothing more counts: the hash failed. */
    CHECK_ERR(blkhash_update(h, &byte, 1), EINVAL);
    CHECK_ERR(blkhash_final(h, md, &len), EINVAL);
    blkhash_free(h);

    /* Up to 2^64 - 1 bytes exactly is fine, not one more. */
    h = new_with("null", 64 << 20, 1, 0);
    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    CHECK_ERR(blkhash_zero(h, SIZE_MAX), 0);
    CHECK_ERR(blkhash_update(h, &byte, 1), EINVAL);
    blkhash_free(h);

    h = new_with("null", 64 << 20, 1, 0);
    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    CHECK_ERR(blkhash_zero(h, SIZE_MAX - 1), 0);
    CHECK_ERR(blkhash_update(h, &byte, 1), 0);
    CHECK_ERR(blkhash_final(h, md, &len), 0);
    CHECK(len == 0);
    blkhash_free(h);

    /* The async API: an update past the limit fails the hash. */
    h = new_with("null", 64 << 20, 1, 4);
    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    CHECK_ERR(blkhash_zero(h, SIZE_MAX), 0);
    CHECK_ERR(blkhash_aio_update(h, &byte, 1, NULL), EINVAL);
    CHECK_ERR(blkhash_final(h, md, &len), EINVAL);
    blkhash_free(h);

    /* With a real digest the check comes first: no hours of zeros (and
     * without it, this would run for hours: stop at the failures above). */
    if (failures)
        return;
    h = new_with("sha256", 65536, 1, 0);
    if (h == NULL)
        DIE("blkhash_new_opts: %s", strerror(errno));
    CHECK_ERR(blkhash_update(h, &byte, 1), 0);
    CHECK_ERR(blkhash_zero(h, SIZE_MAX), EINVAL);
    blkhash_free(h);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "threads") == 0) {
        check_threads();
        return finish("limits threads");
    }
    if (argc == 2 && strcmp(argv[1], "length") == 0) {
        check_length();
        return finish("limits length");
    }
    DIE("usage: limits threads|length");
}

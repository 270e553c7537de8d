/*
 * Many hashes at once from many threads, with worker counts from 1 to 128:
 * every one must give the digest a single-threaded hash gives.
 *
 *   threads [CALLER_THREADS [ROUNDS]]
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <blkhash.h>

#include "check.h"

#define SIZE (8u << 20)
#define BS 65536

static unsigned char *data;
static const char *digests[] = {"sha256", "blake3", "sha1", "md5"};
static unsigned char want[4][BLKHASH_MAX_MD_SIZE];
static unsigned want_len[4];
static int rounds = 4;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int thread_failures;

static int digest_with(const char *digest, unsigned workers, size_t chunk,
                       unsigned char *md, unsigned *len)
{
    struct blkhash_opts *o = blkhash_opts_new(digest);
    struct blkhash *h;
    int err = 0;

    if (o == NULL)
        return errno;
    if ((err = blkhash_opts_set_threads(o, (uint8_t)workers))) {
        blkhash_opts_free(o);
        return err;
    }
    h = blkhash_new_opts(o);
    blkhash_opts_free(o);
    if (h == NULL)
        return errno;
    for (size_t off = 0; off < SIZE && !err; off += chunk)
        err = blkhash_update(h, data + off, off + chunk > SIZE ? SIZE - off : chunk);
    if (!err)
        err = blkhash_final(h, md, len);
    blkhash_free(h);
    return err;
}

static void *caller(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    static const unsigned workers[] = {1, 2, 3, 8, 128};
    static const size_t chunks[] = {1 << 20, 4096, 100000, SIZE};

    for (int r = 0; r < rounds; r++) {
        unsigned d = (id + r) % 4;
        unsigned w = workers[(id * 3 + r) % 5];
        size_t c = chunks[(id + 2 * r) % 4];
        unsigned char md[BLKHASH_MAX_MD_SIZE];
        unsigned len = 0;
        int err = digest_with(digests[d], w, c, md, &len);

        if (err || len != want_len[d] || memcmp(md, want[d], len) != 0) {
            pthread_mutex_lock(&lock);
            fprintf(stderr, "caller %u round %d: %s, %u workers, chunks of %zu: %s\n",
                    id, r, digests[d], w, c, err ? strerror(err) : "wrong digest");
            thread_failures++;
            pthread_mutex_unlock(&lock);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned callers = argc > 1 ? (unsigned)atoi(argv[1]) : 8;
    pthread_t *tids;

    if (argc > 2)
        rounds = atoi(argv[2]);
    data = malloc(SIZE);
    tids = calloc(callers, sizeof(*tids));
    if (data == NULL || tids == NULL)
        DIE("out of memory");
    for (size_t i = 0; i < SIZE; i++)
        data[i] = (i / BS) % 4 == 1 ? 0 : (unsigned char)(i * 13 + i / 4093);
    for (int d = 0; d < 4; d++)
        CHECK_ERR(digest_with(digests[d], 1, SIZE, want[d], &want_len[d]), 0);

    for (unsigned t = 0; t < callers; t++)
        if (pthread_create(&tids[t], NULL, caller, (void *)(uintptr_t)t))
            DIE("pthread_create failed");
    for (unsigned t = 0; t < callers; t++)
        pthread_join(tids[t], NULL);
    CHECK(thread_failures == 0);

    free(tids);
    free(data);
    printf("threads: %u callers x %d rounds\n", callers, rounds);
    return finish("threads");
}

/*
 * The simple API and every error path of blkhash.h.
 *
 *   api            run the checks
 *   api digests [NAME...]
 *                  print "NAME HEX" for a fixed input with every digest
 *                  blkhash_digests() names, then with each NAME (a name
 *                  it does not list), for the Rust test to compare with
 *                  the Rust library
 */
#include <errno.h>
#include <stdint.h>
#include <blkhash.h>

#include "check.h"

#define BS 4096

/* The fixed input: 10000 bytes of a pattern, 8192 zeros given as data,
 * 12288 zeros given as zeros, "tail!". The Rust test builds the same. */
static int hash_fixed(const char *name, unsigned char *md, unsigned *len)
{
    static unsigned char data[10000];
    static unsigned char zeros[8192];
    struct blkhash_opts *o = blkhash_opts_new(name);
    struct blkhash *h;
    int err;

    if (o == NULL)
        return errno;
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (unsigned char)(i * 7 + 1);
    err = blkhash_opts_set_block_size(o, BS);
    if (err) {
        blkhash_opts_free(o);
        return err;
    }
    h = blkhash_new_opts(o);
    blkhash_opts_free(o);
    if (h == NULL)
        return errno;
    if ((err = blkhash_update(h, data, sizeof(data))) ||
        (err = blkhash_update(h, zeros, sizeof(zeros))) ||
        (err = blkhash_zero(h, 12288)) ||
        (err = blkhash_update(h, "tail!", 5)) ||
        (err = blkhash_final(h, md, len))) {
        blkhash_free(h);
        return err;
    }
    blkhash_free(h);
    return 0;
}

static void print_digest(const char *name)
{
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    char hex[2 * BLKHASH_MAX_MD_SIZE + 1];
    unsigned len = 0;
    int err = hash_fixed(name, md, &len);

    if (err)
        DIE("%s: %s", name, strerror(err));
    to_hex(md, len, hex);
    printf("%s %s\n", name, hex);
}

static int print_digests(int extra, char **extra_names)
{
    size_t n = blkhash_digests(NULL, 0);
    const char **names = calloc(n, sizeof(*names));

    if (names == NULL)
        DIE("calloc failed");
    if (blkhash_digests(names, n) != n)
        DIE("blkhash_digests wrote fewer names than it counted");
    for (size_t i = 0; i < n; i++)
        print_digest(names[i]);
    for (int i = 0; i < extra; i++)
        print_digest(extra_names[i]);
    free(names);
    return 0;
}

static void check_options(void)
{
    struct blkhash_opts *o;

    errno = 0;
    CHECK(blkhash_opts_new(NULL) == NULL);
    CHECK(errno == EINVAL);

    o = blkhash_opts_new("sha1");
    CHECK(o != NULL);
    if (o == NULL)
        return;
    CHECK(strcmp(blkhash_opts_get_digest_name(o), "sha1") == 0);
    CHECK(blkhash_opts_get_block_size(o) == 64 * 1024);
    CHECK(blkhash_opts_get_threads(o) == 4);
    CHECK(blkhash_opts_get_queue_depth(o) == 0);

    /* Block sizes: multiples of 512 from 512 to 64 MiB. */
    CHECK_ERR(blkhash_opts_set_block_size(o, 0), EINVAL);
    CHECK_ERR(blkhash_opts_set_block_size(o, 511), EINVAL);
    CHECK_ERR(blkhash_opts_set_block_size(o, 1000), EINVAL);
    CHECK_ERR(blkhash_opts_set_block_size(o, (64u << 20) + 512), EINVAL);
    CHECK_ERR(blkhash_opts_set_block_size(o, UINT32_MAX), EINVAL);
    CHECK(blkhash_opts_get_block_size(o) == 64 * 1024);
    CHECK_ERR(blkhash_opts_set_block_size(o, 512), 0);
    CHECK_ERR(blkhash_opts_set_block_size(o, 64u << 20), 0);
    CHECK_ERR(blkhash_opts_set_block_size(o, 1536), 0);
    CHECK(blkhash_opts_get_block_size(o) == 1536);

    /* Threads: 1 to 128. */
    CHECK_ERR(blkhash_opts_set_threads(o, 0), EINVAL);
    CHECK_ERR(blkhash_opts_set_threads(o, 129), EINVAL);
    CHECK_ERR(blkhash_opts_set_threads(o, 255), EINVAL);
    CHECK(blkhash_opts_get_threads(o) == 4);
    CHECK_ERR(blkhash_opts_set_threads(o, 1), 0);
    CHECK_ERR(blkhash_opts_set_threads(o, 128), 0);
    CHECK(blkhash_opts_get_threads(o) == 128);

    /* Queue depth: every value, as in 0.11. */
    CHECK_ERR(blkhash_opts_set_queue_depth(o, 0), 0);
    CHECK_ERR(blkhash_opts_set_queue_depth(o, 100000), 0);
    CHECK(blkhash_opts_get_queue_depth(o) == 100000);
    blkhash_opts_free(o);
    blkhash_opts_free(NULL);

    /* Unknown digests fail when the hash is made, as in 0.11. */
    o = blkhash_opts_new("sha257");
    CHECK(o != NULL);
    errno = 0;
    CHECK(blkhash_new_opts(o) == NULL);
    CHECK(errno == EINVAL);
    blkhash_opts_free(o);
    o = blkhash_opts_new("");
    errno = 0;
    CHECK(blkhash_new_opts(o) == NULL);
    CHECK(errno == EINVAL);
    blkhash_opts_free(o);
    errno = 0;
    CHECK(blkhash_new_opts(NULL) == NULL);
    CHECK(errno == EINVAL);
}

static void check_digest_list(void)
{
    size_t n = blkhash_digests(NULL, 0);
    const char *two[3] = {NULL, NULL, "canary"};
    const char **all;
    int have_sha256 = 0;

    CHECK(n >= 20);
    CHECK(blkhash_digests(two, 2) == 2);
    CHECK(two[0] != NULL && two[1] != NULL);
    CHECK(strcmp(two[2], "canary") == 0);
    CHECK(blkhash_digests(two, 0) == n);

    all = calloc(n + 1, sizeof(*all));
    CHECK(blkhash_digests(all, n + 1) == n);
    for (size_t i = 0; i < n; i++)
        have_sha256 |= strcmp(all[i], "sha256") == 0;
    CHECK(have_sha256);
    CHECK(all[n] == NULL);
    free(all);
}

/* The defaults are sha256 and 64 KiB blocks; OpenSSL's spellings work. */
static void check_defaults(void)
{
    static unsigned char buf[300000];
    unsigned char a[BLKHASH_MAX_MD_SIZE], b[BLKHASH_MAX_MD_SIZE];
    unsigned alen = 0, blen = 0;
    struct blkhash *h;
    struct blkhash_opts *o;
    const char *spellings[] = {"sha256", "SHA256", "SHA2-256", "sha-256"};

    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i % 251);
    h = blkhash_new();
    CHECK(h != NULL);
    CHECK_ERR(blkhash_update(h, buf, sizeof(buf)), 0);
    CHECK_ERR(blkhash_final(h, a, &alen), 0);
    CHECK(alen == 32);
    blkhash_free(h);

    for (size_t s = 0; s < sizeof(spellings) / sizeof(*spellings); s++) {
        o = blkhash_opts_new(spellings[s]);
        CHECK_ERR(blkhash_opts_set_threads(o, 1), 0);
        h = blkhash_new_opts(o);
        blkhash_opts_free(o);
        CHECK(h != NULL);
        if (h == NULL)
            continue;
        /* Odd pieces: the result depends only on the bytes. */
        CHECK_ERR(blkhash_update(h, buf, 1), 0);
        CHECK_ERR(blkhash_update(h, buf + 1, 65535), 0);
        CHECK_ERR(blkhash_update(h, buf + 65536, 100001), 0);
        CHECK_ERR(blkhash_update(h, buf + 165537, sizeof(buf) - 165537), 0);
        CHECK_ERR(blkhash_final(h, b, &blen), 0);
        CHECK(blen == alen && memcmp(a, b, alen) == 0);
        blkhash_free(h);
    }
}

/* blkhash_final writes exactly the digest length, at most the maximum. */
static void check_final_length(void)
{
    size_t n = blkhash_digests(NULL, 0);
    const char **names = calloc(n, sizeof(*names));

    blkhash_digests(names, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char md[BLKHASH_MAX_MD_SIZE + 16];
        unsigned len = 12345;
        struct blkhash_opts *o = blkhash_opts_new(names[i]);
        struct blkhash *h;

        blkhash_opts_set_threads(o, 1);
        h = blkhash_new_opts(o);
        blkhash_opts_free(o);
        CHECK(h != NULL);
        if (h == NULL)
            continue;
        memset(md, 0xa5, sizeof(md));
        CHECK_ERR(blkhash_update(h, "abc", 3), 0);
        CHECK_ERR(blkhash_final(h, md, &len), 0);
        CHECK(len <= BLKHASH_MAX_MD_SIZE);
        for (size_t j = len; j < sizeof(md); j++)
            CHECK(md[j] == 0xa5);
        /* NULL md_len is allowed. */
        blkhash_free(h);
    }
    free(names);
}

static void check_errors(void)
{
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    unsigned len;
    struct blkhash_completion c[4];
    struct blkhash *h = blkhash_new();

    CHECK(h != NULL);
    if (h == NULL)
        return;

    /* The async API needs a queue depth. */
    CHECK_ERR(blkhash_aio_update(h, "x", 1, NULL), ENOTSUP);
    CHECK(blkhash_aio_completion_fd(h) < 0);
    CHECK_ERR(blkhash_aio_completions(h, c, 4), -ENOTSUP);

    /* Empty updates are fine, even with NULL. */
    CHECK_ERR(blkhash_update(h, NULL, 0), 0);
    CHECK_ERR(blkhash_zero(h, 0), 0);
    CHECK_ERR(blkhash_final(h, md, NULL), 0);

    /* Final once only; nothing after it. */
    CHECK_ERR(blkhash_final(h, md, &len), EINVAL);
    CHECK_ERR(blkhash_update(h, "x", 1), EINVAL);
    CHECK_ERR(blkhash_zero(h, 1), EINVAL);
    blkhash_free(h);

    /* The first error sticks. */
    h = blkhash_new();
    CHECK_ERR(blkhash_update(h, "abc", 3), 0);
    CHECK_ERR(blkhash_update(h, NULL, 10), EINVAL);
    CHECK_ERR(blkhash_update(h, "abc", 3), EINVAL);
    CHECK_ERR(blkhash_zero(h, 65536), EINVAL);
    CHECK_ERR(blkhash_final(h, md, &len), EINVAL);
    CHECK_ERR(blkhash_final(h, md, &len), EINVAL);
    blkhash_free(h);

    /* A NULL digest buffer fails the hash (but for the empty null digest). */
    h = blkhash_new();
    CHECK_ERR(blkhash_final(h, NULL, &len), EINVAL);
    blkhash_free(h);
    {
        struct blkhash_opts *o = blkhash_opts_new("null");
        h = blkhash_new_opts(o);
        blkhash_opts_free(o);
        len = 99;
        CHECK_ERR(blkhash_update(h, "abc", 3), 0);
        CHECK_ERR(blkhash_final(h, NULL, &len), 0);
        CHECK(len == 0);
        blkhash_free(h);
    }
    blkhash_free(NULL);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "digests") == 0)
        return print_digests(argc - 2, argv + 2);
    check_options();
    check_digest_list();
    check_defaults();
    check_final_length();
    check_errors();
    return finish("api");
}

/*
 * The reference vectors: hash image files three ways and compare with the
 * checksums blkhash 0.11 computed. Each line of LIST is
 *
 *   PATH DIGEST BLOCK_SIZE MODE HEX
 *
 * MODE: "update" (reads of odd sizes through blkhash_update), "aio" (reads
 * into a ring of buffers through blkhash_aio_update, driven by poll), or
 * "sparse" (data ranges found with SEEK_DATA/SEEK_HOLE through
 * blkhash_update, holes through blkhash_zero).
 *
 *   vectors LIST
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <blkhash.h>

#include "check.h"

#define QD 8
#define AIO_BUF (1 << 20)

static unsigned char *bufs[QD];

static int new_hash(const char *digest, uint32_t bs, unsigned qd, struct blkhash **out)
{
    struct blkhash_opts *o = blkhash_opts_new(digest);
    int err;

    if (o == NULL)
        return errno;
    if ((err = blkhash_opts_set_block_size(o, bs)) || (err = blkhash_opts_set_queue_depth(o, qd)) ||
        (err = blkhash_opts_set_threads(o, 2))) {
        blkhash_opts_free(o);
        return err;
    }
    *out = blkhash_new_opts(o);
    blkhash_opts_free(o);
    return *out ? 0 : errno;
}

/* Read exactly len bytes at off (short only at end of file). */
static ssize_t read_at(int fd, unsigned char *buf, size_t len, off_t off)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, off + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static int hash_update(int fd, struct blkhash *h)
{
    static const size_t sizes[] = {1 << 20, 12345, 65536, 511, 300000};
    off_t off = 0;

    for (unsigned i = 0;; i++) {
        ssize_t n = read_at(fd, bufs[0], sizes[i % 5], off);
        if (n < 0)
            return errno;
        if (n == 0)
            return 0;
        int err = blkhash_update(h, bufs[0], (size_t)n);
        if (err)
            return err;
        off += n;
    }
}

static int hash_aio(int fd, struct blkhash *h)
{
    struct blkhash_completion cs[QD];
    int busy[QD] = {0};
    int inflight = 0, eof = 0;
    off_t off = 0;
    int cfd = blkhash_aio_completion_fd(h);

    if (cfd < 0)
        return -cfd;
    while (!eof || inflight > 0) {
        for (int k = 0; k < QD && !eof; k++) {
            if (busy[k])
                continue;
            ssize_t n = read_at(fd, bufs[k], AIO_BUF, off);
            if (n < 0)
                return errno;
            if (n == 0) {
                eof = 1;
                break;
            }
            int err = blkhash_aio_update(h, bufs[k], (size_t)n, &busy[k]);
            if (err)
                return err;
            busy[k] = 1;
            inflight++;
            off += n;
        }
        if (inflight == 0)
            break;
        struct pollfd p = {.fd = cfd, .events = POLLIN};
        uint64_t counter;
        if (poll(&p, 1, 10000) != 1)
            return ETIMEDOUT;
        if (read(cfd, &counter, 8) < 0 && errno != EAGAIN)
            return errno;
        int n = blkhash_aio_completions(h, cs, QD);
        if (n < 0)
            return -n;
        for (int c = 0; c < n; c++) {
            if (cs[c].error)
                return cs[c].error;
            *(int *)cs[c].user_data = 0;
            inflight--;
        }
    }
    return 0;
}

static int hash_sparse(int fd, struct blkhash *h)
{
    struct stat st;
    off_t off = 0;

    if (fstat(fd, &st))
        return errno;
    while (off < st.st_size) {
        off_t data = lseek(fd, off, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            data = st.st_size;
        else if (data < 0)
            return errno;
        if (data > off) {
            int err = blkhash_zero(h, (size_t)(data - off));
            if (err)
                return err;
            off = data;
            continue;
        }
        off_t hole = lseek(fd, off, SEEK_HOLE);
        if (hole < 0)
            return errno;
        while (off < hole) {
            size_t want = hole - off < AIO_BUF ? (size_t)(hole - off) : AIO_BUF;
            ssize_t n = read_at(fd, bufs[0], want, off);
            if (n <= 0)
                return n < 0 ? errno : EIO;
            int err = blkhash_update(h, bufs[0], (size_t)n);
            if (err)
                return err;
            off += n;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    char path[4096], digest[64], mode[16], hex[2 * BLKHASH_MAX_MD_SIZE + 1];
    unsigned bs;
    unsigned count = 0;
    FILE *list;

    if (argc != 2)
        DIE("usage: vectors LIST");
    list = fopen(argv[1], "r");
    if (list == NULL)
        DIE("%s: %s", argv[1], strerror(errno));
    for (int k = 0; k < QD; k++)
        if ((bufs[k] = malloc(AIO_BUF)) == NULL)
            DIE("out of memory");

    while (fscanf(list, "%4095s %63s %u %15s %128s", path, digest, &bs, mode, hex) == 5) {
        struct blkhash *h = NULL;
        unsigned char md[BLKHASH_MAX_MD_SIZE];
        char got[2 * BLKHASH_MAX_MD_SIZE + 1];
        unsigned len = 0;
        int aio = strcmp(mode, "aio") == 0;
        int fd = open(path, O_RDONLY);
        int err;

        if (fd < 0)
            DIE("%s: %s", path, strerror(errno));
        err = new_hash(digest, bs, aio ? QD : 0, &h);
        if (!err) {
            if (aio)
                err = hash_aio(fd, h);
            else if (strcmp(mode, "sparse") == 0)
                err = hash_sparse(fd, h);
            else
                err = hash_update(fd, h);
        }
        if (!err)
            err = blkhash_final(h, md, &len);
        blkhash_free(h);
        close(fd);
        to_hex(md, err ? 0 : len, got);
        if (err || strcmp(got, hex) != 0) {
            fprintf(stderr, "%s %s %u %s: got %s, want %s\n", path, digest, bs, mode,
                    err ? strerror(err) : got, hex);
            failures++;
        }
        count++;
    }
    fclose(list);
    for (int k = 0; k < QD; k++)
        free(bufs[k]);
    printf("vectors: %u checked\n", count);
    CHECK(count > 0);
    return finish("vectors");
}

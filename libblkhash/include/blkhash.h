/*
 * blkhash.h: checksums of disk images, block by block, in parallel.
 *
 * The C interface of libblkhash (shared object libblkhash.so.0). Programs
 * written for libblkhash 0.11 compile against this header unchanged and
 * compute the same digests. Manual pages: blkhash(3), blkhash-aio(3),
 * blkhash-opts(3).
 *
 * Conventions: functions returning int return 0 or an errno value (the
 * async completion calls return a negative errno value); constructors
 * return NULL and set errno. Once a call on a hash fails, every later call
 * on it returns the same error, so a digest that missed data is never
 * produced. A hash may be used from one thread at a time; different hashes
 * are independent.
 */

#ifndef BLKHASH_H
#define BLKHASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes blkhash_final() writes at most: the largest digest (sha512). */
#define BLKHASH_MAX_MD_SIZE 64

/* A hash being computed. Opaque. */
struct blkhash;

/* How a hash is made: digest, block size, threads, async queue depth. */
struct blkhash_opts;

/* A finished async update, as blkhash_aio_completions() reports it. */
struct blkhash_completion {
    /* The user_data given to blkhash_aio_update(). */
    void *user_data;

    /* 0 when the update was hashed, else an errno value. */
    int error;
};

/*
 * A new hash with the default options: sha256, 64 KiB blocks, 4 threads,
 * no async API. Free it with blkhash_free().
 *
 * fork(): the hash's worker threads do not exist in a child process. A
 * hash made before fork() must be used in only one of the processes, the
 * parent; a child that needs a hash makes its own (see blkhash(3), FORK).
 *
 * Returns NULL and sets errno on failure: EAGAIN when the worker threads
 * cannot be started (the limit on threads, RLIMIT_NPROC, was reached).
 */
struct blkhash *blkhash_new(void);

/*
 * A new hash with the given options (see blkhash_opts_new()). The options
 * may be freed once this returns. The digest and the block size are part
 * of the result: other values give other digests.
 *
 * Returns NULL and sets errno on failure: EINVAL for a digest name this
 * library does not know, or NULL opts; EAGAIN when the worker threads
 * cannot be started. The same fork() rule as blkhash_new().
 */
struct blkhash *blkhash_new_opts(const struct blkhash_opts *opts);

/*
 * Add len bytes at buf. The bytes are copied, so buf may be reused as soon
 * as the call returns. Whole blocks of zeros are recognised and cost no
 * digest. Calls may be of any length; lengths that are multiples of the
 * block size are fastest.
 *
 * Returns 0, or an errno value (EINVAL for a NULL buf with a non-zero len,
 * a call after blkhash_final(), or a total past 2^64 - 1 bytes). After an
 * error every later call fails with it.
 */
int blkhash_update(struct blkhash *h, const void *buf, size_t len);

/*
 * Add len bytes known to be zeros (a hole in a sparse file, an unallocated
 * or zero cluster of an image) without reading or digesting anything for
 * whole blocks. Much faster than passing zeros to blkhash_update().
 *
 * Returns 0, or an errno value (EINVAL for a total past 2^64 - 1 bytes, the
 * most a hash's length field records). After an error every later call
 * fails with it.
 */
int blkhash_zero(struct blkhash *h, size_t len);

/*
 * Start adding len bytes at buf without copying them, and return at once.
 * The hash reads buf in place: the caller must leave it unchanged (and
 * allocated) until a completion with this user_data is reported by
 * blkhash_aio_completions(), or until blkhash_free(). The bytes join the
 * digest in call order, mixed in any way with blkhash_update() and
 * blkhash_zero().
 *
 * Needs a hash made with blkhash_opts_set_queue_depth().
 *
 * Returns 0 when the update was started, else an errno value: ENOTSUP
 * without a queue depth, EAGAIN when queue depth updates are already in
 * flight (not an error of the hash: collect completions, then retry),
 * EINVAL for a NULL buf with a non-zero len or a total past 2^64 - 1
 * bytes.
 */
int blkhash_aio_update(struct blkhash *h, const void *buf, size_t len,
                       void *user_data);

/*
 * The file descriptor to poll for completions: it is readable when
 * completions may be ready. It is an eventfd with O_NONBLOCK set (the
 * caller may clear it); read its 8 bytes before calling
 * blkhash_aio_completions(). It belongs to the hash: do not close it.
 *
 * Returns a negative value (-ENOTSUP) for a hash made without a queue
 * depth.
 */
int blkhash_aio_completion_fd(struct blkhash *h);

/*
 * Copy up to count ready completions to out, in no particular order, each
 * update being reported once. A wake-up may find none ready (0): poll
 * again.
 *
 * Returns the number of completions copied, or a negative errno value
 * (-ENOTSUP without a queue depth, the hash's error after a failure).
 */
int blkhash_aio_completions(struct blkhash *h, struct blkhash_completion *out,
                            unsigned count);

/*
 * Finish the hash: wait for updates in flight, write the digest to
 * md_value (at most BLKHASH_MAX_MD_SIZE bytes) and, if md_len is not NULL,
 * its length to md_len. Async updates still in flight complete first, and
 * their completions can still be collected.
 *
 * Returns 0, or an errno value (EINVAL when called a second time). On error
 * md_value and md_len are undefined.
 */
int blkhash_final(struct blkhash *h, unsigned char *md_value,
                  unsigned int *md_len);

/*
 * Free a hash, finished or not. NULL is allowed. No buffer given to
 * blkhash_aio_update() is read after this returns.
 */
void blkhash_free(struct blkhash *h);

/*
 * The digest names (the names OpenSSL gives them, each one Python's
 * hashlib.new() takes too, plus blake3 and null): fills names with up to
 * count pointers to static strings and returns how many it wrote. With
 * NULL names or a zero count, returns how many names there are.
 * blkhash_opts_new() takes these and other spellings: OpenSSL's
 * (SHA2-256), hashlib's (sha3_256, shake_128), and blake2b-256 (BLAKE2b
 * with a 32-byte output, oVirt imageio's blake2b), which no OpenSSL or
 * hashlib name means.
 */
size_t blkhash_digests(const char **names, size_t count);

/*
 * New options for the digest digest_name (see blkhash_digests()), with
 * the defaults: 64 KiB blocks, 4 threads, queue depth 0. The name is
 * copied, and checked by blkhash_new_opts(). Free with blkhash_opts_free().
 *
 * Returns NULL and sets errno (EINVAL for a NULL name) on failure.
 */
struct blkhash_opts *blkhash_opts_new(const char *digest_name);

/*
 * The block size in bytes: a multiple of 512 from 512 to 64 MiB (powers
 * of two are what other tools use). Changes the digest.
 *
 * Returns 0, or EINVAL for a size out of range.
 */
int blkhash_opts_set_block_size(struct blkhash_opts *o, uint32_t block_size);

/*
 * Threads digesting blocks, 1 to 128 (default 4). Does not change the
 * digest.
 *
 * Returns 0, or EINVAL for a count out of range.
 */
int blkhash_opts_set_threads(struct blkhash_opts *o, uint8_t threads);

/*
 * Async updates that may be in flight at once; a non-zero value enables
 * blkhash_aio_update() and the completion fd. 0, the default, leaves them
 * off (they fail with ENOTSUP).
 *
 * Returns 0 (every value is valid).
 */
int blkhash_opts_set_queue_depth(struct blkhash_opts *o, unsigned queue_depth);

/* The digest name (owned by o). */
const char *blkhash_opts_get_digest_name(struct blkhash_opts *o);

/* The block size. */
uint32_t blkhash_opts_get_block_size(struct blkhash_opts *o);

/* The number of threads. */
uint8_t blkhash_opts_get_threads(struct blkhash_opts *o);

/* The async queue depth. */
unsigned blkhash_opts_get_queue_depth(struct blkhash_opts *o);

/* Free options. NULL is allowed. */
void blkhash_opts_free(struct blkhash_opts *o);

#ifdef __cplusplus
}
#endif

#endif /* BLKHASH_H */

/* Tiny test helpers shared by the C test programs. */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

/* Record a failed expectation and go on, so one run shows every failure. */
#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                    \
            failures++;                                                  \
        }                                                                \
    } while (0)

/* An int result that must equal an expected errno value (0 for success). */
#define CHECK_ERR(expr, want)                                            \
    do {                                                                 \
        int got_ = (expr);                                               \
        if (got_ != (want)) {                                            \
            fprintf(stderr, "%s:%d: %s: got %d (%s), want %d (%s)\n",    \
                    __FILE__, __LINE__, #expr, got_, strerror(got_ < 0 ? -got_ : got_), \
                    (want), strerror((want) < 0 ? -(want) : (want)));    \
            failures++;                                                  \
        }                                                                \
    } while (0)

/* Stop at once: nothing sensible can follow. */
#define DIE(...)                                                         \
    do {                                                                 \
        fprintf(stderr, __VA_ARGS__);                                    \
        fputc('\n', stderr);                                             \
        exit(2);                                                         \
    } while (0)

static inline void to_hex(const unsigned char *md, unsigned len, char *out)
{
    for (unsigned i = 0; i < len; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
    out[2 * len] = '\0';
}

static inline int finish(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif

/*
 * The blkhash checksum (sha256, 64 KiB blocks) of standard input, in hex:
 * what `blksum < FILE` prints before its name. scripts/test-install.sh
 * links it statically (cc -static, pkg-config --static) and compares.
 */
#include <blkhash.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    static unsigned char buf[1 << 20];
    unsigned char md[BLKHASH_MAX_MD_SIZE];
    unsigned int len;
    size_t n;
    int err = 0;
    struct blkhash *h = blkhash_new();

    if (h == NULL) {
        perror("blkhash_new");
        return 1;
    }
    while (!err && (n = fread(buf, 1, sizeof(buf), stdin)) > 0)
        err = blkhash_update(h, buf, n);
    if (!err && ferror(stdin))
        err = EIO;
    if (!err)
        err = blkhash_final(h, md, &len);
    blkhash_free(h);
    if (err) {
        fprintf(stderr, "hex: %s\n", strerror(err));
        return 1;
    }
    for (unsigned int i = 0; i < len; i++)
        printf("%02x", md[i]);
    printf("\n");
    return 0;
}

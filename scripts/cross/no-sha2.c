/*
 * LD_PRELOAD shim for aarch64 programs run under qemu-user: getauxval()
 * reports the CPU without its SHA-2 (and SHA-512) instructions, so the
 * run-time detection of Rust's std and of the cpufeatures crate takes the
 * path of a CPU that lacks them. QEMU's aarch64 CPU models all have them,
 * and qemu-user has no switch to take them away. Built and used by
 * scripts/test-cross.sh.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/auxv.h>

unsigned long getauxval(unsigned long type)
{
    static unsigned long (*real)(unsigned long);
    unsigned long value;

    if (real == NULL)
        real = (unsigned long (*)(unsigned long))dlsym(RTLD_NEXT, "getauxval");
    value = real(type);
    if (type == AT_HWCAP)
        value &= ~(unsigned long)(HWCAP_SHA2 | HWCAP_SHA512);
    return value;
}

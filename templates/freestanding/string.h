/* The <string.h> that code exported by micrograd-c needs, for freestanding targets with no libc
 * (clang --target=wasm32 -ffreestanding -nostdlibinc -I<this directory>). Compilers emit calls
 * to memcpy and memset even in freestanding code, so these are real (weak) functions: one
 * definition wins when several files include this header, or when a libc is linked after all. */
#ifndef MICROGRAD_C_FREESTANDING_STRING_H
#define MICROGRAD_C_FREESTANDING_STRING_H

typedef __SIZE_TYPE__ size_t;

__attribute__((weak)) void *memcpy(void *restrict dest, const void *restrict src, size_t n)
{
    unsigned char *d = (unsigned char *)dest;
    const unsigned char *s = (const unsigned char *)src;
    while (n--)
        *d++ = *s++;
    return dest;
}

__attribute__((weak)) void *memset(void *dest, int c, size_t n)
{
    unsigned char *d = (unsigned char *)dest;
    while (n--)
        *d++ = (unsigned char)c;
    return dest;
}

#endif

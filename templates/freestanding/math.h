/* The <math.h> that code exported by micrograd-c needs, for freestanding targets with no libc
 * (clang --target=wasm32 -ffreestanding -nostdlibinc -I<this directory>): exp, log, tanh, pow,
 * sqrt (the instruction: __builtin_sqrt), INFINITY and NAN. exp and log are musl's (from FreeBSD's msun), within 1 ulp of the C library;
 * tanh (via an expm1 built on them) within 8 ulp; pow with an integer exponent, what
 * `Value ** k` usually is, multiplies, and otherwise is exp(y log x), within 16 ulp for moderate
 * results (tests/test_export.py measures these). Uses clang and GCC builtins only. */
#ifndef MICROGRAD_C_FREESTANDING_MATH_H
#define MICROGRAD_C_FREESTANDING_MATH_H

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define HUGE_VAL (__builtin_huge_val())
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)

#define exp mgc_exp
#define log mgc_log
#define tanh mgc_tanh
#define pow mgc_pow
#define sqrt __builtin_sqrt
#define sqrtf __builtin_sqrtf

typedef unsigned long long mgc_u64;

static inline mgc_u64 mgc_bits(double x) { mgc_u64 i; __builtin_memcpy(&i, &x, 8); return i; }
static inline double mgc_from_bits(mgc_u64 i) { double x; __builtin_memcpy(&x, &i, 8); return x; }

/* x * 2^n, without double rounding in the subnormal range */
static inline double mgc_scalbn(double x, int n)
{
    double y = x;
    if (n > 1023) {
        y *= 0x1p1023;
        n -= 1023;
        if (n > 1023) {
            y *= 0x1p1023;
            n -= 1023;
            if (n > 1023)
                n = 1023;
        }
    } else if (n < -1022) {
        y *= 0x1p-1022 * 0x1p53;
        n += 1022 - 53;
        if (n < -1022) {
            y *= 0x1p-1022 * 0x1p53;
            n += 1022 - 53;
            if (n < -1022)
                n = -1022;
        }
    }
    return y * mgc_from_bits((mgc_u64)(0x3ff + n) << 52);
}

static inline double mgc_exp(double x)
{
    static const double half[2] = {0.5, -0.5};
    const double ln2hi = 6.93147180369123816490e-01, ln2lo = 1.90821492927058770002e-10,
                 invln2 = 1.44269504088896338700e+00, P1 = 1.66666666666666019037e-01,
                 P2 = -2.77777777770155933842e-03, P3 = 6.61375632143793436117e-05,
                 P4 = -1.65339022054652515390e-06, P5 = 4.13813679705723846039e-08;
    double hi, lo = 0, c, xx, y;
    int k, sign;
    unsigned hx = (unsigned)(mgc_bits(x) >> 32);
    sign = (int)(hx >> 31);
    hx &= 0x7fffffff;
    if (hx >= 0x4086232b) { /* |x| >= 708.39 or nan */
        if (x != x)
            return x;
        if (x > 709.782712893383973096)
            return x * 0x1p1023; /* overflow: inf */
        if (x < -745.13321910194110842)
            return 0;
    }
    if (hx > 0x3fd62e42) { /* |x| > 0.5 ln2: reduce to |r| <= 0.5 ln2 */
        if (hx >= 0x3ff0a2b2)
            k = (int)(invln2 * x + half[sign]);
        else
            k = 1 - sign - sign;
        hi = x - k * ln2hi;
        lo = k * ln2lo;
        x = hi - lo;
    } else if (hx > 0x3e300000) { /* |x| > 2^-28 */
        k = 0;
        hi = x;
    } else {
        return 1 + x;
    }
    xx = x * x;
    c = x - xx * (P1 + xx * (P2 + xx * (P3 + xx * (P4 + xx * P5))));
    y = 1 + (x * c / (2 - c) - lo + hi);
    return k == 0 ? y : mgc_scalbn(y, k);
}

static inline double mgc_log(double x)
{
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10,
                 Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01,
                 Lg3 = 2.857142874366239149e-01, Lg4 = 2.222219843214978396e-01,
                 Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                 Lg7 = 1.479819860511658591e-01;
    mgc_u64 i = mgc_bits(x);
    unsigned hx = (unsigned)(i >> 32);
    int k = 0;
    double hfsq, f, s, z, R, w, t1, t2, dk;
    if (hx < 0x00100000 || hx >> 31) {
        if (i << 1 == 0)
            return -1 / (x * x); /* log(+-0) = -inf */
        if (hx >> 31)
            return (x - x) / 0.0; /* log(negative) = nan */
        k -= 54;                  /* subnormal: scale up */
        x *= 0x1p54;
        i = mgc_bits(x);
        hx = (unsigned)(i >> 32);
    } else if (hx >= 0x7ff00000) {
        return x; /* inf or nan */
    } else if (hx == 0x3ff00000 && i << 32 == 0) {
        return 0;
    }
    /* reduce x into [sqrt(2)/2, sqrt(2)] */
    hx += 0x3ff00000 - 0x3fe6a09e;
    k += (int)(hx >> 20) - 0x3ff;
    hx = (hx & 0x000fffff) + 0x3fe6a09e;
    x = mgc_from_bits((mgc_u64)hx << 32 | (i & 0xffffffff));
    f = x - 1.0;
    hfsq = 0.5 * f * f;
    s = f / (2.0 + f);
    z = s * s;
    w = z * z;
    t1 = w * (Lg2 + w * (Lg4 + w * Lg6));
    t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
    R = t2 + t1;
    dk = k;
    return s * (hfsq + R) + dk * ln2_lo - hfsq + f + dk * ln2_hi;
}

/* exp(x) - 1 without cancellation near 0 (Kahan's trick: the rounding errors of u = exp(x)
 * cancel in (u - 1) * x / log(u)) */
static inline double mgc_expm1(double x)
{
    double u = mgc_exp(x);
    if (u == 1.0)
        return x;
    if (u - 1.0 == -1.0)
        return -1.0;
    if (u > 0x1p1023)
        return u;
    return (u - 1.0) * x / mgc_log(u);
}

static inline double mgc_tanh(double x)
{
    double a = x < 0 ? -x : x, t;
    if (x != x)
        return x;
    if (a > 20)
        t = 1;
    else if (a > 0.5493061443340549) { /* log(3) / 2 */
        t = mgc_expm1(2 * a);
        t = 1 - 2 / (t + 2);
    } else if (a >= 0x1p-1022) {
        t = mgc_expm1(-2 * a);
        t = -t / (t + 2);
    } else {
        t = a;
    }
    return x < 0 ? -t : t;
}

static inline double mgc_pow(double x, double y)
{
    if (y == (double)(long long)y && y >= -1024 && y <= 1024) { /* integer powers: multiply */
        long long n = (long long)y;
        mgc_u64 m = (mgc_u64)(n < 0 ? -n : n);
        double r = 1, b = x;
        for (; m; m >>= 1, b *= b)
            if (m & 1)
                r *= b;
        return n < 0 ? 1 / r : r;
    }
    if (y != y || x != x)
        return x == 1 ? 1 : x + y;
    if (x < 0)
        return NAN; /* a negative base to a non-integer power */
    if (x == 0)
        return y < 0 ? INFINITY : 0;
    return mgc_exp(y * mgc_log(x));
}

#endif

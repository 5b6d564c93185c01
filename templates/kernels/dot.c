/* ---- kernels for fused dot products -------------------------------------------------- */
/* Written unrolled, eight elements a step with eight independent accumulators (dot() and
 * sum_range(): sixteen, below): GCC and Clang turn each step into vector instructions without reassociating anything (no -ffast-math),
 * and TCC, which does not optimise, still gets short dependency chains and few loop branches.
 * Every compiler sums in the same order, so their results agree. */
#define STEP8(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)
/* Clang's loop vectoriser would turn an unrolled step into gathers and scatters across steps;
 * its SLP vectoriser, left to it, makes each step's eight statements two plain vectors. */
#if defined(__clang__)
#define UNROLLED _Pragma("clang loop vectorize(disable)")
#else
#define UNROLLED
#endif

/* Sixteen lanes, two accumulator chains of 512-bit vectors in float64 (one in float32): a dot's
 * multiply-adds wait for their lane's last one, so the dense MNIST step is bound by this chain's
 * latency (README, the roofline); sixteen double lanes measured 0.71-0.79x the epoch time of
 * eight. In float32, eight lanes would make GCC's loop vectoriser vectorise across steps, with
 * permutes, at half the speed; thirty-two did not go faster than sixteen. */
#define STEP16(op) STEP8(op) op(8) op(9) op(10) op(11) op(12) op(13) op(14) op(15)
#define LANES16(s) ((((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + \
                    (((s[8] + s[9]) + (s[10] + s[11])) + ((s[12] + s[13]) + (s[14] + s[15]))))
/* the same sum of the sixteen accumulators s0..s15 of dot() and sum_range() */
#define ACCUMULATORS16 ((((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + \
                        (((s8 + s9) + (s10 + s11)) + ((s12 + s13) + (s14 + s15))))
/* The last n & 15 elements into lanes 0..14, as if the loop went on, then the lanes' sum. Clang keeps an array of the
 * lanes indexed in a loop on the stack (it doubled the time of a convolution's many short dots),
 * so it gets a switch; GCC makes slower code of the switch (1.2x on the same convolution) than
 * of the loop. Both add the same products into the same lanes. */
#if defined(__clang__)
#define TAIL16(op)                                                                              \
    switch (n & 15) {                                                                           \
    case 15: op(14) /* fall through */                                                          \
    case 14: op(13) /* fall through */                                                          \
    case 13: op(12) /* fall through */                                                          \
    case 12: op(11) /* fall through */                                                          \
    case 11: op(10) /* fall through */                                                          \
    case 10: op(9) /* fall through */                                                           \
    case 9: op(8) /* fall through */                                                            \
    case 8: op(7) /* fall through */                                                            \
    case 7: op(6) /* fall through */                                                            \
    case 6: op(5) /* fall through */                                                            \
    case 5: op(4) /* fall through */                                                            \
    case 4: op(3) /* fall through */                                                            \
    case 3: op(2) /* fall through */                                                            \
    case 2: op(1) /* fall through */                                                            \
    case 1: op(0)                                                                               \
    }                                                                                           \
    return ACCUMULATORS16;
#else
#define TAIL16(op)                                                                              \
    real s[16] = {s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15};      \
    for (long i = 0; i < (n & 15); i++)                                                         \
        op##_LANE(i)                                                                            \
    return LANES16(s);
#endif

KERNEL real dot(const real *restrict a, const real *restrict b, long n)
{
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    real s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;
    const real *end = a + (n & ~15L);
#define DOT(l) s##l += a[l] * b[l];
#define DOT_LANE(i) s[i] += a[i] * b[i];
    UNROLLED
    for (; a < end; a += 16, b += 16) {
        STEP16(DOT)
    }
    TAIL16(DOT)
#undef DOT
#undef DOT_LANE
}

/* The sum of x[0..n), in sixteen lanes like dot() */
KERNEL real sum_range(const real *restrict x, long n)
{
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    real s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;
    const real *end = x + (n & ~15L);
#define SUM(l) s##l += x[l];
#define SUM_LANE(i) s[i] += x[i];
    UNROLLED
    for (; x < end; x += 16) {
        STEP16(SUM)
    }
    TAIL16(SUM)
#undef SUM
#undef SUM_LANE
}

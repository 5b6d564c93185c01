/* Shared by the plain-C references (bench/c/zoo_*.c and mnist_reference.c; bench/zoo_peers.py
 * and bench/peers.py put this text first). Double precision throughout; nothing needs -ffast-math. */
#include <math.h>

#define NACC 8 /* independent accumulators: gcc/clang vectorise the sum without reassociating one */

static double dot(const double *a, const double *b, int n)
{
    double acc[NACC] = {0};
    int i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int k = 0; k < NACC; k++)
            acc[k] += a[i + k] * b[i + k];
    for (; i < n; i++)
        acc[0] += a[i] * b[i];
    double s = 0;
    for (int k = 0; k < NACC; k++)
        s += acc[k];
    return s;
}

/* y += a * x */
static void axpy(double *y, double a, const double *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* Softmax cross-entropy of logits z against class `label`: returns the loss and fills
 * dz = softmax(z) - onehot(label), its gradient. */
static double softmax_cross_entropy(const double *z, int n, int label, double *dz)
{
    double m = z[0], sum = 0;
    for (int k = 1; k < n; k++)
        m = z[k] > m ? z[k] : m;
    for (int k = 0; k < n; k++)
        sum += dz[k] = exp(z[k] - m);
    for (int k = 0; k < n; k++)
        dz[k] /= sum;
    dz[label] -= 1;
    return log(sum) - (z[label] - m);
}

/* Hand-written C reference for the micrograd-c MNIST benchmark.
 *
 * MLP 784 -> 50 (ReLU) -> 10, softmax cross-entropy, SGD with batch size 1,
 * float64 throughout. Weights are row-major: W1[j*NIN + i], W2[k*NHID + j].
 *
 * Choices a tuned hand-written loop would make (none needs -ffast-math):
 *  - dot products (zoo_common.h, put before this file) use NACC independent accumulators, so gcc/clang vectorise
 *    them at -O2/-O3 without being allowed to reassociate a single sum;
 *  - the backward pass fuses the SGD update (p -= lr * grad) instead of
 *    materialising gradient arrays; dh is computed from W2 before W2 changes;
 *  - rows of W1 whose hidden unit is inactive (ReLU derivative 0) are skipped:
 *    their gradient is exactly zero, so the result is bit-for-bit unchanged.
 * Pixels are not assumed sparse: every input is multiplied in.
 *
 * Compiled with SPARSE_INPUTS defined (bench's second reference row), it does what a careful
 * C programmer does with MNIST's zeros: it lists each image's chunks of eight pixels that hold a
 * nonzero (one 64-bit test each), and when under three quarters do, the first layer's dots and
 * weight updates visit only those, eight values at a time (the terms left out are exact zeros).
 * The same trick as codegen's sparse_inputs.
 *
 * Compiled with INPUT_MAJOR defined (a third reference row, for scale), W1 is stored pixel by
 * pixel, W1[i*NHID + j] (the caller passes the transpose): each nonzero pixel adds its 50 weights
 * times its value to the hidden sums, and the update subtracts lr * x[i] * dh from that same
 * row, so a step reads and writes only the nonzero pixels' rows, in vector registers. It is what
 * a layout other than the model's parameter order buys; codegen keeps the model's order.
 */
#define NIN 784
#define NHID 50
#define NOUT 10

#ifdef SPARSE_INPUTS
#include <stdint.h>
#include <string.h>
#define CHUNK 8                 /* pixels tested at once: one 64-bit word of the image */
static int chunks[NIN / CHUNK]; /* the current image's chunks that hold a nonzero, by first pixel */
static int n_chunks;
#define SHORT_LIST (4 * n_chunks < 3 * (NIN / CHUNK))
/* A chunk's eight doubles as one vector (GCC/Clang): written as scalar loops over the chunk,
 * GCC 12 keeps them scalar here, which made this row 1.5x the dense reference. */
typedef double chunk_v __attribute__((vector_size(CHUNK * sizeof(double)), aligned(sizeof(double))));

static double dot_sparse(const double *w, const double *x)
{
    chunk_v s = {0};
    for (int k = 0; k < n_chunks; k++)
        s += *(const chunk_v *)(w + chunks[k]) * *(const chunk_v *)(x + chunks[k]);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void sgd_sparse(double *w, double g, const double *x)
{
    for (int k = 0; k < n_chunks; k++)
        *(chunk_v *)(w + chunks[k]) -= g * *(const chunk_v *)(x + chunks[k]);
}
#endif

/* Scales one image into x, then fills hidden activations h and logits z. */
static void forward(const double *W1, const double *b1, const double *W2,
                    const double *b2, const unsigned char *pixels, double scale,
                    double *x, double *h, double *z)
{
    for (int i = 0; i < NIN; i++)
        x[i] = pixels[i] * scale;
#ifdef SPARSE_INPUTS
    n_chunks = 0;
    for (int i = 0; i < NIN; i += CHUNK) {
        uint64_t word;
        memcpy(&word, pixels + i, sizeof word);
        chunks[n_chunks] = i;
        n_chunks += word != 0;
    }
    for (int j = 0; j < NHID; j++) {
        double a = b1[j] + (SHORT_LIST ? dot_sparse(W1 + j * NIN, x) : dot(W1 + j * NIN, x, NIN));
        h[j] = a < 0 ? 0 : a;
    }
#elif defined(INPUT_MAJOR)
    for (int j = 0; j < NHID; j++)
        h[j] = b1[j];
    for (int i = 0; i < NIN; i++) {
        if (x[i] == 0)
            continue;
        const double *w = W1 + i * NHID;
        for (int j = 0; j < NHID; j++)
            h[j] += x[i] * w[j];
    }
    for (int j = 0; j < NHID; j++)
        h[j] = h[j] < 0 ? 0 : h[j];
#else
    for (int j = 0; j < NHID; j++) {
        double a = b1[j] + dot(W1 + j * NIN, x, NIN);
        h[j] = a < 0 ? 0 : a;
    }
#endif
    for (int k = 0; k < NOUT; k++)
        z[k] = b2[k] + dot(W2 + k * NHID, h, NHID);
}

double mlp_train_epoch(double *W1, double *b1, double *W2, double *b2,
                       const unsigned char *X, const unsigned char *labels,
                       long n, double scale, double lr)
{
    double x[NIN], h[NHID], z[NOUT], dz[NOUT], dh[NHID];
    double total = 0;
    for (long s = 0; s < n; s++) {
        forward(W1, b1, W2, b2, X + s * NIN, scale, x, h, z);

        /* loss = logsumexp(z - max z) - (z - max z)[label];
           dloss/dz = softmax(z) - onehot(label). */
        int label = labels[s];
        double m = z[0], sum = 0;
        for (int k = 1; k < NOUT; k++)
            m = z[k] > m ? z[k] : m;
        for (int k = 0; k < NOUT; k++)
            sum += dz[k] = exp(z[k] - m);
        total += log(sum) - (z[label] - m);
        for (int k = 0; k < NOUT; k++)
            dz[k] /= sum;
        dz[label] -= 1;

        /* Back through layer 2 with the old W2, then update it. */
        for (int j = 0; j < NHID; j++) {
            double a = 0;
            for (int k = 0; k < NOUT; k++)
                a += W2[k * NHID + j] * dz[k];
            dh[j] = h[j] > 0 ? a : 0;
        }
        for (int k = 0; k < NOUT; k++) {
            double g = lr * dz[k];
            for (int j = 0; j < NHID; j++)
                W2[k * NHID + j] -= g * h[j];
            b2[k] -= g;
        }
#ifdef INPUT_MAJOR
        for (int j = 0; j < NHID; j++)
            b1[j] -= lr * dh[j];
        for (int i = 0; i < NIN; i++) {
            if (x[i] == 0)
                continue;
            double g = lr * x[i], *w = W1 + i * NHID;
            for (int j = 0; j < NHID; j++)
                w[j] -= g * dh[j];
        }
        continue;
#endif
        for (int j = 0; j < NHID; j++) {
            if (dh[j] == 0)
                continue;
            double g = lr * dh[j];
            double *w = W1 + j * NIN;
#ifdef SPARSE_INPUTS
            if (SHORT_LIST) {
                sgd_sparse(w, g, x);
                b1[j] -= g;
                continue;
            }
#endif
            for (int i = 0; i < NIN; i++)
                w[i] -= g * x[i];
            b1[j] -= g;
        }
    }
    return total / n;
}

long mlp_count_correct(const double *W1, const double *b1, const double *W2,
                       const double *b2, const unsigned char *X,
                       const unsigned char *labels, long n, double scale)
{
    double x[NIN], h[NHID], z[NOUT];
    long correct = 0;
    for (long s = 0; s < n; s++) {
        forward(W1, b1, W2, b2, X + s * NIN, scale, x, h, z);
        int best = 0; /* first maximum, like numpy.argmax */
        for (int k = 1; k < NOUT; k++)
            if (z[k] > z[best])
                best = k;
        correct += best == labels[s];
    }
    return correct;
}

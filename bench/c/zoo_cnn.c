/* Plain-C reference of the zoo's CNN: a 3x3 convolution with 4 filters (valid, ReLU) over a 28x28
 * image, then dense 2704 -> 10, softmax cross-entropy, SGD with batch size 1.
 *
 * Parameters, one flat array in the zoo's order: the filters [F][K][K], their biases [F], then 10
 * dense rows of 2704 weights (the feature maps flattened as [f][i][j]) and a bias. The update is
 * fused into backward, after the gradient has gone through the old dense weights. */

#define SIDE 28
#define K 3
#define F 4
#define OUT (SIDE - K + 1)
#define NH (F * OUT * OUT)
#define NCLS 10

double zoo_cnn_train(double *params, const unsigned char *X, const unsigned char *labels, long n,
                     double scale, double lr)
{
    static double x[SIDE * SIDE], h[NH], dh[NH], z[NCLS], dz[NCLS];
    double *cw = params, *cb = params + F * K * K, *dense = cb + F;
    double total = 0;
    for (long s = 0; s < n; s++) {
        const unsigned char *pixels = X + s * SIDE * SIDE;
        for (int i = 0; i < SIDE * SIDE; i++)
            x[i] = pixels[i] * scale;
        for (int f = 0; f < F; f++)
            for (int i = 0; i < OUT; i++)
                for (int j = 0; j < OUT; j++) {
                    double a = 0;
                    for (int ky = 0; ky < K; ky++)
                        for (int kx = 0; kx < K; kx++)
                            a += cw[(f * K + ky) * K + kx] * x[(i + ky) * SIDE + j + kx];
                    a += cb[f];
                    h[(f * OUT + i) * OUT + j] = a < 0 ? 0 : a;
                }
        for (int k = 0; k < NCLS; k++)
            z[k] = dot(dense + k * (NH + 1), h, NH) + dense[k * (NH + 1) + NH];
        total += softmax_cross_entropy(z, NCLS, labels[s], dz);

        for (int m = 0; m < NH; m++)
            dh[m] = 0;
        for (int k = 0; k < NCLS; k++)
            axpy(dh, dz[k], dense + k * (NH + 1), NH);
        for (int m = 0; m < NH; m++)
            if (!(h[m] > 0))
                dh[m] = 0;
        for (int k = 0; k < NCLS; k++) {
            axpy(dense + k * (NH + 1), -lr * dz[k], h, NH);
            dense[k * (NH + 1) + NH] -= lr * dz[k];
        }
        for (int f = 0; f < F; f++) {
            double gw[K * K] = {0}, gb = 0;
            for (int i = 0; i < OUT; i++)
                for (int j = 0; j < OUT; j++) {
                    double d = dh[(f * OUT + i) * OUT + j];
                    if (d == 0)
                        continue;
                    gb += d;
                    for (int ky = 0; ky < K; ky++)
                        for (int kx = 0; kx < K; kx++)
                            gw[ky * K + kx] += d * x[(i + ky) * SIDE + j + kx];
                }
            for (int q = 0; q < K * K; q++)
                cw[f * K * K + q] -= lr * gw[q];
            cb[f] -= lr * gb;
        }
    }
    return total / n;
}

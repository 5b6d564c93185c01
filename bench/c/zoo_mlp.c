/* Plain-C reference of the zoo's MLP(784, [..., 10]): ReLU hidden layers, softmax cross-entropy,
 * SGD with batch size 1 on uint8 images scaled on the fly.
 *
 * bench/zoo_peers.py defines the shape first: N_LAYERS, SIZES (N_LAYERS + 1 widths, input first)
 * and MAX_WIDTH. Parameters are one flat array in micrograd's order: layer by layer, one row per
 * neuron of its nin weights then its bias. Each step's update is fused into backward (p -= lr * g
 * as soon as g is known, after g has been propagated through the old weights), and neurons whose
 * gradient is 0 (ReLU off) are skipped: their update is exactly zero. */

static const int sizes[N_LAYERS + 1] = SIZES;

double zoo_mlp_train(double *params, const unsigned char *X, const unsigned char *labels, long n,
                     double scale, double lr)
{
    static double act[N_LAYERS + 1][MAX_WIDTH]; /* act[0]: the scaled image; act[l + 1]: layer l's output */
    static double delta[2][MAX_WIDTH];
    double *layer[N_LAYERS];
    double *p = params;
    for (int l = 0; l < N_LAYERS; l++) {
        layer[l] = p;
        p += sizes[l + 1] * (sizes[l] + 1);
    }
    double total = 0;
    for (long s = 0; s < n; s++) {
        const unsigned char *pixels = X + s * sizes[0];
        for (int i = 0; i < sizes[0]; i++)
            act[0][i] = pixels[i] * scale;
        for (int l = 0; l < N_LAYERS; l++) {
            int nin = sizes[l], nout = sizes[l + 1], hidden = l < N_LAYERS - 1;
            for (int j = 0; j < nout; j++) {
                const double *w = layer[l] + j * (nin + 1);
                double a = dot(w, act[l], nin) + w[nin];
                act[l + 1][j] = hidden && a < 0 ? 0 : a;
            }
        }
        double *d = delta[0], *below = delta[1];
        total += softmax_cross_entropy(act[N_LAYERS], sizes[N_LAYERS], labels[s], d);
        for (int l = N_LAYERS - 1; l >= 0; l--) {
            int nin = sizes[l], nout = sizes[l + 1];
            if (l > 0) { /* the gradient of the layer below, through the weights before this step's update */
                for (int i = 0; i < nin; i++)
                    below[i] = 0;
                for (int j = 0; j < nout; j++)
                    if (d[j] != 0)
                        axpy(below, d[j], layer[l] + j * (nin + 1), nin);
                for (int i = 0; i < nin; i++)
                    if (!(act[l][i] > 0))
                        below[i] = 0;
            }
            for (int j = 0; j < nout; j++) {
                if (d[j] == 0)
                    continue;
                double *w = layer[l] + j * (nin + 1);
                axpy(w, -lr * d[j], act[l], nin);
                w[nin] -= lr * d[j];
            }
            double *t = d;
            d = below;
            below = t;
        }
    }
    return total / n;
}

/* Plain-C reference of micrograd's demo: MLP(2, [16, 16, 1]) on NP two-moons points, the SVM
 * max-margin loss mean(relu(1 - y * score)) + alpha * sum(p * p), full-batch SGD with one learning
 * rate per step.
 *
 * Parameters, one flat array in micrograd's order: layer by layer, one row per neuron of its
 * weights then its bias. Gradients are accumulated over the batch, then applied. */

#define NP 100
#define NIN 2
#define H1 16
#define H2 16
#define W1_SIZE (H1 * (NIN + 1))
#define W2_SIZE (H2 * (H1 + 1))
#define NPARAMS (W1_SIZE + W2_SIZE + H2 + 1)

double zoo_moons_train(double *params, const double *X, const double *y, long n_steps, const double *lrs,
                       double alpha)
{
    static double h1[NP][H1], h2[NP][H2], score[NP], grad[NPARAMS];
    double *W1 = params, *W2 = params + W1_SIZE, *W3 = W2 + W2_SIZE;
    double *G1 = grad, *G2 = grad + W1_SIZE, *G3 = G2 + W2_SIZE;
    double total = 0;
    for (long step = 0; step < n_steps; step++) {
        double data_loss = 0, reg = 0;
        for (int s = 0; s < NP; s++) {
            const double *x = X + s * NIN;
            for (int j = 0; j < H1; j++) {
                const double *w = W1 + j * (NIN + 1);
                double a = w[0] * x[0] + w[1] * x[1] + w[NIN];
                h1[s][j] = a < 0 ? 0 : a;
            }
            for (int j = 0; j < H2; j++) {
                const double *w = W2 + j * (H1 + 1);
                double a = dot(w, h1[s], H1) + w[H1];
                h2[s][j] = a < 0 ? 0 : a;
            }
            score[s] = dot(W3, h2[s], H2) + W3[H2];
            double margin = 1 - y[s] * score[s];
            data_loss += margin > 0 ? margin : 0;
        }
        for (int q = 0; q < NPARAMS; q++) {
            reg += params[q] * params[q];
            grad[q] = 2 * alpha * params[q];
        }
        total += data_loss * (1.0 / NP) + alpha * reg;

        for (int s = 0; s < NP; s++) {
            if (!(1 - y[s] * score[s] > 0))
                continue; /* the hinge is flat here: no gradient from this point */
            double ds = -y[s] * (1.0 / NP), dh2[H2], dh1[H1] = {0};
            axpy(G3, ds, h2[s], H2);
            G3[H2] += ds;
            for (int j = 0; j < H2; j++)
                dh2[j] = h2[s][j] > 0 ? ds * W3[j] : 0;
            for (int j = 0; j < H2; j++) {
                if (dh2[j] == 0)
                    continue;
                axpy(G2 + j * (H1 + 1), dh2[j], h1[s], H1);
                G2[j * (H1 + 1) + H1] += dh2[j];
                axpy(dh1, dh2[j], W2 + j * (H1 + 1), H1);
            }
            const double *x = X + s * NIN;
            for (int j = 0; j < H1; j++) {
                if (!(h1[s][j] > 0))
                    continue;
                double *g = G1 + j * (NIN + 1);
                g[0] += dh1[j] * x[0];
                g[1] += dh1[j] * x[1];
                g[NIN] += dh1[j];
            }
        }
        for (int q = 0; q < NPARAMS; q++)
            params[q] -= lrs[step] * grad[q];
    }
    return total / n_steps;
}

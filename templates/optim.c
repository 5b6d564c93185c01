/* ---- optimizer steps ----------------------------------------------------------------------- */
/* One optimizer step over the parameter block, PyTorch's formulas in PyTorch's order of
 * operations (torch.optim.SGD with dampening 0, Adam, AdamW). codegen/optim.py chose the rule:
 * OPTIMIZER (0 SGD, 1 SGD with momentum, 2 Adam/AdamW) and its hyperparameters are #defines, so
 * the compiler folds away every branch that does not apply. `m` and `v` are the optimizer's
 * per-parameter state (momentum buffer; exp_avg and exp_avg_sq), `step` Adam's step count. */
static void optimizer_step(double *restrict p, const double *restrict g, double *restrict m,
                           double *restrict v, double *step, double lr)
{
    if (OPTIMIZER == 0) {
        for (long i = 0; i < N_PARAMS; i++) {
            double grad = WEIGHT_DECAY != 0.0 ? g[i] + WEIGHT_DECAY * p[i] : g[i];
            p[i] = p[i] + -lr * grad;
        }
    } else if (OPTIMIZER == 1) {
        /* PyTorch starts the buffer as a copy of the first gradient: momentum * 0 + grad is that. */
        for (long i = 0; i < N_PARAMS; i++) {
            double grad = WEIGHT_DECAY != 0.0 ? g[i] + WEIGHT_DECAY * p[i] : g[i];
            m[i] = m[i] * MOMENTUM + grad;
            grad = NESTEROV ? grad + MOMENTUM * m[i] : m[i];
            p[i] = p[i] + -lr * grad;
        }
    } else {
        double t = *step += 1.0;
        double step_size = lr / (1.0 - pow(BETA1, t));
        double correction2_sqrt = sqrt(1.0 - pow(BETA2, t));
        double decay = 1.0 - lr * WEIGHT_DECAY; /* AdamW's decoupled decay */
        const double weight = 1.0 - BETA1;      /* torch's lerp(m, grad, 1 - beta1) */
        for (long i = 0; i < N_PARAMS; i++) {
            double grad = g[i];
            if (DECOUPLED_DECAY)
                p[i] *= decay;
            else if (WEIGHT_DECAY != 0.0)
                grad = grad + WEIGHT_DECAY * p[i];
            m[i] = weight < 0.5 ? m[i] + weight * (grad - m[i]) : grad - (grad - m[i]) * (1.0 - weight);
            v[i] = v[i] * BETA2 + ((1.0 - BETA2) * grad) * grad;
            double denom = sqrt(v[i]) / correction2_sqrt + EPS;
            p[i] = p[i] + (-step_size * m[i]) / denom;
        }
    }
}

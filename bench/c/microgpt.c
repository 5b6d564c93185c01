/* microgpt.py by hand in C, as the hand ports write it: a scalar autograd tape rebuilt every step
 * (every add, multiply, pow, exp, log, relu and max of one document is a Value node in an arena),
 * a backward pass over it, microgpt's Adam with its linear learning-rate decay, then microgpt's
 * sampling. The benchmark's peer of the compiled port (bench/gpt_peers.py, docs/gpt.md).
 *
 *     gcc -O2 bench/c/microgpt.c -o microgpt -lm
 *     ./microgpt RUN.bin STEPS [LOSSES.bin]
 *
 * RUN.bin (written by bench/gpt_peers.py) holds what microgpt.py draws from Python's random module,
 * so that this program trains from the same numbers: the initial parameters (random.gauss, in
 * microgpt's order), the documents in their shuffled order, and the Mersenne Twister's state after
 * those draws, from which the sampling draws with random.choices's arithmetic (MT19937,
 * random.random's 53 bits, a bisection of the cumulative weights): the same names as the port.
 * Its layout, little-endian:
 *     "MICROGPT"; int32 vocab_size, n_embd, n_head, n_layer, block_size, n_docs, n_tokens,
 *     n_params, n_samples; float64 lr, beta1, beta2, eps, temperature; float64 params[n_params]
 *     (wte, wpe, lm_head, then per layer attn_wq, attn_wk, attn_wv, attn_wo, mlp_fc1, mlp_fc2, each
 *     row by row); int32 offsets[n_docs + 1] into int32 tokens[n_tokens] (a document: BOS, its
 *     characters, BOS); char chars[vocab_size - 1][4] (each token's character, UTF-8, NUL-padded);
 *     uint32 mt[624] and int32 index (random.getstate()'s).
 *
 * The ops are micrograd's: a - b is a + b * -1, a / b is a * b ** -1, sums start from their first
 * term (microgpt's start 0 adds exactly nothing), and a sum or product with a number is one node
 * (microgpt makes the number a leaf Value; the arithmetic is the same).
 * The arena is in creation order, which is a topological order (a node is made after its operands),
 * so backward is one reverse scan of it, as the fast hand ports do, instead of microgpt's
 * depth-first sort. Gradients reach a node in another order than the interpreter's, so losses
 * agree to rounding, not to the bit (5e-16 relative at most over microgpt's 1,000 steps). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    double data, grad, local[2]; /* local[i]: d data / d child[i] */
    int child[2], n_child;
} Value;

static Value *tape;
static int tape_len, tape_cap;

static int node(double data, int n_child, int a, double la, int b, double lb)
{
    if (tape_len == tape_cap) {
        tape_cap = tape_cap ? 2 * tape_cap : 1 << 16;
        tape = realloc(tape, (size_t)tape_cap * sizeof *tape);
        if (!tape) {
            fprintf(stderr, "microgpt: out of memory for the tape\n");
            exit(1);
        }
    }
    Value *v = &tape[tape_len];
    v->data = data;
    v->grad = 0;
    v->n_child = n_child;
    v->child[0] = a;
    v->local[0] = la;
    v->child[1] = b;
    v->local[1] = lb;
    return tape_len++;
}

#define D(i) (tape[i].data)

static int add(int a, int b) { return node(D(a) + D(b), 2, a, 1, b, 1); }
static int mul(int a, int b) { return node(D(a) * D(b), 2, a, D(b), b, D(a)); }
static int add_k(int a, double k) { return node(D(a) + k, 1, a, 1, 0, 0); }
static int mul_k(int a, double k) { return node(D(a) * k, 1, a, k, 0, 0); }
static int pow_k(int a, double k) { return node(pow(D(a), k), 1, a, k * pow(D(a), k - 1), 0, 0); }
static int vlog(int a) { return node(log(D(a)), 1, a, 1 / D(a), 0, 0); }

static int vexp(int a)
{
    double e = exp(D(a));
    return node(e, 1, a, e, 0, 0);
}

static int relu(int a)
{
    double out = D(a) < 0 ? 0 : D(a);
    return node(out, 1, a, out > 0, 0, 0);
}

static int vmax(int a, int b) /* ties pick a */
{
    return node(D(a) < D(b) ? D(b) : D(a), 2, a, D(a) >= D(b), b, D(a) < D(b));
}

static void backward(int root)
{
    tape[root].grad = 1;
    for (int i = root; i >= 0; i--) {
        const Value *v = &tape[i];
        for (int c = 0; c < v->n_child; c++)
            tape[v->child[c]].grad += v->local[c] * v->grad;
    }
}

/* ---- the model: parameters are the tape's first nodes, matrices row-major in microgpt's order */

static int vocab, n_embd, n_head, n_layer, block_size, n_params;
static int wte, wpe, lm_head, *attn_wq, *attn_wk, *attn_wv, *attn_wo, *mlp_fc1, *mlp_fc2;

static void linear(const int *x, int nin, int w, int nout, int *out)
{
    for (int o = 0; o < nout; o++) {
        int acc = mul(w + o * nin, x[0]);
        for (int i = 1; i < nin; i++)
            acc = add(acc, mul(w + o * nin + i, x[i]));
        out[o] = acc;
    }
}

static void softmax(const int *logits, int n, int *probs)
{
    int top = logits[0];
    for (int i = 1; i < n; i++)
        top = vmax(top, logits[i]);
    int total = -1;
    for (int i = 0; i < n; i++) {
        probs[i] = vexp(add(logits[i], mul_k(top, -1)));
        total = i ? add(total, probs[i]) : probs[i];
    }
    int inverse = pow_k(total, -1);
    for (int i = 0; i < n; i++)
        probs[i] = mul(probs[i], inverse);
}

static void rmsnorm(const int *x, int n, int *out)
{
    int ms = mul(x[0], x[0]);
    for (int i = 1; i < n; i++)
        ms = add(ms, mul(x[i], x[i]));
    int scale = pow_k(add_k(mul_k(ms, pow(n, -1)), 1e-5), -0.5);
    for (int i = 0; i < n; i++)
        out[i] = mul(x[i], scale);
}

/* The logits after `token` at position pos (into logits[vocab]); keys and values: [layer][pos][n_embd],
 * the cache of the positions before, to which this one's are written. */
static void gpt(int token, int pos, int *keys, int *values, int *logits)
{
    int E = n_embd, hd = n_embd / n_head;
    int x[E], residual[E], q[E], attn[E], h[4 * E], weights[block_size], scores[block_size];
    for (int i = 0; i < E; i++)
        x[i] = add(wte + token * E + i, wpe + pos * E + i);
    rmsnorm(x, E, x);
    for (int l = 0; l < n_layer; l++) {
        int *k = keys + ((size_t)l * block_size + pos) * E, *v = values + ((size_t)l * block_size + pos) * E;
        int *layer_keys = keys + (size_t)l * block_size * E, *layer_values = values + (size_t)l * block_size * E;
        memcpy(residual, x, sizeof x);
        rmsnorm(x, E, x);
        linear(x, E, attn_wq[l], E, q);
        linear(x, E, attn_wk[l], E, k);
        linear(x, E, attn_wv[l], E, v);
        for (int hh = 0; hh < n_head; hh++) {
            int hs = hh * hd;
            for (int t = 0; t <= pos; t++) {
                int dot = mul(q[hs], layer_keys[t * E + hs]);
                for (int j = 1; j < hd; j++)
                    dot = add(dot, mul(q[hs + j], layer_keys[t * E + hs + j]));
                scores[t] = mul_k(dot, pow(pow(hd, 0.5), -1));
            }
            softmax(scores, pos + 1, weights);
            for (int j = 0; j < hd; j++) {
                int acc = mul(weights[0], layer_values[hs + j]);
                for (int t = 1; t <= pos; t++)
                    acc = add(acc, mul(weights[t], layer_values[t * E + hs + j]));
                attn[hs + j] = acc;
            }
        }
        linear(attn, E, attn_wo[l], E, x);
        for (int i = 0; i < E; i++)
            x[i] = add(x[i], residual[i]);
        memcpy(residual, x, sizeof x);
        rmsnorm(x, E, x);
        linear(x, E, mlp_fc1[l], 4 * E, h);
        for (int i = 0; i < 4 * E; i++)
            h[i] = relu(h[i]);
        linear(h, 4 * E, mlp_fc2[l], E, x);
        for (int i = 0; i < E; i++)
            x[i] = add(x[i], residual[i]);
    }
    linear(x, E, lm_head, vocab, logits);
}

/* ---- Python's random: MT19937 from the state random.getstate() gives, random(), choices() */

static uint32_t mt[624];
static int mt_index;

static uint32_t mt_next(void)
{
    if (mt_index >= 624) {
        for (int i = 0; i < 624; i++) {
            uint32_t y = (mt[i] & 0x80000000u) | (mt[(i + 1) % 624] & 0x7fffffffu);
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
        }
        mt_index = 0;
    }
    uint32_t y = mt[mt_index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

static double random_double(void) /* random.random() */
{
    uint32_t a = mt_next() >> 5, b = mt_next() >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* random.choices(range(n), weights)[0]: the cumulative weights' bisection (bisect_right, hi n - 1) */
static int choice(const double *weights, int n)
{
    double cum[n];
    cum[0] = weights[0];
    for (int i = 1; i < n; i++)
        cum[i] = cum[i - 1] + weights[i];
    double x = random_double() * cum[n - 1];
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x < cum[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- the run */

static void read_exactly(FILE *f, void *buf, size_t size, size_t n, const char *what)
{
    if (fread(buf, size, n, f) != n) {
        fprintf(stderr, "microgpt: the run file ends before its %s\n", what);
        exit(1);
    }
}

static double seconds(clockid_t clock) /* CLOCK_MONOTONIC: wall time; CLOCK_PROCESS_CPUTIME_ID: CPU time */
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s RUN.bin STEPS [LOSSES.bin]\n", argv[0]);
        return 2;
    }
    int steps = atoi(argv[2]);
    FILE *f = fopen(argv[1], "rb");
    if (!f || steps < 1) {
        fprintf(stderr, "microgpt: %s\n", !f ? "cannot open the run file" : "STEPS must be at least 1");
        return 2;
    }
    char magic[8];
    int32_t header[9];
    double hyper[5];
    read_exactly(f, magic, 1, 8, "header");
    read_exactly(f, header, sizeof header[0], 9, "header");
    read_exactly(f, hyper, sizeof hyper[0], 5, "header");
    if (memcmp(magic, "MICROGPT", 8)) {
        fprintf(stderr, "microgpt: not a run file (bench/gpt_peers.py writes them)\n");
        return 2;
    }
    vocab = header[0], n_embd = header[1], n_head = header[2], n_layer = header[3], block_size = header[4];
    int n_docs = header[5], n_tokens = header[6], n_samples = header[8];
    double lr = hyper[0], beta1 = hyper[1], beta2 = hyper[2], eps = hyper[3], temperature = hyper[4];
    int E = n_embd;

    /* the parameters' places, in microgpt's order: wte, wpe, lm_head, then each layer's six */
    int at = 0;
    wte = at, at += vocab * E;
    wpe = at, at += block_size * E;
    lm_head = at, at += vocab * E;
    int *layers = malloc(6 * sizeof(int) * n_layer);
    attn_wq = layers, attn_wk = layers + n_layer, attn_wv = layers + 2 * n_layer, attn_wo = layers + 3 * n_layer;
    mlp_fc1 = layers + 4 * n_layer, mlp_fc2 = layers + 5 * n_layer;
    for (int l = 0; l < n_layer; l++) {
        attn_wq[l] = at, at += E * E;
        attn_wk[l] = at, at += E * E;
        attn_wv[l] = at, at += E * E;
        attn_wo[l] = at, at += E * E;
        mlp_fc1[l] = at, at += 4 * E * E;
        mlp_fc2[l] = at, at += 4 * E * E;
    }
    n_params = at;
    if (header[7] != n_params || E % n_head) {
        fprintf(stderr, "microgpt: the run file's shape is inconsistent (%d params for %d)\n", header[7], n_params);
        return 2;
    }
    double *init = malloc(sizeof(double) * n_params);
    int32_t *offsets = malloc(sizeof(int32_t) * (n_docs + 1)), *tokens = malloc(sizeof(int32_t) * n_tokens);
    read_exactly(f, init, sizeof init[0], n_params, "parameters");
    read_exactly(f, offsets, sizeof offsets[0], n_docs + 1, "documents");
    read_exactly(f, tokens, sizeof tokens[0], n_tokens, "tokens");
    char *chars = calloc(vocab - 1, 5); /* token i's character at chars + 5 * i, NUL-terminated */
    for (int i = 0; i < vocab - 1; i++)
        read_exactly(f, chars + 5 * i, 1, 4, "characters");
    read_exactly(f, mt, sizeof mt[0], 624, "random state");
    read_exactly(f, &mt_index, sizeof mt_index, 1, "random state");
    fclose(f);
    for (int i = 0; i < n_params; i++)
        node(init[i], 0, 0, 0, 0, 0);
    FILE *losses_out = argc == 4 ? fopen(argv[3], "wb") : NULL;
    if (argc == 4 && !losses_out) {
        fprintf(stderr, "microgpt: cannot write %s\n", argv[3]);
        return 2;
    }
    printf("num docs: %d\nvocab size: %d\nnum params: %d\n", n_docs, vocab, n_params);

    double *m = calloc(n_params, sizeof(double)), *v = calloc(n_params, sizeof(double));
    int *keys = malloc(sizeof(int) * n_layer * block_size * E);
    int *values = malloc(sizeof(int) * n_layer * block_size * E);
    int logits[vocab], probs[vocab];
    double t0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (int step = 0; step < steps; step++) {
        const int32_t *doc = tokens + offsets[step % n_docs];
        int len = offsets[step % n_docs + 1] - offsets[step % n_docs];
        int n = len - 1 < block_size ? len - 1 : block_size;
        tape_len = n_params;
        int loss = -1;
        for (int pos = 0; pos < n; pos++) {
            gpt(doc[pos], pos, keys, values, logits);
            softmax(logits, vocab, probs);
            int loss_t = mul_k(vlog(probs[doc[pos + 1]]), -1);
            loss = pos ? add(loss, loss_t) : loss_t;
        }
        loss = mul_k(loss, 1.0 / n);
        backward(loss);
        double lr_t = lr * (1 - (double)step / steps);
        for (int i = 0; i < n_params; i++) {
            double g = tape[i].grad;
            m[i] = beta1 * m[i] + (1 - beta1) * g;
            v[i] = beta2 * v[i] + (1 - beta2) * pow(g, 2);
            double m_hat = m[i] / (1 - pow(beta1, step + 1)), v_hat = v[i] / (1 - pow(beta2, step + 1));
            tape[i].data -= lr_t * m_hat / (pow(v_hat, 0.5) + eps);
            tape[i].grad = 0;
        }
        printf("step %4d / %4d | loss %.4f\n", step + 1, steps, D(loss));
        if (losses_out)
            fwrite(&D(loss), sizeof(double), 1, losses_out);
    }
    double train_s = seconds(CLOCK_MONOTONIC) - t0, train_cpu_s = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    if (losses_out)
        fclose(losses_out);

    printf("--- inference (new, hallucinated names) ---\n");
    double t1 = seconds(CLOCK_MONOTONIC);
    double scaled[vocab], exps[vocab];
    for (int s = 0; s < n_samples; s++) {
        printf("sample %2d: ", s + 1);
        int token = vocab - 1; /* BOS */
        tape_len = n_params;    /* a new tape, on which the key and value cache grows */
        for (int pos = 0; pos < block_size; pos++) {
            gpt(token, pos, keys, values, logits);
            double top = -INFINITY, total = 0;
            for (int i = 0; i < vocab; i++) {
                scaled[i] = D(logits[i]) * pow(temperature, -1);
                top = scaled[i] > top ? scaled[i] : top;
            }
            for (int i = 0; i < vocab; i++)
                total += exps[i] = exp(scaled[i] + -top);
            double inverse = pow(total, -1);
            for (int i = 0; i < vocab; i++)
                exps[i] *= inverse;
            token = choice(exps, vocab);
            if (token == vocab - 1)
                break;
            fputs(chars + 5 * token, stdout);
        }
        printf("\n");
    }
    printf("time: train %.6f s, %.3f us a step (CPU %.6f s), sampling %.6f s\n", train_s, train_s / steps * 1e6,
           train_cpu_s, seconds(CLOCK_MONOTONIC) - t1);
    return 0;
}

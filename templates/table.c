/* The table form's loops (codegen/write/table.py): a model's single statements as rows of (op,
 * operand slots, result slot), run here, in the module runtime, compiled once per compiler, flags
 * and dtype; the model's unit holds only the rows (data: TABLE_TEXT, base64 of int32 words) and
 * calls table_forward and table_backward between its compiled groups. A segment of rows is
 * [number of runs], then each run [kind, count, rows...]; a run is one loop without a switch per
 * row. The `case`s of the op table's ops are generated from its formulas (table.py's
 * runtime_cases), rendered as the emitter renders them, so that a row computes what the
 * straight-line statement computes, bit for bit. */
#define TABLE_DOT @TABLE_DOT@
#define TABLE_DOT_MAX_PARTS @TABLE_DOT_MAX_PARTS@

/* TABLE_TEXT's words (little-endian int32, base64), decoded into a new array; NULL when out of
 * memory. Made once per loaded model, when its first module loads, and kept (its rows never change). */
static int32_t *table_decode(const char *text, long n_words)
{
    static signed char value[256];
    for (int c = 0; c < 256; c++)
        value[c] = -1;
    const char *letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; i++)
        value[(unsigned char)letters[i]] = (signed char)i;
    int32_t *words = malloc((size_t)(n_words ? n_words : 1) * sizeof *words);
    if (!words)
        return NULL;
    unsigned char *bytes = (unsigned char *)words;
    const long n_bytes = n_words * 4;
    long at = 0;
    uint32_t bits = 0;
    int held = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c && at < n_bytes; c++) {
        if (value[*c] < 0) /* '=' */
            continue;
        bits = bits << 6 | (uint32_t)value[*c];
        held += 6;
        if (held >= 8) {
            held -= 8;
            bytes[at++] = (unsigned char)(bits >> held);
        }
    }
    for (long i = 0; i < n_words; i++) { /* (little-endian on any machine) */
        const unsigned char *b = bytes + 4 * i;
        words[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    }
    return words;
}

/* A dot row's value: its parts (terms, then products) summed in loops.tree_sum's tree, pairwise
 * ((p0 + p1) + (p2 + p3)) + ...; returns the next row. */
static inline const int32_t *table_dot(const int32_t *restrict w, real *restrict d)
{
    const long nt = w[0], np = w[1];
    const int32_t *t = w + 2, *a = t + nt, *b = a + np;
    real p[TABLE_DOT_MAX_PARTS];
    long n = 0;
    for (long k = 0; k < nt; k++)
        p[n++] = d[t[k]];
    for (long k = 0; k < np; k++)
        p[n++] = d[a[k]] * d[b[k]];
    while (n > 1) {
        long m = 0;
        for (long i = 0; i + 1 < n; i += 2)
            p[m++] = p[i] + p[i + 1];
        if (n & 1)
            p[m++] = p[n - 1];
        n = m;
    }
    d[b[np]] = p[0];
    return b + np + 1;
}

/* A dot row's gradients, in the straight-line C's order: the terms, then the second factors,
 * then the first; returns the next row. */
static inline const int32_t *table_dot_backward(const int32_t *restrict w, const real *restrict d, real *restrict g)
{
    const long nt = w[0], np = w[1];
    const int32_t *t = w + 2, *a = t + nt, *b = a + np, *gb = b + np + 1, *ga = gb + np;
    const real go = g[b[np]];
    for (long k = 0; k < nt; k++)
        g[t[k]] += go;
    for (long k = 0; k < np; k++)
        g[gb[k]] += go * d[a[k]];
    for (long k = 0; k < np; k++)
        g[ga[k]] += go * d[b[k]];
    return ga + np;
}

/* One segment's rows forward: each run's values. */
SHARED void table_forward(const int32_t *restrict w, real *restrict d)
{
    for (long runs = *w++; runs > 0; runs--) {
        const long kind = w[0], count = w[1];
        w += 2;
        switch (kind) {
@TABLE_FORWARD@
        case TABLE_DOT:
            for (long r = 0; r < count; r++)
                w = table_dot(w, d);
            break;
        }
    }
}

/* One segment's rows backward: each run's gradient contributions. */
SHARED void table_backward(const int32_t *restrict w, const real *restrict d, real *restrict g)
{
    for (long runs = *w++; runs > 0; runs--) {
        const long kind = w[0], count = w[1];
        w += 2;
        switch (kind) {
@TABLE_BACKWARD@
        case TABLE_DOT:
            for (long r = 0; r < count; r++)
                w = table_dot_backward(w, d, g);
            break;
        }
    }
}

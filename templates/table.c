/* The table form's loops (codegen/write/table.py): a model's single statements as rows of (op,
 * operand slots, result slot), run here, in the module runtime, compiled once per compiler, flags
 * and dtype; the model's unit holds only the rows (data: TABLE_TEXT, base64 of int32 words) and
 * calls table_forward and table_backward between its compiled groups. A segment of rows is
 * [number of runs], then each run [kind, count, rows...]; a run is one loop without a switch per row.
 * The kinds' loops are generated (table.py's runtime_cases) from the op table's formulas, rendered as
 * the emitter renders them, so that a row computes what the straight-line statement computes,
 * bit for bit. */

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

/* The next run: a jump to its kind's loop (labels as values, which TCC, GCC and Clang take): an
 * indirect jump at the end of each kind's loop, whose target the processor predicts from the kind
 * that ran, where one switch for every run mispredicted more (a random graph's step, gcc -O2:
 * 0.97x the time at 5,000 and 20,000 Values, 0.98x at 100,000; tcc 0.97x; clang 1.00x); done
 * after the last run, or at a kind the runtime does not know. */
#define NEXT_RUN do { \
        if (runs-- == 0) \
            return; \
        const unsigned long kind_ = (unsigned long)w[0]; \
        count = w[1]; \
        w += 2; \
        if (kind_ >= sizeof at / sizeof at[0]) \
            return; \
        goto *at[kind_]; \
    } while (0)

/* One segment's rows forward: each run's values. */
SHARED void table_forward(const int32_t *restrict w, real *restrict d)
{
    static const void *const at[] = {@TABLE_FORWARD_LABELS@};
    long runs = *w++, count;
    NEXT_RUN;
@TABLE_FORWARD@
unknown:
    return;
}

/* One segment's rows backward: its coefficient rows' local derivatives (into d), then its edges' contributions. */
SHARED void table_backward(const int32_t *restrict w, real *restrict d, real *restrict g)
{
    static const void *const at[] = {@TABLE_BACKWARD_LABELS@};
    long runs = *w++, count;
    NEXT_RUN;
@TABLE_BACKWARD@
unknown:
    return;
}

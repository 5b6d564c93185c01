/* Index inputs (a gather's index, e.g. a token: the graph's INDEX_INPUTS, {input position, n}) must
 * hold an integer from -n to n - 1, as Python's indexing takes them and the module checks them
 * (templates/samples.c): checked before anything is set or computed, so that no gather reads
 * outside the values it picks among. Models without gathers have none. */
#ifndef N_INDEX_INPUTS
#define N_INDEX_INPUTS 0
static const long INDEX_INPUTS[1][2] = {{0, 0}};
#endif

long @NAME@_index_size(int position)
{
    for (int k = 0; k < N_INDEX_INPUTS; k++)
        if (INDEX_INPUTS[k][0] == position)
            return INDEX_INPUTS[k][1];
    return 0;
}

/* 0 if every index input of `in` is good; else 1 + the position of the first bad one */
static int check_index_inputs(const double *in)
{
    for (int k = 0; k < N_INDEX_INPUTS; k++) {
        double x = in[INDEX_INPUTS[k][0]], n = (double)INDEX_INPUTS[k][1];
        /* (long)x only once x is known in range (NaN fails both comparisons) */
        if (!(x >= -n && x < n) || x != (double)(long)x)
            return (int)INDEX_INPUTS[k][0] + 1;
    }
    return 0;
}

/* The command's message for a row whose index input is bad (1 + its position, as @NAME@_predict and
 * @NAME@_set_input return it): the module's IndexError, as one line */
static int bad_index(const char *program, long row, const double *in, int bad)
{
    int position = bad - 1;
    long n = @NAME@_index_size(position);
    fprintf(stderr, "%s: row %ld: input %d is an index into %ld values, so it must hold an integer from %ld to %ld, "
            "not %.17g\n", program, row, position, n, -n, n - 1, in[position]);
    return 1;
}

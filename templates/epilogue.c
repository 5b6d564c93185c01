EPILOGUE void @NAME@(const real *restrict x, real *restrict y, const real *restrict a,
                    const real *restrict o, long count)
{
    (void)a;
    (void)o;
@BODY@
}

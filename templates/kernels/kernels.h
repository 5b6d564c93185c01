/* The kernel table: every function that generated code calls, one prototype each, in the form
 * it is defined (templates/prelude.c and templates/kernels/). codegen/write/kernels.py reads this file
 * and renders each call from it by parameter name, so a call with a missing, extra or misspelt
 * argument is a Python error, not a C one; tests/test_kernel_table.py compiles it against the
 * definitions (a changed signature must change here too) and checks that the emitters write no
 * call of their own. Generated C does not include this file: its text stays as it was, but for
 * the module's units' declarations of the kernels the runtime's unit of products defines
 * (kernels.py's PRODUCTS: written from the prototypes here, PRODUCT_DECLARATIONS).
 * To add a kernel: its prototype here, its definition in a template (README, "How to add a
 * kernel"). One prototype a line group, `name(` on its first line; no function pointer
 * parameters (a typedef, as Epilogue). */

/* dot products and sums (templates/kernels/dot.c, axpy.c, sparse.c, rows.c) */
KERNEL real dot(const real *restrict a, const real *restrict b, long n);
KERNEL real sum_range(const real *restrict x, long n);
KERNEL real dot_offsets(const real *a, const int32_t *oa, const real *b, const int32_t *ob, long n);
KERNEL real sum_offsets(const real *x, const int32_t *ox, long n);
KERNEL void dot_offsets_lanes(real *restrict out, const real *a, const int32_t *oa, const real *b,
                              const int32_t *ob, long n, long lanes);
KERNEL void dot_offsets_lanes_rows(real *out, long out_step, const real *a, const int32_t *oa, const real *b,
                                   long b_step, const int32_t *ob, long n, long lanes, long rows);
KERNEL real dot_nz(const real *restrict a, const real *restrict x, long n, const int32_t *restrict nz);
KERNEL void dot_rows(const real *restrict a, const real *restrict b, long b_step, long n, long m,
                     real *restrict out, long out_step);

/* updates (templates/kernels/axpy.c, sparse.c) */
KERNEL void axpy(real *restrict y, real alpha, const real *restrict x, long n);
KERNEL void sgd_axpy(real *restrict w, real lr, real alpha, const real *restrict x, long n);
KERNEL void add_range(real *restrict y, real alpha, long n);
KERNEL void add_offsets(real *y, const int32_t *oy, real alpha, long n);
KERNEL void add_offsets_lanes(real *y, const int32_t *oy, const real *alpha, long n, long lanes);
KERNEL void clear_rows(real *y, long y_j, long J, long S);
KERNEL void axpy_offsets(real *restrict y, const int32_t *oy, real alpha, const real *restrict x,
                         const int32_t *ox, long n);
KERNEL void axpy_offsets_lanes(real *restrict y, const int32_t *oy, const real *alpha, const real *restrict x,
                               const int32_t *ox, long n, long lanes);
KERNEL void axpy_offsets_lanes_rows(real *restrict y, const int32_t *oy, long y_step, const real *alpha,
                                    long alpha_step, const real *restrict x, const int32_t *ox, long x_step,
                                    long n, long lanes, long rows);
KERNEL void held_sums_lanes(real *restrict y, long y_row, real *alpha, const int32_t *oa, int clear,
                            const real *restrict x, long x_row, long x_step, const real *active, long active_step,
                            long first, long n, long lanes, long rows);
KERNEL void sum_offsets_lanes(real *restrict out, const real *x, const int32_t *ox, long n, long lanes);
KERNEL void sgd_axpy_offsets(real *w, const int32_t *ow, real lr, real alpha, const real *x,
                             const int32_t *ox, long n);
KERNEL void axpy_nz(real *restrict y, real alpha, const real *restrict x, long n, const int32_t *restrict nz);
KERNEL void sgd_axpy_nz(real *restrict w, real lr, real alpha, const real *restrict x, long n,
                        const int32_t *restrict nz);
KERNEL void sgd_row(real *restrict w, real lr, const real *restrict g, long n);
KERNEL void sgd_rank1_row(real *restrict w, real lr, real alpha, const real *restrict x, long n);

/* a layer: over sparse inputs (templates/kernels/sparse.c), over a batch (gemm.c) */
KERNEL void matvec(real *restrict out, long out_j, const real *restrict bias, long bias_j,
                   const real *restrict w, long w_j, const real *restrict x, long n, long J,
                   const int32_t *restrict nz);
KERNEL void matmul_set(real *restrict out, long out_j, const real *restrict bias, long bias_j,
                       const real *restrict w, long w_j, long w_k, const real *restrict x, long x_k,
                       long J, long S, long K, const int32_t *rows, Epilogue epilogue, real *y, long y_j, int relu);
KERNEL void matmul_acc(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                       const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                       long y_k, const real *a, long a_k, const real *o, long o_k, int overwrite);
KERNEL void matmul_nt(real *restrict out, long out_j, const real *restrict go, long go_j,
                      const real *restrict x, long x_k, long J, long K, long S, const int32_t *rows, real *w,
                      real rate, real *restrict bias, long bias_j);
KERNEL void matmul_acc_nt(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                          const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                          long y_k, const real *a, long a_k, const real *o, long o_k, int overwrite,
                          real *restrict grad, long grad_j, const real *restrict x, long x_k, const int32_t *rows,
                          real *step, real rate, real *restrict bias, long bias_j);

/* a convolution over a batch (templates/kernels/conv.c) */
KERNEL void conv_set(real *restrict out, long out_f, long out_p, long out_q, const real *restrict bias,
                     long bias_f, const real *restrict w, long w_f, long w_k, const real *restrict x, long x_p,
                     long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K, Epilogue epilogue,
                     real *y, long y_f, long y_p, long y_q);
KERNEL void conv_nt(real *restrict out, long out_f, long out_k, real *restrict bias, long bias_f,
                    const real *restrict go, long go_f, long go_p, long go_q, const real *restrict x, long x_p,
                    long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K);
KERNEL void conv_acc(real *restrict out, long out_p, long out_q, const int32_t *offsets, const real *restrict w,
                     long w_f, long w_k, const real *restrict go, long go_f, long go_p, long go_q, long F, long P,
                     long Q, long S, long K);

/* a row's exp, tanh, sigmoid (templates/kernels/exp.c) */
KERNEL void exp_range(real *y, const real *x, long n);
KERNEL void tanh_range(real *y, const real *x, long n);
KERNEL void sigmoid_range(real *y, const real *x, long n);
/* the same over the table form's rows [operand, result] (d[rows[2i + 1]] = f(d[rows[2i]])) */
KERNEL void exp_gather(real *d, const int32_t *rows, long n);
KERNEL void tanh_gather(real *d, const int32_t *rows, long n);
KERNEL void sigmoid_gather(real *d, const int32_t *rows, long n);

/* the sparse inputs' lists (templates/kernels/sparse.c, gemm.c) */
static void scan_range(const real *restrict x, long n, int32_t *restrict nz);
KERNEL void scan_rows(const real *restrict x, long stride, long nb, long n, int32_t *restrict list);

/* a family's short lists that grow (templates/prelude.c) */
static inline real dot_short(const real *a, const real *b, long n);
static inline real sum_short(const real *x, long n);
static inline void axpy_short(real *restrict y, real alpha, const real *restrict x, long n);
static inline void add_short(real *y, real alpha, long n);

/* the ops that select (templates/prelude.c): a gather's index, a maximum's position */
static inline long gather_index(double x, long n);
static inline long largest_at(const real *x, long step, long n);
static inline long largest_in(const real *x, const int32_t *offsets, long n);
/* and a maximum over a batch's lanes (templates/kernels/axpy.c): its values, its gradient */
KERNEL void largest_lanes(real *restrict out, const real *x, long step, long n, long lanes);
KERNEL void add_to_largest_lanes(real *g, const real *x, long step, long n, const real *go, long lanes);

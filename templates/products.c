/* The module runtime's matrix products (templates/kernels/gemm.c, conv.c: RUNTIME_PRODUCTS 2),
 * a unit of their own beside templates/runtime.c (which declares them, as a model's units do):
 * the two compile on two cores at once, the first time a compiler and flags meet them (gcc -O2:
 * 6.8 s of CPU for both in one unit, 4.1 s of it the products'). codegen/write/emit.py's
 * runtime_sources puts the element type, then templates/prelude.c, at its PRELUDE placeholder. */
@PRELUDE@

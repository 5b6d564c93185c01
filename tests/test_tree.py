"""codegen/write/tree.py: the statement tree's one renderer, in the generated C's layout."""
import pytest

from codegen.write.kernels import call
from codegen.write.tree import (Assign, Block, Copy, Declare, Function, If, Invoke, ReadGradient, Seq, Unused, nest,
                                prototype, render)


def test_a_loop_nest_indents_only_its_innermost_body():
    loop = nest((2, 3), [Assign("d[4 + 3 * i0 + i1]", "d[i1]"), call("axpy", y="g", alpha="go", x="d", n=3)],
                independent=True)
    assert render(loop) == ("for (long i0 = 0; i0 < 2; i0++)\n"
                            "    INDEPENDENT for (long i1 = 0; i1 < 3; i1++) {\n"
                            "        d[4 + 3 * i0 + i1] = d[i1];\n"
                            "        axpy(g, go, d, 3);\n"
                            "    }")


def test_blocks_keep_their_statements_at_their_own_indentation_or_on_one_line():
    guarded = If("d[9] > 2", Block((Declare(("sum0", "sum1")), Seq((Assign("g[1]", "sum0", "+="),
                                                                      Copy("snap + 0", "d + 5", 4))))))
    assert render(guarded) == ("if (d[9] > 2) {\n    real sum0 = 0, sum1 = 0;\n    g[1] += sum0;\n"
                               "    memcpy(snap + 0, d + 5, 4 * sizeof(real));\n    }")
    inline = Block((ReadGradient("g[3]"), If("go != 0", Block((Assign("g[1]", "go", "+="),))),
                    If("stamp[0] == gen", Assign("g[2]", "go", "+="), If("go != 0", Block((), inline=True)))),
                   inline=True)
    assert render(inline) == ("{ const real go = g[3]; if (go != 0) { g[1] += go; } "
                              "if (stamp[0] == gen) g[2] += go; else if (go != 0) { } }")


def test_functions_hold_statements_one_per_line_or_on_their_line():
    chunk = Function("backward_body_0", ("real *restrict d", "real *restrict g"),
                     (nest((2,), [Assign("g[i0]", "d[i0]", "+=")]), Invoke("table_backward", ("table + 4", "d", "g"))),
                     "CHUNK void")
    assert render(chunk) == ("CHUNK void backward_body_0(real *restrict d, real *restrict g)\n{\n"
                             "    for (long i0 = 0; i0 < 2; i0++) {\n        g[i0] += d[i0];\n    }\n"
                             "    table_backward(table + 4, d, g);\n}")
    assert prototype(chunk) == "CHUNK void backward_body_0(real *restrict d, real *restrict g);"
    assert render(Function("scan", ("real *d", "long nb"), (Unused(("d", "nb")),), inline=True)) == \
        "static void scan(real *d, long nb) { (void)d; (void)nb; }"


def test_c_text_is_not_a_statement():
    with pytest.raises(TypeError, match="not a statement"):
        render("d[0] = 1;")
    with pytest.raises(TypeError, match="not a statement"):
        render(nest((2,), ["d[0] = 1;"]))


def test_line_count_is_the_rendered_lines():
    """emit cuts functions by it: one for a one-line statement, the rendering's lines otherwise."""
    from codegen.write.tree import line_count
    statements = [Assign("d[1]", "d[0] * 2"), call("axpy", y="g", alpha="go", x="d", n="4"), Copy("g", "d", "4"),
                  nest((3, 4), (Assign("d[i0]", "d[i1]", "+="),)), If("go != 0", Block((Assign("x", "1"),)))]
    for statement in statements:
        assert line_count(statement) == render(statement).count("\n") + 1
    assert line_count(statements[3]) > 1

"""What a node of the lowered graph is, in one place. Kind: a Node's kind (codegen/lower/ir.py),
a leaf's (a constant, a parameter, an input) or a computed node's (an op of the op table, or a
dot: a sum of terms and products). Role: a leaf's kind as the int8 that the arrays of graph.py hold
(Graph.role); LEAF_KINDS turns one into the other. A Kind is its name's text as well
(Kind.OP == "op", and hashes alike), which the table form and the tests may still compare with.
"""

import enum


class Role(enum.IntEnum):
    CONST = 0
    PARAM = 1
    INPUT = 2


class Kind(str, enum.Enum):
    CONST = "const"
    PARAM = "param"
    INPUT = "input"
    OP = "op"
    DOT = "dot"

    __str__ = str.__str__
    __format__ = str.__format__


# The kinds by name, as the lowering's hot loops read them (an Enum's attribute, Kind.OP, is a
# slower lookup); COMPUTED: an op's or a dot's (not a leaf's); LEAF_KINDS: a leaf's Kind by Role.
CONST, PARAM, INPUT, OP, DOT = Kind
COMPUTED = frozenset((OP, DOT))
LEAF_KINDS = (CONST, PARAM, INPUT)

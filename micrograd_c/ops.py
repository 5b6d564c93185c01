"""The op table: every op's value and local derivative, written once.

Each formula is an expression in the small syntax that Python and C share (arithmetic, comparisons,
calls to the primitives below) with placeholders: ``{a}``/``{b}`` the argument values, ``{out}`` the
op's own value, ``{k}`` the op's constant attribute (the exponent of ``**``). The interpreter turns
a formula into a Python function once, at import; the C emitter substitutes slots into the same
string. So the interpreter and the compiled code evaluate the very same formula. A row that names
a ``method`` is also that method of Value (engine.py's op_method makes it: ``x.relu()``).

Primitives: ``exp``, ``log``, ``tanh``, ``pow`` (the C library's; Python's math module calls the
same libm), ``powk`` (``**`` by a number: the exponents micrograd's own code uses written out, C's
in templates/prelude.c), ``where(cond, x, y)`` (C: a ``?:`` macro in templates/prelude.c) and
``positive(x)`` (1 where x > 0, else 0: ReLU's derivative, a real in C where ``x > 0`` would be an
int, which Clang converted lane by lane: micrograd's demo 0.81x the time with clang, Intel AVX-512).
"""

import math
from dataclasses import dataclass, field


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:  # C's exp returns +inf; so must we, for the two to agree
        return math.inf


def _log(x):
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan  # IEEE results where math.log raises


def _pow(x, y):
    """x ** y as C's pow: IEEE results (inf, nan) where Python raises or returns a complex."""
    try:
        result = x ** y
    except (ZeroDivisionError, OverflowError):  # 0 ** negative, or too large: C gives +-inf
        odd = float(y).is_integer() and y % 2 == 1
        return math.copysign(math.inf, x) if odd else math.inf
    return math.nan if isinstance(result, complex) else result


def _reciprocal(x):
    """1 / x as C's: +-inf for +-0 where Python raises (nan stays nan)."""
    return 1.0 / x if x != 0 else math.copysign(math.inf, x)


def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan  # (sqrt(-0.0) is -0.0, as C's; nan stays nan)


def _powk(x, k):
    """x ** k for a number k, the exponents of micrograd's own idioms written out: `/` is `* y **
    -1`, a square `** 2`, an RMSNorm's `** -0.5`, and their derivatives' k - 1. pow() would give
    the same value or one a rounding away (1 / sqrt rounds twice) at several times the cost:
    microgpt's step made ~1,100 pow calls, a quarter of its time. templates/prelude.c's powk
    is the same, term for term."""
    if k == 2:
        return x * x
    if k == -1:
        return _reciprocal(x)
    if k == -2:
        return _reciprocal(x * x)
    if k == -0.5:
        return _reciprocal(_sqrt(x))
    if k == -1.5:
        return _reciprocal(x * _sqrt(x))
    return _pow(x, k)


def _where(cond, if_true, if_false):
    return if_true if cond else if_false


def _positive(x):
    return 1.0 if x > 0 else 0.0


PRIMITIVES = {"exp": _exp, "log": _log, "tanh": math.tanh, "pow": _pow, "powk": _powk, "where": _where,
              "positive": _positive}

# Names the formulas bind; the same names are the placeholders.
_ARGS = ("a", "b", "out", "k")


@dataclass(frozen=True)
class Op:
    name: str                 # the table key
    label: str                # micrograd's `_op` string (format with k= for '**')
    arity: int
    value: str                # formula of the op's value
    grads: tuple              # one formula per argument: d(out)/d(arg)
    selects: str = ""         # "index" or "largest": {a} is the operand picked (GATHER, MAXIMUM below)
    method: str = ""          # the Value method that applies it (x.relu(), x.max(y)): engine.py makes it from the row
    doc: str = ""             # that method's docstring
    row_kernel: str = ""      # a kernel of templates/kernels/kernels.h computing the value over a row (compiled
                              # loops; the table form's rows through its _gather twin), to the fused bound
    in_products: str = ""     # matmul_set's parameter that applies it to a layer's sums as they are stored (in place)
    value_fn: object = field(init=False, repr=False, compare=False)
    grad_fns: tuple = field(init=False, repr=False, compare=False)
    pair_fn: object = field(init=False, repr=False, compare=False)  # value_fn of (a, b) alone, or None

    def __post_init__(self):
        object.__setattr__(self, "value_fn", _python_fn(self.value))
        object.__setattr__(self, "grad_fns", tuple(_python_fn(g) for g in self.grads))
        # for a binary op whose value reads neither out nor k: what maps and accumulates call
        pair = self.arity == 2 and not any(f"{{{n}}}" in self.value for n in ("out", "k"))
        object.__setattr__(self, "pair_fn", _python_fn(self.value, ("a", "b")) if pair else None)

    @property
    def first_choice(self):
        """For an op that selects: the position of its first candidate among its arguments (a
        gather's index comes before them)."""
        return 1 if self.selects == "index" else 0

    def grad_is_one(self, i):
        """Whether d(out)/d(argument i) is the constant 1 (a contribution is then the gradient
        itself, no product written)."""
        return self.grads[i].strip() == "1"

    def render(self, formula, **names):
        """The formula with each placeholder replaced by an expression (e.g. a C slot)."""
        return formula.format(**{n: names.get(n, n) for n in _ARGS})


def _python_fn(formula, names=_ARGS):
    source = f"lambda {', '.join(names)}: " + formula.format(**{n: n for n in _ARGS})
    return eval(source, dict(PRIMITIVES))


_TABLE = [
    Op("add", "+", 2, "{a} + {b}", ("1", "1")),
    Op("mul", "*", 2, "{a} * {b}", ("{b}", "{a}")),
    Op("pow", "**{k}", 1, "powk({a}, {k})", ("{k} * powk({a}, {k} - 1)",)),
    # a ** b with b a Value too (a > 0 for the gradient in b: log a)
    Op("vpow", "**", 2, "pow({a}, {b})", ("{b} * pow({a}, {b} - 1)", "{out} * log({a})")),
    Op("relu", "ReLU", 1, "where({a} < 0, 0, {a})", ("positive({out})",), method="relu", in_products="relu"),
    Op("tanh", "tanh", 1, "tanh({a})", ("1 - {out} * {out}",), method="tanh", row_kernel="tanh_range"),
    Op("sigmoid", "sigmoid", 1, "1 / (1 + exp(-{a}))", ("{out} * (1 - {out})",), method="sigmoid",
       row_kernel="sigmoid_range"),
    Op("exp", "exp", 1, "exp({a})", ("{out}",), method="exp", row_kernel="exp_range"),
    Op("log", "log", 1, "log({a})", ("1 / {a}",), method="log"),
    Op("max", "max", 2, "where({a} < {b}, {b}, {a})", ("({a} >= {b})", "({a} < {b})"), method="max",
       doc="The larger of self and other (ties pick self); the gradient flows to the one picked."),
    # values[index]: an index (an int-valued Value set per sample: a token) picks one of the
    # operands, {a}; the gradient flows to that one only. Its children are (index, *values).
    Op("gather", "gather", 1, "{a}", ("1",), selects="index"),
    # The compiler's form of a chain of `max` (fused mode, as a chain of `+` becomes a sum): {a} is
    # the largest operand, the first one if several are, as the chain's `where` keeps the earlier.
    Op("maximum", "max", 1, "{a}", ("1",), selects="largest"),
]

OPS = {op.name: op for op in _TABLE}
GATHER, MAXIMUM = OPS["gather"], OPS["maximum"]


def get(name):
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(OPS)}") from None

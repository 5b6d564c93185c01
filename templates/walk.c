/* The Value graph's reader at C speed (codegen/walker.py builds it once per machine): the walk of
 * engine.numbered_order and the arrays codegen/lower/graph.py reads from it, in one pass over the
 * Values.
 *
 *   walk(value_type, dot_type, roots, params, inputs, compact)
 *       -> (n, starts, offsets, kids, kinds, codes, roots, params, inputs, k_positions, k_values, values)
 *
 * n: the number of nodes, numbered children first (as numbered_order); starts: the count before
 * each root; offsets (N + 1), kids, roots, params, inputs, k_positions: int64 arrays in
 * bytearrays (a param or input the walk did not reach: -1); kinds: the distinct `_kind`s but None,
 * as met; codes: per node a uint16, 0 for a leaf, else 1 + its `_kind`'s place in kinds;
 * k_values: the `_k` of the nodes at k_positions (those whose `_k` is not None); values: per node
 * a float64, a leaf's `data` (0 for a computed node).
 *
 * compact: a Dot's (engine.Dot) children are its `_terms`, and its kind is dot_type; else its
 * `_prev`, which the caller has made (engine.topological_order), and its `_kind`.
 *
 *   reach(starts, kids, nodes, flags, down)
 *       marks spread along those arrays' edges (see reach below).
 *   depths(starts, kids, nodes, depth)
 *       each node's depth (see depths below).
 *   float_chain(value_type, start, a, b)
 *       a Dot's value and steps over floats (see float_chain below; engine.Dot's, as it is made). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>  /* PyMemberDef: a slot's offset */
#include <stdint.h>
#include <string.h>

static Py_ssize_t prev_offset, kind_offset, k_offset, n_offset, data_offset, terms_offset;  /* slots */
#define SLOT(v, offset) (*(PyObject **)((char *)(v) + (offset)))

/* A growing array of bytes, kept in a bytearray so that the result needs no copy. */
typedef struct { PyObject *array; char *data; size_t size, capacity; } Buffer;

static int grow(Buffer *b, size_t more) {
    if (b->size + more <= b->capacity) return 0;
    size_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + more) capacity *= 2;
    if (b->array ? PyByteArray_Resize(b->array, (Py_ssize_t)capacity)
                 : !(b->array = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)capacity))) return -1;
    b->data = PyByteArray_AS_STRING(b->array);
    b->capacity = capacity;
    return 0;
}

static int push(Buffer *b, const void *x, size_t size) {
    if (grow(b, size)) return -1;
    memcpy(b->data + b->size, x, size);
    b->size += size;
    return 0;
}

static int push_i64(Buffer *b, int64_t x) { return push(b, &x, sizeof x); }

static PyObject *as_bytearray(Buffer *b) {  /* the bytes pushed, as a new reference */
    if (!b->array) return PyByteArray_FromStringAndSize(NULL, 0);
    if (PyByteArray_Resize(b->array, (Py_ssize_t)b->size)) return NULL;
    Py_INCREF(b->array);
    return b->array;
}

static void release(Buffer *b) { Py_CLEAR(b->array); }

#if defined(__GNUC__) && !defined(__TINYC__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif
#define AHEAD 16  /* how many Values ahead of its turn one is fetched (the walk is bound by memory latency) */

/* A Value's number is kept in its `_n` slot while the walk runs, where it reads the Value anyway
 * (a table beside the Values cost a cache miss per look-up), as an odd word, not an object:
 * (number + 1) * 2 + 1, or 1 while the walk is below it. No int is made per Value, and no Python
 * code runs while the marks are out (the collector is paused, a leaf's data that is not a float
 * or an int is read after): every object's address is even, so every object in a slot (-1, or a
 * number an engine.numbered_order walk left) reads as not visited. Every `_n` marked is set back
 * to -1 before the walk returns, holding engine.NUMBERING (the caller) and the GIL throughout. */
#define NOT_VISITED (-2)
#define IN_PROGRESS (-1)
static PyObject *not_numbered;  /* the int -1 */

static int64_t number_of(PyObject *v) {  /* NOT_VISITED, IN_PROGRESS or the number */
    uintptr_t n = (uintptr_t)SLOT(v, n_offset);
    return n & 1 ? (int64_t)(n >> 1) - 1 : NOT_VISITED;
}

typedef struct {
    PyTypeObject *type, *dot;
    int compact;
    PyObject *kinds, *k_values, *slow;  /* slow: (position, Value) of leaves whose data is read after */
    Buffer marked, frames, edges, offsets, kids, codes, k_positions, values;
    int64_t number;
} Walk;

/* The first mark of a Value: the object in its slot goes (it is set back to -1 after). */
static int mark(Walk *w, PyObject *v, int64_t number) {
    PyObject **slot = &SLOT(v, n_offset);
    if (!((uintptr_t)*slot & 1)) {
        if (push(&w->marked, &v, sizeof v)) return -1;
        Py_XDECREF(*slot);  /* an int: freeing it runs no Python code */
    }
    *slot = (PyObject *)(((uintptr_t)(number + 1) << 1) | 1);
    return 0;
}

static void unmark_all(Walk *w) {
    PyObject **v = (PyObject **)w->marked.data, **end = (PyObject **)(w->marked.data + w->marked.size);
    for (; v < end; v++) {
        if (v + AHEAD < end) PREFETCH((char *)v[AHEAD] + n_offset);
        Py_INCREF(not_numbered);
        SLOT(*v, n_offset) = not_numbered;
    }
    w->marked.size = 0;
}

static Py_ssize_t member_offset(PyTypeObject *type, const char *name) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (!descr) return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    else PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
    Py_DECREF(descr);
    return offset;
}

/* Whether the walk reads v as a Dot: compact, and its `_terms` are there (a Dot whose `_prev`
 * was set to other children has none: a Value like any). */
static int compact_dot(const Walk *w, PyObject *v) {
    return w->compact && Py_TYPE(v) == w->dot && SLOT(v, terms_offset) && SLOT(v, terms_offset) != Py_None;
}

/* A Value's children: its `_prev` (a Dot's `_terms` when compact), a tuple (of Values: the walk
 * checks each as it comes to it, when it reads it anyway). */
static PyObject *children(const Walk *w, PyObject *v) {
    PyObject *prev = SLOT(v, compact_dot(w, v) ? terms_offset : prev_offset);
    if (!prev || !PyTuple_Check(prev)) {
        PyErr_SetString(PyExc_TypeError, Py_TYPE(v) == w->dot && !w->compact && prev == Py_None
                        ? "a Dot's chain must be made before a walk that is not compact"
                        : "a Value's _prev must be a tuple");
        return NULL;
    }
    return prev;
}

typedef struct { PyObject *node, *prev; Py_ssize_t next; size_t edges; } Frame;

/* A leaf's data as a double: floats and ints now, anything else (whose __float__ could run
 * Python code) after the marks are gone. */
static int leaf_value(Walk *w, PyObject *node, double *x) {
    PyObject *data = SLOT(node, data_offset);
    *x = 0.0;
    if (data && PyFloat_CheckExact(data)) *x = PyFloat_AS_DOUBLE(data);
    else if (data && PyLong_CheckExact(data)) {
        *x = PyLong_AsDouble(data);
        if (*x == -1.0 && PyErr_Occurred()) return -1;
    } else {
        PyObject *pair = Py_BuildValue("(LO)", (long long)w->number, node);  /* (the collector is paused) */
        if (!pair || PyList_Append(w->slow, pair)) { Py_XDECREF(pair); return -1; }
        Py_DECREF(pair);
    }
    return 0;
}

/* The node has its number: its children's numbers, op, constant attribute and value. */
static int finish(Walk *w, PyObject *node, const int64_t *kid_numbers, Py_ssize_t n_kids) {
    if (mark(w, node, w->number)) return -1;
    if (push(&w->kids, kid_numbers, n_kids * sizeof(int64_t))) return -1;
    if (push_i64(&w->offsets, (int64_t)(w->kids.size / sizeof(int64_t)))) return -1;
    PyObject *kind = compact_dot(w, node) ? (PyObject *)w->dot : SLOT(node, kind_offset), *k = SLOT(node, k_offset);
    uint16_t code = 0;
    double value = 0.0;
    if (kind && kind != Py_None) {
        Py_ssize_t n = PyList_GET_SIZE(w->kinds), i = 0;
        while (i < n && PyList_GET_ITEM(w->kinds, i) != kind) i++;
        if (i == n && PyList_Append(w->kinds, kind)) return -1;
        if (i >= 65535) { PyErr_SetString(PyExc_ValueError, "over 65535 distinct ops"); return -1; }
        code = (uint16_t)(i + 1);
    } else if (leaf_value(w, node, &value)) return -1;
    if (push(&w->codes, &code, sizeof code) || push(&w->values, &value, sizeof value)) return -1;
    if (k && k != Py_None && (push_i64(&w->k_positions, w->number) || PyList_Append(w->k_values, k))) return -1;
    w->number++;
    return 0;
}


/* The walk is bound by memory latency (a miss per Value, one more per leaf's data): a node's
 * children are fetched a few ahead of their turn, and a leaf's data when the leaf has come. */

static void prefetch_ahead(PyObject *prev, Py_ssize_t next) {
    Py_ssize_t size = PyTuple_GET_SIZE(prev);
    if (next + AHEAD < size) PREFETCH((char *)PyTuple_GET_ITEM(prev, next + AHEAD) + n_offset);
    if (next + AHEAD / 2 < size) {
        PyObject *data = SLOT(PyTuple_GET_ITEM(prev, next + AHEAD / 2), data_offset);
        if (data) PREFETCH(data);
    }
}

static int push_frame(Walk *w, PyObject *node, PyObject *prev) {
    for (Py_ssize_t i = 0; i < AHEAD && i < PyTuple_GET_SIZE(prev); i++)
        PREFETCH((char *)PyTuple_GET_ITEM(prev, i) + n_offset);
    Frame f = {node, prev, 0, w->edges.size / sizeof(int64_t)};
    if (push(&w->frames, &f, sizeof f) || mark(w, node, -1)) return -1;
    if (grow(&w->edges, PyTuple_GET_SIZE(prev) * sizeof(int64_t))) return -1;
    w->edges.size += PyTuple_GET_SIZE(prev) * sizeof(int64_t);  /* its children's numbers, to come */
    return 0;
}

/* numbered_order's walk from one root: depth first, children in _prev order, a node numbered
 * after its children; a leaf child numbered when met. Each frame keeps its children's numbers
 * on `edges` as they become known. */
static int walk_from(Walk *w, PyObject *root) {
    PyObject *prev = children(w, root);
    if (!prev || push_frame(w, root, prev)) return -1;
    while (w->frames.size) {
        Frame *f = (Frame *)(w->frames.data + w->frames.size) - 1;
        int64_t *edges = (int64_t *)w->edges.data + f->edges;
        if (f->next < PyTuple_GET_SIZE(f->prev)) {
            prefetch_ahead(f->prev, f->next);
            PyObject *child = PyTuple_GET_ITEM(f->prev, f->next);
            if (!PyObject_TypeCheck(child, w->type)) {
                PyErr_Format(PyExc_TypeError, "a Value's child must be a Value, got %s", Py_TYPE(child)->tp_name);
                return -1;
            }
            int64_t number = number_of(child);
            if (number == IN_PROGRESS) {
                PyErr_SetString(PyExc_ValueError, "the graph has a cycle");
                return -1;
            }
            if (number >= 0) {
                edges[f->next++] = number;
                continue;
            }
            PyObject *grandchildren = children(w, child);
            if (!grandchildren) return -1;
            if (PyTuple_GET_SIZE(grandchildren) == 0) {  /* a leaf: numbered at once */
                edges[f->next++] = w->number;
                if (finish(w, child, NULL, 0)) return -1;
                continue;
            }
            if (push_frame(w, child, grandchildren)) return -1;
            continue;
        }
        PyObject *node = f->node;
        Py_ssize_t n_kids = PyTuple_GET_SIZE(f->prev);
        size_t base = f->edges;
        w->frames.size -= sizeof(Frame);
        if (finish(w, node, edges, n_kids)) return -1;
        w->edges.size = base * sizeof(int64_t);
        if (w->frames.size) {  /* the parent's pending child is this node */
            Frame *parent = (Frame *)(w->frames.data + w->frames.size) - 1;
            ((int64_t *)w->edges.data)[parent->edges + parent->next++] = w->number - 1;
        }
    }
    return 0;
}

/* Each Value's position, -1 where the walk did not reach it (values: PySequence_Fast's); a
 * non-Value raises (checked here, in the one pass over a model's params after the walk). */
static int positions(Walk *w, PyObject *values, Buffer *out) {
    if (grow(out, PySequence_Fast_GET_SIZE(values) * sizeof(int64_t))) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(values); i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(values, i);
        if (i + AHEAD < PySequence_Fast_GET_SIZE(values))
            PREFETCH((char *)PySequence_Fast_GET_ITEM(values, i + AHEAD) + n_offset);
        if (!PyObject_TypeCheck(v, w->type)) {
            PyErr_Format(PyExc_TypeError, "every input and param must be a Value, got %s", Py_TYPE(v)->tp_name);
            return -1;
        }
        int64_t number = number_of(v);
        if (push_i64(out, number >= 0 ? number : -1)) return -1;
    }
    return 0;
}

/* Every root a Value. */
static int all_values(PyTypeObject *type, PyObject *seq) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
        if (!PyObject_TypeCheck(PySequence_Fast_GET_ITEM(seq, i), type)) {
            PyErr_Format(PyExc_TypeError, "compile() needs Values to compute, got %s",
                         Py_TYPE(PySequence_Fast_GET_ITEM(seq, i))->tp_name);
            return -1;
        }
    return 0;
}

/* The buffers sized for at least the leaves listed (most of a model's nodes): fewer copies as
 * they grow. */
static int presize(Walk *w, Py_ssize_t leaves) {
    size_t n = (size_t)leaves + 4096;
    return grow(&w->marked, n * sizeof(PyObject *)) || grow(&w->offsets, n * sizeof(int64_t))
           || grow(&w->kids, n * sizeof(int64_t)) || grow(&w->codes, n * sizeof(uint16_t))
           || grow(&w->values, n * sizeof(double));
}

/* The walk, and the positions of the roots, params and inputs, while the marks are out. */
static int walk_all(Walk *w, PyObject *roots, PyObject *params, PyObject *inputs, PyObject *starts,
                    Buffer *root_positions, Buffer *param_positions, Buffer *input_positions) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(roots); i++) {
        PyObject *root = PySequence_Fast_GET_ITEM(roots, i), *start = PyLong_FromLongLong(w->number);
        if (!start || PyList_Append(starts, start)) { Py_XDECREF(start); return -1; }
        Py_DECREF(start);
        if (number_of(root) < 0 && walk_from(w, root)) return -1;
        if (push_i64(root_positions, number_of(root))) return -1;
    }
    return positions(w, params, param_positions) || positions(w, inputs, input_positions) ? -1 : 0;
}

/* The values of the leaves whose data is neither a float nor an int. */
static int read_slow_values(Walk *w) {
    double *values = (double *)w->values.data;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(w->slow); i++) {
        PyObject *pair = PyList_GET_ITEM(w->slow, i), *data = SLOT(PyTuple_GET_ITEM(pair, 1), data_offset);
        if (!data) {
            PyErr_SetString(PyExc_TypeError, "a leaf Value has no data");
            return -1;
        }
        double x = PyFloat_AsDouble(data);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "a leaf Value's data must be a number, got %s", Py_TYPE(data)->tp_name);
            return -1;
        }
        values[PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0))] = x;
    }
    return 0;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyTypeObject *type, *dot;
    PyObject *roots, *params, *inputs, *result = NULL;
    int compact;
    if (!PyArg_ParseTuple(args, "O!O!OOOp", &PyType_Type, &type, &PyType_Type, &dot, &roots, &params, &inputs,
                          &compact)) return NULL;
    if ((prev_offset = member_offset(type, "_prev")) < 0 || (kind_offset = member_offset(type, "_kind")) < 0
        || (k_offset = member_offset(type, "_k")) < 0 || (n_offset = member_offset(type, "_n")) < 0
        || (data_offset = member_offset(type, "data")) < 0 || (terms_offset = member_offset(dot, "_terms")) < 0)
        return NULL;
    if (!PyType_IsSubtype(dot, type)) {
        PyErr_SetString(PyExc_TypeError, "the Dot type must be a Value type");
        return NULL;
    }
    Walk w = {type, dot, compact};
    Buffer root_positions = {0}, param_positions = {0}, input_positions = {0};
    PyObject *root_seq = PySequence_Fast(roots, "roots must be a sequence"), *param_seq = NULL, *input_seq = NULL;
    PyObject *starts = PyList_New(0);
    w.kinds = PyList_New(0);
    w.k_values = PyList_New(0);
    w.slow = PyList_New(0);
    if (!root_seq || !(param_seq = PySequence_Fast(params, "params and inputs must be sequences"))
        || !(input_seq = PySequence_Fast(inputs, "params and inputs must be sequences"))
        || !starts || !w.kinds || !w.k_values || !w.slow || all_values(type, root_seq)
        || presize(&w, PySequence_Fast_GET_SIZE(param_seq) + PySequence_Fast_GET_SIZE(input_seq))
        || push_i64(&w.offsets, 0))
        goto done;
#if PY_VERSION_HEX >= 0x030A0000
    int collecting = PyGC_Disable();  /* no collection may visit a slot with a mark in it */
#endif
    int failed = walk_all(&w, root_seq, param_seq, input_seq, starts, &root_positions, &param_positions,
                          &input_positions);
    unmark_all(&w);  /* every mark back to -1: the numbered nodes', and on an error the ones it was below */
#if PY_VERSION_HEX >= 0x030A0000
    if (collecting) PyGC_Enable();
#endif
    if (failed || read_slow_values(&w)) goto done;
    PyObject *parts[] = {as_bytearray(&w.offsets), as_bytearray(&w.kids), as_bytearray(&w.codes),
                         as_bytearray(&root_positions), as_bytearray(&param_positions),
                         as_bytearray(&input_positions), as_bytearray(&w.k_positions), as_bytearray(&w.values)};
    int made = 1;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) made &= parts[i] != NULL;
    if (made)
        result = Py_BuildValue("(LOOOOOOOOOOO)", (long long)w.number, starts, parts[0], parts[1], w.kinds, parts[2],
                               parts[3], parts[4], parts[5], parts[6], w.k_values, parts[7]);
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) Py_XDECREF(parts[i]);
done:
    Py_XDECREF(root_seq); Py_XDECREF(param_seq); Py_XDECREF(input_seq);
    Py_XDECREF(starts); Py_XDECREF(w.kinds); Py_XDECREF(w.k_values); Py_XDECREF(w.slow);
    release(&root_positions); release(&param_positions); release(&input_positions);
    release(&w.marked); release(&w.frames); release(&w.edges); release(&w.offsets); release(&w.kids);
    release(&w.codes); release(&w.k_positions); release(&w.values);
    return result;
}

/* reach(starts, kids, nodes, flags, down): marks (flags: a byte per node, writable) spread along
 * the edges over `nodes` (int64 positions, children first; starts and kids as walk returns them):
 * down false, in the nodes' order, a node is marked when one of its children is (which nodes read
 * a parameter: the ones with a gradient); down true, in reverse order, a marked node marks its
 * children (what a root reads): the walks of codegen/write/graph_rows.py, at C speed. */
static PyObject *reach(PyObject *self, PyObject *args) {
    Py_buffer s, k, n, f;
    int down;
    if (!PyArg_ParseTuple(args, "y*y*y*w*p", &s, &k, &n, &f, &down)) return NULL;
    const int64_t *starts = s.buf, *kids = k.buf, *nodes = n.buf;
    uint8_t *flags = f.buf;
    const Py_ssize_t n_starts = s.len / 8, n_kids = k.len / 8, n_nodes = n.len / 8, n_flags = f.len;
    int bad = 0;
    for (Py_ssize_t t = 0; t < n_nodes && !bad; t++) {
        const int64_t i = nodes[down ? n_nodes - 1 - t : t];
        if (i < 0 || i >= n_flags || i + 1 >= n_starts || starts[i] < 0 || starts[i] > starts[i + 1]
            || starts[i + 1] > n_kids) {
            bad = 1;
            break;
        }
        if (down && !flags[i]) continue;
        for (int64_t e = starts[i]; e < starts[i + 1]; e++) {
            const int64_t c = kids[e];
            if (c < 0 || c >= n_flags) {
                bad = 1;
                break;
            }
            if (down) {
                flags[c] = 1;
            } else if (flags[c]) {
                flags[i] = 1;
                break;
            }
        }
    }
    PyBuffer_Release(&s); PyBuffer_Release(&k); PyBuffer_Release(&n); PyBuffer_Release(&f);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "reach: a node or child outside the arrays");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* depths(starts, kids, nodes, depth): depth (an int64 per node, writable, leaves' 0) of each of
 * `nodes` (children first), one more than its deepest child's: the rows of one depth read none of
 * each other (codegen/write/graph_rows.py orders them so). */
static PyObject *depths(PyObject *self, PyObject *args) {
    Py_buffer s, k, n, d;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &s, &k, &n, &d)) return NULL;
    const int64_t *starts = s.buf, *kids = k.buf, *nodes = n.buf;
    int64_t *depth = d.buf;
    const Py_ssize_t n_starts = s.len / 8, n_kids = k.len / 8, n_nodes = n.len / 8, n_depths = d.len / 8;
    int bad = 0;
    for (Py_ssize_t t = 0; t < n_nodes && !bad; t++) {
        const int64_t i = nodes[t];
        if (i < 0 || i >= n_depths || i + 1 >= n_starts || starts[i] < 0 || starts[i] > starts[i + 1]
            || starts[i + 1] > n_kids) {
            bad = 1;
            break;
        }
        int64_t deepest = -1;
        for (int64_t e = starts[i]; e < starts[i + 1]; e++) {
            const int64_t c = kids[e];
            if (c < 0 || c >= n_depths) {
                bad = 1;
                break;
            }
            if (depth[c] > deepest) deepest = depth[c];
        }
        depth[i] = deepest + 1;
    }
    PyBuffer_Release(&s); PyBuffer_Release(&k); PyBuffer_Release(&n); PyBuffer_Release(&d);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "depths: a node or child outside the arrays");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A term's data as a double, as Python's float arithmetic converts it: a float, or an int (exactly
 * PyLong_AsDouble, what float * int does; *is_float 0); 0 for anything else. */
static int chain_term(PyObject *v, double *x, int *is_float) {
    if (v && PyFloat_CheckExact(v)) {
        *x = PyFloat_AS_DOUBLE(v), *is_float = 1;
        return 1;
    }
    if (v && PyLong_CheckExact(v)) {
        *x = PyLong_AsDouble(v), *is_float = 0;
        if (*x == -1.0 && PyErr_Occurred()) {  /* (too big for a float: Python's own arithmetic raises) */
            PyErr_Clear();
            return 0;
        }
        return 1;
    }
    return 0;
}

/* float_chain(value_type, start, a, b): a Dot's chain over floats (micrograd_c/engine.py's Dot),
 * start + a[0].data * b[0].data + ... + a[n-1].data * b[n-1].data, each product and each partial
 * sum rounded as Python's floats round them, in that order: (the value, the bytes of the steps
 * as Dot keeps them: the n products, then the n - 1 partial sums before the last), or None when
 * start is not a float or an int, or a product is not one of floats (a float by a float or an int,
 * as a ReLU's 0 is: Dot's Python then computes it). a and b: sequences of value_type's instances,
 * of one length n >= 1. A Dot of 85 terms is made in 6.5 us with it, 57 with NumPy's chain and its
 * checks (Zen 3). No contraction into fused multiply-adds, which would round once where Python
 * rounds twice. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static PyObject *float_chain(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *start, *a, *b, *result = NULL;
    static PyTypeObject *known;  /* the type whose data slot's offset `data` is */
    static Py_ssize_t data;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyType_Type, &type, &start, &a, &b)) return NULL;
    if (type != known) {
        if ((data = member_offset(type, "data")) < 0) return NULL;
        known = type;
    }
    double total, x, y;
    int x_float, y_float;
    if (!chain_term(start, &total, &x_float)) Py_RETURN_NONE;
    PyObject *as = PySequence_Fast(a, "a Dot's terms must be a sequence"), *bs = NULL, *steps = NULL;
    if (!as || !(bs = PySequence_Fast(b, "a Dot's terms must be a sequence"))) goto done;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(as);
    if (n < 1 || PySequence_Fast_GET_SIZE(bs) != n) {
        PyErr_SetString(PyExc_ValueError, "float_chain: two lists of one length, at least 1");
        goto done;
    }
    if (!(steps = PyBytes_FromStringAndSize(NULL, (2 * n - 1) * (Py_ssize_t)sizeof(double)))) goto done;
    char *out = PyBytes_AS_STRING(steps);
    PyObject **xs = PySequence_Fast_ITEMS(as), **ys = PySequence_Fast_ITEMS(bs);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(xs[i], type) || !PyObject_TypeCheck(ys[i], type)) {
            PyErr_SetString(PyExc_TypeError, "float_chain: terms must be Values");
            goto done;
        }
        if (!chain_term(SLOT(xs[i], data), &x, &x_float) || !chain_term(SLOT(ys[i], data), &y, &y_float)
            || !(x_float || y_float)) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        const double product = x * y;
        memcpy(out + i * sizeof product, &product, sizeof product);
        total = total + product;
        if (i < n - 1) memcpy(out + (n + i) * sizeof total, &total, sizeof total);
    }
    result = Py_BuildValue("(dO)", total, steps);
done:
    Py_XDECREF(as); Py_XDECREF(bs); Py_XDECREF(steps);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The Value graph read into arrays (see the file's comment)."},
    {"reach", reach, METH_VARARGS, "Marks spread along a graph's edges (see its comment)."},
    {"depths", depths, METH_VARARGS, "Each node's depth in a graph (see its comment)."},
    {"float_chain", float_chain, METH_VARARGS, "A Dot's chain over floats (see its comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graph_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit_graph_walk(void) {
    if (!(not_numbered = PyLong_FromLong(-1))) return NULL;
    return PyModule_Create(&module);
}

/* The Value graph's reader at C speed (codegen/walker.py builds it once per machine): the walk of
 * engine.numbered_order and the arrays codegen/graph.py reads from it, in one pass over the
 * Values.
 *
 *   walk(value_type, roots, params, inputs) -> (order, starts, offsets, kids, kinds, codes,
 *                                               roots, params, inputs, k_positions, k_values)
 *
 * order: the Values, children first (as numbered_order); starts: the order's length before each
 * root; offsets (N + 1), kids, roots, params, inputs, k_positions: int64 arrays in bytearrays
 * (a param or input the walk did not reach: -1); kinds: the distinct `_kind`s but None, as met;
 * codes: per node a uint16, 0 for a leaf, else 1 + its `_kind`'s place in kinds; k_values: the
 * `_k` of the nodes at k_positions (those whose `_k` is not None). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>  /* PyMemberDef: a slot's offset */
#include <stdint.h>
#include <string.h>

static Py_ssize_t prev_offset, kind_offset, k_offset, n_offset;  /* of the Value's slots */
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

static int push_i64(Buffer *b, int64_t x) {
    if (grow(b, sizeof x)) return -1;
    memcpy(b->data + b->size, &x, sizeof x);
    b->size += sizeof x;
    return 0;
}

static PyObject *as_bytearray(Buffer *b) {  /* the bytes pushed, as a new reference */
    if (!b->array) return PyByteArray_FromStringAndSize(NULL, 0);
    if (PyByteArray_Resize(b->array, (Py_ssize_t)b->size)) return NULL;
    Py_INCREF(b->array);
    return b->array;
}

static void release(Buffer *b) { Py_CLEAR(b->array); }

/* A Value's number is kept in its `_n` slot while the walk runs, where it reads the Value anyway
 * (a table beside the Values cost a cache miss per look-up): -(number + 3), or -2 while the
 * walk is below it. Every other value (-1, or a number an engine.numbered_order walk
 * left) reads as not visited; the walk sets every `_n` it marked back to -1 before it returns,
 * holding engine.NUMBERING (the caller) and the GIL throughout. */
#define NOT_VISITED (-2)
#define IN_PROGRESS (-1)
static PyObject *in_progress, *not_numbered;  /* the ints -2 and -1 */

static int64_t number_of(PyObject *v) {  /* NOT_VISITED, IN_PROGRESS or the number */
    PyObject *n = SLOT(v, n_offset);
    if (!n || !PyLong_CheckExact(n)) return NOT_VISITED;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(n, &overflow);
    return overflow ? NOT_VISITED : x <= -3 ? -(x + 3) : x == -2 ? IN_PROGRESS : NOT_VISITED;
}

static void set_mark(PyObject *v, PyObject *mark) {  /* steals the reference to mark */
    PyObject *old = SLOT(v, n_offset);
    SLOT(v, n_offset) = mark;
    Py_XDECREF(old);
}

static int mark_number(PyObject *v, int64_t number) {
    PyObject *mark = PyLong_FromLongLong(-(number + 3));
    if (!mark) return -1;
    set_mark(v, mark);
    return 0;
}

static void unmark(PyObject *v) {
    Py_INCREF(not_numbered);
    set_mark(v, not_numbered);
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

/* A Value's children: its `_prev`, which must be a tuple of Values. */
static PyObject *children(PyTypeObject *type, PyObject *v) {
    PyObject *prev = SLOT(v, prev_offset);
    if (!prev || !PyTuple_Check(prev)) {
        PyErr_SetString(PyExc_TypeError, "a Value's _prev must be a tuple");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prev); i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(prev, i), type)) {
            PyErr_Format(PyExc_TypeError, "a Value's child must be a Value, got %s",
                         Py_TYPE(PyTuple_GET_ITEM(prev, i))->tp_name);
            return NULL;
        }
    return prev;
}

typedef struct { PyObject *node, *prev; Py_ssize_t next; size_t edges; } Frame;

typedef struct {
    PyTypeObject *type;
    PyObject *order, *kinds, *k_values;
    Buffer frames, edges, offsets, kids, codes, k_positions;
    int64_t number;
} Walk;

/* The node has its number: appended to the order with its children's numbers and op. */
static int finish(Walk *w, PyObject *node, const int64_t *kid_numbers, Py_ssize_t n_kids) {
    if (PyList_Append(w->order, node) || mark_number(node, w->number)) return -1;
    if (grow(&w->kids, n_kids * sizeof(int64_t))) return -1;
    if (n_kids) memcpy(w->kids.data + w->kids.size, kid_numbers, n_kids * sizeof(int64_t));
    w->kids.size += n_kids * sizeof(int64_t);
    if (push_i64(&w->offsets, (int64_t)(w->kids.size / sizeof(int64_t)))) return -1;
    PyObject *kind = SLOT(node, kind_offset), *k = SLOT(node, k_offset);
    uint16_t code = 0;
    if (kind && kind != Py_None) {
        Py_ssize_t n = PyList_GET_SIZE(w->kinds), i = 0;
        while (i < n && PyList_GET_ITEM(w->kinds, i) != kind) i++;
        if (i == n && PyList_Append(w->kinds, kind)) return -1;
        if (i >= 65535) { PyErr_SetString(PyExc_ValueError, "over 65535 distinct ops"); return -1; }
        code = (uint16_t)(i + 1);
    }
    if (grow(&w->codes, sizeof code)) return -1;
    memcpy(w->codes.data + w->codes.size, &code, sizeof code);
    w->codes.size += sizeof code;
    if (k && k != Py_None && (push_i64(&w->k_positions, w->number) || PyList_Append(w->k_values, k))) return -1;
    w->number++;
    return 0;
}

#if defined(__GNUC__) && !defined(__TINYC__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif

/* The walk is bound by memory latency (a miss per Value): the children are fetched while it
 * finishes the node before them. */
static void prefetch_children(PyObject *prev) {
    for (Py_ssize_t i = PyTuple_GET_SIZE(prev) - 1; i >= 0; i--)
        PREFETCH((char *)PyTuple_GET_ITEM(prev, i) + prev_offset);
}

static int push_frame(Walk *w, PyObject *node, PyObject *prev) {
    prefetch_children(prev);
    if (grow(&w->frames, sizeof(Frame))) return -1;
    Frame f = {node, prev, 0, w->edges.size / sizeof(int64_t)};
    memcpy(w->frames.data + w->frames.size, &f, sizeof f);
    w->frames.size += sizeof f;
    Py_INCREF(in_progress);
    set_mark(node, in_progress);
    if (grow(&w->edges, PyTuple_GET_SIZE(prev) * sizeof(int64_t))) return -1;
    w->edges.size += PyTuple_GET_SIZE(prev) * sizeof(int64_t);  /* its children's numbers, to come */
    return 0;
}

/* numbered_order's walk from one root: depth first, children in _prev order, a node numbered
 * after its children; a leaf child numbered when met. Each frame keeps its children's numbers
 * on `edges` as they become known. */
static int walk_from(Walk *w, PyObject *root) {
    PyObject *prev = children(w->type, root);
    if (!prev || push_frame(w, root, prev)) return -1;
    while (w->frames.size) {
        Frame *f = (Frame *)(w->frames.data + w->frames.size) - 1;
        int64_t *edges = (int64_t *)w->edges.data + f->edges;
        if (f->next < PyTuple_GET_SIZE(f->prev)) {
            PyObject *child = PyTuple_GET_ITEM(f->prev, f->next);
            int64_t number = number_of(child);
            if (number == IN_PROGRESS) {
                PyErr_SetString(PyExc_ValueError, "the graph has a cycle");
                return -1;
            }
            if (number >= 0) {
                edges[f->next++] = number;
                continue;
            }
            PyObject *grandchildren = children(w->type, child);
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
        if (finish(w, node, edges, n_kids)) {
            unmark(node);
            return -1;
        }
        w->edges.size = base * sizeof(int64_t);
        if (w->frames.size) {  /* the parent's pending child is this node */
            Frame *parent = (Frame *)(w->frames.data + w->frames.size) - 1;
            ((int64_t *)w->edges.data)[parent->edges + parent->next++] = w->number - 1;
        }
    }
    return 0;
}

/* Each Value's position in the order, -1 where the walk did not reach it; a non-Value raises. */
static PyObject *positions(Walk *w, PyObject *values) {
    PyObject *seq = PySequence_Fast(values, "params and inputs must be sequences");
    if (!seq) return NULL;
    Buffer out = {0};
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(v, w->type)) {
            PyErr_Format(PyExc_TypeError, "every input and param must be a Value, got %s", Py_TYPE(v)->tp_name);
            goto fail;
        }
        int64_t number = number_of(v);
        if (push_i64(&out, number >= 0 ? number : -1)) goto fail;
    }
    Py_DECREF(seq);
    PyObject *result = as_bytearray(&out);
    release(&out);
    return result;
fail:
    Py_DECREF(seq);
    release(&out);
    return NULL;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *roots, *params, *inputs, *result = NULL;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyType_Type, &type, &roots, &params, &inputs)) return NULL;
    if ((prev_offset = member_offset(type, "_prev")) < 0 || (kind_offset = member_offset(type, "_kind")) < 0
        || (k_offset = member_offset(type, "_k")) < 0 || (n_offset = member_offset(type, "_n")) < 0) return NULL;
    PyObject *root_seq = PySequence_Fast(roots, "roots must be a sequence");
    if (!root_seq) return NULL;
    Walk w = {type};
    PyObject *starts = PyList_New(0), *root_positions = NULL, *param_positions = NULL, *input_positions = NULL;
    w.order = PyList_New(0);
    w.kinds = PyList_New(0);
    w.k_values = PyList_New(0);
    if (!starts || !w.order || !w.kinds || !w.k_values || push_i64(&w.offsets, 0))
        goto done;
    Buffer root_buffer = {0};
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(root_seq); i++) {
        PyObject *root = PySequence_Fast_GET_ITEM(root_seq, i), *start = PyLong_FromLongLong(w.number);
        if (!start || PyList_Append(starts, start)) { Py_XDECREF(start); release(&root_buffer); goto done; }
        Py_DECREF(start);
        if (!PyObject_TypeCheck(root, type)) {
            PyErr_Format(PyExc_TypeError, "compile() needs Values to compute, got %s", Py_TYPE(root)->tp_name);
            release(&root_buffer);
            goto done;
        }
        if (number_of(root) < 0 && walk_from(&w, root)) { release(&root_buffer); goto done; }
        if (push_i64(&root_buffer, number_of(root))) { release(&root_buffer); goto done; }
    }
    root_positions = as_bytearray(&root_buffer);
    release(&root_buffer);
    if (!root_positions || !(param_positions = positions(&w, params)) || !(input_positions = positions(&w, inputs)))
        goto done;
    PyObject *offsets = as_bytearray(&w.offsets), *kids = as_bytearray(&w.kids), *codes = as_bytearray(&w.codes),
             *k_positions = as_bytearray(&w.k_positions);
    if (offsets && kids && codes && k_positions)
        result = Py_BuildValue("(OOOOOOOOOOO)", w.order, starts, offsets, kids, w.kinds, codes, root_positions,
                               param_positions, input_positions, k_positions, w.k_values);
    Py_XDECREF(offsets); Py_XDECREF(kids); Py_XDECREF(codes); Py_XDECREF(k_positions);
done:
    /* every mark back to -1: the order's, and on an error the nodes the walk was below */
    for (Py_ssize_t i = 0; w.order && i < PyList_GET_SIZE(w.order); i++) unmark(PyList_GET_ITEM(w.order, i));
    for (Frame *f = (Frame *)w.frames.data; w.frames.size && f < (Frame *)(w.frames.data + w.frames.size); f++)
        unmark(f->node);
    Py_DECREF(root_seq);
    Py_XDECREF(starts); Py_XDECREF(w.order); Py_XDECREF(w.kinds); Py_XDECREF(w.k_values);
    Py_XDECREF(root_positions); Py_XDECREF(param_positions); Py_XDECREF(input_positions);
    release(&w.frames); release(&w.edges); release(&w.offsets); release(&w.kids); release(&w.codes);
    release(&w.k_positions);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The Value graph read into arrays (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graph_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit_graph_walk(void) {
    if (!(in_progress = PyLong_FromLong(-2)) || !(not_numbered = PyLong_FromLong(-1))) return NULL;
    return PyModule_Create(&module);
}

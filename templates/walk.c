/* The Value graph's reader at C speed (codegen/walker.py builds it once per machine): the walk of
 * engine.numbered_order and the arrays codegen/graph.py reads from it, in one pass over the
 * Values, without numbering them in place (a table of pointers holds their numbers).
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

static Py_ssize_t prev_offset, kind_offset, k_offset;  /* of the Value's slots */

typedef struct { char *data; size_t size, capacity; } Buffer;

static int grow(Buffer *b, size_t more) {
    if (b->size + more <= b->capacity) return 0;
    size_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + more) capacity *= 2;
    char *data = realloc(b->data, capacity);
    if (!data) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int push_i64(Buffer *b, int64_t x) {
    if (grow(b, sizeof x)) return -1;
    memcpy(b->data + b->size, &x, sizeof x);
    b->size += sizeof x;
    return 0;
}

static PyObject *as_bytearray(Buffer *b) {
    return PyByteArray_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->size);
}

/* Visited Values: open addressing on their addresses (a key and its number share a cache line:
 * a look-up is one miss); a number, or IN_PROGRESS while the walk is below it. */
#define IN_PROGRESS (-1)
typedef struct { PyObject *key; int64_t number; } Entry;
typedef struct { Entry *entries; size_t mask, count; } Table;

static size_t hash_of(const Table *t, PyObject *key) {
    return (size_t)(((uintptr_t)key >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & t->mask;
}

static size_t slot_of(const Table *t, PyObject *key) {
    size_t i = hash_of(t, key);
    while (t->entries[i].key && t->entries[i].key != key) i = (i + 1) & t->mask;
    return i;
}

static int table_init(Table *t, size_t capacity) {
    t->entries = calloc(capacity, sizeof *t->entries);
    t->mask = capacity - 1;
    t->count = 0;
    if (!t->entries) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int table_put(Table *t, PyObject *key, int64_t number) {
    if ((t->count + 1) * 2 > t->mask + 1) {  /* over half full: double (a miss probes ~2.5 entries) */
        Table bigger;
        if (table_init(&bigger, (t->mask + 1) * 2)) return -1;
        for (size_t i = 0; i <= t->mask; i++)
            if (t->entries[i].key) bigger.entries[slot_of(&bigger, t->entries[i].key)] = t->entries[i];
        bigger.count = t->count;
        free(t->entries);
        *t = bigger;
    }
    Entry *e = &t->entries[slot_of(t, key)];
    if (!e->key) { e->key = key; t->count++; }
    e->number = number;
    return 0;
}

static int64_t table_get(const Table *t, PyObject *key) {  /* -2: not visited */
    const Entry *e = &t->entries[slot_of(t, key)];
    return e->key ? e->number : -2;
}

#define SLOT(v, offset) (*(PyObject **)((char *)(v) + (offset)))

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
    Table table;
    PyObject *order, *kinds, *k_values;
    Buffer frames, edges, offsets, kids, codes, k_positions;
    int64_t number;
} Walk;

/* The node has its number: appended to the order with its children's numbers and op. */
static int finish(Walk *w, PyObject *node, const int64_t *kid_numbers, Py_ssize_t n_kids) {
    if (table_put(&w->table, node, w->number) || PyList_Append(w->order, node)) return -1;
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

/* The walk is bound by memory latency (a miss per look-up): the children's entries and objects
 * are fetched while it finishes the node before them. */
static void prefetch_children(const Table *t, PyObject *prev) {
    for (Py_ssize_t i = PyTuple_GET_SIZE(prev) - 1; i >= 0; i--) {
        PyObject *child = PyTuple_GET_ITEM(prev, i);
        PREFETCH(&t->entries[hash_of(t, child)]);
        PREFETCH((char *)child + prev_offset);
    }
}

static int push_frame(Walk *w, PyObject *node, PyObject *prev) {
    prefetch_children(&w->table, prev);
    if (table_put(&w->table, node, IN_PROGRESS) || grow(&w->frames, sizeof(Frame))) return -1;
    Frame f = {node, prev, 0, w->edges.size / sizeof(int64_t)};
    memcpy(w->frames.data + w->frames.size, &f, sizeof f);
    w->frames.size += sizeof f;
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
            int64_t number = table_get(&w->table, child);
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
        if (finish(w, node, edges, n_kids)) return -1;
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
        int64_t number = table_get(&w->table, v);
        if (push_i64(&out, number >= 0 ? number : -1)) goto fail;
    }
    Py_DECREF(seq);
    PyObject *result = as_bytearray(&out);
    free(out.data);
    return result;
fail:
    Py_DECREF(seq);
    free(out.data);
    return NULL;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *roots, *params, *inputs, *result = NULL;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyType_Type, &type, &roots, &params, &inputs)) return NULL;
    if ((prev_offset = member_offset(type, "_prev")) < 0 || (kind_offset = member_offset(type, "_kind")) < 0
        || (k_offset = member_offset(type, "_k")) < 0) return NULL;
    PyObject *root_seq = PySequence_Fast(roots, "roots must be a sequence");
    if (!root_seq) return NULL;
    Walk w = {type};
    PyObject *starts = PyList_New(0), *root_positions = NULL, *param_positions = NULL, *input_positions = NULL;
    w.order = PyList_New(0);
    w.kinds = PyList_New(0);
    w.k_values = PyList_New(0);
    if (!starts || !w.order || !w.kinds || !w.k_values || table_init(&w.table, 1 << 16) || push_i64(&w.offsets, 0))
        goto done;
    Buffer root_buffer = {0};
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(root_seq); i++) {
        PyObject *root = PySequence_Fast_GET_ITEM(root_seq, i), *start = PyLong_FromLongLong(w.number);
        if (!start || PyList_Append(starts, start)) { Py_XDECREF(start); free(root_buffer.data); goto done; }
        Py_DECREF(start);
        if (!PyObject_TypeCheck(root, type)) {
            PyErr_Format(PyExc_TypeError, "compile() needs Values to compute, got %s", Py_TYPE(root)->tp_name);
            free(root_buffer.data);
            goto done;
        }
        if (table_get(&w.table, root) < 0 && walk_from(&w, root)) { free(root_buffer.data); goto done; }
        if (push_i64(&root_buffer, table_get(&w.table, root))) { free(root_buffer.data); goto done; }
    }
    root_positions = as_bytearray(&root_buffer);
    free(root_buffer.data);
    if (!root_positions || !(param_positions = positions(&w, params)) || !(input_positions = positions(&w, inputs)))
        goto done;
    PyObject *offsets = as_bytearray(&w.offsets), *kids = as_bytearray(&w.kids), *codes = as_bytearray(&w.codes),
             *k_positions = as_bytearray(&w.k_positions);
    if (offsets && kids && codes && k_positions)
        result = Py_BuildValue("(OOOOOOOOOOO)", w.order, starts, offsets, kids, w.kinds, codes, root_positions,
                               param_positions, input_positions, k_positions, w.k_values);
    Py_XDECREF(offsets); Py_XDECREF(kids); Py_XDECREF(codes); Py_XDECREF(k_positions);
done:
    Py_DECREF(root_seq);
    Py_XDECREF(starts); Py_XDECREF(w.order); Py_XDECREF(w.kinds); Py_XDECREF(w.k_values);
    Py_XDECREF(root_positions); Py_XDECREF(param_positions); Py_XDECREF(input_positions);
    free(w.table.entries);
    free(w.frames.data); free(w.edges.data); free(w.offsets.data); free(w.kids.data); free(w.codes.data);
    free(w.k_positions.data);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The Value graph read into arrays (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graph_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit_graph_walk(void) { return PyModule_Create(&module); }

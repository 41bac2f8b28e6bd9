/*
 * The runtime's per-record loops on a remote function's hot path, compiled.
 *
 * Each function here does exactly what one pure-Python loop does (named beside it) and is
 * chosen in its place when this extension was built (statefun/_compiled.py). The contract
 * tests (tests/unit/test_hot_loops.py) run every case, and random inputs, through both and
 * compare. Where the Python loop would take an unusual turn (a value of another kind, bytes
 * that do not parse as expected), a function here returns None or stops early and lets the
 * Python code decide, so that the two never disagree on what is an error.
 *
 *   kafka_run    a run of Kafka records into (id, TypedValue) pairs
 *                (ingress/_kafka_runs.py: messages)
 *   mailbox_run  a run of (id, value) pairs into a busy address's mailbox as Envelopes,
 *                each Invocation encoded ahead (runtime/_dispatcher.py: Dispatcher.offer_run)
 *   kafka_rows   a reply's KafkaProducerRecords into the producer's rows
 *                (egress/kafka.py: KafkaSink.write_many)
 *   egress_groups  a FromFunction's egress records, grouped per egress id, read from its
 *                bytes (runtime/_dispatcher.py: group_egress)
 *   invocation_wires  a batch's Invocations, encoded ahead or now
 *                (runtime/_remote.py: encode_to_function)
 *   produce_rows the Kafka egress's rows handed to librdkafka, on the producer thread
 *                (egress/_kafka_librdkafka.py: Sender.send)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *s_typename, *s_has_value, *s_value, *s_id, *s_caller, *s_wire, *s_decode,
    *s_utf8, *s_empty;

static PyObject *
call1(PyObject *fn, PyObject *arg)
{
    return PyObject_Vectorcall(fn, &arg, 1, NULL);
}

/* 0 if ``nargs`` is ``expected``, else -1 with a TypeError naming ``name``. */
static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return -1;
}

/* An int argument as a Py_ssize_t: 0, or -1 with the error set. */
static int
as_size(PyObject *number, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(number);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A new instance of ``cls`` without its __init__ (as object.__new__(cls)). */
static PyObject *
new_bare(PyTypeObject *cls)
{
    return cls->tp_alloc(cls, 0);
}

/* ---- attributes in place ----------------------------------------------------------------- */

/* Where objects of one class keep some named attributes: for a class whose attributes are
 * __slots__ (member descriptors) and that reads and writes them the generic way, their offsets,
 * read and written in place as the descriptors would; for anything else (or an object of
 * another class), by name. */
#define LAYOUT_MAX 5

typedef struct {
    PyTypeObject *cls;
    PyObject *names[LAYOUT_MAX];
    Py_ssize_t offsets[LAYOUT_MAX]; /* -1: by name */
} Layout;

static void
layout_of(Layout *layout, PyTypeObject *cls, PyObject *const *names, int count)
{
    layout->cls = cls;
    int generic = cls->tp_getattro == PyObject_GenericGetAttr &&
                  cls->tp_setattro == PyObject_GenericSetAttr;
    for (int i = 0; i < count; i++) {
        layout->names[i] = names[i];
        layout->offsets[i] = -1;
        if (!generic) {
            continue;
        }
        PyObject *descr = PyObject_GetAttr((PyObject *)cls, names[i]);
        if (descr == NULL) {
            PyErr_Clear();
            continue;
        }
        if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY) &&
                PyType_IsSubtype(cls, PyDescr_TYPE(descr))) {
                layout->offsets[i] = member->offset;
            }
        }
        Py_DECREF(descr);
    }
}

/* obj.<name i> = value (obj made by new_bare(layout->cls)); 0, or -1 with an error set. */
static int
layout_set(const Layout *layout, PyObject *obj, int i, PyObject *value)
{
    Py_ssize_t offset = layout->offsets[i];
    if (offset < 0 || !Py_IS_TYPE(obj, layout->cls)) {
        return PyObject_SetAttr(obj, layout->names[i], value);
    }
    PyObject **slot = (PyObject **)((char *)obj + offset);
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

/* obj.<name i> (a new reference), or NULL with an error set. */
static PyObject *
layout_get(const Layout *layout, PyObject *obj, int i)
{
    Py_ssize_t offset = layout->offsets[i];
    if (offset >= 0 && Py_IS_TYPE(obj, layout->cls)) {
        PyObject *value = *(PyObject **)((char *)obj + offset);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(obj, layout->names[i]); /* (an unset slot: its AttributeError) */
}

/* the attributes of a typed value and of an envelope, by their index in a Layout */
enum { TV_TYPENAME, TV_HAS_VALUE, TV_VALUE, TV_COUNT };
enum { ENV_TYPENAME, ENV_ID, ENV_VALUE, ENV_CALLER, ENV_WIRE, ENV_COUNT };

static void
typed_value_layout(Layout *layout, PyTypeObject *cls)
{
    PyObject *names[TV_COUNT] = {s_typename, s_has_value, s_value};
    layout_of(layout, cls, names, TV_COUNT);
}

/* ---- kafka_run ------------------------------------------------------------------------- */

/* Is the error set one of ``caught`` (then cleared: 1), another (kept: -1)? */
static int
take_caught(PyObject *caught)
{
    if (PyErr_ExceptionMatches(caught)) {
        PyErr_Clear();
        return 1;
    }
    return -1;
}

/* Compare field(record) with ``expected`` (!=): 1 differs, 0 same, -1 error. */
static int
field_differs(PyObject *field, PyObject *record, PyObject *expected)
{
    PyObject *got = call1(field, record);
    if (got == NULL) {
        return -1;
    }
    int differs = PyObject_RichCompareBool(got, expected, Py_NE);
    Py_DECREF(got);
    return differs;
}

PyDoc_STRVAR(kafka_run_doc,
             "kafka_run(batch, start, key_of, value_of, partition_of, topic_of, value_type, "
             "validate, typed_cls, caught) -> list\n\n"
             "ingress/_kafka_runs.py's messages(), compiled: (id, typed value) for each record "
             "of the list ``batch`` from ``start`` on, up to the first of another topic or "
             "partition, without a key or a value, or whose key decoding or ``validate`` "
             "raises one of ``caught``.");

static PyObject *
kafka_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("kafka_run", nargs, 10) < 0) {
        return NULL;
    }
    PyObject *batch = args[0];
    PyObject *key_of = args[2], *value_of = args[3], *partition_of = args[4];
    PyObject *topic_of = args[5], *value_type = args[6], *validate = args[7];
    PyObject *typed_cls = args[8], *caught = args[9];
    Py_ssize_t start;
    if (as_size(args[1], &start) < 0) {
        return NULL;
    }
    if (!PyList_Check(batch) || !PyType_Check(typed_cls)) {
        PyErr_SetString(PyExc_TypeError, "kafka_run() needs a list and a class");
        return NULL;
    }
    if (start < 0 || start >= PyList_GET_SIZE(batch)) {
        PyErr_SetString(PyExc_IndexError, "kafka_run(): start is out of the batch");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)typed_cls;
    Layout typed_layout;
    typed_value_layout(&typed_layout, cls);
    PyObject *run = PyList_New(0);
    PyObject *first = PyList_GET_ITEM(batch, start);
    Py_INCREF(first);
    PyObject *topic = call1(topic_of, first);
    PyObject *partition = topic == NULL ? NULL : call1(partition_of, first);
    Py_DECREF(first);
    PyObject *last_key = Py_NewRef(Py_None);
    PyObject *id = Py_NewRef(s_empty);
    PyObject *record = NULL, *key = NULL, *value = NULL;
    if (run == NULL || partition == NULL) {
        goto error;
    }
    for (Py_ssize_t index = start; index < PyList_GET_SIZE(batch); index++) {
        record = Py_NewRef(PyList_GET_ITEM(batch, index));
        key = call1(key_of, record);
        if (key == NULL) {
            goto error;
        }
        value = call1(value_of, record);
        if (value == NULL) {
            goto error;
        }
        if (key == Py_None || value == Py_None) {
            break;
        }
        int differs = field_differs(partition_of, record, partition);
        if (differs < 0) {
            goto error;
        }
        if (differs) {
            break;
        }
        differs = field_differs(topic_of, record, topic);
        if (differs < 0) {
            goto error;
        }
        if (differs) {
            break;
        }
        differs = PyObject_RichCompareBool(key, last_key, Py_NE);
        if (differs < 0) {
            goto error;
        }
        if (differs) {
            PyObject *decoded;
            if (PyBytes_CheckExact(key)) {
                decoded = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                                               NULL);
            }
            else {
                decoded = PyObject_CallMethodOneArg(key, s_decode, s_utf8);
            }
            if (decoded == NULL) {
                if (take_caught(caught) < 0) {
                    goto error;
                }
                break;
            }
            Py_SETREF(id, decoded);
            Py_SETREF(last_key, Py_NewRef(key));
        }
        if (validate != Py_None) {
            PyObject *checked = call1(validate, value);
            if (checked == NULL) {
                if (take_caught(caught) < 0) {
                    goto error;
                }
                break;
            }
            Py_DECREF(checked);
        }
        PyObject *typed = new_bare(cls);
        if (typed == NULL) {
            goto error;
        }
        if (layout_set(&typed_layout, typed, TV_TYPENAME, value_type) < 0 ||
            layout_set(&typed_layout, typed, TV_HAS_VALUE, Py_True) < 0 ||
            layout_set(&typed_layout, typed, TV_VALUE, value) < 0) {
            Py_DECREF(typed);
            goto error;
        }
        PyObject *pair = PyTuple_Pack(2, id, typed);
        Py_DECREF(typed);
        if (pair == NULL) {
            goto error;
        }
        int failed = PyList_Append(run, pair);
        Py_DECREF(pair);
        if (failed) {
            goto error;
        }
        Py_CLEAR(record);
        Py_CLEAR(key);
        Py_CLEAR(value);
    }
    Py_XDECREF(record);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(topic);
    Py_DECREF(partition);
    Py_DECREF(last_key);
    Py_DECREF(id);
    return run;
error:
    Py_XDECREF(record);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(topic);
    Py_XDECREF(partition);
    Py_DECREF(last_key);
    Py_DECREF(id);
    Py_XDECREF(run);
    return NULL;
}

/* ---- mailbox_run ----------------------------------------------------------------------- */

/* The Invocation of ``typed`` as runtime/_remote.py's ingress_encoding() encodes it: its
 * prefix by the value's length and the value's bytes, or (any other value) the fallback's. */
static PyObject *
encode_invocation(const Layout *typed_layout, PyObject *typed, PyObject *value_type,
                  PyObject *prefixes, Py_ssize_t limit, PyObject *fallback)
{
    PyObject *typename = layout_get(typed_layout, typed, TV_TYPENAME);
    if (typename == NULL) {
        return NULL;
    }
    int same = PyObject_RichCompareBool(typename, value_type, Py_EQ);
    Py_DECREF(typename);
    if (same < 0) {
        return NULL;
    }
    if (same) {
        PyObject *has_value = layout_get(typed_layout, typed, TV_HAS_VALUE);
        if (has_value == NULL) {
            return NULL;
        }
        int has = PyObject_IsTrue(has_value);
        Py_DECREF(has_value);
        if (has < 0) {
            return NULL;
        }
        if (has) {
            PyObject *value = layout_get(typed_layout, typed, TV_VALUE);
            if (value == NULL) {
                return NULL;
            }
            if (PyBytes_CheckExact(value)) {
                Py_ssize_t n = PyBytes_GET_SIZE(value);
                if (n > 0 && n < limit && n < PyList_GET_SIZE(prefixes)) {
                    PyObject *prefix = PyList_GET_ITEM(prefixes, n);
                    if (PyBytes_CheckExact(prefix)) {
                        Py_ssize_t head = PyBytes_GET_SIZE(prefix);
                        PyObject *wire = PyBytes_FromStringAndSize(NULL, head + n);
                        if (wire != NULL) {
                            char *out = PyBytes_AS_STRING(wire);
                            memcpy(out, PyBytes_AS_STRING(prefix), head);
                            memcpy(out + head, PyBytes_AS_STRING(value), n);
                        }
                        Py_DECREF(value);
                        return wire;
                    }
                }
            }
            Py_DECREF(value);
        }
    }
    return call1(fallback, typed);
}

PyDoc_STRVAR(mailbox_run_doc,
             "mailbox_run(append, messages, start, stop, id, typename, envelope_cls, encoding, "
             "size, limit) -> (index, size)\n\n"
             "Dispatcher.offer_run's loop, compiled: appends an Envelope (no caller, its "
             "Invocation encoded by ``encoding``: (value type, prefixes, limit, fallback)) for "
             "each pair of ``messages[start:stop]`` while its id is ``id``, stopping after "
             "the one that takes ``size`` (the mailbox's length) past ``limit``.");

static PyObject *
mailbox_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("mailbox_run", nargs, 10) < 0) {
        return NULL;
    }
    PyObject *append = args[0], *messages = args[1], *id = args[4], *typename = args[5];
    PyObject *envelope_cls = args[6], *encoding = args[7];
    Py_ssize_t start, stop, size, limit;
    if (as_size(args[2], &start) < 0 || as_size(args[3], &stop) < 0 ||
        as_size(args[8], &size) < 0 || as_size(args[9], &limit) < 0) {
        return NULL;
    }
    if (!PyList_Check(messages) || !PyType_Check(envelope_cls) || !PyTuple_Check(encoding) ||
        PyTuple_GET_SIZE(encoding) != 4 || !PyList_Check(PyTuple_GET_ITEM(encoding, 1))) {
        PyErr_SetString(PyExc_TypeError,
                        "mailbox_run() needs a list, a class and an encoding of four");
        return NULL;
    }
    PyObject *value_type = PyTuple_GET_ITEM(encoding, 0);
    PyObject *prefixes = PyTuple_GET_ITEM(encoding, 1);
    Py_ssize_t prefix_limit;
    if (as_size(PyTuple_GET_ITEM(encoding, 2), &prefix_limit) < 0) {
        return NULL;
    }
    PyObject *fallback = PyTuple_GET_ITEM(encoding, 3);
    PyTypeObject *cls = (PyTypeObject *)envelope_cls;
    Layout envelope_layout, typed_layout;
    PyObject *envelope_names[ENV_COUNT] = {s_typename, s_id, s_value, s_caller, s_wire};
    layout_of(&envelope_layout, cls, envelope_names, ENV_COUNT);
    /* (the values are mostly of one class: the first one's) */
    PyObject *first = start < PyList_GET_SIZE(messages) ? PyList_GET_ITEM(messages, start) : NULL;
    typed_value_layout(&typed_layout, first != NULL && PyTuple_CheckExact(first) &&
                                              PyTuple_GET_SIZE(first) == 2
                                          ? Py_TYPE(PyTuple_GET_ITEM(first, 1))
                                          : &PyBaseObject_Type);
    Py_ssize_t index = start;
    while (index < stop && index < PyList_GET_SIZE(messages)) {
        PyObject *message = PyList_GET_ITEM(messages, index);
        if (!PyTuple_CheckExact(message) || PyTuple_GET_SIZE(message) != 2) {
            break; /* (not an (id, value) tuple: the Python loop takes it from here) */
        }
        Py_INCREF(message);
        int differs = PyObject_RichCompareBool(PyTuple_GET_ITEM(message, 0), id, Py_NE);
        if (differs != 0) {
            Py_DECREF(message);
            if (differs < 0) {
                return NULL;
            }
            break;
        }
        index++;
        PyObject *value = PyTuple_GET_ITEM(message, 1);
        PyObject *envelope = new_bare(cls);
        PyObject *wire = envelope == NULL
                             ? NULL
                             : encode_invocation(&typed_layout, value, value_type, prefixes,
                                                 prefix_limit, fallback);
        if (wire == NULL || layout_set(&envelope_layout, envelope, ENV_TYPENAME, typename) < 0 ||
            layout_set(&envelope_layout, envelope, ENV_ID, id) < 0 ||
            layout_set(&envelope_layout, envelope, ENV_VALUE, value) < 0 ||
            layout_set(&envelope_layout, envelope, ENV_CALLER, Py_None) < 0 ||
            layout_set(&envelope_layout, envelope, ENV_WIRE, wire) < 0) {
            Py_XDECREF(wire);
            Py_XDECREF(envelope);
            Py_DECREF(message);
            return NULL;
        }
        Py_DECREF(wire);
        Py_DECREF(message);
        PyObject *appended = call1(append, envelope);
        Py_DECREF(envelope);
        if (appended == NULL) {
            return NULL;
        }
        Py_DECREF(appended);
        size++;
        if (size > limit) {
            break;
        }
    }
    return Py_BuildValue("(nn)", index, size);
}

/* ---- invocation_wires ------------------------------------------------------------------ */

PyDoc_STRVAR(invocation_wires_doc,
             "invocation_wires(batch, encode) -> list\n\n"
             "The Invocation bytes of each envelope of the list ``batch``, in order, as "
             "runtime/_remote.py's encode_to_function gathers them: its ``wire`` encoded ahead, "
             "or (None) ``encode(envelope)``.");

static PyObject *
invocation_wires(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "invocation_wires() takes a list and a function");
        return NULL;
    }
    PyObject *batch = args[0], *encode = args[1];
    Py_ssize_t size = PyList_GET_SIZE(batch);
    PyObject *wires = PyList_New(size);
    if (wires == NULL) {
        return NULL;
    }
    Layout layout; /* (one class of envelope: the first one's) */
    PyObject *names[1] = {s_wire};
    layout_of(&layout, size ? Py_TYPE(PyList_GET_ITEM(batch, 0)) : &PyBaseObject_Type, names, 1);
    for (Py_ssize_t index = 0; index < size; index++) {
        if (PyList_GET_SIZE(batch) != size) {
            Py_DECREF(wires);
            PyErr_SetString(PyExc_RuntimeError, "invocation_wires(): the batch changed size");
            return NULL;
        }
        PyObject *envelope = Py_NewRef(PyList_GET_ITEM(batch, index));
        PyObject *wire = layout_get(&layout, envelope, 0);
        if (wire == Py_None) {
            Py_SETREF(wire, call1(encode, envelope));
        }
        Py_DECREF(envelope);
        if (wire == NULL) {
            Py_DECREF(wires);
            return NULL;
        }
        PyList_SET_ITEM(wires, index, wire);
    }
    return wires;
}

/* ---- produce_rows ---------------------------------------------------------------------- */

PyDoc_STRVAR(produce_rows_doc,
             "produce_rows(produce, rows, start, refused) -> (int, exception | None)\n\n"
             "egress/_kafka_librdkafka.py's Sender.send loop, compiled: ``produce(topic, value, "
             "key)`` for each row (topic, key, value, None) of the list ``rows`` from ``start`` "
             "on. Stops at the first row it did not hand over: one with headers or not a tuple "
             "of four (None), or one whose ``produce`` raised one of ``refused`` (that "
             "exception, for the Python loop to handle as its own call's). Any other exception "
             "propagates.");

static PyObject *
produce_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "produce_rows() takes a function, a list, a start "
                                         "and exception classes");
        return NULL;
    }
    PyObject *produce = args[0], *rows = args[1], *refused = args[3];
    Py_ssize_t index;
    if (as_size(args[2], &index) < 0) {
        return NULL;
    }
    for (; index >= 0 && index < PyList_GET_SIZE(rows); index++) {
        PyObject *row = PyList_GET_ITEM(rows, index);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 4 ||
            PyTuple_GET_ITEM(row, 3) != Py_None) {
            break;
        }
        Py_INCREF(row);
        PyObject *call[3] = {PyTuple_GET_ITEM(row, 0), PyTuple_GET_ITEM(row, 2),
                             PyTuple_GET_ITEM(row, 1)};
        PyObject *done = PyObject_Vectorcall(produce, call, 3, NULL);
        Py_DECREF(row);
        if (done == NULL) {
            if (!PyErr_ExceptionMatches(refused)) {
                return NULL;
            }
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (value != NULL && traceback != NULL) {
                PyException_SetTraceback(value, traceback);
            }
            Py_XDECREF(type);
            Py_XDECREF(traceback);
            if (value == NULL) {
                return NULL;
            }
            return Py_BuildValue("(nN)", index, value);
        }
        Py_DECREF(done);
    }
    return Py_BuildValue("(nO)", index, Py_None);
}

/* ---- protobuf's wire format, and text made once per run of the same bytes ---------------- */

/* A varint at data[*pos] below end: 0 on success, -1 if cut off or longer than 64 bits. */
static int
read_varint(const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos, unsigned long long *out)
{
    unsigned long long result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= end) {
            return -1;
        }
        unsigned char byte = data[(*pos)++];
        result |= (unsigned long long)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = result;
            return 0;
        }
    }
    return -1;
}

/* One field of a protobuf message at data[*pos]: its number and wire type, and for a
 * length-delimited field where its bytes are. 0: read (pos after it); -1: cut off or a wire
 * type this reader does not take (groups). */
typedef struct {
    unsigned long long number;
    int wire_type;
    unsigned long long varint; /* wire type 0 */
    Py_ssize_t start, length;  /* wire type 2 */
} Field;

static int
read_field(const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos, Field *field)
{
    unsigned long long tag;
    if (read_varint(data, end, pos, &tag) < 0) {
        return -1;
    }
    field->number = tag >> 3;
    field->wire_type = (int)(tag & 7);
    switch (field->wire_type) {
    case 0:
        return read_varint(data, end, pos, &field->varint);
    case 1:
        if (end - *pos < 8) {
            return -1;
        }
        *pos += 8;
        return 0;
    case 5:
        if (end - *pos < 4) {
            return -1;
        }
        *pos += 4;
        return 0;
    case 2: {
        unsigned long long length;
        if (read_varint(data, end, pos, &length) < 0 ||
            length > (unsigned long long)(end - *pos)) {
            return -1;
        }
        field->start = *pos;
        field->length = (Py_ssize_t)length;
        *pos += (Py_ssize_t)length;
        return 0;
    }
    default:
        return -1;
    }
}

/* The str of the last UTF-8 bytes decoded, for the next ones that are the same (consecutive
 * records mostly share their topic, egress id and type name). */
typedef struct {
    PyObject *text;  /* NULL: none yet */
    PyObject *owner; /* a reference to what holds ``data`` (NULL: the caller keeps it) */
    const unsigned char *data;
    Py_ssize_t length;
} TextCache;

/* The str of data[0:length] (a new reference), or NULL with UnicodeDecodeError set. */
static PyObject *
cached_text(TextCache *cache, const unsigned char *data, Py_ssize_t length, PyObject *owner)
{
    if (cache->text != NULL && cache->length == length &&
        memcmp(cache->data, data, length) == 0) {
        return Py_NewRef(cache->text);
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)data, length, NULL);
    if (text == NULL) {
        return NULL;
    }
    Py_XSETREF(cache->text, Py_NewRef(text));
    Py_XSETREF(cache->owner, Py_XNewRef(owner));
    cache->data = data;
    cache->length = length;
    return text;
}

static void
text_cache_clear(TextCache *cache)
{
    Py_CLEAR(cache->text);
    Py_CLEAR(cache->owner);
}

/* ---- kafka_rows ------------------------------------------------------------------------ */

/* A KafkaProducerRecord's three fields (key 1, value_bytes 2, topic 3; the last of the bytes
 * counts, a string at most once). 0: parsed; -1: anything else (another field or wire type, a
 * string twice, bytes cut off), which the Python code then reads and judges. */
static int
parse_producer_record(const unsigned char *data, Py_ssize_t size, Py_ssize_t starts[4],
                      Py_ssize_t lengths[4])
{
    Py_ssize_t pos = 0;
    Field field;
    for (int number = 1; number <= 3; number++) {
        starts[number] = 0;
        lengths[number] = 0;
    }
    int seen[4] = {0};
    while (pos < size) {
        if (read_field(data, size, &pos, &field) < 0 || field.wire_type != 2 ||
            field.number < 1 || field.number > 3) {
            return -1;
        }
        /* a string field twice: protobuf checks the UTF-8 of each, this reads the last */
        if (field.number != 2 && seen[field.number]++) {
            return -1;
        }
        starts[field.number] = field.start;
        lengths[field.number] = field.length;
    }
    return 0;
}

PyDoc_STRVAR(kafka_rows_doc,
             "kafka_rows(values, typename) -> list | None\n\n"
             "KafkaSink.write_many's usual case, compiled: (topic, key or None, value, None) "
             "for each typed value of the list ``values``, each a KafkaProducerRecord of type "
             "``typename`` with a topic; None when any is not (the Python code then decides).");

static PyObject *
kafka_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("kafka_rows", nargs, 2) < 0) {
        return NULL;
    }
    PyObject *values = args[0], *expected = args[1];
    if (!PyList_Check(values)) {
        Py_RETURN_NONE;
    }
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        return NULL;
    }
    TextCache topics = {0};
    PyObject *topic = NULL;
    Layout typed_layout; /* (the values are mostly of one class: the first one's) */
    typed_value_layout(&typed_layout, PyList_GET_SIZE(values)
                                          ? Py_TYPE(PyList_GET_ITEM(values, 0))
                                          : &PyBaseObject_Type);
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(values); index++) {
        PyObject *typed = Py_NewRef(PyList_GET_ITEM(values, index));
        PyObject *typename = layout_get(&typed_layout, typed, TV_TYPENAME);
        int same = typename == NULL ? -1 : PyObject_RichCompareBool(typename, expected, Py_EQ);
        Py_XDECREF(typename);
        PyObject *value = same > 0 ? layout_get(&typed_layout, typed, TV_VALUE) : NULL;
        Py_DECREF(typed);
        if (same < 0 || (same > 0 && value == NULL)) {
            goto error;
        }
        if (!same || !PyBytes_CheckExact(value)) {
            Py_XDECREF(value);
            goto other;
        }
        Py_ssize_t starts[4], lengths[4];
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(value);
        if (parse_producer_record(data, PyBytes_GET_SIZE(value), starts, lengths) < 0 ||
            lengths[3] == 0) {
            Py_DECREF(value);
            goto other;
        }
        const char *text = (const char *)data;
        Py_XSETREF(topic, cached_text(&topics, data + starts[3], lengths[3], value));
        if (topic == NULL) {
            Py_DECREF(value);
            PyErr_Clear();
            goto other;
        }
        PyObject *key;
        if (lengths[1] == 0) {
            key = Py_NewRef(Py_None);
        }
        else {
            key = PyUnicode_DecodeUTF8(text + starts[1], lengths[1], NULL);
            if (key == NULL) {
                Py_DECREF(value);
                PyErr_Clear();
                goto other;
            }
        }
        PyObject *payload = PyBytes_FromStringAndSize(text + starts[2], lengths[2]);
        Py_DECREF(value);
        if (payload == NULL) {
            Py_DECREF(key);
            goto error;
        }
        PyObject *row = PyTuple_New(4);
        if (row == NULL) {
            Py_DECREF(key);
            Py_DECREF(payload);
            goto error;
        }
        PyTuple_SET_ITEM(row, 0, Py_NewRef(topic));
        PyTuple_SET_ITEM(row, 1, key);
        PyTuple_SET_ITEM(row, 2, payload);
        PyTuple_SET_ITEM(row, 3, Py_NewRef(Py_None));
        int failed = PyList_Append(rows, row);
        Py_DECREF(row);
        if (failed) {
            goto error;
        }
    }
    Py_XDECREF(topic);
    text_cache_clear(&topics);
    return rows;
other:
    Py_XDECREF(topic);
    text_cache_clear(&topics);
    Py_DECREF(rows);
    Py_RETURN_NONE;
error:
    Py_XDECREF(topic);
    text_cache_clear(&topics);
    Py_DECREF(rows);
    return NULL;
}

/* ---- egress_groups --------------------------------------------------------------------- */

/* An EgressMessage's fields (its argument's merged from each occurrence, as protobuf merges
 * a message field that appears more than once). */
typedef struct {
    Py_ssize_t ns_start, ns_length, type_start, type_length;
    Py_ssize_t typename_start, typename_length, value_start, value_length;
    int has_value;
} Egress;

/* 0: parsed; -1: anything else (a known field of another wire type, bytes cut off). */
static int
parse_typed_value(const unsigned char *data, Py_ssize_t start, Py_ssize_t end, Egress *egress)
{
    Py_ssize_t pos = start;
    Field field;
    while (pos < end) {
        if (read_field(data, end, &pos, &field) < 0) {
            return -1;
        }
        if (field.number == 1 || field.number == 3) {
            if (field.wire_type != 2) {
                return -1;
            }
            if (field.number == 1) {
                egress->typename_start = field.start;
                egress->typename_length = field.length;
            }
            else {
                egress->value_start = field.start;
                egress->value_length = field.length;
            }
        }
        else if (field.number == 2) {
            if (field.wire_type != 0) {
                return -1;
            }
            egress->has_value = field.varint != 0;
        }
    }
    return 0;
}

static int
parse_egress(const unsigned char *data, Py_ssize_t start, Py_ssize_t end, Egress *egress)
{
    Py_ssize_t pos = start;
    Field field;
    memset(egress, 0, sizeof(*egress));
    while (pos < end) {
        if (read_field(data, end, &pos, &field) < 0) {
            return -1;
        }
        if (field.number >= 1 && field.number <= 3 && field.wire_type != 2) {
            return -1;
        }
        if (field.number == 1) {
            egress->ns_start = field.start;
            egress->ns_length = field.length;
        }
        else if (field.number == 2) {
            egress->type_start = field.start;
            egress->type_length = field.length;
        }
        else if (field.number == 3) {
            if (parse_typed_value(data, field.start, field.start + field.length, egress) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* What consecutive egress records share: their ids' parts, the id made of the last two, and
 * their type names. */
typedef struct {
    TextCache namespaces, types, typenames;
    PyObject *id, *id_namespace, *id_type; /* the last id and the two parts it was made of */
} EgressTexts;

static void
egress_texts_clear(EgressTexts *texts)
{
    text_cache_clear(&texts->namespaces);
    text_cache_clear(&texts->types);
    text_cache_clear(&texts->typenames);
    Py_CLEAR(texts->id);
    Py_CLEAR(texts->id_namespace);
    Py_CLEAR(texts->id_type);
}

/* The egress id "namespace/type" of ``egress`` (a new reference); NULL with an error set:
 * UnicodeDecodeError (not the usual case), or another. */
static PyObject *
egress_id(EgressTexts *texts, const unsigned char *data, const Egress *egress)
{
    PyObject *ns = cached_text(&texts->namespaces, data + egress->ns_start, egress->ns_length,
                               NULL);
    PyObject *type = ns == NULL ? NULL
                                : cached_text(&texts->types, data + egress->type_start,
                                              egress->type_length, NULL);
    PyObject *id = NULL;
    if (type != NULL) {
        if (texts->id != NULL && ns == texts->id_namespace && type == texts->id_type) {
            id = Py_NewRef(texts->id);
        }
        else if ((id = PyUnicode_FromFormat("%U/%U", ns, type)) != NULL) {
            Py_XSETREF(texts->id, Py_NewRef(id));
            Py_XSETREF(texts->id_namespace, Py_NewRef(ns));
            Py_XSETREF(texts->id_type, Py_NewRef(type));
        }
    }
    Py_XDECREF(ns);
    Py_XDECREF(type);
    return id;
}

/* Append the egress message to its egress id's list in ``groups``: 0, or -1 with an error
 * set, or 1: not the usual case (an egress id with a part missing, text not UTF-8). */
static int
group_egress(PyObject *groups, const unsigned char *data, const Egress *egress,
             const Layout *typed_layout, EgressTexts *texts)
{
    if (egress->ns_length == 0 || egress->type_length == 0) {
        return 1; /* (the Python code refuses the reply, saying why) */
    }
    PyObject *id = egress_id(texts, data, egress);
    PyObject *typename = id == NULL ? NULL
                                    : cached_text(&texts->typenames, data + egress->typename_start,
                                                  egress->typename_length, NULL);
    if (typename == NULL) {
        Py_XDECREF(id);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    /* (the bytes as sent, has_value or not, as protobuf's reading gives them) */
    PyObject *value = PyBytes_FromStringAndSize((const char *)data + egress->value_start,
                                                egress->value_length);
    PyObject *typed = value == NULL ? NULL : new_bare(typed_layout->cls);
    int failed = typed == NULL || layout_set(typed_layout, typed, TV_TYPENAME, typename) < 0 ||
                 layout_set(typed_layout, typed, TV_HAS_VALUE,
                            egress->has_value ? Py_True : Py_False) < 0 ||
                 layout_set(typed_layout, typed, TV_VALUE, value) < 0;
    Py_DECREF(typename);
    Py_XDECREF(value);
    if (!failed) {
        PyObject *records = PyDict_GetItemWithError(groups, id);
        if (records == NULL) {
            records = PyErr_Occurred() ? NULL : PyList_New(0);
            failed = records == NULL || PyDict_SetItem(groups, id, records) < 0;
            if (records != NULL) {
                Py_DECREF(records); /* (the dict holds it) */
            }
        }
        failed = failed || PyList_Append(records, typed) < 0;
    }
    Py_DECREF(id);
    Py_XDECREF(typed);
    return failed ? -1 : 0;
}

PyDoc_STRVAR(egress_groups_doc,
             "egress_groups(reply, typed_cls) -> dict | None\n\n"
             "The egress records of a FromFunction's invocation result, read from its bytes as "
             "Dispatcher._apply_remote groups them: egress id (\"namespace/type\") -> its "
             "records (``typed_cls`` values) in order, ids in the order they first appear; "
             "None when the reply is not the usual case (the Python code then reads it).");

static PyObject *
egress_groups(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "egress_groups() takes a reply and a class");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Layout typed_layout;
    typed_value_layout(&typed_layout, (PyTypeObject *)args[1]);
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t size = view.len, pos = 0;
    PyObject *groups = PyDict_New();
    EgressTexts texts = {0};
    int outcome = groups == NULL ? -1 : 0; /* 0 going, -1 error, 1 not the usual case */
    Field top, inner;
    while (outcome == 0 && pos < size) {
        if (read_field(data, size, &pos, &top) < 0 || top.number == 101 ||
            (top.number == 100 && top.wire_type != 2)) {
            outcome = 1; /* (a reply that asks for state, or that upb would judge) */
            break;
        }
        if (top.number != 100) {
            continue;
        }
        /* an InvocationResponse (more than one merge: their egress lists add up) */
        Py_ssize_t at = top.start, end = top.start + top.length;
        while (outcome == 0 && at < end) {
            if (read_field(data, end, &at, &inner) < 0 ||
                (inner.number >= 1 && inner.number <= 4 && inner.wire_type != 2)) {
                outcome = 1;
                break;
            }
            if (inner.number != 4) {
                continue;
            }
            Egress egress;
            if (parse_egress(data, inner.start, inner.start + inner.length, &egress) < 0) {
                outcome = 1;
                break;
            }
            outcome = group_egress(groups, data, &egress, &typed_layout, &texts);
        }
    }
    egress_texts_clear(&texts);
    PyBuffer_Release(&view);
    if (outcome == 0) {
        return groups;
    }
    Py_XDECREF(groups);
    if (outcome < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- the module ------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"kafka_run", (PyCFunction)(void (*)(void))kafka_run, METH_FASTCALL, kafka_run_doc},
    {"mailbox_run", (PyCFunction)(void (*)(void))mailbox_run, METH_FASTCALL, mailbox_run_doc},
    {"kafka_rows", (PyCFunction)(void (*)(void))kafka_rows, METH_FASTCALL, kafka_rows_doc},
    {"egress_groups", (PyCFunction)(void (*)(void))egress_groups, METH_FASTCALL,
     egress_groups_doc},
    {"invocation_wires", (PyCFunction)(void (*)(void))invocation_wires, METH_FASTCALL,
     invocation_wires_doc},
    {"produce_rows", (PyCFunction)(void (*)(void))produce_rows, METH_FASTCALL, produce_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hotloops_module = {
    PyModuleDef_HEAD_INIT,
    "statefun._hotloops",
    "The runtime's per-record loops on a remote function's hot path, compiled "
    "(statefun/_compiled.py chooses them).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int
intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__hotloops(void)
{
    if (intern(&s_typename, "typename") < 0 || intern(&s_has_value, "has_value") < 0 ||
        intern(&s_value, "value") < 0 || intern(&s_id, "id") < 0 ||
        intern(&s_caller, "caller") < 0 || intern(&s_wire, "wire") < 0 ||
        intern(&s_decode, "decode") < 0 || intern(&s_utf8, "utf-8") < 0 ||
        intern(&s_empty, "") < 0) {
        return NULL;
    }
    return PyModule_Create(&hotloops_module);
}

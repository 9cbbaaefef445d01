/* A remat-ir external solver in plain C, with no libraries: the proof that any
 * language can plan a graph (remat_ir.solvers.external documents the protocol).
 *
 *   cc -O2 -o external_solver external_solver.c
 *   remat-ir solve model.rir --solver exec:./external_solver -o planned.rir
 *
 * It reads the framed graph on stdin, decodes the few protobuf fields it needs
 * by hand (schemas/remat_ir.proto), and prints on stdout the store-everything
 * schedule: every forward node, then every backward node, in file order (the
 * library writes nodes in dependency order), each value freed right after its
 * last use. Graph inputs are resident and graph outputs must stay live, so
 * neither is ever freed. Progress goes to stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FORWARD = 1, BACKWARD = 2, HEURISTIC = 3 };
enum { VARINT = 0, FIXED64 = 1, BYTES = 2, FIXED32 = 5 };

static void die(const char *why) {
    fprintf(stderr, "external_solver: %s\n", why);
    exit(1);
}

/* ------------------------------------------------------------- decoding */

typedef struct { const uint8_t *p, *end; } Buf;

static uint64_t read_varint(Buf *b) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) die("truncated varint");
        uint8_t byte = *b->p++;
        x |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) return x;
    }
    die("varint longer than 10 bytes");
    return 0;
}

static Buf read_bytes(Buf *b) {  /* a length-delimited field's contents */
    uint64_t n = read_varint(b);
    if (n > (uint64_t)(b->end - b->p)) die("truncated length-delimited field");
    Buf inner = {b->p, b->p + n};
    b->p += n;
    return inner;
}

static void skip(Buf *b, int wire) {
    size_t n = 0;
    switch (wire) {
    case VARINT: read_varint(b); return;
    case BYTES: read_bytes(b); return;
    case FIXED64: n = 8; break;
    case FIXED32: n = 4; break;
    default: die("unsupported wire type");
    }
    if (n > (size_t)(b->end - b->p)) die("truncated fixed-size field");
    b->p += n;
}

typedef struct { int64_t *v; size_t n, cap; } Ints;

static void push(Ints *a, int64_t x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 8;
        if (!(a->v = realloc(a->v, a->cap * sizeof *a->v))) die("out of memory");
    }
    a->v[a->n++] = x;
}

/* A repeated int64 field, packed (wire type 2) or one element per tag. */
static void read_ints(Buf *b, int wire, Ints *into) {
    if (wire == BYTES) {
        Buf packed = read_bytes(b);
        while (packed.p < packed.end) push(into, (int64_t)read_varint(&packed));
    } else {
        push(into, (int64_t)read_varint(b));
    }
}

typedef struct { int64_t id; int phase; Ints inputs, outputs; } Node;

static Node *nodes;
static size_t n_nodes;
static Ints graph_inputs, graph_outputs;  /* value ids */
static char budget[32] = "none";

static Node parse_node(Buf b) {  /* Node: id 1, inputs 4, outputs 5, phase 8 */
    Node node = {0};
    while (b.p < b.end) {
        uint64_t tag = read_varint(&b);
        int field = (int)(tag >> 3), wire = (int)(tag & 7);
        if (field == 1 && wire == VARINT) node.id = (int64_t)read_varint(&b);
        else if (field == 4) read_ints(&b, wire, &node.inputs);
        else if (field == 5) read_ints(&b, wire, &node.outputs);
        else if (field == 8 && wire == VARINT) node.phase = (int)read_varint(&b);
        else skip(&b, wire);
    }
    return node;
}

static int64_t parse_value_id(Buf b) {  /* GraphInput / GraphOutput: value_id 1 */
    int64_t id = 0;
    while (b.p < b.end) {
        uint64_t tag = read_varint(&b);
        if (tag == (1 << 3 | VARINT)) id = (int64_t)read_varint(&b);
        else skip(&b, (int)(tag & 7));
    }
    return id;
}

static void parse_metadata_entry(Buf b) {  /* map entry: key 1, value 2 */
    Buf key = {0}, value = {0};
    while (b.p < b.end) {
        uint64_t tag = read_varint(&b);
        if (tag == (1 << 3 | BYTES)) key = read_bytes(&b);
        else if (tag == (2 << 3 | BYTES)) value = read_bytes(&b);
        else skip(&b, (int)(tag & 7));
    }
    const char *wanted = "remat_ir.solve.budget_bytes";
    size_t n = (size_t)(value.end - value.p);
    if ((size_t)(key.end - key.p) == strlen(wanted) && !memcmp(key.p, wanted, strlen(wanted))
        && n < sizeof budget) {
        memcpy(budget, value.p, n);
        budget[n] = 0;
    }
}

static void parse_graph(Buf b) {  /* Graph: nodes 6, inputs 7, outputs 8, metadata 11 */
    size_t cap = 0;
    while (b.p < b.end) {
        uint64_t tag = read_varint(&b);
        int field = (int)(tag >> 3), wire = (int)(tag & 7);
        if (wire == BYTES && field == 6) {
            if (n_nodes == cap && !(nodes = realloc(nodes, (cap = cap ? 2 * cap : 64) * sizeof *nodes)))
                die("out of memory");
            nodes[n_nodes++] = parse_node(read_bytes(&b));
        } else if (wire == BYTES && field == 7) push(&graph_inputs, parse_value_id(read_bytes(&b)));
        else if (wire == BYTES && field == 8) push(&graph_outputs, parse_value_id(read_bytes(&b)));
        else if (wire == BYTES && field == 11) parse_metadata_entry(read_bytes(&b));
        else skip(&b, wire);
    }
}

/* ------------------------------------------------------------- encoding */

static uint8_t *out;
static size_t out_n, out_cap;

static void emit_byte(uint8_t byte) {
    if (out_n == out_cap && !(out = realloc(out, out_cap = out_cap ? 2 * out_cap : 4096)))
        die("out of memory");
    out[out_n++] = byte;
}

static void emit_varint(uint64_t x) {
    for (; x >= 0x80; x >>= 7) emit_byte((uint8_t)(x | 0x80));
    emit_byte((uint8_t)x);
}

/* Schedule.steps (field 3) holds a Step: compute = 1 (node id) or free = 2 (value id).
 * The Step is 1 tag byte plus the id's varint, so its length fits in one byte. */
static void emit_step(int action, int64_t id) {
    uint8_t len = 1;
    for (uint64_t x = (uint64_t)id; x >= 0x80; x >>= 7) len++;
    emit_byte(3 << 3 | BYTES);
    emit_byte((uint8_t)(len + 1));
    emit_byte((uint8_t)(action << 3 | VARINT));
    emit_varint((uint64_t)id);
}

/* ------------------------------------------------------------- planning */

static int cmp_ids(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(void) {
    uint8_t *raw = NULL;  /* all of stdin */
    size_t n = 0, cap = 0, got;
    do {
        if (n == cap && !(raw = realloc(raw, cap = cap ? 2 * cap : 1 << 16))) die("out of memory");
        got = fread(raw + n, 1, cap - n, stdin);
        n += got;
    } while (got > 0);
    if (n < 20 || memcmp(raw, "RMIR", 4)) die("stdin is not a framed remat IR graph");
    uint64_t length = 0;  /* header: magic, major, minor, payload length (LE u64), CRC-32 */
    for (int i = 7; i >= 0; i--) length = length << 8 | raw[8 + i];
    if (length != n - 20) die("the graph on stdin is truncated");
    parse_graph((Buf){raw + 20, raw + n});

    /* Value ids written by the library are small and dense: index arrays by id. */
    int64_t max_id = 0;
    for (size_t i = 0; i < n_nodes; i++)
        for (size_t k = 0; k < nodes[i].outputs.n; k++)
            if (nodes[i].outputs.v[k] > max_id) max_id = nodes[i].outputs.v[k];
    if (max_id >= (1 << 26)) die("value ids above 2^26 are not supported");
    char *keep = calloc((size_t)max_id + 1, 1);       /* graph outputs: never freed */
    long *last = malloc(((size_t)max_id + 1) * sizeof *last);  /* position of last use */
    if (!keep || !last) die("out of memory");
    for (size_t k = 0; k < graph_outputs.n; k++)
        if (graph_outputs.v[k] >= 0 && graph_outputs.v[k] <= max_id) keep[graph_outputs.v[k]] = 1;

    /* The compute order: forward nodes, then backward nodes, each in file order. */
    size_t *order = malloc((n_nodes + 1) * sizeof *order), forward = 0, steps = 0;
    if (!order) die("out of memory");
    for (int phase = FORWARD; phase <= BACKWARD; phase++)
        for (size_t i = 0; i < n_nodes; i++)
            if (nodes[i].phase == phase) order[steps++] = i;
    for (size_t i = 0; i < n_nodes; i++) forward += nodes[i].phase == FORWARD;
    fprintf(stderr, "c solver: %zu nodes (%zu forward, %zu backward), %zu graph inputs, "
            "budget %s\n", n_nodes, forward, steps - forward, graph_inputs.n, budget);

    /* Only values some node computes can be freed; graph inputs and constants never are. */
    for (int64_t v = 0; v <= max_id; v++) last[v] = -1;
    for (size_t pos = 0; pos < steps; pos++) {  /* producers come before their users */
        Node *node = &nodes[order[pos]];
        for (size_t k = 0; k < node->inputs.n; k++) {
            int64_t v = node->inputs.v[k];
            if (v >= 0 && v <= max_id && last[v] >= 0) last[v] = (long)pos;
        }
        for (size_t k = 0; k < node->outputs.n; k++) last[node->outputs.v[k]] = (long)pos;
    }

    const char *name = "c-store-all";  /* Schedule.name = 1 */
    emit_byte(1 << 3 | BYTES);
    emit_varint(strlen(name));
    for (const char *c = name; *c; c++) emit_byte((uint8_t)*c);
    size_t emitted = 0, backward_start = 0;
    Ints frees = {0};
    for (size_t pos = 0; pos < steps; pos++) {
        Node *node = &nodes[order[pos]];
        emit_step(1, node->id), emitted++;
        /* A value whose life ends here is one of this node's inputs or outputs. */
        frees.n = 0;
        for (size_t k = 0; k < node->inputs.n; k++) push(&frees, node->inputs.v[k]);
        for (size_t k = 0; k < node->outputs.n; k++) push(&frees, node->outputs.v[k]);
        qsort(frees.v, frees.n, sizeof *frees.v, cmp_ids);
        for (size_t k = 0; k < frees.n; k++) {
            int64_t v = frees.v[k];
            if ((k > 0 && frees.v[k - 1] == v) || v < 0 || v > max_id) continue;
            if (last[v] == (long)pos && !keep[v]) emit_step(2, v), emitted++;
        }
        if (pos + 1 == forward) backward_start = emitted;
    }
    emit_byte(4 << 3 | VARINT);  /* Schedule.backward_start = 4 */
    emit_varint(backward_start);
    emit_byte(7 << 3 | VARINT);  /* Schedule.status = 7 */
    emit_varint(HEURISTIC);
    if (fwrite(out, 1, out_n, stdout) != out_n || fflush(stdout)) die("cannot write stdout");
    fprintf(stderr, "c solver: %zu steps, backward starts at step %zu\n", emitted, backward_start);
    return 0;
}

/* diag.capture._ctcp: the per-packet TCP state machine of tcpstate.analyze_packets, one packet at a time.
 *
 * Wireshark 4.0's tcp_analyze_sequence_number as diag implements it (docs/analyzer.md), plus diag's extras
 * (unwrapped sequence numbers, new bytes, bytes in flight, scaled window, ACK and TSval/TSecr RTTs). The
 * numpy code in tcpstate.py is this kernel's twin: both compute identical columns, and the tests hold them
 * to each other. Everything here follows the numpy twin's definitions, which are stated there and in
 * docs/analyzer.md; the comments below say only what the sequential form changes.
 *
 * State lives in an Analyzer object, per direction (group = conn * 2 + direction), so the packets can be
 * fed in several chunks with the same result as one feed. The only thing a later packet can change about
 * an earlier one is an RTT sample whose two ends came in the "wrong" file order (an ACK or TSecr echo
 * before the segment or TSval it matches, possible with equal or out-of-order timestamps): such a sample
 * is written into the output when its row is in the current chunk, else returned by feed() as a late
 * (row, value) pair for the caller to apply.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

#define EMPTY (-(INT64_C(1) << 44)) /* "no sequence number yet" (tcpstate's -_GROUP_SPAN) */
#define LOW32 INT64_C(0xFFFFFFFF)   /* tshark's unsigned -1 duplicate-ACK counter */
#define FAST_RETRANSMISSION_WINDOW_NS INT64_C(20000000)
#define DEFAULT_OOO_THRESHOLD_NS INT64_C(3000000)

/* ------------------------------------------------------------------------------------------------------
 * A hash map from (group, 64-bit position) to a timestamp and two "seen" bits, open addressing with
 * linear probing. Used for the data-end -> ACK and TSval -> TSecr matches.
 */
#define SLOT_USED 1u
#define SLOT_FIRST 2u  /* the segment (or TSval sender) was seen: ts is its time */
#define SLOT_SECOND 4u /* the first ACK (or TSecr echo) was seen */

typedef struct {
    int64_t pos;
    int64_t ts;
    uint32_t group;
    uint32_t bits;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask; /* capacity - 1 (capacity a power of two), 0 when not allocated */
    size_t count;
    int shift;   /* 64 - log2(capacity) */
} Map;

static inline uint64_t map_hash(uint32_t group, int64_t pos) {
    uint64_t h = (uint64_t)pos * UINT64_C(0x9E3779B97F4A7C15);
    h ^= (uint64_t)group * UINT64_C(0xC2B2AE3D27D4EB4F);
    h ^= h >> 31;
    return h * UINT64_C(0x94D049BB133111EB);
}

static int map_init(Map *m, int bits) {
    size_t cap = (size_t)1 << bits;
    m->slots = (Slot *)calloc(cap, sizeof(Slot));
    if (!m->slots)
        return -1;
    m->mask = cap - 1;
    m->count = 0;
    m->shift = 64 - bits;
    return 0;
}

static void map_free(Map *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->count = 0;
}

static int map_grow(Map *m) {
    Map bigger;
    int bits = 64 - m->shift + 1;
    if (bits > 60 || map_init(&bigger, bits) < 0)
        return -1;
    for (size_t i = 0; i <= m->mask; i++) {
        Slot *s = &m->slots[i];
        if (!(s->bits & SLOT_USED))
            continue;
        size_t j = (size_t)(map_hash(s->group, s->pos) >> bigger.shift);
        while (bigger.slots[j].bits & SLOT_USED)
            j = (j + 1) & bigger.mask;
        bigger.slots[j] = *s;
    }
    bigger.count = m->count;
    free(m->slots);
    *m = bigger;
    return 0;
}

/* The slot of (group, pos), inserted (bits = SLOT_USED) when absent; NULL when out of memory. */
static Slot *map_get(Map *m, uint32_t group, int64_t pos) {
    if (!m->slots && map_init(m, 12) < 0)
        return NULL;
    size_t j = (size_t)(map_hash(group, pos) >> m->shift);
    for (;;) {
        Slot *s = &m->slots[j];
        if (!(s->bits & SLOT_USED))
            break;
        if (s->pos == pos && s->group == group)
            return s;
        j = (j + 1) & m->mask;
    }
    if ((m->count + 1) * 5 > (m->mask + 1) * 3) { /* keep the load under 0.6 */
        if (map_grow(m) < 0)
            return NULL;
        j = (size_t)(map_hash(group, pos) >> m->shift);
        while (m->slots[j].bits & SLOT_USED)
            j = (j + 1) & m->mask;
    }
    Slot *s = &m->slots[j];
    s->pos = pos;
    s->group = group;
    s->ts = 0;
    s->bits = SLOT_USED;
    m->count++;
    return s;
}

static Slot *map_find(const Map *m, uint32_t group, int64_t pos) {
    if (!m->slots)
        return NULL;
    size_t j = (size_t)(map_hash(group, pos) >> m->shift);
    for (;;) {
        Slot *s = &m->slots[j];
        if (!(s->bits & SLOT_USED))
            return NULL;
        if (s->pos == pos && s->group == group)
            return s;
        j = (j + 1) & m->mask;
    }
}

/* ------------------------------------------------------------------------------------------------------
 * Growable arrays.
 */
typedef struct {
    int64_t row;
    int64_t value; /* a timestamp (waiting ends) or an RTT (late samples) */
} RowValue;

typedef struct {
    RowValue *items;
    size_t len, cap;
} RowValues;

static int rv_push(RowValues *v, int64_t row, int64_t value) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 2;
        RowValue *items = (RowValue *)realloc(v->items, cap * sizeof(RowValue));
        if (!items)
            return -1;
        v->items = items;
        v->cap = cap;
    }
    v->items[v->len].row = row;
    v->items[v->len].value = value;
    v->len++;
    return 0;
}

/* ACKs sent before the acked direction's first packet: their target is known only once that packet gives
 * the acked direction's first sequence number (the anchor of the ACK unwrap). */
typedef struct {
    int64_t local; /* the ACK unwrapped in the acking direction's own space */
    int64_t row;
    int64_t ts;
} EarlyAck;

typedef struct {
    EarlyAck *items;
    size_t len, cap;
} EarlyAcks;

/* The ends of a direction's first (non-retransmitted) data segments while they only grow - the usual
 * case - in an array sorted by construction: appending and binary search instead of a hash map insert per
 * segment (a cache miss each). An end at or below the largest one goes to the hash map (see data_end_seen). */
typedef struct {
    int64_t pos;
    int64_t ts;
} End;

typedef struct {
    End *items;
    uint8_t *acked; /* its first ACK was seen */
    size_t len, cap;
    /* Bounded memory (Analyzer(spill_window=W)): when the array holds W ends, its older half goes to a
     * temporary file, still sorted (every end there lies below the array's first), as 24-byte records
     * (pos, ts, acked). tshark's analysis never forgets an end - a retransmission or a late ACK of any age
     * must find it - so the old ends are kept, on disk; they are read back only for such rare packets. */
    FILE *disk;
    int64_t on_disk;
    int io_error;
} Ends;

#define END_RECORD_BYTES 24
#define SPILL_BATCH 4096

/* A temporary file in $TMPDIR (else /tmp), unlinked at once: tmpfile() would ignore TMPDIR, and the ends of a
 * long capture are ~0.5 GB a 20 M segments, so a user with a small /tmp must be able to move them. */
static FILE *spill_file(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char path[4096];
    if (snprintf(path, sizeof path, "%s/diag-ends-XXXXXX", dir) >= (int)sizeof path)
        return NULL;
    int fd = mkstemp(path);
    if (fd < 0)
        return NULL;
    unlink(path);
    FILE *file = fdopen(fd, "w+b");
    if (!file)
        close(fd);
    return file;
}

static int ends_spill(Ends *v) {
    if (!v->disk) {
        v->disk = spill_file();
        if (!v->disk) {
            v->io_error = 1;
            return -1;
        }
    }
    size_t half = v->len / 2;
    int fd = fileno(v->disk);
    int64_t batch[3 * SPILL_BATCH];
    for (size_t k = 0; k < half; k += SPILL_BATCH) {
        size_t n = half - k < SPILL_BATCH ? half - k : SPILL_BATCH;
        for (size_t i = 0; i < n; i++) {
            batch[3 * i] = v->items[k + i].pos;
            batch[3 * i + 1] = v->items[k + i].ts;
            batch[3 * i + 2] = v->acked[k + i];
        }
        size_t bytes = n * END_RECORD_BYTES;
        off_t at = (off_t)(v->on_disk + (int64_t)k) * END_RECORD_BYTES;
        if (pwrite(fd, batch, bytes, at) != (ssize_t)bytes) {
            v->io_error = 1;
            return -1;
        }
    }
    memmove(v->items, v->items + half, (v->len - half) * sizeof(End));
    memmove(v->acked, v->acked + half, v->len - half);
    v->len -= half;
    v->on_disk += (int64_t)half;
    return 0;
}

static int ends_push(Ends *v, int64_t pos, int64_t ts, size_t window) {
    if (window && v->len >= window && ends_spill(v) < 0)
        return -1;
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4; /* small first: a SYN-only direction holds one end */
        End *items = (End *)realloc(v->items, cap * sizeof(End));
        if (!items)
            return -1;
        v->items = items;
        uint8_t *acked = (uint8_t *)realloc(v->acked, cap);
        if (!acked)
            return -1;
        v->acked = acked;
        v->cap = cap;
    }
    v->items[v->len].pos = pos;
    v->items[v->len].ts = ts;
    v->acked[v->len] = 0;
    v->len++;
    return 0;
}

/* Where an end was found: in the array (index) or on disk (record), with its time and ACK flag. */
typedef struct {
    int found;
    int on_disk;
    int64_t index;
    int64_t ts;
    int acked;
} EndRef;

/* Find pos among the ends (array, then disk). Returns -1 on a read error, else 0 (ref->found says). */
static int ends_lookup(Ends *v, int64_t pos, EndRef *ref) {
    ref->found = 0;
    if (v->len && pos >= v->items[0].pos) {
        size_t lo = 0, hi = v->len;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (v->items[mid].pos < pos)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < v->len && v->items[lo].pos == pos) {
            ref->found = 1;
            ref->on_disk = 0;
            ref->index = (int64_t)lo;
            ref->ts = v->items[lo].ts;
            ref->acked = v->acked[lo];
        }
        return 0;
    }
    if (!v->on_disk)
        return 0;
    int fd = fileno(v->disk);
    int64_t lo = 0, hi = v->on_disk, record[3];
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (pread(fd, record, END_RECORD_BYTES, (off_t)mid * END_RECORD_BYTES) != END_RECORD_BYTES) {
            v->io_error = 1;
            return -1;
        }
        if (record[0] < pos) {
            lo = mid + 1;
        } else if (record[0] > pos) {
            hi = mid;
        } else {
            ref->found = 1;
            ref->on_disk = 1;
            ref->index = mid;
            ref->ts = record[1];
            ref->acked = record[2] != 0;
            return 0;
        }
    }
    return 0;
}

static int ends_set_acked(Ends *v, const EndRef *ref) {
    if (!ref->on_disk) {
        v->acked[ref->index] = 1;
        return 0;
    }
    int64_t one = 1;
    if (pwrite(fileno(v->disk), &one, sizeof one, (off_t)ref->index * END_RECORD_BYTES + 16) != sizeof one) {
        v->io_error = 1;
        return -1;
    }
    return 0;
}

static void ends_free(Ends *v) {
    free(v->items);
    free(v->acked);
    if (v->disk)
        fclose(v->disk);
}

/* ------------------------------------------------------------------------------------------------------
 * Per-direction state.
 */
typedef struct {
    /* sequence numbers */
    int64_t seq_rel;        /* of the last packet */
    int64_t nextseq;        /* tshark's nextseq, EMPTY before the first packet */
    int64_t nextseq_time;   /* when nextseq was last raised, 0 before */
    int64_t data_end;       /* highest seq + len of data, EMPTY before any data */
    uint32_t seq32;         /* of the last packet */
    uint32_t first_seq32;
    /* ACK numbers, unwrapped in this direction's own space from its first packet's ACK field */
    uint32_t first_ack32;
    uint32_t ack_filled32;  /* the last ACK field, carried over packets without the ACK flag */
    int64_t ack_local;      /* of the last packet */
    /* the last packet */
    int64_t last_ts;
    uint32_t last_ack32;
    uint16_t last_win;
    uint8_t last_flags;
    uint8_t last_keep_alive;
    uint8_t seen;
    uint8_t ack_flag_seen;
    /* duplicate-ACK counter since the ACK number last changed; reads tshark's unsigned -1 after an
     * ACKed-unseen reset while it is 0 (minus_one), and before this direction's next packet (reset_pending) */
    uint8_t minus_one;
    uint8_t reset_pending;
    uint8_t lagging;        /* maxseqtobeacked behind nextseq, at lag_level */
    uint8_t tsval_known;
    uint8_t tsecr_known;
    uint8_t ack_target_known;
    int64_t dupacks;
    int64_t lag_level;
    /* the last key this direction sent to each RTT map (a repeat cannot change anything) */
    uint32_t last_tsval;
    uint32_t last_tsecr;
    int64_t last_ack_target;
    EarlyAcks early;
    Ends ends;
    int64_t ack_map_max; /* the highest ACK target of this direction's data in ack_map (EMPTY: none) */
    int64_t ack_max;     /* the highest ACK this direction sent, in its ack_local space (EMPTY: none) */
} Direction;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ngroups;
    Direction *dirs;
    int64_t *wscale;    /* per group */
    int64_t *ooo_threshold; /* per connection */
    Map ack_map;        /* (acked group, end) -> first non-retransmitted data segment, first ACK */
    Map ack_waiting;    /* (acked group, end) -> index into waiting_acks: a first ACK before its data */
    RowValues waiting_acks;
    Map ts_map;         /* (sender group, TSval) -> first sender, first echo */
    Map ts_waiting;
    RowValues waiting_echoes;
    int64_t rows;       /* packets fed so far */
    size_t spill_window; /* ends kept in memory per direction before the older half goes to disk (0: all) */
    int busy;
    int broken;
} Analyzer;

/* Where one feed writes; RTT samples for rows before `first_row` go to the late lists. */
typedef struct {
    int64_t first_row;
    int64_t *ack_rtt;
    int64_t *ts_rtt;
    RowValues late_ack;
    RowValues late_ts;
} Sink;

static inline int32_t as_int32(uint32_t v) { return (int32_t)v; }

/* a - b modulo 2**64, as numpy's int64 arithmetic wraps (timestamps come from untrusted files) */
static inline int64_t wrapping_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }

static inline int64_t shift_left(int64_t value, int64_t shift) {
    /* numpy's int64 left shift: 0 for shifts of 64 or more, modulo 2**64 otherwise */
    if (shift >= 64)
        return 0;
    return (int64_t)((uint64_t)value << shift);
}

static inline int64_t anchor_of(const Direction *acking, const Direction *acked) {
    /* The offset from the acking direction's own ACK space to the acked direction's seq_rel space. */
    return as_int32(acking->first_ack32 - acked->first_seq32);
}

static int emit(Sink *sink, RowValues *late, int64_t *out, int64_t row, int64_t value) {
    if (row >= sink->first_row) {
        out[row - sink->first_row] = value;
        return 0;
    }
    return rv_push(late, row, value);
}

/* The first segment (or TSval sender) of a key. */
static int match_first(Map *map, Map *waiting, RowValues *waits, Sink *sink, RowValues *late, int64_t *out,
                       uint32_t group, int64_t pos, int64_t ts) {
    Slot *s = map_get(map, group, pos);
    if (!s)
        return -1;
    if (s->bits & SLOT_FIRST)
        return 0;
    s->bits |= SLOT_FIRST;
    s->ts = ts;
    if (s->bits & SLOT_SECOND) { /* its first ACK came earlier in the file */
        Slot *w = map_find(waiting, group, pos);
        if (w) {
            RowValue *ack = &waits->items[w->ts];
            int64_t delta = wrapping_sub(ack->value, ts);
            if (delta >= 0 && emit(sink, late, out, ack->row, delta) < 0)
                return -1;
        }
    }
    return 0;
}

/* The first ACK (or TSecr echo) of a key. */
static int match_second(Map *map, Map *waiting, RowValues *waits, Sink *sink, RowValues *late, int64_t *out,
                        uint32_t group, int64_t pos, int64_t row, int64_t ts) {
    Slot *s = map_get(map, group, pos);
    if (!s)
        return -1;
    if (s->bits & SLOT_SECOND)
        return 0;
    s->bits |= SLOT_SECOND;
    if (s->bits & SLOT_FIRST) {
        int64_t delta = wrapping_sub(ts, s->ts);
        if (delta >= 0)
            return emit(sink, late, out, row, delta);
        return 0;
    }
    Slot *w = map_get(waiting, group, pos);
    if (!w)
        return -1;
    w->ts = (int64_t)waits->len;
    return rv_push(waits, row, ts);
}

/* An ACK whose target (in the acked direction's seq_rel space) is `target`. */
static int ack_seen(Analyzer *a, Sink *sink, uint32_t acked_group, int64_t target, int64_t row, int64_t ts) {
    Ends *ends = &a->dirs[acked_group].ends;
    if (ends->len && target <= ends->items[ends->len - 1].pos) {
        EndRef ref;
        if (ends_lookup(ends, target, &ref) < 0)
            return -1;
        if (ref.found) {
            if (ref.acked)
                return 0;
            if (ends_set_acked(ends, &ref) < 0)
                return -1;
            int64_t delta = wrapping_sub(ts, ref.ts);
            return delta >= 0 ? emit(sink, &sink->late_ack, sink->ack_rtt, row, delta) : 0;
        }
    }
    if (target > a->dirs[acked_group].ack_map_max)
        a->dirs[acked_group].ack_map_max = target;
    return match_second(&a->ack_map, &a->ack_waiting, &a->waiting_acks, sink, &sink->late_ack, sink->ack_rtt,
                        acked_group, target, row, ts);
}

/* A non-retransmitted data segment of `group` ending at `end`. A position lives either in the sorted
 * array or in the hash map, never in both: an end above the array's last is appended unless the map
 * already knows it (an earlier ACK waiting for it); an end at or below it that the array lacks goes to
 * the map. */
static int data_end_seen(Analyzer *a, Sink *sink, uint32_t group, int64_t end, int64_t ts) {
    Ends *ends = &a->dirs[group].ends;
    if (!ends->len || end > ends->items[ends->len - 1].pos) {
        /* the map can know an end above the array only as the target of an earlier ACK */
        if (end > a->dirs[group].ack_map_max || !map_find(&a->ack_map, group, end))
            return ends_push(ends, end, ts, a->spill_window);
    } else {
        EndRef ref;
        if (ends_lookup(ends, end, &ref) < 0)
            return -1;
        if (ref.found)
            return 0; /* not the first segment with this end */
    }
    return match_first(&a->ack_map, &a->ack_waiting, &a->waiting_acks, sink, &sink->late_ack, sink->ack_rtt,
                       group, end, ts);
}

/* The acked direction's first packet: the ACKs that came before it get their targets. */
static int flush_early_acks(Analyzer *a, Sink *sink, Py_ssize_t acking) {
    Direction *d = &a->dirs[acking];
    Direction *acked = &a->dirs[acking ^ 1];
    int64_t anchor = anchor_of(d, acked);
    for (size_t k = 0; k < d->early.len; k++) {
        EarlyAck *e = &d->early.items[k];
        if (ack_seen(a, sink, (uint32_t)(acking ^ 1), e->local + anchor, e->row, e->ts) < 0)
            return -1;
    }
    free(d->early.items);
    d->early.items = NULL;
    d->early.len = d->early.cap = 0;
    return 0;
}

static int early_push(EarlyAcks *v, int64_t local, int64_t row, int64_t ts) {
    if (v->len && v->items[v->len - 1].local == local)
        return 0; /* a repeat is never the first ACK of its target */
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 2;
        EarlyAck *items = (EarlyAck *)realloc(v->items, cap * sizeof(EarlyAck));
        if (!items)
            return -1;
        v->items = items;
        v->cap = cap;
    }
    v->items[v->len].local = local;
    v->items[v->len].row = row;
    v->items[v->len].ts = ts;
    v->len++;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------
 * Buffers.
 */
enum { SIGNED, UNSIGNED, BOOLEAN };

typedef struct {
    const char *name;
    int kind;
    Py_ssize_t itemsize;
    int writable;
    int optional; /* None is accepted: the output is not written */
} Spec;

#define NINPUTS 11
#define NOUTPUTS 16
#define NBUFFERS (NINPUTS + NOUTPUTS)

static const Spec SPECS[NBUFFERS] = {
    {"conn", SIGNED, 4, 0},
    {"direction", SIGNED, 1, 0},
    {"ts_ns", SIGNED, 8, 0},
    {"seq", UNSIGNED, 4, 0},
    {"ack", UNSIGNED, 4, 0},
    {"plen", SIGNED, 4, 0},
    {"win", UNSIGNED, 2, 0},
    {"flags", UNSIGNED, 1, 0},
    {"tsval", UNSIGNED, 4, 0},
    {"tsecr", UNSIGNED, 4, 0},
    {"has_ts", BOOLEAN, 1, 0},
    {"seq_rel", SIGNED, 8, 1, 1},
    {"end_rel", SIGNED, 8, 1, 1},
    {"new_bytes", SIGNED, 8, 1},
    {"retransmission", BOOLEAN, 1, 1},
    {"fast_retransmission", BOOLEAN, 1, 1},
    {"spurious_retransmission", BOOLEAN, 1, 1},
    {"out_of_order", BOOLEAN, 1, 1},
    {"lost_segment", BOOLEAN, 1, 1},
    {"dup_ack", BOOLEAN, 1, 1},
    {"zero_window", BOOLEAN, 1, 1},
    {"window_full", BOOLEAN, 1, 1},
    {"in_flight", SIGNED, 8, 1},
    {"window_bytes", SIGNED, 4, 1},
    {"ack_rtt_ns", SIGNED, 8, 1},
    {"ts_rtt_ns", SIGNED, 8, 1},
    {"peer_in_flight", SIGNED, 4, 1},
};

static const char *kind_name(int kind) {
    return kind == SIGNED ? "int" : kind == UNSIGNED ? "uint" : "bool";
}

/* The element kind of a struct-module format, or -1 when it is not a native-order integer or bool. */
static int format_kind(const char *format) {
    if (!format)
        return UNSIGNED; /* a plain byte buffer */
    if (*format == '@' || *format == '=' || *format == '<') {
#if PY_BIG_ENDIAN
        if (*format == '<')
            return -1;
#endif
        format++;
    }
    if (strlen(format) != 1)
        return -1;
    switch (*format) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
        return SIGNED;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
        return UNSIGNED;
    case '?':
        return BOOLEAN;
    default:
        return -1;
    }
}

static int get_buffer(PyObject *obj, const Spec *spec, Py_buffer *view, Py_ssize_t n) {
    if (obj == Py_None && spec->optional) {
        memset(view, 0, sizeof(*view)); /* buf NULL: not written; PyBuffer_Release ignores a NULL obj */
        return 0;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (spec->writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: needs a C-contiguous%s buffer (a numpy array) of %s%zd",
                     spec->name, spec->writable ? ", writable" : "", kind_name(spec->kind), spec->itemsize * 8);
        return -1;
    }
    int kind = format_kind(view->format);
    if (view->itemsize != spec->itemsize || kind != spec->kind
        || (spec->kind == BOOLEAN && view->itemsize != 1)) {
        PyErr_Format(PyExc_ValueError, "%s: needs dtype %s%zd, got format '%s' of %zd bytes", spec->name,
                     kind_name(spec->kind), spec->itemsize * 8, view->format ? view->format : "B",
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (n >= 0 && view->len != n * spec->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: has %zd entries, conn has %zd", spec->name,
                     view->len / spec->itemsize, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------
 * The per-packet loop (runs without the GIL). Returns 0, or -1 when out of memory.
 */
typedef struct {
    const int32_t *conn;
    const int8_t *direction;
    const int64_t *ts;
    const uint32_t *seq;
    const uint32_t *ack;
    const int32_t *plen;
    const uint16_t *win;
    const uint8_t *flags;
    const uint32_t *tsval;
    const uint32_t *tsecr;
    const uint8_t *has_ts;
    int64_t *seq_rel;
    int64_t *end_rel;
    int64_t *new_bytes;
    uint8_t *retransmission;
    uint8_t *fast;
    uint8_t *spurious;
    uint8_t *ooo;
    uint8_t *lost;
    uint8_t *dup_ack;
    uint8_t *zero_window;
    uint8_t *window_full;
    int64_t *in_flight;
    int32_t *window_bytes;
    int64_t *ack_rtt;
    int64_t *ts_rtt;
    int32_t *peer_in_flight;
} Columns;

static int run(Analyzer *a, const Columns *c, Py_ssize_t n, Sink *sink) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t row = sink->first_row + i;
        c->ack_rtt[i] = -1; /* before this row's matches: they write only this row or earlier ones */
        c->ts_rtt[i] = -1;
        const Py_ssize_t conn = c->conn[i];
        const Py_ssize_t g = conn * 2 + c->direction[i];
        Direction *d = &a->dirs[g];
        Direction *rev = &a->dirs[g ^ 1];
        const uint8_t flags = c->flags[i];
        const int64_t plen = c->plen[i];
        const int64_t ts = c->ts[i];
        const uint32_t seq32 = c->seq[i];
        const uint32_t ack32 = c->ack[i];
        const uint16_t win = c->win[i];
        const int synfin = (flags & (TH_SYN | TH_FIN)) != 0;
        const int syn_fin_rst = (flags & (TH_SYN | TH_FIN | TH_RST)) != 0;
        const int has_ack = (flags & TH_ACK) != 0;
        const int first = !d->seen;
        const int has_rev = rev->seen;

        /* Unwrap seq and ACK by the signed 32-bit step from this direction's previous packet. */
        int64_t seq_rel, ack_local;
        uint32_t ack_filled32;
        if (first) {
            seq_rel = 0;
            ack_local = 0;
            ack_filled32 = ack32;
            d->first_seq32 = seq32;
            d->first_ack32 = ack32;
        } else {
            seq_rel = d->seq_rel + as_int32(seq32 - d->seq32);
            ack_filled32 = (has_ack || !d->ack_flag_seen) ? ack32 : d->ack_filled32;
            ack_local = d->ack_local + as_int32(ack_filled32 - d->ack_filled32);
        }
        const int64_t end_rel = seq_rel + plen + synfin;
        if (first) {
            d->seen = 1; /* before the early ACKs: their anchor needs this direction's first seq */
            if (rev->early.len && flush_early_acks(a, sink, g ^ 1) < 0)
                return -1;
        }

        const int64_t nextseq = d->nextseq;
        const int has_next = nextseq > EMPTY;
        const int64_t nextseq_time = d->nextseq_time;
        const int64_t below_next = nextseq - seq_rel; /* 0: at nextseq; 1: one byte below it */
        const int zero_window_probe = plen == 1 && has_rev && rev->last_win == 0 && has_next && below_next == 0;
        const int64_t moves_next = zero_window_probe ? EMPTY : end_rel;
        const int64_t nextseq_after = moves_next > nextseq ? moves_next : nextseq;
        /* maxseqtobeacked: lags behind nextseq from a packet that raises nextseq without starting at it,
         * until a later packet starts at the old nextseq or an ACK passes it (below) */
        if (d->lagging) {
            if (moves_next > EMPTY && seq_rel == d->lag_level)
                d->lagging = 0;
        } else if (moves_next > EMPTY && has_next && nextseq_after > nextseq && seq_rel != nextseq) {
            d->lagging = 1;
            d->lag_level = nextseq;
        }
        if (moves_next > nextseq) {
            d->nextseq = moves_next;
            d->nextseq_time = ts;
        }

        int64_t new_bytes = 0;
        if (plen > 0) {
            int64_t base = d->data_end > EMPTY ? d->data_end : seq_rel;
            new_bytes = seq_rel + plen - base;
            if (new_bytes < 0)
                new_bytes = 0;
            if (seq_rel + plen > d->data_end)
                d->data_end = seq_rel + plen;
        }

        const int plain = !syn_fin_rst && !zero_window_probe;
        const int keep_alive = plain && plen <= 1 && has_next && below_next == 1;
        const int dup_ack = plain && plen == 0 && win != 0 && !first && win == d->last_win && has_next
                            && below_next == 0 && ack32 == d->last_ack32 && !(has_rev && rev->last_keep_alive);
        if (first || ack32 != d->last_ack32) {
            d->dupacks = 0;
            d->minus_one = 0;
        } else if (d->reset_pending) {
            d->dupacks = 0;
            d->minus_one = 1;
        }
        d->reset_pending = 0;
        if (dup_ack)
            d->dupacks++;

        /* This packet's ACK in the reverse direction's seq_rel space. */
        const int64_t ack_rel = has_rev ? ack_local + anchor_of(d, rev) : 0;
        if (has_ack && has_rev) {
            if (rev->lagging && ack_rel > rev->lag_level)
                rev->lagging = 0; /* maxseqtobeacked catches up with nextseq */
            else if (rev->nextseq > EMPTY && ack_rel > rev->nextseq)
                rev->reset_pending = 1; /* ACKed unseen: the reverse counter becomes unsigned -1 */
        }
        int64_t rev_dupacks = rev->dupacks;
        if (rev->reset_pending || (rev->dupacks == 0 && rev->minus_one))
            rev_dupacks = LOW32;

        const int data_or_sf = (plen > 0 || synfin) && !keep_alive;
        const int not_advanced = data_or_sf && has_next && (below_next > 1 || (below_next == 1 && plen <= 1));
        const uint32_t end32 = seq32 + (uint32_t)plen;
        const int64_t rev_ack32 = rev->last_ack32;
        const int spurious = data_or_sf && plen > 0 && has_rev && rev_ack32 != 0
                             && as_int32(end32 - rev->last_ack32) <= 0;
        const int64_t since_rev = wrapping_sub(ts, rev->last_ts);
        const int fast = not_advanced && !spurious && has_rev && rev_dupacks >= 2 && rev_ack32 == seq32
                         && since_rev >= 0 && since_rev < FAST_RETRANSMISSION_WINDOW_NS;
        const int64_t since_next = wrapping_sub(ts, nextseq_time);
        const int ooo = not_advanced && !spurious && !fast && since_next >= 0
                        && since_next < a->ooo_threshold[conn] && nextseq != end_rel;
        const int retransmission = (not_advanced && !ooo) || spurious;
        const int lost = has_next && below_next < 0 && !(flags & TH_RST) && !zero_window_probe;
        const int checked = !syn_fin_rst && !zero_window_probe;
        const int zero_window = win == 0 && checked;
        const int64_t shift_fwd = a->wscale[g];
        const int64_t shift_rev = a->wscale[g ^ 1];
        int window_full = 0;
        if (plen > 0 && checked && has_rev && shift_rev >= 0) {
            /* the reverse side's window is unscaled while its last packet is its SYN */
            int64_t rev_shift = (rev->last_flags & TH_SYN) ? 0 : shift_rev;
            window_full = end32 == (uint32_t)((uint64_t)rev_ack32 + (uint64_t)shift_left(rev->last_win, rev_shift));
        }
        int64_t window = win;
        if (!(flags & TH_SYN) && shift_fwd >= 0)
            window = shift_left(win, shift_fwd);
        int64_t in_flight = -1;
        if (plen > 0 && has_rev && (rev->last_flags & TH_ACK)) {
            int64_t highest = nextseq > end_rel ? nextseq : end_rel;
            in_flight = highest - (rev->ack_local + anchor_of(rev, d));
            if (in_flight < 0)
                in_flight = 0;
        }

        if (c->seq_rel) /* None when the caller keeps no sequence numbers (only plots draw them) */
            c->seq_rel[i] = seq_rel;
        if (c->end_rel)
            c->end_rel[i] = end_rel;
        c->new_bytes[i] = new_bytes;
        c->retransmission[i] = (uint8_t)retransmission;
        c->fast[i] = (uint8_t)fast;
        c->spurious[i] = (uint8_t)spurious;
        c->ooo[i] = (uint8_t)ooo;
        c->lost[i] = (uint8_t)lost;
        c->dup_ack[i] = (uint8_t)dup_ack;
        c->zero_window[i] = (uint8_t)zero_window;
        c->window_full[i] = (uint8_t)window_full;
        c->in_flight[i] = in_flight;
        c->window_bytes[i] = (int32_t)(uint32_t)(uint64_t)window;

        /* An ACK of reverse-direction data not acknowledged before (above this direction's highest ACK so
         * far, which lay below the reverse direction's highest data end): the reverse direction's data still
         * in flight after it. The busy runs of the duplex overlap read it (busy.py); -1 on other packets. */
        int32_t peer_in_flight = -1;
        if (has_ack) {
            if (has_rev && d->ack_max > EMPTY && ack_local > d->ack_max && rev->data_end > EMPTY
                && d->ack_max + anchor_of(d, rev) < rev->data_end) {
                const int64_t left = rev->data_end - ack_rel;
                peer_in_flight = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int32_t)left;
            }
            if (ack_local > d->ack_max)
                d->ack_max = ack_local;
        }
        c->peer_in_flight[i] = peer_in_flight;

        /* RTTs: data -> the first ACK of exactly its end (Karn: never retransmitted), TSval -> first echo. */
        if (plen > 0 && !retransmission && data_end_seen(a, sink, (uint32_t)g, end_rel, ts) < 0)
            return -1;
        if (has_ack) {
            if (has_rev) {
                if (!d->ack_target_known || d->last_ack_target != ack_rel) {
                    if (ack_seen(a, sink, (uint32_t)(g ^ 1), ack_rel, row, ts) < 0)
                        return -1;
                    d->ack_target_known = 1;
                    d->last_ack_target = ack_rel;
                }
            } else if (early_push(&d->early, ack_local, row, ts) < 0) {
                return -1;
            }
        }
        if (c->has_ts[i]) {
            const uint32_t tsval = c->tsval[i];
            const uint32_t tsecr = c->tsecr[i];
            if (has_ack && tsecr != 0 && !(d->tsecr_known && d->last_tsecr == tsecr)) {
                if (match_second(&a->ts_map, &a->ts_waiting, &a->waiting_echoes, sink, &sink->late_ts,
                                 sink->ts_rtt, (uint32_t)(g ^ 1), tsecr, row, ts) < 0)
                    return -1;
                d->tsecr_known = 1;
                d->last_tsecr = tsecr;
            }
            if (!(d->tsval_known && d->last_tsval == tsval)) {
                if (match_first(&a->ts_map, &a->ts_waiting, &a->waiting_echoes, sink, &sink->late_ts,
                                sink->ts_rtt, (uint32_t)g, tsval, ts) < 0)
                    return -1;
                d->tsval_known = 1;
                d->last_tsval = tsval;
            }
        }

        d->seq_rel = seq_rel;
        d->seq32 = seq32;
        d->ack_filled32 = ack_filled32;
        d->ack_local = ack_local;
        d->ack_flag_seen |= (uint8_t)has_ack;
        d->last_ts = ts;
        d->last_ack32 = ack32;
        d->last_win = win;
        d->last_flags = flags;
        d->last_keep_alive = (uint8_t)keep_alive;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------
 * Python type.
 */
static void Analyzer_dealloc(Analyzer *a) {
    if (a->dirs) {
        for (Py_ssize_t g = 0; g < a->ngroups; g++) {
            free(a->dirs[g].early.items);
            ends_free(&a->dirs[g].ends);
        }
    }
    free(a->dirs);
    free(a->wscale);
    free(a->ooo_threshold);
    map_free(&a->ack_map);
    map_free(&a->ack_waiting);
    map_free(&a->ts_map);
    map_free(&a->ts_waiting);
    free(a->waiting_acks.items);
    free(a->waiting_echoes.items);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static int Analyzer_init(Analyzer *a, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ngroups", "wscale", "first_rtt_ns", "spill_window", NULL};
    Py_ssize_t ngroups, spill_window = 0;
    PyObject *wscale_obj, *rtt_obj;
    if (a->dirs) {
        PyErr_SetString(PyExc_RuntimeError, "Analyzer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nOO|n:Analyzer", kwlist, &ngroups, &wscale_obj, &rtt_obj,
                                     &spill_window))
        return -1;
    if (spill_window < 0 || spill_window == 1) {
        PyErr_SetString(PyExc_ValueError, "spill_window must be 0 (keep every end in memory) or at least 2");
        return -1;
    }
    if (ngroups < 0 || ngroups % 2 || ngroups > ((Py_ssize_t)1 << 32)) {
        PyErr_Format(PyExc_ValueError, "ngroups must be 2 x the number of connections (0 .. 2**32), got %zd",
                     ngroups);
        return -1;
    }
    static const Spec wscale_spec = {"wscale", SIGNED, 8, 0};
    static const Spec rtt_spec = {"first_rtt_ns", SIGNED, 8, 0};
    Py_buffer wscale, rtt;
    if (get_buffer(wscale_obj, &wscale_spec, &wscale, ngroups) < 0)
        return -1;
    if (get_buffer(rtt_obj, &rtt_spec, &rtt, ngroups / 2) < 0) {
        PyBuffer_Release(&wscale);
        return -1;
    }
    size_t groups = ngroups ? (size_t)ngroups : 1;
    a->dirs = (Direction *)calloc(groups, sizeof(Direction));
    a->wscale = (int64_t *)malloc(groups * sizeof(int64_t));
    a->ooo_threshold = (int64_t *)malloc(groups * sizeof(int64_t));
    if (!a->dirs || !a->wscale || !a->ooo_threshold) {
        PyBuffer_Release(&wscale);
        PyBuffer_Release(&rtt);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(a->wscale, wscale.buf, (size_t)ngroups * sizeof(int64_t));
    const int64_t *first_rtt = (const int64_t *)rtt.buf;
    for (Py_ssize_t k = 0; k < ngroups / 2; k++)
        a->ooo_threshold[k] = first_rtt[k] > 0 ? first_rtt[k] : DEFAULT_OOO_THRESHOLD_NS;
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        a->dirs[g].nextseq = EMPTY;
        a->dirs[g].data_end = EMPTY;
        a->dirs[g].ack_map_max = EMPTY;
        a->dirs[g].ack_max = EMPTY;
    }
    a->ngroups = ngroups;
    a->spill_window = (size_t)spill_window;
    PyBuffer_Release(&wscale);
    PyBuffer_Release(&rtt);
    return 0;
}

static PyObject *late_list(const RowValues *v) {
    PyObject *list = PyList_New((Py_ssize_t)v->len);
    if (!list)
        return NULL;
    for (size_t k = 0; k < v->len; k++) {
        PyObject *item = Py_BuildValue("(LL)", (long long)v->items[k].row, (long long)v->items[k].value);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, item);
    }
    return list;
}

static PyObject *Analyzer_feed(Analyzer *a, PyObject *args, PyObject *kwargs) {
    static char *kwlist[NBUFFERS + 1] = {
        "conn", "direction", "ts_ns", "seq", "ack", "plen", "win", "flags", "tsval", "tsecr", "has_ts",
        "seq_rel", "end_rel", "new_bytes", "retransmission", "fast_retransmission", "spurious_retransmission",
        "out_of_order", "lost_segment", "dup_ack", "zero_window", "window_full", "in_flight", "window_bytes",
        "ack_rtt_ns", "ts_rtt_ns", "peer_in_flight", NULL,
    }; /* the names of SPECS, in order */
    PyObject *objs[NBUFFERS];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOOOOOOOOOOOOOOOOOO:feed", kwlist, &objs[0], &objs[1],
                                     &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &objs[7], &objs[8],
                                     &objs[9], &objs[10], &objs[11], &objs[12], &objs[13], &objs[14], &objs[15],
                                     &objs[16], &objs[17], &objs[18], &objs[19], &objs[20], &objs[21],
                                     &objs[22], &objs[23], &objs[24], &objs[25], &objs[26]))
        return NULL;
    if (!a->dirs) {
        PyErr_SetString(PyExc_RuntimeError, "Analyzer was not initialised");
        return NULL;
    }
    if (a->broken) {
        PyErr_SetString(PyExc_RuntimeError, "Analyzer ran out of memory in an earlier feed; start a new one");
        return NULL;
    }
    if (a->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Analyzer.feed is already running in another thread");
        return NULL;
    }
    Py_buffer views[NBUFFERS];
    int got = 0;
    Py_ssize_t n = -1;
    for (; got < NBUFFERS; got++) {
        if (get_buffer(objs[got], &SPECS[got], &views[got], n) < 0)
            break;
        if (got == 0)
            n = views[0].len / 4;
    }
    PyObject *result = NULL;
    if (got < NBUFFERS)
        goto done;
    /* Validate the whole chunk before any state changes: a rejected feed leaves the Analyzer as it was. */
    const int32_t *conn = (const int32_t *)views[0].buf;
    const int8_t *direction = (const int8_t *)views[1].buf;
    const int64_t nconn = a->ngroups / 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (conn[i] < 0 || conn[i] >= nconn) {
            PyErr_Format(PyExc_ValueError, "conn[%zd] = %d is outside 0..%lld (wscale has %lld connections)",
                         i, (int)conn[i], (long long)(nconn - 1), (long long)nconn);
            goto done;
        }
        if (direction[i] != 0 && direction[i] != 1) {
            PyErr_Format(PyExc_ValueError, "direction[%zd] = %d: must be 0 or 1", i, (int)direction[i]);
            goto done;
        }
    }
    Columns c = {
        conn, direction, (const int64_t *)views[2].buf, (const uint32_t *)views[3].buf,
        (const uint32_t *)views[4].buf, (const int32_t *)views[5].buf, (const uint16_t *)views[6].buf,
        (const uint8_t *)views[7].buf, (const uint32_t *)views[8].buf, (const uint32_t *)views[9].buf,
        (const uint8_t *)views[10].buf,
        (int64_t *)views[11].buf, (int64_t *)views[12].buf, (int64_t *)views[13].buf,
        (uint8_t *)views[14].buf, (uint8_t *)views[15].buf, (uint8_t *)views[16].buf, (uint8_t *)views[17].buf,
        (uint8_t *)views[18].buf, (uint8_t *)views[19].buf, (uint8_t *)views[20].buf, (uint8_t *)views[21].buf,
        (int64_t *)views[22].buf, (int32_t *)views[23].buf, (int64_t *)views[24].buf, (int64_t *)views[25].buf,
        (int32_t *)views[26].buf,
    };
    Sink sink = {a->rows, c.ack_rtt, c.ts_rtt, {NULL, 0, 0}, {NULL, 0, 0}};
    int rc;
    a->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = run(a, &c, n, &sink);
    Py_END_ALLOW_THREADS
    a->busy = 0;
    if (rc < 0) {
        a->broken = 1;
        int io_error = 0;
        for (Py_ssize_t g = 0; g < a->ngroups; g++)
            io_error |= a->dirs[g].ends.io_error;
        if (io_error)
            PyErr_SetString(PyExc_OSError, "Analyzer could not write or read its temporary file of segment ends "
                                           "(is the temporary directory full? set TMPDIR to another)");
        else
            PyErr_NoMemory();
    } else {
        a->rows += n;
        PyObject *late_ack = late_list(&sink.late_ack);
        PyObject *late_ts = late_ack ? late_list(&sink.late_ts) : NULL;
        if (late_ack && late_ts)
            result = PyTuple_Pack(2, late_ack, late_ts);
        Py_XDECREF(late_ack);
        Py_XDECREF(late_ts);
    }
    free(sink.late_ack.items);
    free(sink.late_ts.items);
done:
    for (int k = 0; k < got; k++)
        PyBuffer_Release(&views[k]);
    return result;
}

static PyObject *Analyzer_get_rows(Analyzer *a, void *closure) {
    (void)closure;
    return PyLong_FromLongLong((long long)a->rows);
}

static PyMethodDef Analyzer_methods[] = {
    {"feed", (PyCFunction)(void (*)(void))Analyzer_feed, METH_VARARGS | METH_KEYWORDS,
     "feed(conn, direction, ts_ns, seq, ack, plen, win, flags, tsval, tsecr, has_ts, seq_rel, end_rel, "
     "new_bytes, retransmission, fast_retransmission, spurious_retransmission, out_of_order, lost_segment, "
     "dup_ack, zero_window, window_full, in_flight, window_bytes, ack_rtt_ns, ts_rtt_ns, peer_in_flight) -> "
     "(late_ack_rtt, late_ts_rtt)\n\n"
     "Analyze the next packets (reader column dtypes: int32 conn, int8 direction, int64 ts_ns, uint32 seq/ack/"
     "tsval/tsecr, int32 plen, uint16 win, uint8 flags, bool has_ts) into the PacketState arrays given (same "
     "length; int64, bool, int32 window_bytes and peer_in_flight). Returns the RTT samples that fall on rows of "
     "earlier feeds, "
     "as lists of (row, ns). seq_rel and end_rel may be None: then they are not written."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Analyzer_getset[] = {
    {"rows", (getter)Analyzer_get_rows, NULL, "packets fed so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AnalyzerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "diag.capture._ctcp.Analyzer",
    .tp_basicsize = sizeof(Analyzer),
    .tp_dealloc = (destructor)Analyzer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Analyzer(ngroups, wscale, first_rtt_ns, spill_window=0): tshark's per-packet TCP analysis, fed in "
              "chunks.\n\n"
              "ngroups = 2 x connections; wscale: int64[ngroups] (shift per conn*2+direction, -1 unknown); "
              "first_rtt_ns: int64[ngroups // 2] (handshake RTT, 0 unknown); spill_window: the data segment ends "
              "a direction keeps in memory before the older half goes to a temporary file (0: all in memory).",
    .tp_methods = Analyzer_methods,
    .tp_getset = Analyzer_getset,
    .tp_init = (initproc)Analyzer_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ctcp",
    "The TCP state machine of diag.capture.tcpstate in C (numpy twin: tcpstate._analyze_packets_numpy).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ctcp(void) {
    if (PyType_Ready(&AnalyzerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&AnalyzerType);
    if (PyModule_AddObject(m, "Analyzer", (PyObject *)&AnalyzerType) < 0) {
        Py_DECREF(&AnalyzerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

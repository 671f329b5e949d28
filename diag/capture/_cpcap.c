/* diag.capture._cpcap: the capture reader's per-record work in C.
 *
 * Its numpy twin is reader._ColumnBuilder (+ reader._PcapWalker for the record walk); both must give the
 * same columns, skip counts, SYN options and errors for any bytes, and tests/test_native_pcap.py holds them
 * to that. What runs here:
 *   - the pcap record walk (record headers -> data, caplen, ts_ns; either byte order, micro/nanoseconds),
 *   - the pcapng block walk for packet blocks (enhanced, simple, obsolete); section headers and interface
 *     descriptions go back to Python, which owns the interface table,
 *   - the per-record decode: link layer, IPv4/IPv6 (a jumbogram's hop-by-hop length, a super-segment's
 *     length from the frame's original length), the TCP inside VXLAN, Geneve, GRE and IP-in-IP tunnels, skip
 *     reasons in the twin's order of precedence, TCP fields, the timestamp option in both layouts, SYN
 *     options, endpoint ids (first appearance, a hash table per address family).
 * Every read is checked against the record's caplen, and every record against the buffer: any bytes are safe.
 * Output goes straight into caller-allocated column arrays (the buffer protocol; no numpy C API), one call
 * per chunk of the file, with the GIL released for the loop.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL and the pages fault one by one */
#endif
#endif

/* --- byte access ------------------------------------------------------------------------------------ */

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
/* The IP version an EtherType announces (0: not IP), for Ethernet, SLL and SLL2 alike. */
static inline int ethertype_ip_version(unsigned etype) { return etype == 0x0800 ? 4 : etype == 0x86DD ? 6 : 0; }

static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint32_t le32(const uint8_t *p)
{
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | (uint32_t)p[0];
}

static inline uint32_t rd32(const uint8_t *p, int big) { return big ? be32(p) : le32(p); }
static inline uint16_t rd16(const uint8_t *p, int big)
{
    return big ? be16(p) : (uint16_t)(p[0] | (p[1] << 8));
}

/* --- link types, columns, skip reasons ---------------------------------------------------------------- */

enum {
    LT_NULL = 0, LT_ETHERNET = 1, LT_RAW_BSD = 12, LT_RAW_BSD14 = 14, LT_RAW = 101, LT_LOOP = 108,
    LT_LINUX_SLL = 113, LT_IPV4 = 228, LT_IPV6 = 229, LT_LINUX_SLL2 = 276
};

static int supported_linktype(long lt)
{
    switch (lt) {
    case LT_NULL: case LT_ETHERNET: case LT_RAW_BSD: case LT_RAW_BSD14: case LT_RAW: case LT_LOOP:
    case LT_LINUX_SLL: case LT_IPV4: case LT_IPV6: case LT_LINUX_SLL2:
        return 1;
    default:
        return 0;
    }
}

/* The columns in reader.COLUMN_DTYPES order, and each one's item size. */
enum { C_TS, C_SRC, C_DST, C_SEQ, C_ACK, C_PLEN, C_WIN, C_FLAGS, C_TSVAL, C_TSECR, C_HAS_TS, C_FRAME, C_TUNNEL, NCOLS };
static const Py_ssize_t column_itemsize[NCOLS] = {8, 4, 4, 4, 4, 4, 2, 1, 4, 4, 1, 8, 1};

typedef struct {
    int64_t *ts_ns;
    int32_t *src, *dst;
    uint32_t *seq, *ack;
    int32_t *plen;
    uint16_t *win;
    uint8_t *flags;
    uint32_t *tsval, *tsecr;
    uint8_t *has_ts;
    int64_t *frame;
    uint8_t *tunnel;  /* the encapsulations the packet came through (T_* bits), 0: none */
    int64_t capacity; /* rows every column has room for */
} Columns;

/* Skip reasons as the twin counts them, in the order it first counts them (the order of skipped's keys). */
enum { SK_NON_IP, SK_SHORT_IP, SK_BAD_IHL, SK_FRAGMENT, SK_IPV6_EXT, SK_NON_TCP, SK_SHORT_TCP, SK_BAD_THL,
       SK_TUNNEL_TOO_DEEP, NSKIP };

typedef struct {
    int64_t skip[NSKIP];
} Counts;

/* --- the decoder: endpoint tables, SYN options, counters ---------------------------------------------- */

typedef struct {
    uint8_t key[18]; /* address, port (big-endian) */
    uint8_t used;
    int32_t id;
} V6Slot;

typedef struct {
    int64_t row;
    int32_t mss;     /* -1: no MSS option */
    int32_t wscale;  /* -1: no window-scale option */
    int32_t sack_permitted;
    int32_t timestamps;
} SynRow;

#define ENDPOINT_KEY_BYTES 19 /* family (4 or 6), 16 address bytes (IPv4: 4, zero padded), port big-endian */
#define V4_PRESENT (1ULL << 48) /* marks a used slot: keys are address << 16 | port, below 2^48 */
#define HASH_MULT 0x9E3779B97F4A7C15ULL

/* 64 - log2(cap) for a power-of-two cap: the shift that maps a 64-bit hash to a slot. */
static int slot_shift(size_t cap)
{
    int bits = 0;
    while (((size_t)1 << bits) < cap)
        bits++;
    return 64 - bits;
}

typedef struct {
    PyObject_HEAD
    int busy;
    int64_t first_frame;
    int64_t frames;       /* records decoded so far (kept or skipped) */
    int64_t rows;         /* rows written to the columns (since the last rewind) */
    int64_t rows_rewound; /* rows given back by rewind(): with rows, the rows decoded so far */
    int64_t record_index; /* pcap records walked so far */
    int64_t bytes_walked; /* pcap chunk bytes walked so far: rows per byte sizes the next prefault */
    uint64_t *v4_keys;
    int32_t *v4_ids;
    size_t v4_cap, v4_used; /* cap: a power of two */
    int v4_shift;
    V6Slot *v6;
    size_t v6_cap, v6_used;
    int v6_shift;
    uint8_t *endpoint_keys;
    size_t endpoints, endpoint_cap;
    SynRow *syns;
    size_t syn_count, syn_cap;
} Decoder;

/* Status of a decode loop run without the GIL. */
enum { ST_OK = 0, ST_NOMEM = 1, ST_FULL = 2 };

static int add_endpoint(Decoder *d, int family, const uint8_t *address, int address_bytes, uint16_t port,
                        int32_t *id)
{
    if (d->endpoints >= (size_t)INT32_MAX)
        return ST_NOMEM;
    if (d->endpoints == d->endpoint_cap) {
        size_t cap = d->endpoint_cap ? d->endpoint_cap * 2 : 64;
        uint8_t *keys = PyMem_RawRealloc(d->endpoint_keys, cap * ENDPOINT_KEY_BYTES);
        if (!keys)
            return ST_NOMEM;
        d->endpoint_keys = keys;
        d->endpoint_cap = cap;
    }
    uint8_t *key = d->endpoint_keys + d->endpoints * ENDPOINT_KEY_BYTES;
    memset(key, 0, ENDPOINT_KEY_BYTES);
    key[0] = (uint8_t)family;
    memcpy(key + 1, address, (size_t)address_bytes);
    key[17] = (uint8_t)(port >> 8);
    key[18] = (uint8_t)port;
    *id = (int32_t)d->endpoints++;
    return ST_OK;
}

static int v4_grow(Decoder *d)
{
    size_t cap = d->v4_cap ? d->v4_cap * 2 : 64;
    uint64_t *keys = PyMem_RawCalloc(cap, sizeof(uint64_t));
    int32_t *ids = PyMem_RawMalloc(cap * sizeof(int32_t));
    if (!keys || !ids) {
        PyMem_RawFree(keys);
        PyMem_RawFree(ids);
        return ST_NOMEM;
    }
    int shift = slot_shift(cap);
    for (size_t i = 0; i < d->v4_cap; i++) {
        uint64_t k = d->v4_keys[i];
        if (!k)
            continue;
        size_t slot = (size_t)((k * HASH_MULT) >> shift);
        while (keys[slot])
            slot = (slot + 1) & (cap - 1);
        keys[slot] = k;
        ids[slot] = d->v4_ids[i];
    }
    PyMem_RawFree(d->v4_keys);
    PyMem_RawFree(d->v4_ids);
    d->v4_keys = keys;
    d->v4_ids = ids;
    d->v4_cap = cap;
    d->v4_shift = shift;
    return ST_OK;
}

static inline int v4_id(Decoder *d, const uint8_t *address, const uint8_t *port, int32_t *id)
{
    uint64_t k = V4_PRESENT | ((uint64_t)be32(address) << 16) | be16(port);
    if (d->v4_cap) {
        int shift = d->v4_shift;
        size_t slot = (size_t)((k * HASH_MULT) >> shift);
        for (;;) {
            uint64_t there = d->v4_keys[slot];
            if (there == k) {
                *id = d->v4_ids[slot];
                return ST_OK;
            }
            if (!there)
                break;
            slot = (slot + 1) & (d->v4_cap - 1);
        }
    }
    if ((d->v4_used + 1) * 2 > d->v4_cap && v4_grow(d))
        return ST_NOMEM;
    if (add_endpoint(d, 4, address, 4, be16(port), id))
        return ST_NOMEM;
    int shift = d->v4_shift;
    size_t slot = (size_t)((k * HASH_MULT) >> shift);
    while (d->v4_keys[slot])
        slot = (slot + 1) & (d->v4_cap - 1);
    d->v4_keys[slot] = k;
    d->v4_ids[slot] = *id;
    d->v4_used++;
    return ST_OK;
}

static inline size_t v6_hash(const uint8_t *key, int shift)
{
    uint64_t a, b;
    memcpy(&a, key, 8);
    memcpy(&b, key + 8, 8);
    uint64_t h = (a * HASH_MULT) ^ (b + 0x632BE59BD9B4E019ULL) * 0xC2B2AE3D27D4EB4FULL ^ ((uint64_t)be16(key + 16) << 7);
    h ^= h >> 29;
    h *= HASH_MULT;
    return (size_t)(h >> shift);
}

static int v6_grow(Decoder *d)
{
    size_t cap = d->v6_cap ? d->v6_cap * 2 : 64;
    V6Slot *slots = PyMem_RawCalloc(cap, sizeof(V6Slot));
    if (!slots)
        return ST_NOMEM;
    int shift = slot_shift(cap);
    for (size_t i = 0; i < d->v6_cap; i++) {
        if (!d->v6[i].used)
            continue;
        size_t slot = v6_hash(d->v6[i].key, shift);
        while (slots[slot].used)
            slot = (slot + 1) & (cap - 1);
        slots[slot] = d->v6[i];
    }
    PyMem_RawFree(d->v6);
    d->v6 = slots;
    d->v6_cap = cap;
    d->v6_shift = shift;
    return ST_OK;
}

static inline int v6_id(Decoder *d, const uint8_t *address, const uint8_t *port, int32_t *id)
{
    uint8_t key[18];
    memcpy(key, address, 16);
    key[16] = port[0];
    key[17] = port[1];
    if (d->v6_cap) {
        size_t slot = v6_hash(key, d->v6_shift);
        while (d->v6[slot].used) {
            if (!memcmp(d->v6[slot].key, key, 18)) {
                *id = d->v6[slot].id;
                return ST_OK;
            }
            slot = (slot + 1) & (d->v6_cap - 1);
        }
    }
    if ((d->v6_used + 1) * 2 > d->v6_cap && v6_grow(d))
        return ST_NOMEM;
    if (add_endpoint(d, 6, address, 16, be16(port), id))
        return ST_NOMEM;
    size_t slot = v6_hash(key, d->v6_shift);
    while (d->v6[slot].used)
        slot = (slot + 1) & (d->v6_cap - 1);
    memcpy(d->v6[slot].key, key, 18);
    d->v6[slot].used = 1;
    d->v6[slot].id = *id;
    d->v6_used++;
    return ST_OK;
}

/* TLV walk over a SYN's option bytes, as reader.parse_tcp_options: stops quietly at a malformed option. */
static int add_syn(Decoder *d, int64_t row, const uint8_t *opt, int64_t len)
{
    if (d->syn_count == d->syn_cap) {
        size_t cap = d->syn_cap ? d->syn_cap * 2 : 64;
        SynRow *syns = PyMem_RawRealloc(d->syns, cap * sizeof(SynRow));
        if (!syns)
            return ST_NOMEM;
        d->syns = syns;
        d->syn_cap = cap;
    }
    SynRow *s = &d->syns[d->syn_count++];
    s->row = row;
    s->mss = -1;
    s->wscale = -1;
    s->sack_permitted = 0;
    s->timestamps = 0;
    int64_t off = 0;
    while (off < len) {
        uint8_t kind = opt[off];
        if (kind == 0)
            break;
        if (kind == 1) {
            off++;
            continue;
        }
        if (off + 1 >= len)
            break;
        int64_t length = opt[off + 1];
        if (length < 2 || off + length > len)
            break;
        const uint8_t *body = opt + off + 2;
        if (kind == 2 && length == 4)
            s->mss = be16(body);
        else if (kind == 3 && length == 3)
            s->wscale = body[0] < 14 ? body[0] : 14; /* RFC 7323: larger shifts are treated as 14 */
        else if (kind == 4)
            s->sack_permitted = 1;
        else if (kind == 8 && length == 10)
            s->timestamps = 1;
        off += length;
    }
    return ST_OK;
}

/* --- tunnels and IPv6 options ---------------------------------------------------------------------------- */

/* The encapsulations whose inner TCP is decoded (bits of the tunnel column, pcapfile.TUNNELS). */
enum { T_NONE = 0, T_VXLAN = 1, T_GENEVE = 2, T_GRE = 4, T_IPIP = 8, T_TRUNCATED = -1 };
#define MAX_TUNNEL_DEPTH 3   /* tunnels inside tunnels followed at most this deep */
#define VXLAN_PORT 4789      /* IANA; tshark's defaults too (Linux's own default 8472 is not decoded, as there) */
#define GENEVE_PORT 6081

static int ipv6_extension(unsigned next)
{
    return next == 0 || next == 43 || next == 60 || next == 51 || next == 50 || next == 135 || next == 139
           || next == 140;
}

/* The Jumbo Payload option's length among hop-by-hop options (TLVs, Pad1 a single byte); -1 if absent. */
static int64_t jumbo_length(const uint8_t *opt, int64_t len)
{
    int64_t off = 0;
    while (off < len) {
        if (opt[off] == 0) {
            off++;
            continue;
        }
        if (off + 1 >= len || off + 2 + opt[off + 1] > len)
            return -1;
        if (opt[off] == 0xC2 && opt[off + 1] == 4)
            return be32(opt + off + 2);
        off += 2 + opt[off + 1];
    }
    return -1;
}

/* An inner Ethernet frame at e (rem bytes captured): *net = the offset of its IP header, *version. */
static int inner_ethernet(const uint8_t *e, int64_t rem, int64_t *net, int *version)
{
    if (rem < 14)
        return T_TRUNCATED;
    unsigned etype = be16(e + 12);
    int64_t off = 14;
    for (int tag = 0; tag < 2 && (etype == 0x8100 || etype == 0x88A8 || etype == 0x9100); tag++) {
        if (rem < off + 4)
            return T_TRUNCATED;
        etype = be16(e + off + 2);
        off += 4;
    }
    *version = ethertype_ip_version(etype);
    *net = off;
    return *version ? 1 : T_NONE;
}

/* What a protocol number or type says is inside: an Ethernet frame, or IPv4/IPv6 (GRE, Geneve). */
static int inner_by_type(unsigned type, const uint8_t *at, int64_t rem, int64_t *net, int *version)
{
    if (type == 0x6558) /* transparent Ethernet bridging */
        return inner_ethernet(at, rem, net, version);
    *net = 0;
    *version = ethertype_ip_version(type);
    return *version ? 1 : T_NONE;
}

/* The packet a tunnel carries: VXLAN (UDP port 4789) and Geneve (6081) over UDP, GRE (IP protocol 47,
 * version 0, IP or transparent Ethernet bridging inside), IP in IP (4, 41). ip: the outer IP header, l4: the
 * offset of its payload. Returns the tunnel's bit with *inner = the inner IP header's offset from ip and
 * *version, or T_NONE (not a tunnel, or not IP inside), or T_TRUNCATED (the capture ends inside the tunnel
 * or inner link headers). Of two UDP ports the lower is tried first, as tshark does. */
static int tunnel_inner(const uint8_t *ip, int64_t ip_caplen, int64_t l4, unsigned proto, int64_t *inner,
                        int *version)
{
    const uint8_t *h = ip + l4;
    int64_t rem = ip_caplen - l4;
    int64_t net = 0;
    int ok, kind;
    if (proto == 4 || proto == 41) {
        *inner = l4;
        *version = proto == 4 ? 4 : 6;
        return T_IPIP;
    }
    if (proto == 17) {
        if (rem < 4)
            return T_NONE;
        unsigned a = be16(h), b = be16(h + 2);
        unsigned lo = a < b ? a : b, hi = a < b ? b : a;
        unsigned port = (lo == VXLAN_PORT || lo == GENEVE_PORT) ? lo : (hi == VXLAN_PORT || hi == GENEVE_PORT) ? hi : 0;
        if (!port)
            return T_NONE;
        if (rem < 16)
            return T_TRUNCATED;
        if (port == VXLAN_PORT) {
            ok = inner_ethernet(h + 16, rem - 16, &net, version);
            net += 16;
            kind = T_VXLAN;
        } else { /* Geneve of any version: tshark decodes them all alike */
            int64_t header = 16 + (int64_t)(h[8] & 0x3F) * 4;
            if (rem < header)
                return T_TRUNCATED;
            ok = inner_by_type(be16(h + 10), h + header, rem - header, &net, version);
            net += header;
            kind = T_GENEVE;
        }
    } else if (proto == 47) {
        if (rem < 4)
            return T_TRUNCATED;
        unsigned flags = be16(h);
        if ((flags & 0x7) || (flags & 0x4000)) /* version 1 (PPTP) or source routing: not decoded */
            return T_NONE;
        int64_t header = 4 + ((flags & 0x8000) ? 4 : 0) + ((flags & 0x2000) ? 4 : 0) + ((flags & 0x1000) ? 4 : 0);
        if (rem < header)
            return T_TRUNCATED;
        ok = inner_by_type(be16(h + 2), h + header, rem - header, &net, version);
        net += header;
        kind = T_GRE;
    } else {
        return T_NONE;
    }
    if (ok != 1)
        return ok;
    *inner = l4 + net;
    return kind;
}

/* --- the per-record decode ------------------------------------------------------------------------------ */

/* One record: p[0..caplen) are its captured bytes. Writes a row or counts the skip reason. */
static inline int decode_record(Decoder *d, const uint8_t *p, int64_t caplen, int64_t orig_len, int64_t ts_ns,
                                int linktype, Columns *out, Counts *counts)
{
    int64_t frame = d->first_frame + d->frames++;
    int64_t net;
    int version;
    switch (linktype) {
    case LT_ETHERNET: {
        if (caplen <= 14)
            goto non_ip;
        unsigned etype = be16(p + 12);
        net = 14;
        for (int tag = 0; tag < 2 && (etype == 0x8100 || etype == 0x88A8 || etype == 0x9100); tag++) {
            if (caplen <= net + 4) /* the network header would start at or past the end */
                goto non_ip;
            etype = be16(p + net + 2);
            net += 4;
        }
        version = ethertype_ip_version(etype);
        break;
    }
    case LT_LINUX_SLL: {
        net = 16;
        if (caplen <= net)
            goto non_ip;
        version = ethertype_ip_version(be16(p + 14));
        break;
    }
    case LT_LINUX_SLL2: {
        net = 20;
        if (caplen <= net)
            goto non_ip;
        version = ethertype_ip_version(be16(p));
        break;
    }
    case LT_NULL:
    case LT_LOOP: {
        net = 4;
        if (caplen <= net)
            goto non_ip;
        /* BSD loopback writes the family in the host's order; OpenBSD's loop in network order. */
        uint32_t family = be32(p);
        if (linktype == LT_NULL && family >= 256)
            family = le32(p);
        version = family == 2 ? 4 : (family == 10 || family == 24 || family == 28 || family == 30) ? 6 : 0;
        break;
    }
    default: { /* raw IP flavours */
        net = 0;
        if (caplen <= 0)
            goto non_ip;
        unsigned nibble = p[0] >> 4;
        version = nibble == 4 ? 4 : nibble == 6 ? 6 : 0;
        if ((linktype == LT_IPV4 && version != 4) || (linktype == LT_IPV6 && version != 6))
            version = 0;
        break;
    }
    }
    if (!version)
        goto non_ip;

    /* The IP layers: the outer one, and the packet inside each tunnel it carries (tunnel_inner), down to TCP. */
    const int64_t reported = orig_len > caplen ? orig_len : caplen; /* the frame's length on the wire */
    uint8_t tunnel = 0;
    const uint8_t *ip;
    int64_t ip_caplen, tcp_off, ip_total;
    for (int depth = 0;; depth++) {
        ip = p + net;
        ip_caplen = caplen - net;
        unsigned proto;
        if (version == 4) {
            if (ip_caplen < 20) {
                counts->skip[SK_SHORT_IP]++;
                return ST_OK;
            }
            tcp_off = (int64_t)(ip[0] & 0x0F) * 4;
            if (tcp_off < 20) {
                counts->skip[SK_BAD_IHL]++;
                return ST_OK;
            }
            if (be16(ip + 6) & 0x3FFF) {
                counts->skip[SK_FRAGMENT]++;
                return ST_OK;
            }
            proto = ip[9];
            ip_total = be16(ip + 2);
            /* Total length 0: a TSO/GSO super-segment captured before the NIC cut it (or BIG TCP beyond 64 KiB).
             * Its length is the frame's on the wire (pcap orig_len), known even when snaplen cut the capture:
             * tshark's ip.tso_support (on by default) does the same. A tunnel's inner packet: what is left of
             * the frame from its header on. */
            if (ip_total == 0)
                ip_total = reported - net;
        } else {
            if (ip_caplen < 40) {
                counts->skip[SK_SHORT_IP]++;
                return ST_OK;
            }
            proto = ip[6];
            tcp_off = 40;
            int64_t jumbo = -1;
            if (proto == 0) { /* hop-by-hop options: a jumbogram's length is there (RFC 2675, IPv6 BIG TCP) */
                int64_t hbh = ip_caplen >= 42 ? ((int64_t)ip[41] + 1) * 8 : 0;
                if (!hbh || ip_caplen < 40 + hbh) {
                    counts->skip[SK_SHORT_IP]++;
                    return ST_OK;
                }
                jumbo = jumbo_length(ip + 42, hbh - 2);
                proto = ip[40];
                tcp_off = 40 + hbh;
            }
            if (proto == 44) {
                counts->skip[SK_FRAGMENT]++;
                return ST_OK;
            }
            if (ipv6_extension(proto)) {
                counts->skip[SK_IPV6_EXT]++;
                return ST_OK;
            }
            unsigned payload = be16(ip + 4);
            ip_total = payload ? (int64_t)payload + 40 : jumbo >= 0 ? jumbo + 40 : 40;
        }
        /* No more than was on the wire (a length field beyond it is bogus; tshark cuts it there too). */
        if (ip_total > reported - net)
            ip_total = reported - net;
        if (proto == 6)
            break;
        int64_t inner = 0;
        int kind = tunnel_inner(ip, ip_caplen, tcp_off, proto, &inner, &version);
        if (depth >= MAX_TUNNEL_DEPTH) { /* a tunnel inside the deepest one followed: said as such, not "non_tcp" */
            counts->skip[kind > 0 ? SK_TUNNEL_TOO_DEEP : SK_NON_TCP]++;
            return ST_OK;
        }
        if (kind == T_TRUNCATED) {
            counts->skip[SK_SHORT_IP]++;
            return ST_OK;
        }
        if (kind == T_NONE) {
            counts->skip[SK_NON_TCP]++;
            return ST_OK;
        }
        tunnel |= (uint8_t)kind;
        net += inner;
    }
    if (ip_caplen < tcp_off + 20) {
        counts->skip[SK_SHORT_TCP]++;
        return ST_OK;
    }
    const uint8_t *tcp = ip + tcp_off;
    int64_t thl = (int64_t)(tcp[12] >> 4) * 4;
    if (thl < 20 || ip_total < tcp_off + thl) {
        counts->skip[SK_BAD_THL]++;
        return ST_OK;
    }

    int64_t row = d->rows;
    if (row >= out->capacity)
        return ST_FULL;
    int32_t src, dst;
    if (version == 4) {
        if (v4_id(d, ip + 12, tcp, &src) || v4_id(d, ip + 16, tcp + 2, &dst))
            return ST_NOMEM;
    } else {
        if (v6_id(d, ip + 8, tcp, &src) || v6_id(d, ip + 24, tcp + 2, &dst))
            return ST_NOMEM;
    }
    uint8_t flags = tcp[13];
    uint32_t tsval = 0, tsecr = 0;
    uint8_t has_ts = 0;
    int64_t tcp_caplen = ip_caplen - tcp_off;
    /* The timestamp option as stacks lay it out: NOP NOP TS (Linux, BSD), or TS first. */
    if (thl >= 32 && tcp_caplen >= 32 && tcp[20] == 1 && tcp[21] == 1 && tcp[22] == 8 && tcp[23] == 10) {
        tsval = be32(tcp + 24);
        tsecr = be32(tcp + 28);
        has_ts = 1;
    } else if (thl >= 30 && tcp_caplen >= 30 && tcp[20] == 8 && tcp[21] == 10) {
        tsval = be32(tcp + 22);
        tsecr = be32(tcp + 26);
        has_ts = 1;
    }
    out->ts_ns[row] = ts_ns;
    out->src[row] = src;
    out->dst[row] = dst;
    out->seq[row] = be32(tcp + 4);
    out->ack[row] = be32(tcp + 8);
    out->plen[row] = (int32_t)(ip_total - tcp_off - thl);
    out->win[row] = be16(tcp + 14);
    out->flags[row] = flags;
    out->tsval[row] = tsval;
    out->tsecr[row] = tsecr;
    out->has_ts[row] = has_ts;
    out->frame[row] = frame;
    out->tunnel[row] = tunnel;
    d->rows = row + 1;
    if (flags & 0x02) { /* SYN: its options shape the connection */
        int64_t header_bytes = thl < tcp_caplen ? thl : tcp_caplen;
        if (add_syn(d, row, tcp + 20, header_bytes - 20))
            return ST_NOMEM;
    }
    return ST_OK;

non_ip:
    counts->skip[SK_NON_IP]++;
    return ST_OK;
}

/* --- Python glue: column buffers -------------------------------------------------------------------------- */

typedef struct {
    Py_buffer views[NCOLS];
    int held;
} ColumnViews;

static void release_columns(ColumnViews *cv)
{
    for (int i = 0; i < cv->held; i++)
        PyBuffer_Release(&cv->views[i]);
    cv->held = 0;
}

/* Fault in the whole pages of rows [lo, hi) of every column in one call each: a fresh column page costs
 * a page fault (several microseconds here) when first written; populated ahead it costs ~15% less CPU for
 * a whole read. Only pages wholly inside the rows are touched, and populating does not change their bytes. */
static void prefault_columns(const ColumnViews *cv, int64_t lo, int64_t hi)
{
#ifdef __linux__
    for (int i = 0; i < cv->held; i++) {
        uintptr_t a = (uintptr_t)cv->views[i].buf + (uintptr_t)lo * (uintptr_t)column_itemsize[i];
        uintptr_t b = (uintptr_t)cv->views[i].buf + (uintptr_t)hi * (uintptr_t)column_itemsize[i];
        a = (a + 4095) & ~(uintptr_t)4095;
        b &= ~(uintptr_t)4095;
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
    }
#else
    (void)cv;
    (void)lo;
    (void)hi;
#endif
}

/* The 13 column arrays (reader.COLUMN_DTYPES order), writable and contiguous; capacity = the shortest. */
static int get_columns(PyObject *seq, ColumnViews *cv, Columns *out)
{
    cv->held = 0;
    PyObject *fast = PySequence_Fast(seq, "columns must be a sequence of 13 arrays");
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != NCOLS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "columns must be a sequence of 13 arrays");
        return -1;
    }
    int64_t capacity = INT64_MAX;
    void *base[NCOLS];
    for (int i = 0; i < NCOLS; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (PyObject_GetBuffer(item, &cv->views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            Py_DECREF(fast);
            release_columns(cv);
            return -1;
        }
        cv->held++;
        if (cv->views[i].itemsize != column_itemsize[i]) {
            Py_DECREF(fast);
            release_columns(cv);
            PyErr_Format(PyExc_ValueError, "column %d has item size %zd, expected %zd", i,
                         cv->views[i].itemsize, column_itemsize[i]);
            return -1;
        }
        int64_t rows = (int64_t)(cv->views[i].len / column_itemsize[i]);
        if (rows < capacity)
            capacity = rows;
        base[i] = cv->views[i].buf;
    }
    Py_DECREF(fast);
    out->ts_ns = base[C_TS];
    out->src = base[C_SRC];
    out->dst = base[C_DST];
    out->seq = base[C_SEQ];
    out->ack = base[C_ACK];
    out->plen = base[C_PLEN];
    out->win = base[C_WIN];
    out->flags = base[C_FLAGS];
    out->tsval = base[C_TSVAL];
    out->tsecr = base[C_TSECR];
    out->has_ts = base[C_HAS_TS];
    out->frame = base[C_FRAME];
    out->tunnel = base[C_TUNNEL];
    out->capacity = capacity;
    return 0;
}

static int claim(Decoder *d)
{
    if (d->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this Decoder is already decoding in another thread");
        return -1;
    }
    d->busy = 1;
    return 0;
}

static PyObject *loop_status_error(int status)
{
    if (status == ST_NOMEM)
        return PyErr_NoMemory();
    PyErr_SetString(PyExc_RuntimeError, "the column arrays are too short for this chunk");
    return NULL;
}

static PyObject *counts_tuple(const Counts *c)
{
    PyObject *t = PyTuple_New(NSKIP);
    if (!t)
        return NULL;
    for (int i = 0; i < NSKIP; i++) {
        PyObject *v = PyLong_FromLongLong(c->skip[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* --- pcap ------------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(pcap_chunk_doc,
"pcap_chunk(buf, start, stop, big_endian, ns_per_tick, limit, linktype, columns)\n"
"-> (end, records, skip_counts, bad_caplen)\n\n"
"Walk and decode the complete pcap records of buf[start:stop]. end: where the first incomplete record\n"
"starts (stop if none); records: complete records decoded; skip_counts: one count per skip reason in the\n"
"twin's order; bad_caplen: -1, or the caplen of a record that claims more than limit bytes (the walk stops\n"
"there: record number record_index + records + 1 of the file is corrupt).");

static PyObject *Decoder_pcap_chunk(Decoder *d, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t start, stop;
    int big_endian, linktype;
    long long ns_per_tick, limit;
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "y*nnpLLiO:pcap_chunk", &buf, &start, &stop, &big_endian, &ns_per_tick,
                          &limit, &linktype, &columns))
        return NULL;
    if (start < 0 || stop < start || stop > buf.len || !supported_linktype(linktype) || limit < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "pcap_chunk: bad range, limit or link type");
        return NULL;
    }
    ColumnViews cv;
    Columns out;
    if (get_columns(columns, &cv, &out) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (claim(d) < 0) {
        release_columns(&cv);
        PyBuffer_Release(&buf);
        return NULL;
    }
    const uint8_t *data = buf.buf;
    Counts counts;
    memset(&counts, 0, sizeof counts);
    int64_t records = 0, bad_caplen = -1;
    Py_ssize_t off = start;
    int status = ST_OK;
    Py_BEGIN_ALLOW_THREADS
    /* The rows this chunk will likely add: at the rate of the chunks before (+25%), at most the bound. The
     * rate counts rewound rows too: after a rewind the chunk lands on rows [0, expect) again. */
    int64_t bound = (int64_t)(stop - start) / 56 + 1;
    double rows_so_far = (double)(d->rows_rewound + d->rows);
    int64_t expect = d->bytes_walked ? (int64_t)((double)(stop - start) * rows_so_far / (double)d->bytes_walked * 1.25) + 1024 : bound;
    int64_t hi = d->rows + (expect < bound ? expect : bound);
    prefault_columns(&cv, d->rows, hi < out.capacity ? hi : out.capacity);
    while (stop - off >= 16) {
        const uint8_t *h = data + off;
        uint32_t caplen = rd32(h + 8, big_endian);
        if ((long long)caplen > limit) {
            bad_caplen = caplen;
            break;
        }
        if ((Py_ssize_t)caplen > stop - off - 16)
            break;
        int64_t ts_ns = (int64_t)rd32(h, big_endian) * 1000000000LL + (int64_t)rd32(h + 4, big_endian) * ns_per_tick;
        status = decode_record(d, h + 16, caplen, rd32(h + 12, big_endian), ts_ns, linktype, &out, &counts);
        if (status)
            break;
        records++;
        off += 16 + (Py_ssize_t)caplen;
    }
    Py_END_ALLOW_THREADS
    d->busy = 0;
    d->record_index += records;
    d->bytes_walked += off - start;
    release_columns(&cv);
    PyBuffer_Release(&buf);
    if (status)
        return loop_status_error(status);
    PyObject *ct = counts_tuple(&counts);
    if (!ct)
        return NULL;
    return Py_BuildValue("nLNL", off, (long long)records, ct, (long long)bad_caplen);
}

/* --- pcapng ----------------------------------------------------------------------------------------------- */

/* An interface as reader._read_pcapng_native hands it over (48 bytes, native order):
 * ts_ns = ticks * num (kind 0), ticks // den (kind 1), (ticks * num) >> den (kind 2), 0 (kind 3). */
typedef struct {
    int64_t linktype;
    int64_t snaplen;
    uint64_t num;
    int64_t kind;
    uint64_t den;
    int64_t unused;
} Interface;

enum { TS_MUL = 0, TS_DIV = 1, TS_SHIFT = 2, TS_ZERO = 3 };

/* Block walk statuses: where it stopped and why. */
enum {
    NG_END = 0,          /* fewer than 12 bytes left */
    NG_INCOMPLETE = 1,   /* the block at off does not end within the buffer */
    NG_PYTHON = 2,       /* a section header or interface description: Python reads it */
    NG_BAD_LENGTH = 3,
    NG_INCONSISTENT = 4,
    NG_TIMESTAMP = 5,
    NG_SIMPLE_FIRST = 6, /* a simple packet block before any interface */
    NG_TABLE_FULL = 7
};

static void mul64(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo)
{
    uint64_t a0 = a & 0xFFFFFFFFu, a1 = a >> 32, b0 = b & 0xFFFFFFFFu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
    *lo = (mid << 32) | (p00 & 0xFFFFFFFFu);
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* ticks -> ns as the twin's exact integer arithmetic; 0 if the result passes int64 (year 2262). */
static int ticks_to_ns(const Interface *iface, uint64_t ticks, int64_t *ns)
{
    uint64_t hi, lo;
    switch (iface->kind) {
    case TS_MUL:
        mul64(ticks, iface->num, &hi, &lo);
        break;
    case TS_DIV:
        hi = 0;
        lo = ticks / iface->den;
        break;
    case TS_SHIFT: {
        mul64(ticks, iface->num, &hi, &lo);
        uint64_t s = iface->den;
        if (s >= 128) {
            hi = lo = 0;
        } else if (s >= 64) {
            lo = hi >> (s - 64);
            hi = 0;
        } else if (s > 0) {
            lo = (lo >> s) | (hi << (64 - s));
            hi >>= s;
        }
        break;
    }
    default:
        hi = lo = 0;
        break;
    }
    if (hi || lo > (uint64_t)INT64_MAX)
        return 0;
    *ns = (int64_t)lo;
    return 1;
}

PyDoc_STRVAR(pcapng_blocks_doc,
"pcapng_blocks(buf, off, big_endian, interfaces, table, used) -> (status, off, used)\n\n"
"Walk pcapng blocks of buf from off, adding a (data offset, caplen, ts_ns, linktype, original length) row to\n"
"the five int64 arrays of table for each enhanced, simple or obsolete packet block; other blocks are checked\n"
"and passed.\n"
"Stops at the buffer's end (0), an incomplete block (1), a section header or interface description for\n"
"Python to read (2), or a broken block (3 bad length, 4 inconsistent, 5 timestamp past 2262, 6 simple\n"
"packet before any interface, 7 table full); off is where it stopped.");

static PyObject *pcapng_blocks(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer buf, ifaces_buf;
    Py_ssize_t off, used;
    int big;
    PyObject *table;
    if (!PyArg_ParseTuple(args, "y*npy*On:pcapng_blocks", &buf, &off, &big, &ifaces_buf, &table, &used))
        return NULL;
    Py_buffer tv[5];
    int held = 0;
    PyObject *fast = NULL;
    PyObject *result = NULL;
    if (off < 0 || off > buf.len || ifaces_buf.len % (Py_ssize_t)sizeof(Interface) || used < 0) {
        PyErr_SetString(PyExc_ValueError, "pcapng_blocks: bad offset, interfaces or row count");
        goto done;
    }
    fast = PySequence_Fast(table, "table must be 5 int64 arrays");
    if (!fast)
        goto done;
    if (PySequence_Fast_GET_SIZE(fast) != 5) {
        PyErr_SetString(PyExc_ValueError, "table must be 5 int64 arrays");
        goto done;
    }
    Py_ssize_t rows_cap = PY_SSIZE_T_MAX;
    for (int i = 0; i < 5; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &tv[i],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        held++;
        if (tv[i].itemsize != 8) {
            PyErr_SetString(PyExc_ValueError, "table must be 5 int64 arrays");
            goto done;
        }
        if (tv[i].len / 8 < rows_cap)
            rows_cap = tv[i].len / 8;
    }
    if (used > rows_cap) {
        PyErr_SetString(PyExc_ValueError, "pcapng_blocks: more rows used than the table holds");
        goto done;
    }
    {
        int64_t *t_off = tv[0].buf, *t_caplen = tv[1].buf, *t_ts = tv[2].buf, *t_lt = tv[3].buf, *t_orig = tv[4].buf;
        const uint8_t *data = buf.buf;
        Py_ssize_t n = buf.len;
        Interface ifaces_local[1];
        const Interface *ifaces = ifaces_buf.len ? (const Interface *)ifaces_buf.buf : ifaces_local;
        /* The interface table comes as bytes; copy it if the buffer is not aligned for int64. */
        Interface *aligned = NULL;
        size_t n_ifaces = (size_t)ifaces_buf.len / sizeof(Interface);
        if (n_ifaces && ((uintptr_t)ifaces_buf.buf % sizeof(int64_t))) {
            aligned = PyMem_Malloc(n_ifaces * sizeof(Interface));
            if (!aligned) {
                PyErr_NoMemory();
                goto done;
            }
            memcpy(aligned, ifaces_buf.buf, n_ifaces * sizeof(Interface));
            ifaces = aligned;
        }
        int status = NG_END;
        Py_BEGIN_ALLOW_THREADS
        while (n - off >= 12) {
            const uint8_t *b = data + off;
            if (b[0] == 0x0A && b[1] == 0x0D && b[2] == 0x0D && b[3] == 0x0A) {
                status = NG_PYTHON;
                break;
            }
            uint32_t btype = rd32(b, big), blen = rd32(b + 4, big);
            if (btype == 1) {
                status = NG_PYTHON;
                break;
            }
            uint32_t min_len = btype == 2 ? 32 : btype == 3 ? 16 : btype == 5 ? 28 : btype == 6 ? 32 : 12;
            if (blen < min_len || blen % 4 || blen > (1u << 20) + 64) {
                status = NG_BAD_LENGTH;
                break;
            }
            if ((Py_ssize_t)blen > n - off) {
                status = NG_INCOMPLETE;
                break;
            }
            if (btype == 6 || btype == 2) {
                uint32_t iface_id = btype == 6 ? rd32(b + 8, big) : rd16(b + 8, big);
                uint32_t caplen = rd32(b + 20, big);
                if (iface_id >= n_ifaces || 32 + (uint64_t)caplen > blen) {
                    status = NG_INCONSISTENT;
                    break;
                }
                uint64_t ticks = ((uint64_t)rd32(b + 12, big) << 32) | rd32(b + 16, big);
                int64_t ts_ns;
                if (!ticks_to_ns(&ifaces[iface_id], ticks, &ts_ns)) {
                    status = NG_TIMESTAMP;
                    break;
                }
                if (used >= rows_cap) {
                    status = NG_TABLE_FULL;
                    break;
                }
                t_off[used] = off + 28;
                t_caplen[used] = caplen;
                t_ts[used] = ts_ns;
                t_lt[used] = ifaces[iface_id].linktype;
                t_orig[used] = rd32(b + 24, big);
                used++;
            } else if (btype == 3) {
                if (!n_ifaces) {
                    status = NG_SIMPLE_FIRST;
                    break;
                }
                if (used >= rows_cap) {
                    status = NG_TABLE_FULL;
                    break;
                }
                uint64_t caplen = rd32(b + 8, big);
                t_orig[used] = (int64_t)caplen; /* a simple packet block holds the original length */
                uint64_t room = blen - 16;
                uint64_t snap = ifaces[0].snaplen > 0 ? (uint64_t)ifaces[0].snaplen : caplen;
                if (room < caplen)
                    caplen = room;
                if (snap < caplen)
                    caplen = snap;
                t_off[used] = off + 12;
                t_caplen[used] = (int64_t)caplen;
                t_ts[used] = 0;
                t_lt[used] = ifaces[0].linktype;
                used++;
            }
            off += blen;
        }
        Py_END_ALLOW_THREADS
        PyMem_Free(aligned);
        result = Py_BuildValue("inn", status, off, used);
    }
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&tv[i]);
    Py_XDECREF(fast);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&ifaces_buf);
    return result;
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(buf, offsets, caplens, ts_ns, origs, count, linktype, columns) -> skip_counts\n\n"
"Decode count records of one link type whose data lie at buf[offsets[i]:offsets[i] + caplens[i]], origs[i]\n"
"bytes long on the wire (int64 arrays; a record outside buf is a ValueError before anything is decoded).");

static PyObject *Decoder_decode_rows(Decoder *d, PyObject *args)
{
    Py_buffer buf, offs, caps, tss, origs;
    Py_ssize_t count;
    int linktype;
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*niO:decode_rows", &buf, &offs, &caps, &tss, &origs, &count, &linktype,
                          &columns))
        return NULL;
    PyObject *result = NULL;
    ColumnViews cv;
    cv.held = 0;
    if (count < 0 || offs.len / 8 < count || caps.len / 8 < count || tss.len / 8 < count || origs.len / 8 < count
        || !supported_linktype(linktype)) {
        PyErr_SetString(PyExc_ValueError, "decode_rows: arrays shorter than count, or a bad link type");
        goto done;
    }
    const int64_t *o = offs.buf, *c = caps.buf, *t = tss.buf, *w = origs.buf;
    int64_t o_item, c_item;
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(&o_item, (const char *)o + 8 * i, 8);
        memcpy(&c_item, (const char *)c + 8 * i, 8);
        if (o_item < 0 || c_item < 0 || o_item > buf.len || c_item > buf.len - o_item) {
            PyErr_SetString(PyExc_ValueError, "decode_rows: a record lies outside the buffer");
            goto done;
        }
    }
    Columns out;
    if (get_columns(columns, &cv, &out) < 0)
        goto done;
    if (claim(d) < 0)
        goto done;
    {
        Counts counts;
        memset(&counts, 0, sizeof counts);
        int status = ST_OK;
        const uint8_t *data = buf.buf;
        Py_BEGIN_ALLOW_THREADS
        int64_t hi = d->rows + count;
        prefault_columns(&cv, d->rows, hi < out.capacity ? hi : out.capacity);
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t ts_item, w_item;
            memcpy(&o_item, (const char *)o + 8 * i, 8);
            memcpy(&c_item, (const char *)c + 8 * i, 8);
            memcpy(&ts_item, (const char *)t + 8 * i, 8);
            memcpy(&w_item, (const char *)w + 8 * i, 8);
            status = decode_record(d, data + o_item, c_item, w_item, ts_item, linktype, &out, &counts);
            if (status)
                break;
        }
        Py_END_ALLOW_THREADS
        d->busy = 0;
        if (status)
            loop_status_error(status);
        else
            result = counts_tuple(&counts);
    }
done:
    release_columns(&cv);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&caps);
    PyBuffer_Release(&tss);
    PyBuffer_Release(&origs);
    return result;
}

/* --- the rest of the Decoder type ---------------------------------------------------------------------------- */

static PyObject *Decoder_skip_frames(Decoder *d, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "skip_frames: a negative count");
        return NULL;
    }
    d->frames += n;
    Py_RETURN_NONE;
}

static PyObject *Decoder_endpoint_keys(Decoder *d, PyObject *args)
{
    Py_ssize_t first = 0;
    if (!PyArg_ParseTuple(args, "|n:endpoint_keys", &first))
        return NULL;
    if (first < 0 || (size_t)first > d->endpoints) {
        PyErr_SetString(PyExc_ValueError, "endpoint_keys: first is past the endpoints numbered");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)d->endpoint_keys + (size_t)first * ENDPOINT_KEY_BYTES,
                                     (Py_ssize_t)((d->endpoints - (size_t)first) * ENDPOINT_KEY_BYTES));
}

/* Streaming: the rows written so far have been handed on, so the next chunk writes from row 0 of the same
 * columns. Frames, endpoint ids, record and byte counters carry on; the SYN table holds the new rows only. */
static PyObject *Decoder_rewind(Decoder *d, PyObject *Py_UNUSED(ignored))
{
    if (d->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this Decoder is already decoding in another thread");
        return NULL;
    }
    d->rows_rewound += d->rows;
    d->rows = 0;
    d->syn_count = 0;
    Py_RETURN_NONE;
}

static PyObject *Decoder_syn_rows(Decoder *d, PyObject *Py_UNUSED(ignored))
{
    return PyBytes_FromStringAndSize((const char *)d->syns, (Py_ssize_t)(d->syn_count * sizeof(SynRow)));
}

static int Decoder_init(Decoder *d, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"first_frame", NULL};
    long long first_frame = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L:Decoder", kwlist, &first_frame))
        return -1;
    if (d->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Decoder is in use");
        return -1;
    }
    d->first_frame = first_frame;
    d->frames = d->rows = d->rows_rewound = d->record_index = d->bytes_walked = 0;
    PyMem_RawFree(d->v4_keys);
    PyMem_RawFree(d->v4_ids);
    PyMem_RawFree(d->v6);
    PyMem_RawFree(d->endpoint_keys);
    PyMem_RawFree(d->syns);
    d->v4_keys = NULL;
    d->v4_ids = NULL;
    d->v6 = NULL;
    d->endpoint_keys = NULL;
    d->syns = NULL;
    d->v4_cap = d->v4_used = d->v6_cap = d->v6_used = 0;
    d->endpoints = d->endpoint_cap = d->syn_count = d->syn_cap = 0;
    return 0;
}

static void Decoder_dealloc(Decoder *d)
{
    PyMem_RawFree(d->v4_keys);
    PyMem_RawFree(d->v4_ids);
    PyMem_RawFree(d->v6);
    PyMem_RawFree(d->endpoint_keys);
    PyMem_RawFree(d->syns);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyObject *Decoder_get_frames(Decoder *d, void *Py_UNUSED(closure)) { return PyLong_FromLongLong(d->frames); }
static PyObject *Decoder_get_rows(Decoder *d, void *Py_UNUSED(closure)) { return PyLong_FromLongLong(d->rows); }
static PyObject *Decoder_get_record_index(Decoder *d, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(d->record_index);
}
static PyObject *Decoder_get_endpoints(Decoder *d, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(d->endpoints);
}

static PyGetSetDef Decoder_getset[] = {
    {"frames", (getter)Decoder_get_frames, NULL, "records decoded so far, kept or skipped", NULL},
    {"rows", (getter)Decoder_get_rows, NULL, "rows written to the columns since the last rewind", NULL},
    {"record_index", (getter)Decoder_get_record_index, NULL, "pcap records walked so far", NULL},
    {"endpoints", (getter)Decoder_get_endpoints, NULL, "endpoints numbered so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Decoder_methods[] = {
    {"pcap_chunk", (PyCFunction)Decoder_pcap_chunk, METH_VARARGS, pcap_chunk_doc},
    {"decode_rows", (PyCFunction)Decoder_decode_rows, METH_VARARGS, decode_rows_doc},
    {"skip_frames", (PyCFunction)Decoder_skip_frames, METH_O,
     "skip_frames(n): count n records that are not decoded (an unsupported pcapng link type)"},
    {"endpoint_keys", (PyCFunction)Decoder_endpoint_keys, METH_VARARGS,
     "endpoint_keys(first=0) -> bytes: 19 bytes per endpoint id from id first on (family 4/6, 16 address bytes, "
     "big-endian port)"},
    {"rewind", (PyCFunction)Decoder_rewind, METH_NOARGS,
     "rewind(): the next row is written at row 0 again and the SYN table is emptied (streaming: the rows so far "
     "were handed on); frames, endpoints and the record count carry on"},
    {"syn_rows", (PyCFunction)Decoder_syn_rows, METH_NOARGS,
     "syn_rows() -> bytes: per SYN row int64 row, int32 mss (-1: none), wscale (-1: none), sack_permitted, "
     "timestamps (native order)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "diag.capture._cpcap.Decoder",
    .tp_doc = PyDoc_STR("Decoder(first_frame=1): columns from capture records, endpoint ids across chunks"),
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_getset = Decoder_getset,
};

static PyMethodDef module_methods[] = {
    {"pcapng_blocks", pcapng_blocks, METH_VARARGS, pcapng_blocks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "diag.capture._cpcap",
    .m_doc = "The capture reader's per-record work in C; reader.py holds its numpy twin.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__cpcap(void)
{
    if (PyType_Ready(&DecoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "INTERFACE_BYTES", (long)sizeof(Interface)) < 0
        || PyModule_AddIntConstant(m, "SYN_ROW_BYTES", (long)sizeof(SynRow)) < 0
        || PyModule_AddIntConstant(m, "ENDPOINT_KEY_BYTES", ENDPOINT_KEY_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

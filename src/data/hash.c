// hash.c: the content hash of data read from files (data_impl.h), taken piece by piece
// as the readers bring the bytes in, so that ranks can compare what they train on
// without reading a file twice.
//
// Four lanes of 64 bits, each taking every fourth 8-byte word of a 32-byte stripe:
//   lane = rotl(lane + word * K2, 31) * K1
// (a multiply-rotate round with the odd 64-bit constants of xxHash64), then the lanes
// are folded, the length and the tail (under 32 bytes) mixed in, and the result
// avalanched. Four independent lanes keep a core's multipliers busy: about 9 GB/s on
// the 2-core VM, where fread from the page cache delivers about 2 GB/s and CRC32C
// (src/core, table-driven) hashes 2 GB/s; so the readers' hash adds a fifth or less to
// a read. It is meant to tell a changed byte from none, not to resist an adversary.
#include "data_impl.h"

#include <string.h>

#define K1 0x9E3779B185EBCA87ull
#define K2 0xC2B2AE3D27D4EB4Full
#define K3 0x165667B19E3779F9ull
#define K4 0x85EBCA77C2B2AE63ull

static uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static uint64_t load64(const uint8_t *p) { // little-endian, whatever the host
    uint64_t v;
    memcpy(&v, p, sizeof v); // one load
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint64_t round64(uint64_t lane, uint64_t word) {
    return rotl(lane + word * K2, 31) * K1;
}

static void stripes(dt_data_hash *h, const uint8_t *p, size_t n) {
    uint64_t a = h->lane[0], b = h->lane[1], c = h->lane[2], d = h->lane[3];
    for (; n >= 32; p += 32, n -= 32) {
        a = round64(a, load64(p));
        b = round64(b, load64(p + 8));
        c = round64(c, load64(p + 16));
        d = round64(d, load64(p + 24));
    }
    h->lane[0] = a, h->lane[1] = b, h->lane[2] = c, h->lane[3] = d;
}

void dt_data_hash_init(dt_data_hash *h) {
    memset(h, 0, sizeof *h);
    h->lane[0] = K1 + K2;
    h->lane[1] = K2;
    h->lane[2] = 0;
    h->lane[3] = 0 - K1;
}

void dt_data_hash_add(dt_data_hash *h, const void *data, size_t n) {
    const uint8_t *p = data;
    h->total += n;
    if (h->ntail) { // complete the stripe left over from the last piece first
        size_t take = 32 - h->ntail < n ? 32 - h->ntail : n;
        memcpy(h->tail + h->ntail, p, take);
        h->ntail += take, p += take, n -= take;
        if (h->ntail < 32)
            return;
        stripes(h, h->tail, 32);
        h->ntail = 0;
    }
    size_t whole = n & ~(size_t)31;
    stripes(h, p, whole);
    memcpy(h->tail, p + whole, n - whole);
    h->ntail = n - whole;
}

uint64_t dt_data_hash_end(const dt_data_hash *h) {
    uint64_t v =
        rotl(h->lane[0], 1) + rotl(h->lane[1], 7) + rotl(h->lane[2], 12) + rotl(h->lane[3], 18);
    for (int i = 0; i < 4; i++)
        v = (v ^ round64(0, h->lane[i])) * K1 + K4;
    v += h->total;
    size_t i = 0;
    for (; i + 8 <= h->ntail; i += 8)
        v = rotl(v ^ round64(0, load64(h->tail + i)), 27) * K1 + K4;
    for (; i < h->ntail; i++)
        v = rotl(v ^ (h->tail[i] * 0x27D4EB2F165667C5ull), 11) * K1;
    v ^= v >> 33; // avalanche: every input bit reaches every output bit
    v *= K2;
    v ^= v >> 29;
    v *= K3;
    v ^= v >> 32;
    return v;
}

uint64_t dt_data_hash_bytes(const void *data, size_t n) {
    dt_data_hash h;
    dt_data_hash_init(&h);
    dt_data_hash_add(&h, data, n);
    return dt_data_hash_end(&h);
}

uint64_t dt_data_hash_pair(uint64_t a, uint64_t b) {
    uint8_t bytes[16];
    for (int i = 0; i < 8; i++)
        bytes[i] = (uint8_t)(a >> 8 * i), bytes[8 + i] = (uint8_t)(b >> 8 * i);
    return dt_data_hash_bytes(bytes, sizeof bytes);
}

size_t dt_data_read_hashed(void *dst, size_t n, FILE *f, dt_data_hash *h) {
    // In pieces that stay in the cache between the read and the hash.
    enum { PIECE = 1 << 20 };
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < PIECE ? n - done : PIECE;
        size_t got  = fread((uint8_t *)dst + done, 1, want, f);
        dt_data_hash_add(h, (uint8_t *)dst + done, got);
        done += got;
        if (got < want)
            break;
    }
    return done;
}

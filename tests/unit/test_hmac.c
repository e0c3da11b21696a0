// test_hmac.c: SHA-256 against the FIPS 180-4 examples and HMAC-SHA256 against every
// RFC 4231 test case (case 5's truncated output compared on its 16 bytes), fed whole
// and in pieces; the constant-time comparison; random bytes that differ between calls.
#include "../check.h"
#include "core/hmac.h"

#include <stdlib.h>
#include <string.h>

static void unhex(const char *h, uint8_t *out, size_t *n) {
    size_t k = 0;
    for (; h[0] && h[1]; h += 2) {
        char b[3] = {h[0], h[1], 0};
        out[k++]  = (uint8_t)strtoul(b, NULL, 16);
    }
    *n = k;
}

static bool same_hex(const uint8_t *d, size_t n, const char *want) {
    uint8_t w[64];
    size_t  wn;
    unhex(want, w, &wn);
    return wn <= n && memcmp(d, w, wn) == 0;
}

static void test_sha256(void) {
    check_current = "sha256";
    struct {
        const char *msg, *digest;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t   d[32];
        dt_sha256 s;
        dt_sha256_init(&s);
        // one byte at a time, so the buffering is exercised
        for (const char *p = v[i].msg; *p; p++)
            dt_sha256_update(&s, p, 1);
        dt_sha256_final(&s, d);
        CHECK(same_hex(d, 32, v[i].digest));
    }
    // a million 'a': many blocks
    char *m = malloc(1000000);
    memset(m, 'a', 1000000);
    uint8_t   d[32];
    dt_sha256 s;
    dt_sha256_init(&s);
    dt_sha256_update(&s, m, 333333);
    dt_sha256_update(&s, m, 1000000 - 333333);
    dt_sha256_final(&s, d);
    CHECK(same_hex(d, 32, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    free(m);
}

static void test_rfc4231(void) {
    check_current = "hmac rfc4231";
    char big_key[2 * 131 + 1]; // 131 bytes of 0xaa, in hex
    memset(big_key, 'a', 2 * 131);
    big_key[2 * 131] = '\0';
    struct {
        const char *key, *data; // hex
        const char *mac;
    } v[] = {
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
         "a3b6167473100ee06e0c796c2955552b"},
        {big_key,
         "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048617368"
         "204b6579204669727374",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {big_key,
         "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73697a"
         "65206b657920616e642061206c6172676572207468616e20626c6f636b2d73697a6520646174612e20546865"
         "206b6579206e6565647320746f20626520686173686564206265666f7265206265696e672075736564206279"
         "2074686520484d414320616c676f726974686d2e",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t key[256], data[512], mac[32];
        size_t  kn, dn;
        unhex(v[i].key, key, &kn);
        unhex(v[i].data, data, &dn);
        const void *parts[1] = {data};
        size_t      lens[1]  = {dn};
        dt_hmac_sha256(key, kn, 1, parts, lens, mac);
        if (!CHECK(same_hex(mac, 32, v[i].mac)))
            fprintf(stderr, "     RFC 4231 test case %zu\n", i + 1);
        // the same message cut in three parts
        const void *p3[3] = {data, data + dn / 3, data + dn / 2};
        size_t      l3[3] = {dn / 3, dn / 2 - dn / 3, dn - dn / 2};
        uint8_t     mac3[32];
        dt_hmac_sha256(key, kn, 3, p3, l3, mac3);
        CHECK(memcmp(mac, mac3, 32) == 0);
    }
}

static void test_misc(void) {
    check_current = "ct_equal, random";
    uint8_t a[32] = {0}, b[32] = {0};
    CHECK(dt_ct_equal(a, b, 32));
    b[31] = 1;
    CHECK(!dt_ct_equal(a, b, 32));
    CHECK(dt_ct_equal(a, b, 31));
    dt_random_bytes(a, sizeof a);
    dt_random_bytes(b, sizeof b);
    CHECK(memcmp(a, b, 32) != 0);
}

int main(void) {
    test_sha256();
    test_rfc4231();
    test_misc();
    return check_summary();
}

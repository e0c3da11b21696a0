// fuzz_store_msg.c: arbitrary bytes from a store client must give an error reply (or a
// clean parse), never a crash, a leak or a read out of bounds. The server's parser,
// request checks and every command handler run on the input, without sockets.
#include <stddef.h>
#include <stdint.h>

void dt_store_fuzz_serve(const uint8_t *data, size_t n);
int  LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // The server accepts a client only after hello and auth; prepend them half of the
    // time so the handlers behind them are reached too.
    // hello (protocol 2, a nonce) and auth with an empty proof: the fuzz server has no
    // token, so it admits the client.
    static const uint8_t hello[] = {
        'D', 'T', 'S', '1', 1,   0,   2,  0,  2,  0,  0,  0,  0,  0,   0,   0,   46,
        0,   0,   0,   0,   0,   0,   0,  32, 0,  0,  0,  0,  1,  2,   3,   4,   5,
        6,   7,   8,   9,   10,  11,  12, 13, 14, 15, 16, 17, 18, 19,  20,  21,  22,
        23,  24,  25,  26,  27,  28,  29, 30, 31, 6,  0,  0,  0,  'd', 't', 'r', 'a',
        'i', 'n', 'D', 'T', 'S', '1', 9,  0,  1,  0,  0,  0,  0,  0,   0,   0,   0,
        0,   4,   0,   0,   0,   0,   0,  0,  0,  0,  0,  0,  0};
    uint8_t buf[4096 + sizeof hello];
    if (size > 4096 || size == 0 || (data[0] & 1)) {
        dt_store_fuzz_serve(data, size);
        return 0;
    }
    for (size_t i = 0; i < sizeof hello; i++)
        buf[i] = hello[i];
    for (size_t i = 0; i < size; i++)
        buf[sizeof hello + i] = data[i];
    dt_store_fuzz_serve(buf, sizeof hello + size);
    return 0;
}

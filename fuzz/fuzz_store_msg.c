// fuzz_store_msg.c: arbitrary bytes from a store client must give an error reply (or a
// clean parse), never a crash, a leak or a read out of bounds. The server's parser,
// request checks and every command handler run on the input, without sockets.
#include <stddef.h>
#include <stdint.h>

void dt_store_fuzz_serve(const uint8_t *data, size_t n);
int  LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // The server accepts a client only after a hello; prepend one half of the time so
    // the handlers behind it are reached too.
    static const uint8_t hello[] = {'D', 'T', 'S', '1', 1, 0, 2,   0,   1,   0,   0,   0,  0,
                                    0,   0,   0,   14,  0, 0, 0,   0,   0,   0,   0,   0,  0,
                                    0,   0,   6,   0,   0, 0, 'd', 't', 'r', 'a', 'i', 'n'};
    uint8_t              buf[4096 + sizeof hello];
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

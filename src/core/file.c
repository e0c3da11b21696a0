// file.c: opening files to read without trusting what the path names (file.h).
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

const char *dt_file_kind(unsigned mode) {
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISREG(mode)  ? "a regular file"
                            : "a special file";
}

dt_status dt_open_regular(const char *path, FILE **out, uint64_t *size) {
    *out = NULL;
    // O_NONBLOCK: opening a FIFO must not wait for a writer; cleared once it is known
    // to be a regular file.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "%s: cannot open", path);
    struct stat sb;
    int         fl;
    dt_status   st = DT_OK;
    if (fstat(fd, &sb) != 0)
        st = dt_fail_errno(DT_ERR_IO, "%s: cannot stat", path);
    else if (!S_ISREG(sb.st_mode))
        st = dt_fail(DT_ERR_IO, "%s: expected a regular file, found %s", path,
                     dt_file_kind(sb.st_mode));
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        st = dt_fail_errno(DT_ERR_IO, "%s: cannot set blocking reads", path);
    FILE *f = st == DT_OK ? fdopen(fd, "rb") : NULL;
    if (st == DT_OK && !f)
        st = dt_fail_errno(DT_ERR_IO, "%s: cannot open", path);
    if (st) {
        close(fd);
        return st;
    }
    *out  = f;
    *size = (uint64_t)sb.st_size;
    return DT_OK;
}

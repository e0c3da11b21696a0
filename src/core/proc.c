// proc.c: processes: pidfds (core.h), the kernel's handle on a process that tells its
// end through poll() without being its parent and without the race of a reused pid.
#include "dtrain/core.h"

#include <sys/syscall.h>
#include <unistd.h>

// The number is the same on every architecture (the unified syscall table of 5.3);
// older C libraries' headers do not have the name.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

int dt_pidfd_open(int pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

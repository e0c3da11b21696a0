// guard.h: dtrain-mnist's start-up checks and its preemption stop, kept apart from the
// training loop in main.c.
#ifndef DTRAIN_MNIST_GUARD_H
#define DTRAIN_MNIST_GUARD_H

#include "dtrain/comm.h"

#include <stdbool.h>
#include <stdint.h>

// Exit status of a run stopped by SIGTERM (a scheduler's preemption notice) at a step
// boundary agreed by every rank, its state saved when --checkpoint-dir is set:
// EX_TEMPFAIL of sysexits.h ("try again later": rerun with --resume). dtrun ends the
// job without a restart when its workers exit with it.
#define MNIST_EXIT_PREEMPTED 75

// --save-model PATH: its directory exists and takes a new file (probed with a temporary
// file, removed at once; PATH itself is not touched), and PATH, when it exists, is a
// regular file. --checkpoint-dir DIR: created when missing (with its parents), a
// directory, and writable. Errors name the path and the errno text.
dt_status mnist_check_save_model(const char *path);
dt_status mnist_check_checkpoint_dir(const char *dir);

// A setting every rank must share, as a 64-bit value (doubles by their bits: is_double).
typedef struct mnist_setting {
    const char *flag; // "--batch-size"
    int64_t     value;
    bool        is_double, is_bool; // printed as a number, or as "on"/"off"
} mnist_setting;

// Collective: every rank sends its settings to every other; on any difference every
// rank fails with the same message naming the flag, rank 0's value and the first
// differing rank's value. n must be the same on every rank (it is the program's table).
dt_status mnist_check_settings(dt_pg *pg, const mnist_setting *s, int n);

// SIGTERM handling (see guard.c). mnist_preempt_block: blocks SIGTERM in the calling
// (main) thread before any other starts, so they all inherit the mask; call first.
// mnist_preempt_watch: in a process that trains (not the parent of --num-processes,
// whose dt_spawn forwards the signal), starts the thread that takes SIGTERM: before
// mnist_preempt_arm and after mnist_preempt_release it ends the process at once, as
// usual; in between it is a request to stop at the next step boundary.
void mnist_preempt_block(void);
void mnist_preempt_watch(void);
void mnist_preempt_arm(void);
// Whether a SIGTERM came since the last call (consumed: reported once).
bool mnist_preempt_pending(void);
// Collective (pg may be NULL): whether any rank has seen a SIGTERM so far; every rank
// gets the same answer for the same step. *stop is sticky (true stays true).
dt_status mnist_preempt_agree(dt_pg *pg, bool *stop);
// Training is over: a SIGTERM that came after the last agreement, or any later one,
// ends the process at once.
void mnist_preempt_release(void);

#endif

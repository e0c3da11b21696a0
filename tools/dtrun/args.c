// args.c: dtrun's command line. One table describes every flag: getopt_long's option
// array and the --help text are both generated from it, so they cannot disagree.
// Flags follow torchrun's names; the underscore spellings (--nproc_per_node) are
// accepted too, as torchrun accepts them.
#include "dtrun.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    OPT_NPROC = 1000,
    OPT_NNODES,
    OPT_NODE_RANK,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_STANDALONE,
    OPT_MAX_RESTARTS,
    OPT_LOG_DIR,
    OPT_TEE,
    OPT_RDZV_ID,
    OPT_RDZV_ENDPOINT,
    OPT_RDZV_TIMEOUT,
    OPT_NODE_TIMEOUT,
    OPT_STOP_GRACE,
    OPT_TERM_GRACE,
    OPT_HELP,
    OPT_HELP_ENV,
    OPT_VERSION,
};

typedef struct flag {
    const char *name;
    int         id;
    const char *metavar; // NULL: the flag takes no value
    const char *help;
} flag;

static const flag flags[] = {
    {"nproc-per-node", OPT_NPROC, "N",
     "worker processes on this node: a number, or \"cpu\" or \"auto\" for one per CPU core "
     "(default 1)"},
    {"nnodes", OPT_NNODES, "M",
     "nodes in the job, one dtrun on each (default 1; \"M:M\" is M); MIN:MAX: an elastic "
     "job whose nodes may come and go, ranks by arrival, through the store at "
     "--rdzv-endpoint (docs/dtrun.md)"},
    {"node-rank", OPT_NODE_RANK, "K",
     "this node's index in [0, M) (default 0); node 0 hosts the "
     "store"},
    {"master-addr", OPT_MASTER_ADDR, "A",
     "address of node 0 as every node reaches it (default $MASTER_ADDR, else 127.0.0.1)"},
    {"master-port", OPT_MASTER_PORT, "P",
     "port of node 0's store (default $MASTER_PORT, else 29500); on one node, the workers' "
     "MASTER_PORT (default: a free port)"},
    {"standalone", OPT_STANDALONE, NULL, "a single-node job on a free port"},
    {"max-restarts", OPT_MAX_RESTARTS, "R",
     "after a worker fails, stop every worker and restart the whole group, up to R times "
     "(default 0)"},
    {"log-dir", OPT_LOG_DIR, "D",
     "write each rank's output to D/attempt_<restart>/rank_<rank>.log instead of the console"},
    {"tee", OPT_TEE, NULL, "with --log-dir, also relay the output to the console"},
    {"rdzv-id", OPT_RDZV_ID, "ID",
     "job id, given to the workers as TORCHELASTIC_RUN_ID "
     "(default \"none\")"},
    {"rdzv-endpoint", OPT_RDZV_ENDPOINT, "HOST[:PORT]",
     "node 0's store as torchrun's rendezvous endpoint: the same as --master-addr HOST "
     "--master-port PORT (not with them)"},
    {"rdzv-timeout", OPT_RDZV_TIMEOUT, "S",
     "seconds to wait for every node to join (default "
     "600)"},
    {"node-timeout", OPT_NODE_TIMEOUT, "S",
     "seconds without news from a node before it counts as lost (default 15, or $DT_TIMEOUT_MS "
     "when that is shorter, but at least 1)"},
    {"stop-grace", OPT_STOP_GRACE, "S",
     "seconds between SIGTERM and SIGKILL when stopping workers (default 1)"},
    {"term-grace", OPT_TERM_GRACE, "S",
     "when dtrun itself gets SIGTERM (a scheduler's preemption notice): seconds the workers "
     "get, after it is forwarded, to reach a step boundary and save a checkpoint before SIGKILL "
     "(default 30; at least --stop-grace)"},
    {"help", OPT_HELP, NULL, "this text"},
    {"help-env", OPT_HELP_ENV, NULL,
     "every DT_* environment variable the workers' library reads: meaning, default, range"},
    {"version", OPT_VERSION, NULL, "print the version"},
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

static void print_wrapped(FILE *f, const char *text, int indent, int width) {
    int col = indent;
    for (const char *p = text; *p;) {
        const char *e = p;
        while (*e && *e != ' ')
            e++;
        int w = (int)(e - p);
        if (col > indent && col + 1 + w > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", w, p);
        col += w;
        p = *e ? e + 1 : e;
    }
    fputc('\n', f);
}

static void print_help(FILE *f) {
    fprintf(f, "usage: dtrun [options] PROGRAM [ARGS...]\n\n");
    print_wrapped(f,
                  "Runs PROGRAM as --nproc-per-node worker processes on this node, as torchrun "
                  "does: each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
                  "GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (also "
                  "DT_RESTART_COUNT), DT_JOB_TOKEN and OMP_NUM_THREADS=1 when unset. Output "
                  "lines are prefixed \"[rank N]\". When a worker fails, every worker of the job "
                  "is stopped, on every node, and a summary names the rank, host, exit code or "
                  "signal, time and last lines. For several nodes, run one dtrun per node with "
                  "the same --nnodes, --master-addr and --master-port.",
                  0, 79);
    fprintf(f, "\noptions:\n");
    for (int i = 0; i < NFLAGS; i++) {
        char left[64];
        snprintf(left, sizeof left, "  --%s%s%s", flags[i].name, flags[i].metavar ? " " : "",
                 flags[i].metavar ? flags[i].metavar : "");
        fprintf(f, "%-24s", left);
        if ((int)strlen(left) >= 24)
            fprintf(f, "\n%24s", "");
        print_wrapped(f, flags[i].help, 24, 79);
    }
    fprintf(f, "\n");
    print_wrapped(f,
                  "Preemption: SIGTERM to dtrun is forwarded to every worker, dtrun waits for "
                  "them (--term-grace) and exits 75 without a restart; a program that saves its "
                  "state at the next step and exits with 75 (EX_TEMPFAIL, as dtrain-mnist "
                  "does) can be run again with its resume flag. Workers that exit with 75 on "
                  "their own, or are ended by a SIGTERM dtrun did not send (also in their "
                  "first moments), end the job the same way.",
                  0, 79);
    fprintf(f, "\n");
    print_wrapped(f,
                  "Exit status: 0 when every worker succeeded, 1 when the job failed, 2 for a "
                  "usage error, 75 when the job stopped for a SIGTERM and every worker "
                  "stopped cleanly (preempted), 128+N when stopped by signal N otherwise.",
                  0, 79);
}

// Finds PROGRAM the way execvp would, so that a typo is a clear error before anything
// starts (and the child can use execve, which does not allocate).
static bool resolve_program(const char *prog, char *out, size_t n) {
    struct stat sb;
    if (strchr(prog, '/')) {
        snprintf(out, n, "%s", prog);
        return access(out, X_OK) == 0 && stat(out, &sb) == 0 && !S_ISDIR(sb.st_mode);
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *e   = strchr(p, ':');
        size_t      len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0)
            snprintf(out, n, "./%s", prog);
        else
            snprintf(out, n, "%.*s/%s", (int)len, p, prog);
        if (access(out, X_OK) == 0 && stat(out, &sb) == 0 && !S_ISDIR(sb.st_mode))
            return true;
        if (!e)
            return false;
        p = e + 1;
    }
}

// The environment variable the flag being parsed came from (PET_*), or NULL.
static const char *parsing_var;

static int usage_error(const char *msg) {
    if (parsing_var)
        fprintf(stderr, "dtrun: %s (from environment variable %s)\n", msg, parsing_var);
    else
        fprintf(stderr, "dtrun: %s\n(dtrun --help lists the options)\n", msg);
    return 2;
}

static int parse_seconds(const char *s, const char *what, double lo, int64_t *out_ms) {
    double v;
    if (dt_parse_double(s, lo, 1e7, what, &v) != DT_OK)
        return usage_error(dt_last_error());
    *out_ms = (int64_t)(v * 1000.0 + 0.5);
    return 0;
}

// torchrun reads each flag it was not given from PET_<FLAG> (Kubeflow's PyTorchJob sets
// PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT and the
// PET_RDZV_* variables this way): the same here. Each set variable becomes "--flag value"
// placed before the command line's own flags, so a flag given on the command line, parsed
// later, wins, and a bad value gets the flag's own error. A flag without a value is on
// for 1/true, off for 0/false. Variables for flags dtrun does not have are ignored.
typedef struct env_args {
    int         n;                 // arguments in argv
    char       *argv[2 * NFLAGS];  // "--flag" [value] pairs
    const char *var[2 * NFLAGS];   // the variable each argument came from
    char        names[NFLAGS][48]; // storage of the "--flag" strings
} env_args;

static void flag_var(const flag *f, char *var, size_t n) {
    snprintf(var, n, "PET_%s", f->name);
    for (char *p = var + 4; *p; p++)
        *p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
}

// Returns 0, or 2 after a usage error (a flag without a value set to something else
// than 1/true/0/false).
static int env_flags(env_args *e) {
    static char vars[NFLAGS][48];
    e->n = 0;
    for (int i = 0; i < NFLAGS; i++) {
        if (flags[i].id == OPT_HELP || flags[i].id == OPT_HELP_ENV || flags[i].id == OPT_VERSION)
            continue;
        flag_var(&flags[i], vars[i], sizeof vars[i]);
        const char *v = getenv(vars[i]);
        if (!v || !*v)
            continue;
        snprintf(e->names[i], sizeof e->names[i], "--%s", flags[i].name);
        if (!flags[i].metavar) {
            bool on = strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0;
            if (!on && strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0) {
                char msg[200];
                snprintf(msg, sizeof msg,
                         "environment variable %s expects 1, true, 0 or false, found \"%.60s\"",
                         vars[i], v);
                return usage_error(msg);
            }
            if (on)
                e->var[e->n] = vars[i], e->argv[e->n++] = e->names[i];
            continue;
        }
        e->var[e->n] = vars[i], e->argv[e->n++] = e->names[i];
        e->var[e->n] = vars[i], e->argv[e->n++] = (char *)(uintptr_t)v;
    }
    return 0;
}

// A PyTorchJob pod of the classic form (one process per pod) has WORLD_SIZE (the pods)
// and RANK (this pod) but no PET_* variables: without --nnodes, dtrun reads them as
// --nnodes and --node-rank, so that each pod's dtrun joins the others instead of
// training alone. With --node-rank given, or WORLD_SIZE 1, nothing is read.
static int classic_pod(dtrun_args *a) {
    const char *w = getenv("WORLD_SIZE"), *r = getenv("RANK");
    long        world, rank;
    if (!w || !*w || !r || !*r || a->node_rank_given)
        return 0;
    parsing_var = "WORLD_SIZE";
    if (dt_parse_long(w, 1, 65536, "--nnodes", &world) != DT_OK)
        return usage_error(dt_last_error());
    parsing_var = "RANK";
    if (dt_parse_long(r, 0, world - 1, "--node-rank", &rank) != DT_OK)
        return usage_error(dt_last_error());
    parsing_var = NULL;
    if (world > 1)
        dtrun_say("--nnodes %ld --node-rank %ld from WORLD_SIZE and RANK (one dtrun per pod, "
                  "as a PyTorchJob sets them)",
                  world, rank);
    a->nnodes = (int)world, a->node_rank = (int)rank;
    return 0;
}

// --rdzv-endpoint HOST[:PORT] ("[v6addr]:PORT" too): node 0's store. Without a port,
// torchrun's default rendezvous port 29400.
static dt_status parse_endpoint(const char *s, dtrun_args *a) {
    static char host[256];
    const char *colon = s[0] == '[' ? strstr(s, "]:") : strrchr(s, ':');
    size_t      hl    = colon ? (size_t)(colon - s) : strlen(s);
    long        port  = 29400;
    if (s[0] == '[' && colon)
        colon++, hl -= 1, s++;
    if (hl == 0 || hl >= sizeof host)
        return dt_fail(DT_ERR_ARG, "--rdzv-endpoint expects HOST[:PORT], found \"%s\"", s);
    if (colon)
        DT_TRY(dt_parse_long(colon + 1, 1, 65535, "--rdzv-endpoint's port", &port));
    snprintf(host, sizeof host, "%.*s", (int)hl, s);
    a->master_addr = host, a->master_port = (int)port, a->port_given = true;
    return DT_OK;
}

int dtrun_args_parse(int argc, char **argv, dtrun_args *a) {
    memset(a, 0, sizeof *a);
    a->nproc           = 1;
    a->nnodes          = 1;
    a->run_id          = "none";
    a->rdzv_timeout_ms = 600 * 1000;
    a->stop_grace_ms   = 1000;
    a->term_grace_ms   = 30000;
    a->node_timeout_ms = -1; // default below

    // Both spellings of every flag, from the table.
    struct option opts[2 * NFLAGS + 1];
    char          alt[NFLAGS][40];
    int           no = 0;
    for (int i = 0; i < NFLAGS; i++) {
        int has    = flags[i].metavar ? required_argument : no_argument;
        opts[no++] = (struct option){flags[i].name, has, NULL, flags[i].id};
        snprintf(alt[i], sizeof alt[i], "%s", flags[i].name);
        bool dashed = false;
        for (char *p = alt[i]; *p; p++)
            if (*p == '-')
                *p = '_', dashed = true;
        if (dashed)
            opts[no++] = (struct option){alt[i], has, NULL, flags[i].id};
    }
    opts[no] = (struct option){NULL, 0, NULL, 0};

    // PET_* first, then the command line: the later value of a flag wins.
    static env_args env;
    parsing_var = NULL;
    if (env_flags(&env))
        return 2;
    // The merged argv lives as long as dtrun (the program's arguments point into it);
    // held in a static so that it stays reachable, not leaked, at exit.
    static char **volatile kept __attribute__((unused)); // volatile: the store stays
    char **all = malloc(sizeof *all * (size_t)(argc + env.n + 1));
    if (!all)
        return usage_error("out of memory");
    kept   = all;
    all[0] = argv[0];
    memcpy(all + 1, env.argv, sizeof *all * (size_t)env.n);
    memcpy(all + 1 + env.n, argv + 1, sizeof *all * (size_t)argc); // with the NULL
    argc += env.n;
    argv = all;

    long        v;
    const char *nnodes_s = NULL, *nnodes_var = NULL;
    bool        endpoint = false, addr_flag = false;
    opterr = 0;
    optind = 1;
    int c;
    // "+": stop at PROGRAM, so its own flags are left alone.
    for (;;) {
        int at      = optind; // no permutation: the option read next starts here
        c           = getopt_long(argc, argv, "+:h", opts, NULL);
        parsing_var = at >= 1 && at <= env.n ? env.var[at - 1] : NULL;
        if (c == -1)
            break;
        dt_status st = DT_OK;
        switch (c) {
        case OPT_NPROC:
            if (strcmp(optarg, "cpu") == 0 || strcmp(optarg, "auto") == 0) {
                long n   = sysconf(_SC_NPROCESSORS_ONLN);
                a->nproc = n > 0 ? (int)n : 1;
            } else if ((st = dt_parse_long(optarg, 1, 4096, "--nproc-per-node", &v)) == DT_OK) {
                a->nproc = (int)v;
            }
            break;
        case OPT_NNODES:
            nnodes_s = optarg, nnodes_var = parsing_var;
            break;
        case OPT_NODE_RANK:
            if ((st = dt_parse_long(optarg, 0, 65535, "--node-rank", &v)) == DT_OK)
                a->node_rank = (int)v, a->node_rank_given = true;
            break;
        case OPT_MASTER_ADDR:
            if (!*optarg)
                return usage_error("--master-addr expects a host name or address, found \"\"");
            a->master_addr = optarg, addr_flag |= !parsing_var;
            break;
        case OPT_MASTER_PORT:
            if ((st = dt_parse_long(optarg, 1, 65535, "--master-port", &v)) == DT_OK)
                a->master_port = (int)v, a->port_given = true, addr_flag |= !parsing_var;
            break;
        case OPT_STANDALONE:
            a->standalone = true;
            break;
        case OPT_MAX_RESTARTS:
            if ((st = dt_parse_long(optarg, 0, 1000000, "--max-restarts", &v)) == DT_OK)
                a->max_restarts = (int)v;
            break;
        case OPT_LOG_DIR:
            if (!*optarg)
                return usage_error("--log-dir expects a directory, found \"\"");
            a->log_dir = optarg;
            break;
        case OPT_TEE:
            a->tee = true;
            break;
        case OPT_RDZV_ID:
            if (!*optarg || strlen(optarg) > 200 || strpbrk(optarg, " \t\n"))
                return usage_error("--rdzv-id expects 1..200 characters without spaces");
            a->run_id = optarg;
            break;
        case OPT_RDZV_ENDPOINT:
            if ((st = parse_endpoint(optarg, a)) != DT_OK)
                break;
            endpoint |= !parsing_var; // PET_RDZV_ENDPOINT overrides PET_MASTER_ADDR
            break;
        case OPT_RDZV_TIMEOUT:
            if (parse_seconds(optarg, "--rdzv-timeout", 0.001, &a->rdzv_timeout_ms))
                return 2;
            break;
        case OPT_NODE_TIMEOUT:
            if (parse_seconds(optarg, "--node-timeout", 0.1, &a->node_timeout_ms))
                return 2;
            break;
        case OPT_STOP_GRACE:
            if (parse_seconds(optarg, "--stop-grace", 0, &a->stop_grace_ms))
                return 2;
            break;
        case OPT_TERM_GRACE:
            if (parse_seconds(optarg, "--term-grace", 0, &a->term_grace_ms))
                return 2;
            break;
        case 'h':
        case OPT_HELP:
            print_help(stdout);
            return 1;
        case OPT_HELP_ENV:
            dt_settings_print(stdout);
            return 1;
        case OPT_VERSION:
            printf("dtrun (dtrain) %s\n", DT_VERSION_STRING);
            return 1;
        case ':': {
            char msg[300];
            snprintf(msg, sizeof msg, "option \"%s\" expects a value", argv[optind - 1]);
            return usage_error(msg);
        }
        default: {
            char msg[300];
            if (optopt > 0 && optopt < 256)
                snprintf(msg, sizeof msg, "unknown option \"-%c\"", optopt);
            else
                snprintf(msg, sizeof msg, "unknown option \"%s\"", argv[optind - 1]);
            return usage_error(msg);
        }
        }
        if (st != DT_OK)
            return usage_error(dt_last_error());
    }
    parsing_var = NULL;
    if (endpoint && addr_flag)
        return usage_error("--rdzv-endpoint names node 0's store, as --master-addr and "
                           "--master-port do: expected one or the other");
    parsing_var = nnodes_var;
    if (nnodes_s) {
        // torchrun's MIN:MAX form: only a fixed size is supported.
        const char *colon = strchr(nnodes_s, ':');
        char        first[32];
        if (colon) {
            snprintf(first, sizeof first, "%.*s", (int)(colon - nnodes_s), nnodes_s);
            if (strcmp(first, colon + 1) != 0) { // elastic: MIN:MAX (docs/dtrun.md)
                long lo, hi;
                if (dt_parse_long(first, 1, 65536, "--nnodes's MIN", &lo) != DT_OK ||
                    dt_parse_long(colon + 1, 1, 65536, "--nnodes's MAX", &hi) != DT_OK)
                    return usage_error(dt_last_error());
                if (lo > hi) {
                    char msg[200];
                    snprintf(msg, sizeof msg,
                             "--nnodes expects MIN:MAX with MIN <= MAX, found \"%s\"", nnodes_s);
                    return usage_error(msg);
                }
                a->elastic_min = (int)lo, a->elastic_max = (int)hi;
                snprintf(first, sizeof first, "1"); // each dtrun: its node alone
                a->node_rank = 0;                   // ranks by arrival
            }
        } else {
            snprintf(first, sizeof first, "%s", nnodes_s);
        }
        if (dt_parse_long(first, 1, 65536, "--nnodes", &v) != DT_OK)
            return usage_error(dt_last_error());
        a->nnodes = (int)v;
    } else if (classic_pod(a) != 0) {
        return 2;
    }
    parsing_var = NULL;
    if (optind >= argc)
        return usage_error("expected a PROGRAM to run after the options");
    a->prog_argv = argv + optind;
    if (a->node_rank >= a->nnodes) {
        char msg[160];
        snprintf(msg, sizeof msg, "--node-rank expects a value below --nnodes (%d), found %d",
                 a->nnodes, a->node_rank);
        return usage_error(msg);
    }
    if (a->standalone && a->nnodes > 1)
        return usage_error("--standalone is for a single node, but --nnodes is above 1");
    if ((long)a->nnodes * a->nproc > (1L << 20))
        return usage_error("--nnodes times --nproc-per-node expects at most 1048576 workers");

    // Addresses: flag, then the environment, then the defaults.
    if (!a->master_addr) {
        const char *e  = getenv("MASTER_ADDR");
        a->master_addr = e && *e ? e : "127.0.0.1";
        if (a->nnodes > 1 && !(e && *e))
            dtrun_say("--master-addr not given: using 127.0.0.1, which works only when every "
                      "node is this machine");
    }
    if (!a->port_given && !a->standalone) {
        const char *e = getenv("MASTER_PORT");
        if (e && *e) {
            if (dt_parse_long(e, 1, 65535, "environment variable MASTER_PORT", &v) != DT_OK)
                return usage_error(dt_last_error());
            a->master_port = (int)v;
            a->port_given  = true;
        }
    }
    if (a->standalone) {
        a->port_given  = false;
        a->master_port = 0;
    }
    if (a->nnodes > 1 && !a->port_given)
        a->master_port = 29500, a->port_given = true; // torchrun's default
    if (a->elastic_min && a->standalone)
        return usage_error("--standalone is for a single node, but --nnodes is an elastic range");
    if (a->elastic_min && !a->port_given)
        a->master_port = 29400, a->port_given = true; // torchrun's rendezvous port

    if (a->node_timeout_ms < 0) {
        long t;
        if (dt_setting_int("DT_TIMEOUT_MS", &t) != DT_OK)
            return usage_error(dt_last_error());
        a->node_timeout_ms = 15000;
        if (t > 0 && t < a->node_timeout_ms)
            a->node_timeout_ms = t < 1000 ? 1000 : t;
    }

    if (!resolve_program(a->prog_argv[0], a->prog_path, sizeof a->prog_path)) {
        char msg[4200];
        snprintf(msg, sizeof msg, "cannot run \"%s\": %s", a->prog_argv[0],
                 strchr(a->prog_argv[0], '/') ? "no such executable file" : "not found in PATH");
        return usage_error(msg);
    }
    return 0;
}

// cpu.c: the CPU probe (cpu.h). x86-64 asks cpuid through GCC's __builtin_cpu_supports
// (which also checks that the OS saves the wide registers) and cpuid for what GCC does
// not name; arm64 has NEON always. Cache sizes come from sysfs, then sysconf, then a
// conservative guess, so blockings never rest on one machine's constants.
#include "kernels/cpu.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

static const char *const isa_names[DT_ISA_COUNT_] = {"ref",        "avx2", "avx512",
                                                     "avx512bf16", "amx",  "neon"};

const char *dt_isa_name(dt_isa t) {
    return t >= 0 && t < DT_ISA_COUNT_ ? isa_names[t] : "?";
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dt_cpu         cpu;
static int            isa_setting = -1; // DT_ISA's level, -1 unset or invalid

// "auto" first, then the levels in dt_isa order (settings.c's DT_ISA choices).
static int read_isa_setting(void) {
    int choice = 0;
    if (dt_setting_choice("DT_ISA", &choice) != DT_OK) {
        dt_clear_error(); // dt_cpu_check reports it
        return -1;
    }
    return choice == 0 ? -1 : choice - 1;
}

// Bytes of one cache level from sysfs ("32K"), 0 when absent.
static size_t sysfs_cache(int level, bool data) {
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        int lv = fgets(buf, sizeof buf, f) ? atoi(buf) : 0;
        fclose(f);
        if (lv != level)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!(f = fopen(path, "r")))
            continue;
        bool is_inst = fgets(buf, sizeof buf, f) && strncmp(buf, "Instruction", 11) == 0;
        fclose(f);
        if (data && is_inst)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r")))
            continue;
        size_t v = 0;
        if (fgets(buf, sizeof buf, f)) {
            char *end = NULL;
            v         = strtoul(buf, &end, 10);
            if (end && (*end == 'K' || *end == 'k'))
                v <<= 10;
            else if (end && (*end == 'M' || *end == 'm'))
                v <<= 20;
        }
        fclose(f);
        return v;
    }
    return 0;
}

static size_t cache_size(int level, int sc_name, size_t guess) {
    size_t v = sysfs_cache(level, level == 1);
    if (!v) {
        long s = sysconf(sc_name);
        v      = s > 0 ? (size_t)s : 0;
    }
    return v ? v : guess;
}

#if defined(__x86_64__)
static void probe_family(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    char     brand[49] = {0};
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++) {
            __get_cpuid(0x80000002u + i, &a, &b, &c, &d);
            memcpy(brand + 16 * i, (unsigned[4]){a, b, c, d}, 16);
        }
    }
    const char *p = brand;
    while (*p == ' ')
        p++;
    snprintf(cpu.model, sizeof cpu.model, "%s", *p ? p : "x86-64");
    __builtin_cpu_init();
    // F16C is cpuid 1 ECX bit 29 (clang's __builtin_cpu_supports does not name it); the
    // AVX it needs is checked, OS support included, through "avx2"
    bool f16c            = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    cpu.has[DT_ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("bmi2") && f16c;
    cpu.has[DT_ISA_AVX512] = cpu.has[DT_ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512dq") &&
                             __builtin_cpu_supports("avx512vl");
    cpu.has[DT_ISA_AVX512BF16] = cpu.has[DT_ISA_AVX512] && __builtin_cpu_supports("avx512bf16");
    // AMX: cpuid 7.0 EDX bits 24 (tile) and 22 (bf16); the kernels that use it ask the
    // kernel for the tile state themselves (arch_prctl), which may still refuse
    bool amx = false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        amx            = (d & (1u << 24)) && (d & (1u << 22));
        cpu.avx512fp16 = cpu.has[DT_ISA_AVX512] && (d & (1u << 23));
    }
    cpu.has[DT_ISA_AMX] = cpu.has[DT_ISA_AVX512BF16] && amx;
    cpu.best            = DT_ISA_REF;
    for (int t = DT_ISA_AVX2; t <= DT_ISA_AMX; t++)
        if (cpu.has[t])
            cpu.best = (dt_isa)t;
}
#elif defined(__aarch64__)
static void probe_family(void) {
    snprintf(cpu.model, sizeof cpu.model, "arm64");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char  line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "CPU part", 8) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v++;
                while (isspace((unsigned char)*v))
                    v++;
                v[strcspn(v, "\n")] = 0;
                snprintf(cpu.model, sizeof cpu.model, "arm64 part %s", v);
            }
            break;
        }
    }
    if (f)
        fclose(f);
    cpu.has[DT_ISA_NEON] = true; // Advanced SIMD is part of the arm64 baseline
    cpu.best             = DT_ISA_NEON;
}
#else
static void probe_family(void) {
    snprintf(cpu.model, sizeof cpu.model, "unknown CPU");
    cpu.best = DT_ISA_REF;
}
#endif

static bool same_family(dt_isa t) {
#if defined(__aarch64__)
    return t == DT_ISA_REF || t == DT_ISA_NEON;
#elif defined(__x86_64__)
    return t != DT_ISA_NEON;
#else
    return t == DT_ISA_REF;
#endif
}

static void probe(void) {
    cpu.has[DT_ISA_REF] = true;
    probe_family();
    cpu.l1d     = cache_size(1, _SC_LEVEL1_DCACHE_SIZE, 32u << 10);
    cpu.l2      = cache_size(2, _SC_LEVEL2_CACHE_SIZE, 256u << 10);
    cpu.l3      = cache_size(3, _SC_LEVEL3_CACHE_SIZE, 0);
    long n      = sysconf(_SC_NPROCESSORS_ONLN);
    cpu.cores   = n > 0 ? (int)n : 1;
    cpu.cap     = cpu.best;
    isa_setting = read_isa_setting();
    if (isa_setting >= 0 && same_family((dt_isa)isa_setting) && isa_setting < (int)cpu.best)
        cpu.cap = (dt_isa)isa_setting;
}

const dt_cpu *dt_cpu_get(void) {
    pthread_once(&once, probe);
    return &cpu;
}

dt_status dt_cpu_check(void) {
    pthread_once(&once, probe);
    int choice = 0;
    DT_TRY(dt_setting_choice("DT_ISA", &choice)); // names the value and the choices
    if (choice > 0 && !same_family((dt_isa)(choice - 1)))
        return dt_fail(DT_ERR_ARG,
                       "DT_ISA=%s: expected a kernel target of this CPU's family (%s), found "
                       "one of another architecture",
                       dt_isa_name((dt_isa)(choice - 1)),
#if defined(__aarch64__)
                       "ref|neon"
#else
                       "ref|avx2|avx512|avx512bf16|amx"
#endif
        );
    return DT_OK;
}

bool dt_isa_on(dt_isa t) {
    const dt_cpu *c = dt_cpu_get();
    if (t == DT_ISA_REF)
        return true;
    if (t < 0 || t >= DT_ISA_COUNT_ || !c->has[t])
        return false;
    // neon is the only arm64 level: it is on unless the cap is ref
    return t == DT_ISA_NEON ? c->cap != DT_ISA_REF : t <= c->cap;
}

dt_isa dt_isa_top(void) {
    return dt_cpu_get()->cap;
}

static const char *size_str(size_t b, char *buf, size_t n) {
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, n, "%zu MiB", b >> 20);
    else
        snprintf(buf, n, "%zu KiB", b >> 10);
    return buf;
}

const char *dt_cpu_describe(char *buf, size_t n) {
    const dt_cpu *c = dt_cpu_get();
    char          l1[24], l2[24], l3[24], has[96] = "";
    for (int t = DT_ISA_AVX2; t < DT_ISA_COUNT_; t++)
        if (c->has[t]) {
            size_t k = strlen(has);
            snprintf(has + k, sizeof has - k, "%s%s", k ? " " : "", dt_isa_name((dt_isa)t));
        }
    snprintf(buf, n, "%s (L1d %s, L2 %s, L3 %s, %d CPUs): kernels %s (DT_ISA%s%s; has %s%s)",
             c->model, size_str(c->l1d, l1, sizeof l1), size_str(c->l2, l2, sizeof l2),
             c->l3 ? size_str(c->l3, l3, sizeof l3) : "none", c->cores, dt_isa_name(c->cap),
             isa_setting >= 0 ? "=" : " unset",
             isa_setting >= 0 ? dt_isa_name((dt_isa)isa_setting) : "", *has ? has : "ref only",
             c->avx512fp16 ? ", avx512fp16" : "");
    return buf;
}

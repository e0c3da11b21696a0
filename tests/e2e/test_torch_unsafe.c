// test_torch_unsafe.c: tools/dt_torch.py from-torch loads weights only. A .pt file is a
// pickle, and a pickled object's __reduce__ names a function that unpickling calls: here
// open(MARKER, "w"), which only creates an empty file, so the test sees whether code
// from the file ran without doing anything harmful. Each hostile variant must be
// refused (exit 1, a message saying what the file held) and its marker must not exist:
//   dict       the object beside a tensor in a plain state_dict
//   nested     the same under "model" (a training checkpoint's layout)
//   legacy     the dict in torch's pre-1.6 format (_use_new_zipfile_serialization=False)
//   raw        a plain pickle.dump, no torch container at all
//   top        the object itself as the whole file
//   like       the dict variant converted with --like (the other loading path)
// Plain files still convert: a state_dict, and one nested under "model"; a dict that
// holds a number where a tensor belongs is refused naming the key. Skipped, saying
// so, when /usr/bin/python3 has no torch, and in the sanitizer builds (only Python runs).
#include "../check.h"
#include "../lib/prog.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tool[PATH_MAX + 64], dir[64] = "/tmp/dt-torch-unsafe-XXXXXX";

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

// Writes the files: one hostile .pt per variant (each with its own marker), and the
// plain ones. The markers are removed first, in case making the files created them.
static bool make_files(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/make.py", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    fprintf(f, "import pickle, sys, torch\n"
               "d = sys.argv[1]\n"
               "class Marker:\n"
               "    def __init__(self, name): self.name = name\n"
               "    def __reduce__(self): return (open, (d + '/marker-' + self.name, 'w'))\n"
               "t = torch.arange(6, dtype=torch.float32).reshape(2, 3)\n"
               "torch.save({'w': t, 'x': Marker('dict')}, d + '/dict.pt')\n"
               "torch.save({'w': t, 'x': Marker('like')}, d + '/like.pt')\n"
               "torch.save({'model': {'w': t, 'x': Marker('nested')}}, d + '/nested.pt')\n"
               "torch.save({'w': t, 'x': Marker('legacy')}, d + '/legacy.pt',\n"
               "           _use_new_zipfile_serialization=False)\n"
               "with open(d + '/raw.pt', 'wb') as f:\n"
               "    pickle.dump({'w': Marker('raw')}, f, protocol=2)\n"
               "torch.save(Marker('top'), d + '/top.pt')\n"
               "torch.save({'w': t}, d + '/plain.pt')\n"
               "torch.save({'model': {'w': t}}, d + '/ckpt.pt')\n"
               "torch.save({'w': t, 'n': 3}, d + '/number.pt')\n");
    fclose(f);
    char *out;
    int   rc = test_run(&out, "/usr/bin/python3 %s %s 2>&1 && rm -f %s/marker-*", path, dir, dir);
    if (rc != 0)
        fprintf(stderr, "     making the files: %s\n", out);
    free(out);
    return rc == 0;
}

static void test_hostile_refused(void) {
    static const char *const variants[] = {"dict", "nested", "legacy", "raw", "top", "like"};
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const char *v = variants[i];
        char        marker[256], like[300] = "", *out;
        snprintf(marker, sizeof marker, "%s/marker-%s", dir, v);
        if (strcmp(v, "like") == 0)
            snprintf(like, sizeof like, " --like %s/plain.bin", dir);
        int  rc  = test_run(&out, "/usr/bin/python3 %s from-torch %s/%s.pt %s/%s.bin%s 2>&1", tool,
                            dir, v, dir, v, like);
        bool ran = exists(marker);
        CHECK_EQ(rc, 1);
        CHECK(!ran);
        CHECK(strstr(out, "refused") != NULL && strstr(out, "loads weights only") != NULL);
        if (rc != 1 || ran || !strstr(out, "refused"))
            fprintf(stderr, "     variant %s: exit %d, marker %s; output: %s\n", v, rc,
                    ran ? "CREATED (code from the file ran)" : "absent", out);
        free(out);
    }
}

static void test_plain_converts(void) {
    char *out;
    // plain.bin is also the --like reference of test_hostile_refused.
    CHECK_EQ(test_run(&out, "/usr/bin/python3 %s from-torch %s/plain.pt %s/plain.bin 2>&1", tool,
                      dir, dir),
             0);
    CHECK(strstr(out, "wrote 1 tensors") != NULL);
    free(out);
    CHECK_EQ(test_run(&out, "/usr/bin/python3 %s from-torch %s/ckpt.pt %s/ckpt.bin 2>&1", tool, dir,
                      dir),
             0);
    free(out);
    CHECK_EQ(test_run(&out, "/usr/bin/python3 %s show %s/ckpt.bin 2>&1", tool, dir), 0);
    CHECK(strstr(out, "w [2, 3]") != NULL);
    free(out);
    // Something other than a tensor where a tensor belongs is refused, naming the key.
    CHECK_EQ(test_run(&out, "/usr/bin/python3 %s from-torch %s/number.pt %s/number.bin 2>&1", tool,
                      dir, dir),
             1);
    CHECK(strstr(out, "expected a state_dict") != NULL && strstr(out, "'n' holding int") != NULL);
    free(out);
}

int main(void) {
#ifdef DT_SANITIZE // the tool is Python: a sanitizer build of dtrain has nothing here to check
    printf("skipped under a sanitizer: tools/dt_torch.py runs no code of dtrain's\n");
    return check_summary();
#endif
    char *out;
    int   rc = test_run(&out, "/usr/bin/python3 -c 'import torch' 2>&1");
    free(out);
    if (rc != 0) {
        printf("skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)\n");
        return check_summary();
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    snprintf(tool, sizeof tool, "%s/tools/dt_torch.py", cwd);
    if (!exists(tool)) {
        CHECK(!"tools/dt_torch.py not found: run the test from the repository root");
        return check_summary();
    }
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return check_summary();
    }
    if (CHECK(make_files())) {
        RUN(test_plain_converts);
        RUN(test_hostile_refused);
    }
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}

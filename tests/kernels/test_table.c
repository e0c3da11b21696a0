// test_table.c: the kernel table itself: a cap's table takes each row from the highest
// target within the cap that the CPU has, ref's table holds ref's kernels only, the rows
// say who filled them, another device's table holds its own rows and nothing else, and
// the names the start-up line and --profile print.
#include "targets.h"

#include "nn/ops.h"

static int count_from(const dt_ktab *t, const char *who) {
    int  n = 0;
    char buf[160];
    for (int r = 0; r < DT_KROW_COUNT_; r++) {
        dt_krow_describe(t, (dt_krow)r, buf, sizeof buf);
        const char *colon = strstr(buf, ": ");
        n += colon && strncmp(colon + 2, who, strlen(who)) == 0 &&
             (colon[2 + strlen(who)] == '/' || colon[2 + strlen(who)] == 0);
    }
    return n;
}

static void test_caps(void) {
    const dt_ktab *ref = dt_ktab_get(DT_KDEV_HOST, DT_ISA_REF);
    CHECK(ref != NULL && ref == dt_ktab_get(DT_KDEV_HOST, DT_ISA_REF));
    CHECK(dt_k() == dt_ktab_get(DT_KDEV_HOST, dt_isa_top()));
    // ref's table: every row ref fills, each from ref; the portable rows are never NULL
    const dt_ktab *only = dt_ktab_only(DT_ISA_REF);
    CHECK(ref->relu_fwd == only->relu_fwd && ref->sgemm == only->sgemm);
    CHECK(ref->shifted_gemm && ref->bn_stats && ref->attn_fwd && ref->reduce && ref->f32_to_f16);
    CHECK(!ref->conv_cl_fwd && !ref->gemm_bf16 && !ref->gemm_amx); // variants of some targets
    CHECK(count_from(ref, "ref") > 50);
    char buf[160];
    CHECK(strcmp(dt_krow_describe(ref, DT_KROW_relu_fwd, buf, sizeof buf), "relu fwd: ref") == 0);
    CHECK(strcmp(dt_krow_describe(ref, DT_KROW_sgemm, buf, sizeof buf), "sgemm: ref/dtrain") == 0);
    CHECK(strcmp(dt_krow_describe(ref, DT_KROW_conv_cl_fwd, buf, sizeof buf), "conv2d fwd: none") ==
          0);
    // each target's table: a row the target fills is its own; one it lacks stays below
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = kt_targets(ts);
    for (int i = 1; i < nt; i++) {
        const dt_ktab *t = dt_ktab_get(DT_KDEV_HOST, ts[i]), *o = dt_ktab_only(ts[i]);
        check_current = dt_isa_name(ts[i]);
        CHECK(count_from(o, dt_isa_name(ts[i])) > 0);
        if (o->relu_fwd)
            CHECK(t->relu_fwd == o->relu_fwd && t->relu_fwd != ref->relu_fwd);
        if (!o->attn16_fwd)
            CHECK(t->attn16_fwd == dt_ktab_get(DT_KDEV_HOST, ts[i - 1])->attn16_fwd);
    }
    check_current = "caps";
    // a target the CPU lacks has no table of its own
    for (int t = 0; t < DT_ISA_COUNT_; t++)
        CHECK((dt_ktab_only((dt_isa)t) != NULL) == dt_cpu_get()->has[t]);
    char line[320];
    dt_kernels_describe(line, sizeof line);
    CHECK(strstr(line, "rows:") != NULL && strstr(line, dt_isa_name(dt_isa_top())) != NULL);
}

// A device with its own rows: only those, recorded under its name.
static void fake_relu(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0 ? x[i] : 0;
}
static void fill_fake(dt_ktab *t) {
    t->relu_fwd              = fake_relu;
    t->how[DT_KROW_relu_fwd] = "test";
}

static void test_device(void) {
    CHECK(dt_ktab_get((dt_kdev)1, DT_ISA_REF) == NULL);
    CHECK_ERR(dt_kdev_add(DT_KDEV_HOST, "host", fill_fake), DT_ERR_ARG, "device");
    CHECK_OK(dt_kdev_add((dt_kdev)1, "fake", fill_fake));
    CHECK_ERR(dt_kdev_add((dt_kdev)1, "again", fill_fake), DT_ERR_STATE, "fake");
    const dt_ktab *t = dt_ktab_get((dt_kdev)1, DT_ISA_REF);
    CHECK(t && t->relu_fwd == fake_relu && !t->sgemm && !t->add);
    char buf[160];
    CHECK(strcmp(dt_krow_describe(t, DT_KROW_relu_fwd, buf, sizeof buf), "relu fwd: fake/test") ==
          0);
    CHECK(strcmp(dt_krow_describe(t, DT_KROW_add, buf, sizeof buf), "add: none") == 0);
}

// What --profile prints for a convolution: the kernel that runs for the shape.
static void test_conv_names(void) {
    char         buf[160];
    dt_nn_conv2d p = {
        .cin = 16, .cout = 32, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .groups = 1};
    dt_nn_conv2d_kernel(&p, 14, false, false, buf, sizeof buf);
    if (dt_k()->conv_cl_fwd)
        CHECK(strcmp(buf, "conv2d fwd: avx512/channels-in-lanes") == 0);
    else if (dt_k()->conv_ext_ok && dt_k()->conv_ext_ok(&p, 14, false)) // oneDNN (kernels/dnnl)
        CHECK(strcmp(buf, "conv2d fwd: avx2/onednn") == 0);
    else { // stride 2 never takes the shifted GEMMs: im2col and the sgemm row
        char want[96];
        snprintf(want, sizeof want, "conv2d fwd: %s/im2col", dt_k()->from[DT_KROW_sgemm]);
        CHECK(strcmp(buf, want) == 0);
    }
    dt_nn_conv2d_kernel(&p, 14, true, true, buf, sizeof buf);
    CHECK(strncmp(buf, "conv2d bwd: ", 12) == 0);
}

int main(void) {
    char line[320];
    printf("# %s\n", dt_kernels_describe(line, sizeof line));
    RUN(test_caps);
    RUN(test_device);
    RUN(test_conv_names);
    return check_summary();
}

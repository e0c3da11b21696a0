// test_settings.c: the DT_* settings table: defaults, ranges, choices, unknown names.
#include "../check.h"
#include "dtrain/core.h"

#include <stdlib.h>
#include <string.h>

static void test_table(void) {
    size_t            n;
    const dt_setting *t = dt_settings(&n);
    CHECK(n >= 20);
    for (size_t i = 0; i < n; i++) {
        CHECK(strncmp(t[i].name, "DT_", 3) == 0);
        CHECK(t[i].help && *t[i].help);
        if (t[i].kind == DT_SETTING_INT)
            CHECK(t[i].lo <= t[i].def && t[i].def <= t[i].hi);
        if (t[i].kind == DT_SETTING_CHOICE)
            CHECK(t[i].choices && strchr(t[i].choices, '|'));
        for (size_t j = 0; j < i; j++) // each name once
            CHECK(strcmp(t[i].name, t[j].name) != 0);
        CHECK(dt_setting_find(t[i].name) == &t[i]);
    }
    CHECK(dt_setting_find("DT_NO_SUCH") == NULL);
}

static void test_int(void) {
    long v = 0;
    unsetenv("DT_RING_LAG");
    CHECK_OK(dt_setting_int("DT_RING_LAG", &v));
    CHECK_EQ(v, 2);
    setenv("DT_RING_LAG", "7", 1);
    CHECK_OK(dt_setting_int("DT_RING_LAG", &v));
    CHECK_EQ(v, 7);
    setenv("DT_RING_LAG", "-1", 1);
    CHECK(dt_setting_int("DT_RING_LAG", &v) == DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "DT_RING_LAG") && strstr(dt_last_error(), "\"-1\""));
    setenv("DT_RING_LAG", "two", 1);
    CHECK(dt_setting_int("DT_RING_LAG", &v) == DT_ERR_ARG);
    unsetenv("DT_RING_LAG");
}

static void test_choice(void) {
    int c = -1;
    unsetenv("DT_ALLREDUCE_ALGO");
    CHECK_OK(dt_setting_choice("DT_ALLREDUCE_ALGO", &c));
    CHECK_EQ(c, 0);
    setenv("DT_ALLREDUCE_ALGO", "rdouble", 1);
    CHECK_OK(dt_setting_choice("DT_ALLREDUCE_ALGO", &c));
    CHECK_EQ(c, 4);
    setenv("DT_ALLREDUCE_ALGO", "RING", 1);
    CHECK_OK(dt_setting_choice("DT_ALLREDUCE_ALGO", &c));
    CHECK_EQ(c, 5);
    setenv("DT_ALLREDUCE_ALGO", "tree", 1);
    CHECK(dt_setting_choice("DT_ALLREDUCE_ALGO", &c) == DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "auto|native|hier|shm|rdouble|ring") &&
          strstr(dt_last_error(), "\"tree\""));
    unsetenv("DT_ALLREDUCE_ALGO");
}

static void test_string(void) {
    unsetenv("DT_SOCKET_IFADDR");
    CHECK(dt_setting_str("DT_SOCKET_IFADDR") == NULL);
    setenv("DT_SOCKET_IFADDR", "", 1);
    CHECK(dt_setting_str("DT_SOCKET_IFADDR") == NULL);
    setenv("DT_SOCKET_IFADDR", "10.1.2.3", 1);
    CHECK(strcmp(dt_setting_str("DT_SOCKET_IFADDR"), "10.1.2.3") == 0);
    unsetenv("DT_SOCKET_IFADDR");
}

static void test_unknown(void) {
    char msg[512];
    setenv("DT_TIMOUT_MS", "5", 1);
    setenv("DT_TEST_BACKEND", "tcp", 1); // the test suite's own: not reported
    CHECK_EQ(dt_settings_check_unknown(msg, sizeof msg), 1);
    CHECK(strstr(msg, "DT_TIMOUT_MS is not a dtrain setting (did you mean DT_TIMEOUT_MS?)"));
    setenv("DT_ZZZZZZZZZZZZZZZZ", "1", 1); // nothing close: no suggestion
    CHECK_EQ(dt_settings_check_unknown(msg, sizeof msg), 2);
    CHECK(strstr(msg, "DT_ZZZZZZZZZZZZZZZZ is not a dtrain setting") &&
          !strstr(msg, "ZZZZ is not a dtrain setting (did"));
    unsetenv("DT_TIMOUT_MS");
    unsetenv("DT_ZZZZZZZZZZZZZZZZ");
    unsetenv("DT_TEST_BACKEND");
    CHECK_EQ(dt_settings_check_unknown(msg, sizeof msg), 0);
}

int main(void) {
    RUN(test_table);
    RUN(test_int);
    RUN(test_choice);
    RUN(test_string);
    RUN(test_unknown);
    return check_summary();
}

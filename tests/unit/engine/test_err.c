/* test_err.c - error names and the assertion handler (engine/src/err.c): kvr_strerror of every
 * code (distinct, Dynamo's names for the index-event kinds, "unknown error" outside the enum),
 * and KVR_ASSERT aborting with the expression, file and line (checked in a forked child, so the
 * test works with CK_FORK=no too). */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr/err.h"

START_TEST(strerror_every_code)
{
    static const struct {
        int code;
        const char *name;
    } want[] = {
        {KVR_OK, "ok"},
        {KVR_ENOMEM, "out of memory"},
        {KVR_EINVAL, "invalid argument"},
        {KVR_ENOTFOUND, "not found"},
        {KVR_EEXIST, "already exists"},
        {KVR_EIO, "I/O error"},
        {KVR_ECORRUPT, "corrupt input"},
        {KVR_ETIMEDOUT, "timed out"},
        {KVR_ERANGE, "out of range"},
        {KVR_EPARENT, "ParentBlockNotFound"},
        {KVR_ENOBLOCK, "BlockNotFound"},
        {KVR_EINVALSEQ, "InvalidBlockSequence"},
        {KVR_ECAPACITY, "CapacityExhausted"},
        {KVR_EDOMAIN, "UnsupportedResidencyDomain"},
        {KVR_EBUSY, "busy"},
        {KVR_ESTATE, "invalid state"},
    };
    size_t n = sizeof(want) / sizeof(want[0]);
    /* the table covers the whole enum */
    ck_assert_int_eq((int)n, -KVR_ERR_MIN_);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(want[i].code, -(int)i);
        ck_assert_str_eq(kvr_strerror(want[i].code), want[i].name);
        for (size_t j = 0; j < i; j++)
            ck_assert_str_ne(kvr_strerror(want[i].code), kvr_strerror(want[j].code));
    }
    const int outside[] = {KVR_ERR_MIN_, KVR_ERR_MIN_ - 1, 1, 42, -1000, -2147483647 - 1};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++)
        ck_assert_str_eq(kvr_strerror(outside[i]), "unknown error");
}
END_TEST

START_TEST(assert_aborts_with_location)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ne(pid, -1);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        int two = 2;
        KVR_ASSERT(two + two == 5);
        _exit(0); /* not reached */
    }
    close(fds[1]);
    char buf[512] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof(buf) - 1 && (r = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)r;
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(WTERMSIG(status), SIGABRT);
    ck_assert_msg(strstr(buf, "assertion failed: two + two == 5 (") != NULL, "stderr: %s", buf);
    ck_assert_msg(strstr(buf, "test_err.c:") != NULL, "stderr: %s", buf);
    /* a true assertion does nothing */
    KVR_ASSERT(1 + 1 == 2);
}
END_TEST

Suite *err_suite(void);

Suite *err_suite(void)
{
    Suite *s = suite_create("err");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, strerror_every_code);
    tcase_add_test(tc, assert_aborts_with_location);
    suite_add_tcase(s, tc);
    return s;
}

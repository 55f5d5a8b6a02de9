/* check_main.c - shared main() for every Check suite binary.
 *
 * Each suite source defines `Suite *<module>_suite(void)`; CMake passes the function name in
 * KVR_SUITE_FN. CK_FORK=no is set by the sanitizer builds (see cmake/KvrCheck.cmake). */
#include <check.h>
#include <stdlib.h>

Suite *KVR_SUITE_FN(void);

int main(void)
{
    SRunner *sr = srunner_create(KVR_SUITE_FN());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

# kvr_add_check_suite(<name> SOURCES ... LIBS ... LABELS ... [TIMEOUT s])
# One Check suite per module: the source test_<name>.c exports `Suite *<name>_suite(void)`;
# tests/support/check_main.c provides main(). One binary and one CTest entry per suite.
function(kvr_add_check_suite name)
  cmake_parse_arguments(S "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 300)
  endif()
  set(target test_${name})
  add_executable(${target} ${S_SOURCES} ${PROJECT_SOURCE_DIR}/tests/support/check_main.c)
  target_compile_definitions(${target} PRIVATE KVR_SUITE_FN=${name}_suite)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_link_libraries(${target} PRIVATE ${S_LIBS} PkgConfig::CHECK kvr_warnings kvr_sanitizers
                        Threads::Threads m)
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${target})
  set(env "KVR_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data")
  if(KVR_ASAN OR KVR_TSAN)
    list(APPEND env "CK_FORK=no")
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${S_TIMEOUT} LABELS "${S_LABELS}"
                       ENVIRONMENT "${env}")
endfunction()

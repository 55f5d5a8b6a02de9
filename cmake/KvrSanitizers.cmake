# Sanitizers through the INTERFACE target kvr_sanitizers (never global flags).
# ASan+UBSan and TSan are mutually exclusive.
add_library(kvr_sanitizers INTERFACE)
if(KVR_ASAN AND KVR_TSAN)
  message(FATAL_ERROR "KVR_ASAN and KVR_TSAN are mutually exclusive")
endif()
if(KVR_ASAN)
  target_compile_options(kvr_sanitizers INTERFACE -fsanitize=address,undefined
                         -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_link_options(kvr_sanitizers INTERFACE -fsanitize=address,undefined)
  target_compile_definitions(kvr_sanitizers INTERFACE KVR_SANITIZED=1)
endif()
if(KVR_TSAN)
  target_compile_options(kvr_sanitizers INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(kvr_sanitizers INTERFACE -fsanitize=thread)
  target_compile_definitions(kvr_sanitizers INTERFACE KVR_SANITIZED=1)
endif()

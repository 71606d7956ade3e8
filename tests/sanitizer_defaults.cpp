// The sanitizer settings every test program of a SPECULA_SANITIZE build runs with, so that a
// plain `ctest` gives the same verdicts as the CI script. The runtimes ask for these before
// main(); options in the environment still override them.
extern "C" {

// The out-of-memory tests ask for terabytes and expect a status, not an abort.
const char* __asan_default_options() {
    return "detect_leaks=1:allocator_may_return_null=1";
}

const char* __ubsan_default_options() {
    return "print_stacktrace=1";
}

// The Khronos validation layer keeps state for the process-wide VkInstance, which specula never
// destroys (one instance per process), until exit: nothing else is suppressed.
const char* __lsan_default_suppressions() {
    return "leak:libVkLayer_khronos_validation.so\n";
}
}

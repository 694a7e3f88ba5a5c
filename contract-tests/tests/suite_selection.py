"""What the in-process runs of the suite (pytester) leave out, for both of this folder's tests."""

#: the suite's checks that start fresh interpreters: they find plugins through installed entry
#: points, which the in-process runs' plugins (registered directly, not installed) are not
FRESH_PROCESS_TESTS = "test_cpu_startup_options_keep_audio or imports_no_torch"

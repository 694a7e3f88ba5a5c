"""Runtime: device and dtype choice, threads and allocator, compile, checkpoint loading.

- :mod:`~mizuoto.runtime.device`: ``select_device``, ``select_dtype``, ``describe``,
  ``cpu_native_dtype`` and ``emulated_dtype_warning`` (bfloat16/float16 emulated on this CPU);
- :mod:`~mizuoto.runtime.threads`: ``apply_cpu_threads``, ``openmp_binding`` (pinning);
- :mod:`~mizuoto.runtime.allocator`: ``find_allocator_library`` (jemalloc, tcmalloc),
  ``loaded_allocator`` (the one that provides malloc), ``check_cpu_allocator``;
- :mod:`~mizuoto.runtime.startup`: ``check_startup_options`` (allocator and pinning, at every
  load) and the environment the ``mizuoto`` command restarts itself with;
- :mod:`~mizuoto.runtime.in_effect`: ``compute_in_effect``, a result's ``Applied.compute``;
- :mod:`~mizuoto.runtime.compile`: ``maybe_compile`` (falls back to eager);
- :mod:`~mizuoto.runtime.out_of_memory`: ``is_out_of_memory`` (CUDA, MPS and the CPU
  allocator), ``release_cached_memory``;
- :mod:`~mizuoto.runtime.weight_norm`: ``fold_weight_norm`` for state dicts;
- :mod:`~mizuoto.runtime.checkpoint`: ``load_state_dict_file``, strict ``load_into`` and
  ``load_weights_into`` (a weights file copied in tensor by tensor);
- :mod:`~mizuoto.runtime.module_state`: ``kernel_state`` (what picks kernels, for parity tests);
- :mod:`~mizuoto.runtime.atomic` and :mod:`~mizuoto.runtime.seeds`.
"""

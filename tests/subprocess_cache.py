"""Lets every process of a multi-process test run write the test run's compilation cache.

JAX writes persistent-cache entries from process 0 only (so that many hosts do not contend
for one shared file system). Process 1 of a 2-process test run compiles for its own devices,
so its cache keys differ from process 0's: without its own writes, every later run of the same
2-process command (the resumed half of a stopped run) compiles all of process 1's functions
again, about a minute on 2 cores. The written executables are the ones process 1 compiled and
would use anyway; only the test run's private cache (tests/conftest.py) is written.
"""

from tests import import_hook

_MODULE = "jax._src.compiler"


def every_process_writes() -> None:
  """Patches jax._src.compiler's cache write once it is imported (now, if it already is)."""
  import_hook.after_import(_MODULE, _patch)


def _patch(compiler) -> None:
  from jax._src import compilation_cache, distributed

  write = compiler._cache_write

  def cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if distributed.global_state.process_id == 0 or host_callbacks:
      return write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
    compilation_cache.put_executable_and_time(
        cache_key, module_name, executable, backend, int(compile_time_secs)
    )

  compiler._cache_write = cache_write

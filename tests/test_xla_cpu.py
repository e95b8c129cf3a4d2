"""XLA's CPU convolution path chosen from the processor (cl_jax.runtime.xla_cpu), on
/proc/cpuinfo texts of the processor kinds: Eigen's where AVX2 comes without AVX-512 and no
XLA_FLAGS are set, XLA's default otherwise."""

import os
import subprocess
import sys

from cl_jax.runtime import xla_cpu

ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx fma avx2 bmi2\n"
ZEN5 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse2 avx\n"


def test_eigens_path_only_for_avx2_without_avx512_and_without_xla_flags():
  assert xla_cpu.choose({}, ZEN3, False) == xla_cpu.EIGEN_FLAG
  assert xla_cpu.choose({}, ZEN5, False) is None
  assert xla_cpu.choose({}, OLD, False) is None
  # The user's XLA_FLAGS, even empty, keep XLA's choice; so does an accelerator plugin.
  assert xla_cpu.choose({"XLA_FLAGS": ""}, ZEN3, False) is None
  assert xla_cpu.choose({"XLA_FLAGS": "--xla_dump_to=/tmp/x"}, ZEN3, False) is None
  assert xla_cpu.choose({}, ZEN3, True) is None


def test_importing_cl_jax_keeps_the_flags_it_finds_and_says_what_it_chose():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  code = "import os, cl_jax; print(repr(os.environ.get('XLA_FLAGS')), cl_jax.XLA_CPU_CHOICE)"
  with open("/proc/cpuinfo") as f:
    want = xla_cpu.choose({}, f.read(), xla_cpu.has_accelerator_plugin())
  out = subprocess.run(
      [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout
  assert out.startswith(repr(want))  # this machine's choice, None on AVX-512
  kept = subprocess.run(
      [sys.executable, "-c", code],
      env={**env, "XLA_FLAGS": "--xla_backend_optimization_level=2"},
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  assert kept.strip() == "'--xla_backend_optimization_level=2' None"

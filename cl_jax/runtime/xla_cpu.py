"""XLA's CPU convolution path, chosen from the processor when no XLA_FLAGS are set.

XLA's CPU backend has two convolution paths: YNNPACK's fusions (XLA's default) and Eigen's
(selected with EIGEN_FLAG). They compute the same convolutions with other roundings and at other
speeds: on a 2-core AMD EPYC with AVX-512 (Zen 5) the quick start's first 120 steps took 70.1 s
and 72.7 s (commit 3484e57), on a 2-core AMD EPYC with AVX2 only (Zen 3) the whole quick start
took 1,218 s with YNNPACK (commit 6d1aac6) and 9-10.5 minutes with Eigen's path
(docs/quickstart.md). So, where the environment sets no XLA_FLAGS, no accelerator plugin is
installed (the backend is the CPU) and the processor has AVX2 but not AVX-512, importing cl_jax
sets XLA_FLAGS to EIGEN_FLAG before JAX creates its CPU client; every process of a run (the
trainer, its probe, a study's fingerprint) then computes on the same path, and a study's record
names it (its environment's XLA_FLAGS). Setting XLA_FLAGS, even to "", keeps XLA's choice.
"""

import importlib.util
import os

EIGEN_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
# JAX's accelerator plugins: with one installed the backend may not be the CPU, and XLA_FLAGS
# reaches the plugin's compiler too.
ACCELERATOR_MODULES = (
    "jax_plugins.xla_cuda12",
    "jax_plugins.xla_cuda13",
    "jax_plugins.xla_rocm7",
    "libtpu",
)


def has_accelerator_plugin() -> bool:
  """Whether one of ACCELERATOR_MODULES can be imported."""
  for name in ACCELERATOR_MODULES:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except (ImportError, ValueError):  # a missing parent package
      continue
  return False


def choose(environ: dict, cpuinfo: str, accelerator_plugin: bool) -> str | None:
  """EIGEN_FLAG when `environ` has no XLA_FLAGS, there is no accelerator plugin and the
  processor's flags (`cpuinfo`, /proc/cpuinfo's text) hold avx2 but not avx512f; else None."""
  if "XLA_FLAGS" in environ or accelerator_plugin:
    return None
  flags = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
  words = set(flags.partition(":")[2].split())
  return EIGEN_FLAG if "avx2" in words and "avx512f" not in words else None


def apply() -> str | None:
  """Set XLA_FLAGS to choose()'s flag where it gives one; returns a line saying so, or None."""
  if "XLA_FLAGS" in os.environ or not os.path.exists("/proc/cpuinfo"):
    return None
  with open("/proc/cpuinfo") as f:
    flag = choose(dict(os.environ), f.read(), has_accelerator_plugin())
  if flag is None:
    return None
  os.environ["XLA_FLAGS"] = flag
  return (
      f"XLA_FLAGS={flag}: Eigen's convolutions, about twice as fast as XLA's default on a "
      "processor without AVX-512 (set XLA_FLAGS, even to '', to choose)"
  )

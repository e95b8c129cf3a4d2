"""The accelerators that cl_jax.bench.compile compiles for: their memory, peak bf16 throughput
and memory bandwidth per chip, each from its vendor's page.

  chip      HBM per chip   peak dense bf16   HBM bandwidth   source
  TPU v4    32 GiB         275 TFLOP/s       1,200 GB/s      https://cloud.google.com/tpu/docs/v4
  TPU v5e   16 GB          197 TFLOP/s       819 GB/s        https://cloud.google.com/tpu/docs/v5e
  TPU v5p   95 GB          459 TFLOP/s       2,765 GB/s      https://cloud.google.com/tpu/docs/v5p
  TPU v6e   32 GB          918 TFLOP/s       1,638 GB/s      https://cloud.google.com/tpu/docs/v6e
  H100 SXM  80 GB          989 TFLOP/s       3,350 GB/s      https://www.nvidia.com/en-us/data-center/h100/

GB is 10^9 bytes and GiB 2^30, as each page writes it. The peaks are the vendors' dense (no
sparsity) figures, the same as cl_jax.bench.device_peaks.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: float
  peak_bf16_flops: float  # FLOP/s
  hbm_bytes_per_s: float
  source: str


CHIPS = {
    "v4": Chip("TPU v4", 32 * 2**30, 275e12, 1200e9, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", 16e9, 197e12, 819e9, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 95e9, 459e12, 2765e9, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", 32e9, 918e12, 1638e9, "https://cloud.google.com/tpu/docs/v6e"),
    "h100": Chip(
        "NVIDIA H100 SXM", 80e9, 989e12, 3350e9, "https://www.nvidia.com/en-us/data-center/h100/"
    ),
}

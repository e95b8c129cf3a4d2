"""Peak dense bf16 throughput of accelerators, for the model-FLOPs utilisation (MFU) of
cl_jax.bench.step.

Vendor figures for dense (no sparsity) bf16 matrix math per chip, in TFLOP/s:
  NVIDIA A100 (SXM and PCIe)          312
  NVIDIA H100 SXM                     989
  NVIDIA H100 PCIe                    756
  NVIDIA H200                         989
  Google TPU v4                       275
  Google TPU v5e ("TPU v5 lite")      197
  Google TPU v5p                      459
A CPU or an unlisted device has no entry: its MFU is reported as unknown.
"""

# (substring of jax's device_kind, lower-cased; peak TFLOP/s), most specific first.
PEAKS_TFLOPS = (
    ("h100 pcie", 756.0),
    ("h100", 989.0),
    ("h200", 989.0),
    ("a100", 312.0),
    ("tpu v5 lite", 197.0),
    ("tpu v5e", 197.0),
    ("tpu v5p", 459.0),
    ("tpu v5", 459.0),
    ("tpu v4", 275.0),
)


def peak_tflops(device_kind: str) -> float | None:
  """Peak dense bf16 TFLOP/s of one device of `device_kind` (jax.Device.device_kind), or None
  where it is not known (CPUs, unlisted devices)."""
  kind = device_kind.lower()
  for key, peak in PEAKS_TFLOPS:
    if key in kind:
      return peak
  return None

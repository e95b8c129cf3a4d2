"""Benchmarks that print their numbers: the train step (step), the input pipeline (input), the
augmentation (augment), the PyTorch reference step (torch_reference), the profile of a step
(profile), device peaks (device_peaks), and the one-command report of them all (report)."""

"""What every command runs on: errors and the command line, the device mesh, multi-host start-up,
checkpoints, the run's config and metrics, the progress line, the workdir's writer lock, and
write faults."""

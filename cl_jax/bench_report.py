"""python -m cl_jax.bench_report: every number of one device in one command
(cl_jax.bench.report)."""

from cl_jax.bench import report

if __name__ == "__main__":
  report.run()

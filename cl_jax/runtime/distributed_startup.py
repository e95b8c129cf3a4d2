"""Multi-host start-up: joining a multi-process run, or a one-line error saying why not.

jax.distributed.initialize waits for every process and, when one never starts,
aborts the whole process after its timeout (SIGABRT, a C++ stack trace, no word
on which process is missing). So when the coordinator address, process count
and process id are known up front, the processes first check in with process 0
over a plain TCP connection on the coordinator port (standard library only);
a process that does not join is then named in a `UsageError` on every process
before jax starts its runtime.
"""

import os
import socket
import time

import jax

from cl_jax.runtime.errors import UsageError

_HELLO = "cl_jax-start"
_RETRY_S = 0.25
# jax's ValueErrors when the cluster environment left a value unset, and what to do.
_NOT_DETECTED = {
    "coordinator_address should be defined.": (
        "no coordinator address found (not a Cloud TPU VM, no SLURM or Open MPI "
        "environment, JAX_COORDINATOR_ADDRESS unset): give --coordinator_address, "
        "--num_processes and --process_id"
    ),
    "Number of processes must be defined.": (
        "the number of processes was not found in the environment: give --num_processes "
        "and --process_id"
    ),
    "The process id of the current process must be defined.": (
        "this process's id was not found in the environment: give --process_id"
    ),
}


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 300,
) -> None:
  """Join a multi-process run (jax.distributed.initialize).

  Unset arguments are detected from the environment: Cloud TPU VM metadata,
  SLURM, Open MPI, or JAX_COORDINATOR_ADDRESS. On CPU, cross-process
  collectives use gloo unless JAX_CPU_COLLECTIVES_IMPLEMENTATION says otherwise.
  Must run before anything touches a device.

  timeout_s: how long to wait for all processes to join.
  Raises UsageError for inconsistent arguments, a coordinator that cannot be
  found, or processes that did not join within timeout_s.
  """
  address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  _check_arguments(address, num_processes, process_id, timeout_s)
  if address is not None and num_processes not in (None, 1) and process_id is not None:
    _rendezvous(address, num_processes, process_id, timeout_s)
  if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in os.environ:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s,
    )
  except ValueError as e:
    if str(e) not in _NOT_DETECTED:
      raise
    raise UsageError(_NOT_DETECTED[str(e)]) from None


def _check_arguments(
    address: str | None, num_processes: int | None, process_id: int | None, timeout_s: int
) -> None:
  """UsageError for what is wrong before any process is contacted."""
  if timeout_s < 1:
    raise UsageError(f"the multi-host start-up timeout must be at least 1 s, got {timeout_s}")
  if address is not None:
    _split_address(address)
  if num_processes is not None and num_processes < 1:
    raise UsageError(f"--num_processes must be at least 1, got {num_processes}")
  if process_id is not None and process_id < 0:
    raise UsageError(f"--process_id must be at least 0, got {process_id}")
  if None not in (num_processes, process_id) and process_id >= num_processes:
    raise UsageError(
        f"--process_id={process_id} is not in [0, {num_processes}): with "
        f"--num_processes={num_processes} the ids run from 0 to {num_processes - 1}"
    )


def _split_address(address: str) -> tuple[str, int]:
  """(host, port) of a HOST:PORT coordinator address; brackets of an IPv6 host dropped."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise UsageError(
        f"coordinator address {address!r} is not HOST:PORT "
        "(e.g. --coordinator_address=10.0.0.1:1234)"
    )
  return host.strip("[]"), int(port)


def _rendezvous(address: str, num_processes: int, process_id: int, timeout_s: int) -> None:
  """Every process checks in with process 0 before jax starts its runtime.

  Process 0 listens on the coordinator port until processes 1..N-1 have
  checked in, then answers each; a process that does not join within
  timeout_s, or one started with another --num_processes or a taken id, turns
  into a UsageError on process 0 and on every process that did check in.
  """
  host, port = _split_address(address)
  if process_id == 0:
    _gather(port, num_processes, timeout_s, address)
  else:
    _check_in(host, port, num_processes, process_id, timeout_s, address)


def _what_to_check(num_processes: int, port: int) -> str:
  """The advice that ends every start-up error."""
  return (
      f"check that all {num_processes} processes were started with the same "
      f"--num_processes and --coordinator_address, each with its own --process_id "
      f"in [0, {num_processes}), and that port {port} of the coordinator is reachable"
  )


def _listen(port: int) -> socket.socket:
  """A socket listening on `port` of every interface (IPv4 and, where possible, IPv6)."""
  try:
    if socket.has_dualstack_ipv6():
      return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))
  except OSError as e:
    raise UsageError(
        f"process 0 cannot listen on the coordinator port {port} "
        f"({os.strerror(e.errno)}): is another process 0 or another program "
        "using it? choose a free port"
    ) from None


def _read_line(conn: socket.socket, timeout_s: float) -> str:
  """One short line from `conn` ('' on end of stream, timeout or a reset connection)."""
  conn.settimeout(max(timeout_s, 0.001))
  data = b""
  try:
    while not data.endswith(b"\n") and len(data) < 4096:
      chunk = conn.recv(4096)
      if not chunk:
        return ""
      data += chunk
  except OSError:
    return ""
  return data.decode(errors="replace").strip()


def _parse_hello(line: str) -> tuple[int, int] | None:
  """(num_processes, process_id) of a check-in line; None for anything else."""
  parts = line.split()
  if len(parts) != 3 or parts[0] != _HELLO or not all(p.isdigit() for p in parts[1:]):
    return None
  return int(parts[1]), int(parts[2])


def _hello_problem(hello: tuple[int, int], num_processes: int, joined: set[int]) -> str | None:
  """Why a check-in from another process cannot join this run (None if it can)."""
  their_count, their_id = hello
  if their_count != num_processes:
    return (
        f"process {their_id} was started with --num_processes={their_count}, "
        f"process 0 with --num_processes={num_processes}"
    )
  if their_id in joined or their_id == 0:
    return f"two processes were started with --process_id={their_id}"
  return None


def _missing_message(
    missing: list[int], num_processes: int, timeout_s: int, address: str, port: int
) -> str:
  """The coordinator's timeout error, naming the processes that did not join."""
  names = ", ".join(map(str, missing))
  who = f"process {names} did" if len(missing) == 1 else f"processes {names} did"
  return (
      f"multi-host start-up timed out: process 0 (the coordinator, at {address}) waited "
      f"{timeout_s} s for {num_processes} processes, but {who} not join; "
      f"{_what_to_check(num_processes, port)}"
  )


def _gather(port: int, num_processes: int, timeout_s: int, address: str) -> None:
  """Process 0: wait for processes 1..N-1 to check in, then answer each."""
  deadline = time.monotonic() + timeout_s
  joined: set[int] = set()
  conns: list[socket.socket] = []
  answer = "error: process 0 stopped during start-up"
  with _listen(port) as server:
    try:
      while len(joined) < num_processes - 1:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          missing = sorted(set(range(1, num_processes)) - joined)
          raise UsageError(_missing_message(missing, num_processes, timeout_s, address, port))
        server.settimeout(remaining)
        try:
          conn, _ = server.accept()
        except TimeoutError:
          continue
        hello = _parse_hello(_read_line(conn, deadline - time.monotonic()))
        if hello is None:  # not one of ours, or gone before it said who it is
          conn.close()
          continue
        conns.append(conn)
        problem = _hello_problem(hello, num_processes, joined)
        if problem:
          raise UsageError(
              f"multi-host start-up failed: {problem}; " f"{_what_to_check(num_processes, port)}"
          )
        joined.add(hello[1])
      answer = "ok"
    except UsageError as e:
      answer = f"error: {e}"
      raise
    finally:
      for conn in conns:
        _send_line(conn, answer)


def _send_line(conn: socket.socket, line: str) -> None:
  """Send one line and close `conn`; a peer that is already gone is no error."""
  with conn:
    try:
      conn.sendall(line.encode() + b"\n")
    except OSError:
      pass


def _connect(host: str, port: int, deadline: float) -> socket.socket | None:
  """A connection to host:port, retried until `deadline` (None if it never answered)."""
  while True:
    try:
      return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
    except socket.gaierror:
      raise UsageError(f"the coordinator host {host!r} does not resolve") from None
    except OSError:
      if time.monotonic() + _RETRY_S >= deadline:
        return None
      time.sleep(_RETRY_S)


def _check_in(
    host: str, port: int, num_processes: int, process_id: int, timeout_s: int, address: str
) -> None:
  """Processes 1..N-1: report to process 0 and wait for its answer.

  Once connected, the wait for the answer defers to process 0's own timeout
  (with some slack), so the error names the processes that did not join.
  """
  conn = _connect(host, port, time.monotonic() + timeout_s)
  if conn is None:
    raise UsageError(
        f"multi-host start-up timed out: process {process_id} of {num_processes} "
        f"waited {timeout_s} s, but the coordinator (process 0) at {address} did "
        f"not answer; {_what_to_check(num_processes, port)}"
    )
  with conn:
    try:
      conn.sendall(f"{_HELLO} {num_processes} {process_id}\n".encode())
    except OSError:
      pass
    answer = _read_line(conn, timeout_s + 30)
  if answer == "ok":
    return
  if answer.startswith("error: "):
    raise UsageError(
        f"process {process_id} stopped because process 0 reported: " f"{answer[len('error: '):]}"
    )
  raise UsageError(
      f"multi-host start-up failed: process {process_id} got no answer from "
      f"the coordinator (process 0) at {address}: did process 0 stop, or is "
      f"another program listening on port {port}?"
  )

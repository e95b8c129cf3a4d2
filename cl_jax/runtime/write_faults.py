"""Write faults as one line: no space, a read-only file system, no permission, a store error.

A failed write raises in many shapes: an OSError from Python's own file calls, a
ValueError or RuntimeError from orbax's writer threads carrying TensorStore's
"RESOURCE_EXHAUSTED ... No space left on device", an object-store client's
exception (Forbidden, TooManyRequests, ...). `reason` recognises them by errno,
by the client's exception class or by the system's own phrase, and
`guard` turns them into a WriteFault (a UsageError, so the entry points print it
as one line) that says what could not be written, where, the free space there
when it is known, and what to do next. Any other exception passes unchanged.
"""

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator

from cl_jax.runtime.errors import UsageError

# errno values that mean "this location cannot take the write", not a defect.
FAULT_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is too large for the file system",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "an input/output error of the device",
}
# The same conditions as the system and TensorStore word them inside other exceptions.
_PHRASES = {
    "No space left on device": FAULT_ERRNOS[errno.ENOSPC],
    "Disk quota exceeded": FAULT_ERRNOS[errno.EDQUOT],
    "Read-only file system": FAULT_ERRNOS[errno.EROFS],
    "Permission denied": FAULT_ERRNOS[errno.EACCES],
    "PERMISSION_DENIED": FAULT_ERRNOS[errno.EACCES],
    "Input/output error": FAULT_ERRNOS[errno.EIO],
    "File too large": FAULT_ERRNOS[errno.EFBIG],
}


# Object-store client errors (google.api_core.exceptions, as gcsfs and google-cloud-storage
# raise them), recognised by class name so that no client library need be imported.
_STORE_ERRORS = {
    "Forbidden": "the object store refused the write (403 Forbidden: check the permissions)",
    "Unauthorized": "the object store refused the write (401 Unauthorized: check credentials)",
    "TooManyRequests": "the object store throttled the writes (429 Too Many Requests)",
    "ServiceUnavailable": "the object store was unavailable (503)",
    "InsufficientStorage": "the object store has no space (507)",
}


class WriteFault(UsageError):
  """A write failed because of where it went (space, permissions, the store), not a defect."""


def _chain(e: BaseException) -> Iterator[BaseException]:
  """`e` and the exceptions it was raised from or while handling."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def reason(e: BaseException) -> str | None:
  """Why a write failed, in words ("no space left on the device"), if `e` is a write
  fault; None for any other exception."""
  for link in _chain(e):
    if isinstance(link, OSError) and link.errno in FAULT_ERRNOS:
      return FAULT_ERRNOS[link.errno]
    if type(link).__name__ in _STORE_ERRORS:
      return _STORE_ERRORS[type(link).__name__]
    words = reason_in_text(str(link))
    if words is not None:
      return words
  return None


def reason_in_text(text: str) -> str | None:
  """The write fault that an error message (or log line) words, if any."""
  for phrase, words in _PHRASES.items():
    if phrase in text:
      return words
  return None


def _size(n: float) -> str:
  """n bytes in B, kB, MB, GB or TB (powers of 1000)."""
  for unit in ("B", "kB", "MB", "GB"):
    if n < 1000:
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  return f"{n:.1f} TB"


def free_space(path: str) -> str | None:
  """'F free of T' on the file system holding `path` (or its nearest existing parent);
  None for a URL or when it cannot be read."""
  path = str(path)
  if "://" in path:
    return None
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  try:
    usage = shutil.disk_usage(path)
  except OSError:
    return None
  return f"{_size(usage.free)} free of {_size(usage.total)}"


def describe(what: str, where: str, why: str, then: str = "") -> str:
  """The one line: what could not be written, where, why, the free space, and `then`."""
  space = free_space(where)
  line = f"could not write {what} to {where}: {why}" + (f" ({space})" if space else "")
  return line + (f". {then}" if then else "")


@contextlib.contextmanager
def guard(
    what: str | Callable[[BaseException], str], where: str, then: Callable[[], str] = lambda: ""
):
  """Inside, a write fault becomes WriteFault(describe(what, where, reason, then())); any
  other exception (a WriteFault included) passes unchanged.

  Args:
    what: what was being written ("the metrics log"), or a function of the exception
      that names it.
    where: the file or folder written to (an OSError's own file name replaces it).
    then: the advice after the line, called only on a fault (it may look at, and tidy,
      what is left on disk).
  """
  try:
    yield
  except Exception as e:
    why = reason(e)
    if isinstance(e, WriteFault):
      advice = then()
      if not advice:
        raise
      raise WriteFault(f"{e}. {advice}") from None
    if why is None:
      raise
    named = what(e) if callable(what) else what
    raise WriteFault(describe(named, _filename(e) or where, why, then())) from None


def _filename(e: BaseException) -> str | None:
  """The path an OSError in `e`'s chain names, if any."""
  for link in _chain(e):
    if isinstance(link, OSError) and link.filename:
      return str(link.filename)
  return None


@contextlib.contextmanager
def in_threads():
  """Inside, a write fault that ends a background thread (TensorBoard's event writer, a
  checkpoint writer) is kept in the yielded list instead of printed as a traceback, for
  the caller to report; any other exception of a thread is printed as usual.

  When the block itself fails, write faults of threads that outlive it are dropped from
  then on: the block's own failure is the one reported, and a writer thread left running
  on the same full disk (TensorBoard's, whose close stops at its failed flush) can only
  repeat it."""
  faults = []
  previous = threading.excepthook

  def hook(args):
    if args.exc_value is not None and reason(args.exc_value) is not None:
      faults.append(args.exc_value)
      return
    previous(args)

  threading.excepthook = hook
  yield faults
  threading.excepthook = previous  # not reached when the block fails: the hook stays


def check_writable(directory: str, what: str) -> None:
  """WriteFault, before any work, if a file cannot be created in local `directory` (made if
  missing), e.g. for a read-only job's report; URLs are not checked."""
  if "://" in str(directory):
    return
  probe = os.path.join(directory, f".write_check.{os.getpid()}")
  try:
    os.makedirs(directory, exist_ok=True)
    with open(probe, "wb") as f:
      f.write(b"\0" * 4096)  # a page: an empty file fits even on a full disk
      f.flush()
      os.fsync(f.fileno())
  except Exception as e:
    why = reason(e)
    if why is None:
      raise
    raise WriteFault(describe(what, str(directory), why)) from None
  finally:
    if os.path.exists(probe):
      os.remove(probe)


def raise_thread_fault(faults: list, workdir: str) -> None:
  """Raise the first write fault that ended a background writer thread (TensorBoard's
  event writer is the only one the loop does not wait on) as a WriteFault."""
  if faults:
    with guard("the TensorBoard events", f"{workdir}/tb"):
      raise faults[0]


def close_all(closers, failing: bool) -> None:
  """Call every closer in order. When the run is already failing, their own errors are
  dropped (the first failure is the one to report); otherwise the first is raised once
  all have run."""
  first = None
  for close in closers:
    try:
      close()
    except Exception as e:
      first = first or e
  if first is not None and not failing:
    raise first

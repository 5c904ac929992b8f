"""tensorflow-datasets as the last data source: local first, the network only when asked.

`read(name, split, download=...)` first asks tfds for data it has already prepared (no network).
Only with `download=True` does it let tfds download, and only after `network_reachable()` saw a
TCP connection to the download host open within a few seconds: tfds' own downloader retries
for minutes without a word on an offline machine. Every failure is a `TfdsUnavailable` whose
message is one short line, for `sources.load` to put into its "not found" error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import urllib.parse

import numpy as np

# Where tensorflow-datasets downloads from (its GCS mirror), and how long `download=True` waits
# for a TCP connection to it (DNS included) before declaring the machine offline.
HOST = ("storage.googleapis.com", 443)
NETWORK_TIMEOUT_S = 5.0


class TfdsUnavailable(Exception):
  """tfds cannot provide the split; the message says why in one line."""


def data_dir() -> str:
  """tfds' local data directory (`$TFDS_DATA_DIR`, else ~/tensorflow_datasets)."""
  return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")


def _probe_address() -> tuple[str, int]:
  """The host a download would connect to first: the HTTPS proxy if one is set."""
  proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
  if proxy:
    parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parsed.hostname:
      return parsed.hostname, parsed.port or 3128
  return HOST


def network_reachable(address: tuple[str, int] | None = None,
                      timeout: float | None = None) -> bool:
  """True if a TCP connection to `address` (default: the tfds host) opens within `timeout` s.

  The probe runs in a daemon thread joined with the timeout, because name resolution
  (`getaddrinfo`) ignores socket timeouts and can block far longer on a black-holed network.
  """
  address = _probe_address() if address is None else address
  timeout = NETWORK_TIMEOUT_S if timeout is None else timeout
  opened, done = threading.Event(), threading.Event()

  def probe():
    try:
      with socket.create_connection(address, timeout=timeout):
        opened.set()
    except OSError:
      pass
    finally:
      done.set()

  threading.Thread(target=probe, name="dpkd-network-probe", daemon=True).start()
  done.wait(timeout)
  return opened.is_set()


def _brief(error: BaseException, limit: int = 100) -> str:
  """`Type: first line of the message`, cut to `limit` characters (tfds errors are long)."""
  lines = str(error).strip().splitlines()
  text = f"{type(error).__name__}: {lines[0] if lines else ''}"
  return text if len(text) <= limit else text[:limit - 3] + "..."


@contextlib.contextmanager
def _quiet_absl():
  """Silences tfds' absl warnings (e.g. about half-written folders) while we only probe."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _read(name: str, split: str, *, download: bool) -> tuple[np.ndarray, np.ndarray]:
  """Reads every record of a tfds split into NumPy arrays (raises whatever tfds raises)."""
  import tensorflow_datasets as tfds  # Deferred: importing tfds costs ~0.5 s.

  source = tfds.data_source(name, split=split, download=download)
  # One record at a time: batched `__getitems__` is broken under tfds.testing.mock_data.
  records = [source[i] for i in range(len(source))]
  images = np.stack([np.asarray(record["image"]) for record in records])  # (N, H, W, C)
  labels = np.asarray([record["label"] for record in records])  # (N,) int64
  return images, labels


def read(name: str, split: str, *, download: bool) -> tuple[np.ndarray, np.ndarray]:
  """(images (N, H, W, C), labels (N,)) of a tfds split, or TfdsUnavailable.

  Args:
    name / split: the tfds dataset name and split.
    download: after finding nothing prepared locally, check the network (a few seconds at
      most) and let tfds download and prepare the dataset.
  """
  try:
    with _quiet_absl():
      return _read(name, split, download=False)  # prepared data: no network involved
  except Exception as error:  # pylint: disable=broad-except
    # tfds raises many unrelated types (DatasetNotFoundError, KeyError on empty splits,
    # ImportError, ...); all mean "not prepared here".
    local = (f"tensorflow-datasets has not prepared it in {data_dir()!r} "
             f"({_brief(error)})")
    if not download:
      raise TfdsUnavailable(local) from error
  host, port = _probe_address()
  if not network_reachable((host, port)):
    raise TfdsUnavailable(f"{local}; --download: cannot reach {host}:{port} within "
                          f"{NETWORK_TIMEOUT_S:g} s (offline?)")
  try:
    return _read(name, split, download=True)
  except Exception as error:  # pylint: disable=broad-except
    raise TfdsUnavailable(f"{local}; its download failed ({_brief(error)})") from error

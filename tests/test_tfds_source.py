"""dpkd_jax.data.tfds_source and the offline paths of sources.load:
never a network access without download=True; with it, a few-second reachability check first,
so an offline machine gets one line naming every place looked in, not a silent hang."""

import os
from pathlib import Path
import socket
import subprocess
import sys
import threading

import pytest
import tensorflow_datasets as tfds

from dpkd_jax import errors
from dpkd_jax.data import sources


pytestmark = pytest.mark.usefixtures("isolated_data_sources")



@pytest.fixture
def black_hole(monkeypatch):
  """Every TCP connection hangs (a firewalled, offline machine); released at teardown."""
  release = threading.Event()

  def create_connection(*args, **kwargs):
    release.wait(60)
    raise OSError("simulated network black hole")

  monkeypatch.setattr(socket, "create_connection", create_connection)
  monkeypatch.delenv("HTTPS_PROXY", raising=False)
  monkeypatch.delenv("https_proxy", raising=False)
  yield
  release.set()


def _tfds_without_data(monkeypatch):
  """tfds has nothing prepared; returns the `download` argument of every call."""
  calls = []

  def data_source(*args, download=False, **kwargs):
    calls.append(download)
    if download:
      raise AssertionError("a download was started on an unreachable network")
    raise RuntimeError("simulated: dataset not prepared")

  monkeypatch.setattr(tfds, "data_source", data_source)
  return calls


def test_offline_download_fails_fast_without_downloading(monkeypatch, tmp_path, black_hole):
  calls = _tfds_without_data(monkeypatch)
  monkeypatch.setattr(sources.tfds_source, "NETWORK_TIMEOUT_S", 0.2)
  with pytest.raises(sources.DataNotFoundError) as excinfo:
    sources.load("mnist", data_dir=tmp_path, download=True)
  assert calls == [False]  # looked for prepared data, never started the download
  message = str(excinfo.value)
  assert "\n" not in message
  for fragment in (f"no mnist.npz in {str(tmp_path)!r} (--data_dir)", "tensorflow-datasets",
                   sources.tfds_source.data_dir(), "cannot reach storage.googleapis.com:443",
                   "--data_dir=DIR", "x_train, y_train, x_test, y_test", "--download"):
    assert fragment in message


def test_no_network_without_download(monkeypatch, tmp_path):
  calls = _tfds_without_data(monkeypatch)

  def no_network(*args, **kwargs):
    raise AssertionError("touched the network without download=True")

  monkeypatch.setattr(socket, "create_connection", no_network)
  monkeypatch.setenv(sources.DATA_DIR_ENV_VAR, str(tmp_path))
  with pytest.raises(sources.DataNotFoundError) as excinfo:
    sources.load("fashion_mnist")
  assert calls == [False]
  assert f"no fashion_mnist.npz in {str(tmp_path)!r} ($DPKD_DATA_DIR)" in str(excinfo.value)


def test_network_reachable(black_hole):
  assert not sources.tfds_source.network_reachable(timeout=0.1)  # returns despite the hang


def test_network_reachable_local_listener():
  with socket.create_server(("127.0.0.1", 0)) as server:
    address = server.getsockname()[:2]
    assert sources.tfds_source.network_reachable(address, timeout=5)
  # Nothing listens there any more: refused at once.
  assert not sources.tfds_source.network_reachable(address, timeout=5)


def test_proxy_is_probed(monkeypatch):
  monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:8080")
  assert sources.tfds_source._probe_address() == ("proxy.example", 8080)


def test_data_errors_are_user_errors(tmp_path):
  (tmp_path / "mnist.npz").write_text("not an archive")
  with pytest.raises(errors.UserError, match=r"mnist\.npz.*cannot read"):
    sources.load("mnist", data_dir=tmp_path)
  with pytest.raises(errors.UserError, match="unknown dataset"):
    sources.load("imagenet")
  assert issubclass(sources.DataNotFoundError, errors.UserError)


def test_cli_offline_download_one_line(tmp_path):
  """The teacher CLI, offline (an unreachable proxy), --download: one line, exit 2."""
  env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
         "JAX_PLATFORMS": "cpu", "TFDS_DATA_DIR": str(tmp_path / "tfds"),
         "HTTPS_PROXY": "http://127.0.0.1:9"}  # discard port: nothing listens, refused at once
  env.pop(sources.DATA_DIR_ENV_VAR, None)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.teacher", "--dataset=mnist", "--download",
       f"--data_dir={tmp_path}", f"--workdir={tmp_path}/run", "--no_progress"],
      env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: dataset 'mnist'"), result.stderr
  assert "cannot reach 127.0.0.1:9" in lines[0] and str(tmp_path / "tfds") in lines[0]
  assert sorted(os.listdir(tmp_path)) == ["tfds"] or os.listdir(tmp_path) == []

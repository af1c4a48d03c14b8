"""A Google Cloud Storage emulator on 127.0.0.1, so tests can run with a ``gs://`` workdir.

``with gcs_workdir() as workdir:`` starts an in-memory GCS server (``gcp-storage-emulator``)
on a free loopback port, points every client of the run at it, and yields a fresh
``gs://rljax-test/<random>`` URL; on exit the server stops and the environment is restored.
The clients are the two a run uses:

* gcsfs, through ``etils.epath`` (metrics, trace, TensorBoard events, HF and tokenizer files,
  orbax's metadata): ``STORAGE_EMULATOR_HOST`` and an anonymous token;
* tensorstore's ``gcs`` kvstore (orbax's array chunks): ``TENSORSTORE_GCS_HTTP_URL`` and a
  fixed test token (``GOOGLE_AUTH_TOKEN_FOR_TESTING``).

Nothing leaves the machine: no client looks for Google credentials (which would probe the
GCE metadata server), and the metadata host variables point at a closed loopback port in case
one does. gcsfs's default class probes the bucket layout over gRPC with default credentials,
so the plain ``gcsfs.core.GCSFileSystem`` is registered for ``gs://`` while the server runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterator
from http import server
from urllib import parse

BUCKET = "rljax-test"
# A loopback port nothing listens on: a stray metadata-server probe fails at once, locally.
_CLOSED_LOOPBACK = "127.0.0.1:9"


class _QuietServer(server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # tensorstore drops connections it no longer needs; the emulator then fails to write.
        pass


def _handler(storage, lock: threading.Lock):
    from gcp_storage_emulator.server import RequestHandler

    class LockedHandler(RequestHandler):
        """Serialises requests: the emulator's in-memory store is not thread-safe.

        It also sends an object's generation with its bytes (``x-goog-generation``), as GCS
        does and the emulator does not: without it tensorstore reads generation 0, and the
        conditional write that follows such a read (OCDBT updating its manifest after a
        retried write) fails with "Malformed StorageGeneration".
        """

        _status = 0  # the status of the response being sent

        def handle_one_request(self):
            with lock:
                super().handle_one_request()

        def send_response(self, code, message=None):
            self._status = code
            super().send_response(code, message)

        def end_headers(self):
            generation = _media_generation(storage, self.command, self.path, self._status)
            if generation is not None:
                self.send_header("x-goog-generation", generation)
            super().end_headers()

    return functools.partial(LockedHandler, storage)


_OBJECT = re.compile(r"/b/(?P<bucket>[^/]+)/o/(?P<name>.+)")


def _media_generation(storage, method: str, path: str, status: int) -> str | None:
    """The generation of the object a successful media GET returned, else None."""
    from gcp_storage_emulator.exceptions import NotFound

    url = parse.urlsplit(path)
    media = url.path.startswith("/download/") or "media" in parse.parse_qs(url.query).get("alt", [])
    match = _OBJECT.search(url.path)
    if method != "GET" or status not in (200, 206) or not media or match is None:
        return None
    try:
        obj = storage.get_file_obj(match["bucket"], parse.unquote(match["name"]))
    except NotFound:  # deleted since: the response says so already
        return None
    return str(obj["generation"])


@contextlib.contextmanager
def gcs_server(bucket: str = BUCKET) -> Iterator[str]:
    """Runs the emulator with ``bucket`` created; yields ``gs://<bucket>``."""
    try:
        import fsspec
        import gcsfs.core
        from gcp_storage_emulator.handlers import buckets
        from gcp_storage_emulator.storage import Storage
    except ImportError as e:
        raise ImportError(
            f"gcs_server needs gcsfs and gcp-storage-emulator ({e}); pip install -e '.[test]'"
        ) from None
    from etils.epath import backend as epath_backend

    storage = Storage(use_memory_fs=True)
    buckets.create_bucket(bucket, storage)
    httpd = _QuietServer(("127.0.0.1", 0), _handler(storage, threading.Lock()))
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, name="gcs-emulator", daemon=True)
    env = {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": _CLOSED_LOOPBACK,
        "GCE_METADATA_IP": _CLOSED_LOOPBACK,
        "GCE_METADATA_ROOT": _CLOSED_LOOPBACK,
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved_conf = {k: fsspec.config.conf.get(k) for k in ("gs", "gcs")}
    saved_classes = {k: fsspec.registry.get(k) for k in ("gs", "gcs")}
    emulator_log = logging.getLogger("gcp_storage_emulator")
    saved_level = emulator_log.level

    def fresh_filesystems():
        # epath and fsspec cache filesystem instances, which hold their token and class.
        gcsfs.core.GCSFileSystem.clear_instance_cache()
        epath_backend.fsspec_backend._get_filesystem.cache_clear()

    thread.start()
    try:
        os.environ.update(env)
        for protocol in ("gs", "gcs"):
            fsspec.config.conf[protocol] = {"token": "anon"}
            fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
        emulator_log.setLevel(logging.CRITICAL)  # it logs every 404 (exists() probes) as ERROR
        fresh_filesystems()
        yield f"gs://{bucket}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for protocol in ("gs", "gcs"):
            if saved_conf[protocol] is None:
                fsspec.config.conf.pop(protocol, None)
            else:
                fsspec.config.conf[protocol] = saved_conf[protocol]
            if saved_classes[protocol] is None:
                # The next use imports the default class again.
                importlib.import_module("fsspec.registry")._registry.pop(protocol, None)
            else:
                fsspec.register_implementation(protocol, saved_classes[protocol], clobber=True)
        emulator_log.setLevel(saved_level)
        fresh_filesystems()


@contextlib.contextmanager
def gcs_workdir(bucket: str = BUCKET) -> Iterator[str]:
    """Runs the emulator and yields a fresh, empty ``gs://<bucket>/<random>`` workdir URL."""
    with gcs_server(bucket) as root:
        yield f"{root}/run-{uuid.uuid4().hex[:8]}"

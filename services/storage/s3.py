"""S3-compatible object storage (MinIO, a cloud bucket) behind the :class:`Storage` interface, through boto3.

Endpoint, region and credentials come from boto3's standard variables and files (``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ~/.aws). Which path each method takes:

- ``writer``: streams, sequentially, to the bucket: one PUT for a small object, else a multipart upload of
  ``part_size`` parts sent as bytes arrive (one part in memory, nothing on disk); completed when the block exits,
  aborted on error. Uploads and ``save_array`` take this path.
- ``file_writer``, ``path_writer``, ``array_writer``: a file in the scratch cache (seekable, mappable), uploaded
  on exit (boto3's multipart ``upload_file``) and kept in the cache as the object's local copy. The TIFF
  writer and memory-mapped results take this path.
- ``local_path`` / ``load_array``: the whole object, downloaded into the scratch cache once (atomic rename) and
  re-validated by ETag and size on every call.
- ``open``: a seekable reader doing ranged GETs (the upload probe reads only the TIFF structure);
  ``iter_chunks(start, end)``: one ranged GET; ``read_rows``: the ``.npy`` header and the rows' byte range.

Every object appears under its key only complete: S3's PUT and CompleteMultipartUpload are atomic.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

import boto3
import numpy as np
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError
from urllib3.exceptions import HTTPError as URLLib3Error

from services.errors import StorageUnavailable
from services.storage.base import Storage
from services.storage.scratch import ScratchCache
from services.storage.space import check_room, full, is_full

MiB = 1 << 20


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (bucket, "some/prefix")."""
    rest = url.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"no bucket in storage URL {url!r}")
    return bucket, prefix.strip("/")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _missing(exc: ClientError) -> bool:
    return _code(exc) in ("404", "NoSuchKey", "NotFound")


# Answers about one object or one request, which the storage code handles itself; any other error of the store
# (unreachable, 5xx, a missing bucket, refused credentials, a full MinIO) is StorageUnavailable.
_OBJECT_CODES = frozenset({"404", "NoSuchKey", "NotFound", "InvalidRange", "NoSuchUpload", "BucketAlreadyOwnedByYou",
                           "BucketAlreadyExists", "PreconditionFailed", "304"})
# A transfer or an object's body cut off mid-read (a connection reset, a read timeout): the store is away too.
_TRANSFER_ERRORS = (BotoCoreError, S3UploadFailedError, URLLib3Error)
_REFUSED = frozenset({"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                      "InvalidToken", "AllAccessDisabled"})


def unavailable(exc: Exception, bucket: str, what: str) -> StorageUnavailable:
    """``exc`` from boto3 as the domain's StorageUnavailable, its reason in words a studio's engineer acts on."""
    if isinstance(exc, ClientError):
        code = _code(exc)
        if code == "NoSuchBucket":
            reason = f"bucket {bucket!r} does not exist"
        elif code in _REFUSED:
            reason = f"the object store refused access to bucket {bucket!r} ({code}): check the credentials " \
                     f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and the bucket's policy"
        else:
            reason = f"the object store answered {code or 'an error'}: {exc}"
    elif isinstance(exc, EndpointConnectionError):
        reason = f"the object store does not answer ({exc})"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return StorageUnavailable(f"storage unavailable ({what}): {reason}")


class GuardedClient:
    """A boto3 S3 client whose calls raise :class:`StorageUnavailable` for errors of the store itself; a
    ClientError about the object (missing, a range past its end) passes as it is."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    @property
    def meta(self) -> Any:
        return self._client.meta

    def get_paginator(self, name: str) -> Any:
        return self._client.get_paginator(name)  # its pages are fetched where they are iterated (S3Storage._pages)

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return call(*args, **kwargs)
            except ClientError as exc:
                if _code(exc) in _OBJECT_CODES:
                    raise
                raise unavailable(exc, self._bucket, name) from exc
            except _TRANSFER_ERRORS as exc:
                raise unavailable(exc, self._bucket, name) from exc

        return guarded


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str, scratch: ScratchCache, part_size: int = 16 * MiB,
                 client: Any = None, create_bucket: bool = False, public_endpoint: str = "") -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.scratch = scratch
        self.part_size = max(part_size, 5 * MiB)  # S3's smallest part but the last
        self.client = GuardedClient(client or boto3.client(
            "s3", config=Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32)), bucket)
        self.transfer = TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                                       max_concurrency=4)
        self.create_bucket = create_bucket
        self.public_endpoint = public_endpoint.strip()
        self._presigner: Any = None
        self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        """The bucket must exist; with ``create_bucket`` (STRATA_S3_CREATE_BUCKET) a missing one is made (a
        typo'd name is otherwise refused, not silently created and written to)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if not _missing(exc):
                raise
            if not self.create_bucket:
                raise StorageUnavailable(f"storage unavailable: bucket {self.bucket!r} does not exist (create it, "
                                         f"or set STRATA_S3_CREATE_BUCKET=true to let Strata create it)") from exc
            region = self.client.meta.region_name
            extra = {} if region in (None, "us-east-1") else {
                "CreateBucketConfiguration": {"LocationConstraint": region}}
            try:
                self.client.create_bucket(Bucket=self.bucket, **extra)
            except ClientError as again:  # another process made it first
                if again.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou",
                                                                        "BucketAlreadyExists"):
                    raise

    def _key(self, key: str) -> str:
        if ".." in key.split("/") or key.startswith("/"):
            raise ValueError(f"storage key escapes the root: {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _head(self, key: str) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], self.client.head_object(Bucket=self.bucket, Key=self._key(key)))
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(key) from exc
            raise

    # Writing

    @contextmanager
    def writer(self, key: str, durable: bool = True) -> Iterator[BinaryIO]:
        upload = MultipartWriter(self.client, self.bucket, self._key(key), self.part_size)
        try:
            yield cast(BinaryIO, upload)
            upload.complete()
        except BaseException:
            upload.abort()
            raise

    def file_writer(self, key: str, durable: bool = True) -> AbstractContextManager[BinaryIO]:
        return self._file_writer(key)

    @contextmanager
    def _file_writer(self, key: str) -> Iterator[BinaryIO]:
        with self.path_writer(key) as tmp, open(tmp, "w+b") as f:
            yield f
            f.flush()

    @contextmanager
    def path_writer(self, key: str) -> Iterator[Path]:
        try:
            with self.scratch.temp_file(key) as tmp:
                yield tmp
                self.scratch.publish(tmp, key, self._upload_file(tmp, key))  # this host's later reads: no download
        except OSError as exc:  # the scratch disk full: StorageUnavailable, as a full local storage
            if is_full(exc, self.scratch.root):
                raise full(self.scratch.root) from exc
            raise

    def room_for(self, key: str, nbytes: int) -> None:
        check_room(self.scratch.root, nbytes)

    def _upload_file(self, path: Path, key: str) -> str:
        """Upload a local file (one PUT up to a part, else boto3's multipart transfer); returns its ETag."""
        if path.stat().st_size <= self.part_size:
            with open(path, "rb") as f:
                return str(self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=f)["ETag"])
        self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer)
        return str(self._head(key)["ETag"])

    # Reading

    def open(self, key: str) -> BinaryIO:
        size = int(self._head(key)["ContentLength"])
        raw = RangedReader(self.client, self.bucket, self._key(key), size)
        return cast(BinaryIO, io.BufferedReader(raw, buffer_size=256 * 1024))

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except FileNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def local_path(self, key: str) -> Path:
        head = self._head(key)
        etag, size = str(head["ETag"]), int(head["ContentLength"])
        cached = self.scratch.lookup(key, etag, size)
        if cached is not None:
            return cached
        with self.scratch.temp_file(key) as tmp:
            self.client.download_file(self.bucket, self._key(key), str(tmp), Config=self.transfer)
            if os.path.getsize(tmp) != size:
                raise OSError(f"{key}: downloaded {os.path.getsize(tmp)} of {size} bytes")
            return self.scratch.publish(tmp, key, etag)

    def load_array(self, key: str, mmap: bool = True) -> np.ndarray:
        """Through the scratch cache. No sample digest to check (one HEAD less per load): on object storage an
        ``array_writer`` array is uploaded whole after its pages were flushed, so no ``.sample`` is written."""
        return np.load(self.local_path(key), mmap_mode="r" if mmap else None, allow_pickle=False)

    def iter_chunks(self, key: str, start: int = 0, end: int | None = None, chunk: int = 1 << 20) -> Iterator[bytes]:
        if end is not None and end <= start:
            return
        span = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=span)["Body"]
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(key) from exc
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return
            raise
        try:
            yield from body.iter_chunks(chunk)
        except _TRANSFER_ERRORS as exc:
            raise unavailable(exc, self.bucket, f"reading {key}") from exc
        finally:
            body.close()

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of a stored C-order ``.npy``: its header and one ranged GET of the rows."""
        with self.open(key) as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
        if fortran or not shape:
            return np.asarray(self.load_array(key, mmap=False)[start:stop])
        start, stop = max(0, start), min(stop, shape[0])
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        data = b"".join(self.iter_chunks(key, offset + start * row, offset + stop * row)) if stop > start else b""
        return np.frombuffer(data, dtype=dtype).reshape((max(stop - start, 0), *shape[1:]))

    def delete_prefix(self, prefix: str) -> None:
        for batch in self._pages(prefix):
            keys = [o["Key"] for o in batch]
            if keys:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys],
                                                                       "Quiet": True})
            for o in batch:
                self.scratch.forget(self._unprefixed(o["Key"]))

    def _unprefixed(self, full: str) -> str:
        return full[len(self.prefix) + 1:] if self.prefix else full

    def _pages(self, prefix: str) -> Iterator[list[dict[str, Any]]]:
        """Objects under ``prefix`` (the whole key or a folder), at most 1000 per page."""
        full = self._key(prefix.rstrip("/")) if prefix else self.prefix
        paginator = self.client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=full))
        while True:
            try:
                page = next(pages)
            except StopIteration:
                return
            except (ClientError, BotoCoreError) as exc:
                raise unavailable(exc, self.bucket, "list_objects_v2") from exc
            yield [o for o in page.get("Contents", []) if o["Key"] == full or o["Key"].startswith(full + "/")
                   or not full]

    def list_sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        for batch in self._pages(prefix):
            for o in batch:
                yield self._unprefixed(o["Key"]), int(o["Size"])

    def last_modified(self, prefix: str) -> float | None:
        return max((o["LastModified"].timestamp() for page in self._pages(prefix) for o in page), default=None)

    def presigned_url(self, key: str, expires_s: int, disposition: str | None = None,
                      content_type: str | None = None) -> str | None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if disposition:
            params["ResponseContentDisposition"] = disposition
        if content_type:
            params["ResponseContentType"] = content_type
        return cast(str, self._signer().generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s))

    def _signer(self) -> Any:
        """The client that signs download URLs: for STRATA_S3_PUBLIC_ENDPOINT where set (a signature covers the
        host, so a URL signed for the service's own endpoint, e.g. ``http://minio:9000`` inside docker-compose,
        cannot be rewritten for stations), else the service's own. Signing is local: no request is made."""
        if not self.public_endpoint:
            return self.client
        if self._presigner is None:
            own = self.client.meta
            self._presigner = boto3.client("s3", endpoint_url=self.public_endpoint, region_name=own.region_name,
                                           config=own.config)
        return self._presigner

    def abort_stale_uploads(self, older_than_s: float) -> int:
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_s)
        aborted = 0
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.prefix}/" if self.prefix else ""}
        while True:
            page = self.client.list_multipart_uploads(**params)
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < cutoff:
                    with contextlib.suppress(ClientError):  # NoSuchUpload: finished or aborted meanwhile
                        self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                           UploadId=upload["UploadId"])
                        aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            params.update(KeyMarker=page.get("NextKeyMarker"), UploadIdMarker=page.get("NextUploadIdMarker"))

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:  # a 404: the bucket is gone
            raise unavailable(exc, self.bucket, "head_bucket") from exc

    def shared_between_hosts(self) -> bool:
        return True

    def scratch_bytes(self) -> int:
        return self.scratch.used_bytes()


class MultipartWriter(io.RawIOBase):
    """A write-only stream to one object: buffered up to a part, then parts uploaded as they fill; ``complete``
    publishes it (one PUT when it never reached a part), ``abort`` leaves nothing."""

    def __init__(self, client: Any, bucket: str, key: str, part_size: int) -> None:
        super().__init__()
        self.client, self.bucket, self.key, self.part_size = client, bucket, key, part_size
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.position

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.buffer += view
        self.position += len(view)
        while len(self.buffer) >= self.part_size:
            self._send(bytes(self.buffer[:self.part_size]))
            del self.buffer[:self.part_size]
        return len(view)

    def _send(self, part: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key)["UploadId"]
        number = len(self.parts) + 1
        got = self.client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                      PartNumber=number, Body=part)
        self.parts.append({"PartNumber": number, "ETag": got["ETag"]})

    def complete(self) -> None:
        if self.upload_id is None:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self.buffer))
        else:
            if self.buffer or not self.parts:
                self._send(bytes(self.buffer))
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                                  MultipartUpload={"Parts": self.parts})
        self.buffer = bytearray()
        self.upload_id = None

    def abort(self) -> None:
        if self.upload_id is not None:  # best effort: `strata storage prune` aborts stale ones, or a lifecycle rule
            with contextlib.suppress(ClientError, BotoCoreError, StorageUnavailable):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        self.upload_id = None
        self.buffer = bytearray()


class RangedReader(io.RawIOBase):
    """A seekable read-only view of one object; every read is a ranged GET (wrap it in a BufferedReader)."""

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        super().__init__()
        self.client, self.bucket, self.key, self.length = client, bucket, key, size
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.length - self.position)
        if want <= 0:
            return 0
        body = self.client.get_object(Bucket=self.bucket, Key=self.key,
                                      Range=f"bytes={self.position}-{self.position + want - 1}")["Body"]
        try:
            got = body.read()
        except _TRANSFER_ERRORS as exc:
            raise unavailable(exc, self.bucket, f"reading {self.key}") from exc
        n = len(got)
        memoryview(buffer).cast("B")[:n] = got
        self.position += n
        return n

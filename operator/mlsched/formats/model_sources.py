"""Reading a SchedulingPolicy's model, and its model card, without trusting the policy.

Any tenant who can write a SchedulingPolicy names what the cluster-wide operator reads, so:

- a `path` must lie inside one of the configured model directories (`--allowed-model-dir`),
  decided from the name alone before anything outside is touched, then again after symlinks;
  the status of a refused path is the same whether or not the file exists, and has no digest;
- the file must be a regular file (no device, FIFO or directory: /dev/zero never ends);
- no read goes past `--max-model-bytes` (+1 byte, to tell "too large" from "exactly the limit");
- a ConfigMap model comes from the policy's own namespace, its card from the key beside it;
- a model too large for one ConfigMap (1 MiB) is split over several of that namespace, named
  in order by annotation MODEL_PARTS of the ConfigMap the reference names, with the whole's
  sha256 (checked after joining: a replaced part is refused, never served); at most MAX_PARTS,
  and no more than `--max-model-bytes` in all.

What comes back is the bytes of both (`ModelBundle`): the loader serves exactly what was hashed.
What cannot be read is a `ModelLoadError` (policies/onnx_runner.py, the same error the loader
raises for a model its card refuses) with the condition reason: ModelNotFound,
ModelPathNotAllowed, ModelTooLarge, ModelInvalid, ModelDigestMismatch.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsched.api import GROUP
from mlsched.formats.dataset_store import PART_BYTES, split
from mlsched.features.card import card_path
from mlsched.policies.onnx_runner import ModelLoadError

ReadConfigMap = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
#: Far above any learned policy we ship (about 100 KiB), far below the operator's memory limit.
DEFAULT_MAX_MODEL_BYTES = 64 * 2**20
#: Annotation of a ConfigMap that holds a model split over others (ConfigMaps hold 1 MiB):
#: JSON {"<key>": {"sha256": "<hex of the whole model>", "parts": ["<ConfigMap>", ...]}}, each
#: named ConfigMap (same namespace) holding its piece under the same key, in order.
MODEL_PARTS = f"{GROUP}/model-parts"
#: Each part is a GET every round; 80 parts of 900 KiB pass the default size limit.
MAX_PARTS = 80
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ModelBundle:
    """A model's bytes and its card's (None when there is none), with the names the policy's
    owner knows them by (a path, or a ConfigMap key), for messages."""

    model: bytes
    card: bytes | None
    model_name: str
    card_name: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.model).hexdigest()

    @property
    def card_digest(self) -> str | None:
        return hashlib.sha256(self.card).hexdigest() if self.card is not None else None


def _size_text(limit: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} bytes"


def _too_large(what: str, limit: int) -> ModelLoadError:
    return ModelLoadError("ModelTooLarge", f"{what} is larger than the model size limit of "
                                           f"{_size_text(limit)} (--max-model-bytes)")


class ModelDirs:
    """The allow-list of directories a `path` may name a file in."""

    def __init__(self, dirs: Sequence[str]):
        self.dirs = tuple(os.path.abspath(d) for d in dirs)
        # A configured directory may itself be a symlink (site-packages, a volume): a path is
        # accepted by its name under either spelling, and by its target under the real one.
        self._names = {os.path.normpath(d) for d in self.dirs} | {os.path.realpath(d) for d in self.dirs}
        self._real = {os.path.realpath(d) for d in self.dirs}

    def check(self, path: str) -> str:
        """The real path to open for `path`, or ModelPathNotAllowed. The first verdict is taken
        on the name only ('..' resolved as text), so nothing outside the directories is
        touched; only then are symlinks resolved, and the target must be inside too."""
        name = os.path.normpath(path)
        if not os.path.isabs(path) or not _inside(name, self._names):
            raise self._refusal(f"{path!r} is not")
        real = os.path.realpath(name)
        if not _inside(real, self._real):
            raise self._refusal(f"{path!r} resolves (through a symlink) outside them")
        return real

    def _refusal(self, detail: str) -> ModelLoadError:
        where = ", ".join(self.dirs) or "none are configured"
        return ModelLoadError("ModelPathNotAllowed", "path must be inside one of the configured "
                                                     f"model directories ({where}); {detail}")


def _inside(path: str, dirs: set[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def read_bounded(real: str, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `real`; FileNotFoundError when it is absent.
    O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after);
    O_NOFOLLOW: a symlink swapped in after the check is not followed."""
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelLoadError("ModelPathNotAllowed", f"{name} is not a regular file")
        if info.st_size > limit:
            raise _too_large(name, limit)
        chunks, total = [], 0
        while total <= limit:  # the size may have grown since fstat
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise _too_large(name, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_allowed(path: str, dirs: ModelDirs | None, limit: int) -> bytes:
    real = dirs.check(path) if dirs is not None else os.path.realpath(path)
    try:
        return read_bounded(real, path, limit)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ModelLoadError("ModelPathNotAllowed", f"{path} is a symlink that does not "
                                 "resolve (a loop), or one swapped in after the check") from None
        raise


def read_path(path: str, dirs: ModelDirs | None, limit: int) -> ModelBundle:
    """A model file and the card beside it (`<stem>.card.json`, under the same rules).
    `dirs` None: a path the operator chose itself (a shipped model), not a tenant."""
    card = str(card_path(Path(os.path.normpath(path))))
    try:
        model = _read_allowed(path, dirs, limit)
    except FileNotFoundError:
        raise ModelLoadError("ModelNotFound", f"no file {path}") from None
    except OSError as err:
        raise ModelLoadError("ModelNotFound", f"cannot read {path}: {err.strerror}") from None
    try:
        card_bytes = _read_allowed(card, dirs, limit)
    except FileNotFoundError:
        card_bytes = None  # the runner says the card is missing, like any other card fault
    except OSError as err:
        raise ModelLoadError("ModelNotFound", f"cannot read {card}: {err.strerror}") from None
    return ModelBundle(model, card_bytes, path, card)


async def read_configmap_model(read: ReadConfigMap, namespace: str, name: str, key: str,
                               limit: int) -> ModelBundle:
    """A model under `key` (binaryData or data) of a ConfigMap in the policy's namespace, or
    joined from the parts it names (MODEL_PARTS), and the card under the key the runner looks
    for beside it (`policy.onnx` → `policy.card.json`)."""
    where = f"ConfigMap {namespace}/{name}"
    body = await read(namespace, name)
    if body is None:
        raise ModelLoadError("ModelNotFound", f"{where} not found")
    card_key = card_path(Path(key)).name
    model = _configmap_value(body, key, f"{where} key {key}", limit)
    named = named_parts(body, key, where)
    if model is not None and named is not None:
        raise ModelLoadError("ModelInvalid", f"{where} holds key {key!r} and also names parts for it "
                                             f"(annotation {MODEL_PARTS}): keep one")
    what = model_name = f"{where} key {key}"
    if named is not None:
        parts, digest = named
        chunks, total = [], 0
        for k, part in enumerate(parts, 1):  # one at a time: a missing or oversized part stops the reads
            chunk = _part_value(part, await read(namespace, part), k, len(parts), key, what, namespace,
                                limit, total)
            chunks.append(chunk)
            total += len(chunk)
        model = _joined(chunks, digest, what)
        model_name = f"{what} ({len(parts)} parts)"
    if model is None:
        raise ModelLoadError("ModelNotFound", f"{where} has no key {key!r}")
    card = _configmap_value(body, card_key, f"{where} key {card_key}", limit)
    return ModelBundle(model, card, model_name, f"{where} key {card_key}")


def model_pieces(model: bytes, card: bytes, part_bytes: int = PART_BYTES) -> list[bytes]:
    """The pieces of `model` when it and its card are too large for one ConfigMap (each piece
    for a part ConfigMap of its own), else [] (one ConfigMap holds both)."""
    return [] if len(model) + len(card) <= part_bytes else split(model, part_bytes)


def parts_annotation(key: str, model: bytes, parts: Sequence[str]) -> dict[str, str]:
    """The annotation naming `model`'s part ConfigMaps in order (what named_parts reads)."""
    return {MODEL_PARTS: json.dumps({key: {"sha256": hashlib.sha256(model).hexdigest(), "parts": list(parts)}})}


def named_parts(body: Mapping[str, Any], key: str, where: str) -> tuple[list[str], str] | None:
    """(the ConfigMaps holding `key`'s pieces in order, the whole's sha256) when `body` splits
    `key` (MODEL_PARTS), else None. ModelInvalid when the annotation is not of that shape."""
    text = ((body.get("metadata") or {}).get("annotations") or {}).get(MODEL_PARTS)
    if text is None:
        return None
    entry_shape = '{"sha256": "<64 hex digits>", "parts": ["<ConfigMap>", ...]}'
    try:
        entries = json.loads(text)
    except ValueError:
        entries = None
    if not isinstance(entries, dict):
        raise ModelLoadError("ModelInvalid", f"{where} annotation {MODEL_PARTS} is not JSON of the "
                                             f'form {{"{key}": {entry_shape}}}')
    entry = entries.get(key)
    if entry is None:
        return None
    parts = entry.get("parts") if isinstance(entry, dict) else None
    digest = entry.get("sha256") if isinstance(entry, dict) else None
    if not (isinstance(parts, list) and parts and isinstance(digest, str) and _SHA256.match(digest)
            and all(isinstance(p, str) and _NAME.match(p) for p in parts)):
        raise ModelLoadError("ModelInvalid", f"{where} annotation {MODEL_PARTS} entry {key!r} is not "
                                             f"of the form {entry_shape}")
    if len(parts) > MAX_PARTS:
        raise ModelLoadError("ModelInvalid", f"{where} annotation {MODEL_PARTS} names {len(parts)} "
                                             f"parts for {key!r}, at most {MAX_PARTS}")
    return parts, digest


def join_parts(pieces: Iterable[tuple[str, Mapping[str, Any] | None]], count: int, key: str, digest: str,
               what: str, namespace: str, limit: int) -> bytes:
    """The model `what` from its `count` parts' bodies in order (None: not found), checked
    against `digest`. Reads `pieces` lazily and stops at the first fault: nothing beyond
    `limit` bytes in all is decoded."""
    chunks, total = [], 0
    for k, (name, part) in enumerate(pieces, 1):
        chunk = _part_value(name, part, k, count, key, what, namespace, limit, total)
        chunks.append(chunk)
        total += len(chunk)
    return _joined(chunks, digest, what)


def _part_value(name: str, part: Mapping[str, Any] | None, k: int, count: int, key: str, what: str,
                namespace: str, limit: int, before: int) -> bytes:
    """Part k's bytes, `before` bytes having come from the parts before it."""
    piece = f"ConfigMap {namespace}/{name} (part {k} of {count} of {what})"
    if part is None:
        raise ModelLoadError("ModelNotFound", f"{piece} not found")
    try:
        chunk = _configmap_value(part, key, piece, limit - before)
    except ModelLoadError as err:
        if err.reason == "ModelTooLarge":
            raise _too_large(f"{what} (in {count} parts)", limit) from None
        raise
    if chunk is None:
        raise ModelLoadError("ModelNotFound", f"{piece} has no key {key!r}")
    return chunk


def _joined(chunks: list[bytes], digest: str, what: str) -> bytes:
    model = b"".join(chunks)
    joined = hashlib.sha256(model).hexdigest()
    if joined != digest:
        raise ModelLoadError("ModelDigestMismatch", f"the {len(chunks)} parts of {what} join to sha256 "
                                                    f"{joined}, annotation {MODEL_PARTS} says {digest}: "
                                                    "a part was replaced, or is from another model")
    return model


def _configmap_value(body: Mapping[str, Any], key: str, what: str, limit: int) -> bytes | None:
    binary = (body.get("binaryData") or {}).get(key)
    if binary is not None:
        # Decoded size from the text's length: nothing bigger than the limit is decoded.
        text = str(binary).strip()
        if len(text) // 4 * 3 - text[-2:].count("=") > limit:
            raise _too_large(what, limit)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ModelLoadError("ModelInvalid", f"{what} is not valid base64") from None
    text = (body.get("data") or {}).get(key)
    if text is None:
        return None
    data = str(text).encode()
    if len(data) > limit:
        raise _too_large(what, limit)
    return data

"""Getting a model from the Hugging Face Hub, as LM Studio and Jan users expect: a repo id
or a file URL, the repo's model files with their sizes and quantizations, and a download
into the models folder that resumes, reports progress and is checked against the hub.

huggingface_hub does the talking: the file list (`HfApi.model_info` with the files'
metadata), each file's location, size, ETag and commit (`get_hf_file_metadata`, the
HEAD of `/{repo}/resolve/{revision}/{file}`), the session, headers and token, and its
error types. The transfer loop is ours, because hf_hub_download deletes a partial file
when a transfer fails and offers no way to cancel: here the partial stays beside the
destination as `<file>.part` (with the ETag it belongs to), a later download sends
`Range: bytes=<have>-` and appends, and a cancel stops between chunks.

Every finished file is checked before it is moved into place: an LFS file against the
sha256 the hub reports (its LFS oid, which is also its ETag), a small git file against
its git blob id (sha1 of "blob <size>\\0" + content). A mismatch deletes the partial and
refuses; nothing unchecked is ever loaded. No Qt here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

CHUNK_BYTES = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# GGUF quantization names as llama.cpp writes them into file names (Q4_K_M, IQ3_XS, F16...)
QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.I)
# what a Hugging Face / MLX model folder needs besides its weights
FOLDER_FILES = re.compile(r"^(config\.json|tokenizer[^/]*|.*\.tiktoken|generation_config\.json|"
                          r"special_tokens_map\.json|chat_template\.(json|jinja)|.*\.safetensors"
                          r"|model\.safetensors\.index\.json)$")  # fmt: skip

Progress = Callable[[int, int], None]  # bytes done, bytes in all


class HubError(Exception):
    """A download or listing that did not happen, in words a person can act on."""


class DownloadCancelled(HubError):
    pass


@dataclass(frozen=True)
class HubSource:
    """What the person pasted: a repo, and a file in it when they pasted a file's URL."""

    repo_id: str
    revision: str = "main"
    filename: str | None = None


@dataclass(frozen=True)
class HubFile:
    path: str  # inside the repo
    size: int
    sha256: str | None  # the LFS oid; None for a small file kept in git itself
    blob_id: str | None  # the git blob id (sha1)

    @property
    def quantization(self) -> str:
        match = QUANT_RE.search(Path(self.path).name)
        return match.group(1).upper() if match else ""


@dataclass(frozen=True)
class HubChoice:
    """One thing to download: a GGUF file, or the files of a safetensors model folder."""

    label: str
    files: tuple[HubFile, ...]
    is_folder: bool = False

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def quantization(self) -> str:
        return "" if self.is_folder else self.files[0].quantization


def parse_source(text: str) -> HubSource:
    """`owner/name`, a huggingface.co repo URL, or a file URL (…/blob|resolve/<rev>/<file>)."""
    text = text.strip()
    if not text:
        raise ValueError("Paste a Hugging Face repo id (owner/name) or a model file's URL.")
    if REPO_ID_RE.match(text):
        return HubSource(text)
    url = urlparse(text if "://" in text else "https://" + text)
    parts = [unquote(p) for p in url.path.split("/") if p]
    if parts[:1] == ["models"]:
        parts = parts[1:]
    if len(parts) >= 2 and REPO_ID_RE.match("/".join(parts[:2])):
        repo_id = "/".join(parts[:2])
        if len(parts) >= 5 and parts[2] in ("blob", "resolve"):
            return HubSource(repo_id, parts[3], "/".join(parts[4:]))
        if len(parts) >= 4 and parts[2] == "tree":
            return HubSource(repo_id, parts[3])
        return HubSource(repo_id)
    raise ValueError(
        f"“{text}” is not a Hugging Face repo id (owner/name) or a file URL such as "
        "https://huggingface.co/owner/name/resolve/main/model.Q4_K_M.gguf."
    )


def choices_for(files: list[HubFile]) -> list[HubChoice]:
    """The GGUF files one by one (largest quantization last), then the safetensors model
    as one folder when the repo holds one (config.json beside *.safetensors)."""
    ggufs = sorted((f for f in files if f.path.lower().endswith(".gguf")), key=lambda f: f.size)
    choices = [HubChoice(f.path, (f,)) for f in ggufs]
    names = {f.path for f in files}
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        folder = tuple(f for f in files if "/" not in f.path and FOLDER_FILES.match(f.path))
        choices.append(HubChoice("Model folder (safetensors)", folder, is_folder=True))
    return choices


def destination(models_dir: Path, repo_id: str, choice: HubChoice) -> Path:
    """Where a choice lands: models/<owner>/<name>/<file>, or that folder for a folder."""
    folder = models_dir.joinpath(*repo_id.split("/"))
    return folder if choice.is_folder else folder / choice.files[0].path


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None) -> None:
        # HF_ENDPOINT is read here, at the edge, as huggingface_hub's own tools honour it
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.token = token

    # -- listing ----------------------------------------------------------------------

    def list_files(self, source: HubSource) -> list[HubFile]:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self.token)
        with _hub_errors(source.repo_id, self.endpoint):
            info = api.model_info(source.repo_id, revision=source.revision, files_metadata=True)
        files = []
        for sibling in info.siblings or []:
            lfs = sibling.lfs
            size = lfs.size if lfs is not None else (sibling.size or 0)
            sha = lfs.sha256 if lfs is not None else None
            files.append(HubFile(sibling.rfilename, size, sha, sibling.blob_id))
        return files

    # -- downloading ------------------------------------------------------------------

    def download(
        self,
        source: HubSource,
        choice: HubChoice,
        models_dir: Path,
        progress: Progress = lambda _done, _total: None,
        cancel: threading.Event | None = None,
    ) -> Path:
        """The downloaded file (or folder), checked; a partial stays for a resume."""
        cancel = cancel or threading.Event()
        target = destination(models_dir, source.repo_id, choice)
        folder = target if choice.is_folder else target.parent
        total, done_before = choice.size, 0
        for hub_file in choice.files:
            dest = folder / hub_file.path

            def report(done: int, _file_total: int, base=done_before) -> None:
                progress(base + done, total)

            self._download_file(source, hub_file, dest, report, cancel)
            done_before += hub_file.size
        progress(total, total)
        return target

    def _download_file(self, source, hub_file: HubFile, dest: Path, progress, cancel) -> None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(
            source.repo_id, hub_file.path, revision=source.revision, endpoint=self.endpoint
        )
        with _hub_errors(source.repo_id, self.endpoint, hub_file.path):
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        etag = (meta.etag or "").strip('"')
        size = meta.size if meta.size is not None else hub_file.size
        expected = _expected_digest(hub_file, etag)
        if dest.is_file() and dest.stat().st_size == size and _digest_of(dest, expected):
            progress(size, size)  # already here and intact
            return
        part = dest.with_name(dest.name + ".part")
        marker = dest.with_name(dest.name + ".part.json")
        have = _resumable_bytes(part, marker, etag, size)
        dest.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(dest.parent).free
        if free < size - have:  # refused before a byte moves, not when the disk fills
            raise HubError(
                f"{hub_file.path} needs {size_text(size - have)} more and {dest.parent} has "
                f"{size_text(free)} free. Free some space, then try again."
            )
        marker.write_text(json.dumps({"etag": etag, "size": size, "url": url}))
        hasher = _new_hasher(expected, size)
        if have:
            with part.open("rb") as f:
                for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                    hasher.update(block)
        # an LFS file's bytes come from where the HEAD's redirect points (a CDN), as in
        # hf_hub_download; a Xet-stored one from the resolve URL, whose redirect the
        # GET follows
        location = url if meta.xet_file_data is not None else (meta.location or url)
        have, hasher = self._transfer(location, part, have, size, hasher, progress, cancel)
        if have != size:
            raise HubError(
                f"{hub_file.path}: the server sent {have:,} of {size:,} bytes. The part is kept; "
                "try again to resume."
            )
        if expected is not None and hasher.hexdigest() != expected[1]:
            part.unlink(missing_ok=True)
            marker.unlink(missing_ok=True)
            raise HubError(
                f"{hub_file.path} is corrupt: its {expected[0]} is {hasher.hexdigest()}, the hub "
                f"says {expected[1]}. The download was deleted; try again."
            )
        os.replace(part, dest)
        marker.unlink(missing_ok=True)

    def _transfer(self, url: str, part: Path, have: int, size: int, hasher, progress, cancel):
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, httpx

        headers = build_hf_headers(token=self.token)
        if urlparse(url).netloc != urlparse(self.endpoint).netloc:
            headers.pop("authorization", None)  # a signed CDN address: the token stays home
        headers["Accept-Encoding"] = "identity"  # byte offsets must be the file's
        if have:
            headers["Range"] = f"bytes={have}-"
        progress(have, size)
        mode = "ab" if have else "wb"
        try:
            with get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=30
            ) as response:
                if response.status_code == 416 and have == size:
                    return have, hasher  # everything was here already
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
                if have and response.status_code == 200:  # Range ignored: start over
                    have, mode = 0, "wb"
                    hasher = _reset(hasher)
                with part.open(mode) as out:
                    # as the bytes arrive: a fixed chunk size would buffer, and a drop
                    # would lose what the buffer held
                    for chunk in response.iter_bytes():
                        if cancel.is_set():
                            raise DownloadCancelled("Download cancelled; the part is kept.")
                        out.write(chunk)
                        hasher.update(chunk)
                        have += len(chunk)
                        progress(have, size)
        except httpx.HTTPError as error:
            raise HubError(
                f"The connection to {urlparse(url).netloc} dropped after {size_text(have)} of "
                f"{size_text(size)} ({type(error).__name__}: {error}). The part is kept: try again "
                "to resume from there."
            ) from error
        return have, hasher


def _expected_digest(hub_file: HubFile, etag: str) -> tuple[str, str] | None:
    """(kind, hex digest) the finished file must have: the LFS sha256 the hub reports, else
    a git blob id (sha1)."""
    if hub_file.sha256:
        return ("sha256", hub_file.sha256.lower())
    if SHA256_RE.match(etag):
        return ("sha256", etag)
    blob = hub_file.blob_id or (etag if SHA1_RE.match(etag) else None)
    return ("git blob id", blob.lower()) if blob else None


class _GitBlobHasher:
    def __init__(self, size: int) -> None:
        self._sha = hashlib.sha1(f"blob {size}\0".encode())  # noqa: S324 (git's own id)
        self._size = size

    def update(self, data: bytes) -> None:
        self._sha.update(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _new_hasher(expected: tuple[str, str] | None, size: int):
    if expected is not None and expected[0] == "git blob id":
        return _GitBlobHasher(size)
    return hashlib.sha256()


def _reset(hasher):
    return _GitBlobHasher(hasher._size) if isinstance(hasher, _GitBlobHasher) else hashlib.sha256()


def _digest_of(path: Path, expected: tuple[str, str] | None) -> bool:
    if expected is None:
        return True
    hasher = _new_hasher(expected, path.stat().st_size)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            hasher.update(block)
    return hasher.hexdigest() == expected[1]


def _resumable_bytes(part: Path, marker: Path, etag: str, size: int) -> int:
    """How much of a partial download can be kept: all of it when it belongs to the same
    version of the file (same ETag) and is not longer than it, else none."""
    if not part.is_file():
        return 0
    try:
        saved = json.loads(marker.read_text())
    except (OSError, ValueError):
        saved = {}
    have = part.stat().st_size
    if saved.get("etag") != etag or have > size:
        part.unlink()
        return 0
    return have


def size_text(num_bytes: int) -> str:
    """Decimal units, as the hub shows sizes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"


class _hub_errors:
    """huggingface_hub's exceptions as HubError, each saying what to do."""

    def __init__(self, repo_id: str, endpoint: str, filename: str | None = None) -> None:
        self.repo_id, self.endpoint, self.filename = repo_id, endpoint, filename

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, _traceback) -> bool:
        if error is None:
            return False
        from huggingface_hub import errors
        from huggingface_hub.utils import httpx

        what = f"{self.filename} in {self.repo_id}" if self.filename else self.repo_id
        if isinstance(error, errors.GatedRepoError):
            message = (
                f"{self.repo_id} is gated: accept its terms on the hub's page and log in "
                "(`hf auth login`, or set HF_TOKEN), then try again."
            )
        elif isinstance(error, errors.RepositoryNotFoundError):
            message = f"No model repo “{self.repo_id}” on {self.endpoint} (or it is private)."
        elif isinstance(error, errors.RevisionNotFoundError):
            message = f"{self.repo_id} has no such branch or revision."
        elif isinstance(error, errors.EntryNotFoundError):
            message = f"{what} does not exist."
        elif isinstance(error, errors.OfflineModeIsEnabled):
            message = "huggingface_hub is in offline mode (HF_HUB_OFFLINE is set)."
        elif isinstance(error, errors.HfHubHTTPError):
            message = f"The hub refused {what}: {error}"
        elif isinstance(error, httpx.HTTPError | OSError):
            message = f"Could not reach {self.endpoint}: {error}"
        else:
            return False
        raise HubError(message) from error
